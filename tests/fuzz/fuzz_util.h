/* Helpers of every fuzz target: failing checks and scratch files under $TMPDIR. Any
 * failed check aborts, which libFuzzer reports as a crash with the input saved. */
#ifndef LOOM_FUZZ_UTIL_H
#define LOOM_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

static inline void fuzz_die(const char *what, const loom_error *err) {
    fprintf(stderr, "fuzz check failed: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
    abort();
}

/* A fresh folder under $TMPDIR (run_fuzz.sh points it at a scratch dir, tmpfs where it
 * can, and removes it afterwards: libFuzzer may exit without running atexit handlers). */
static inline void fuzz_make_dir(char *dir, size_t cap, const char *tag) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/loom_fuzz_%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(dir)) fuzz_die("mkdtemp", NULL);
}

/* Unlinks first: ext4 flushes a truncated-and-rewritten file on close (auto_da_alloc). */
static inline void fuzz_write(const char *path, const void *data, size_t n) {
    unlink(path);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) fuzz_die(path, NULL);
}

#endif
