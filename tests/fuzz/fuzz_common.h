/* Helpers shared by the tokenizer fuzz targets (scratch files: fuzz_util.h): the
 * round-trip / heap-vs-scan oracle. Any failed check aborts, which libFuzzer reports as
 * a crash with the input saved. */
#ifndef LOOM_FUZZ_COMMON_H
#define LOOM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer_impl.h"
#include "fuzz_util.h"

/* The JSON string of a token's alphabet spelling ('"' and '\\' are spelled as themselves). */
static inline void fuzz_json_token(loom_byte_buf *out, const char *bytes, size_t n) {
    loom_byte_buf s = {0};
    if (loom_bytes_spell((const unsigned char *)bytes, n, &s) != 0) fuzz_die("spell", NULL);
    loom_byte_buf_append(out, "\"", 1);
    for (size_t i = 0; i < s.n; i++) {
        if (s.data[i] == '"' || s.data[i] == '\\') loom_byte_buf_append(out, "\\", 1);
        loom_byte_buf_append(out, &s.data[i], 1);
    }
    loom_byte_buf_append(out, "\"", 1);
    free(s.data);
}

/* Writes DIR/encoder.json (the 256 bytes, then each merge's result) and DIR/vocab.bpe from
 * merges "left|right" (byte strings split at the first '|'). */
static inline void fuzz_write_vocab(const char *dir, const char *const *merges, int n) {
    loom_byte_buf enc = {0}, voc = {0};
    char num[32], path[4096];
    loom_byte_buf_append(&enc, "{", 1);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        fuzz_json_token(&enc, &c, 1);
        snprintf(num, sizeof num, ": %d,\n", b);
        loom_byte_buf_append(&enc, num, strlen(num));
    }
    loom_byte_buf_append(&voc, "#version: 0.2\n", 14);
    for (int i = 0; i < n; i++) {
        const char *m = merges[i], *bar = strchr(m, '|');
        size_t la = (size_t)(bar - m), lb = strlen(bar + 1);
        char both[256];
        if (la + lb > sizeof both) fuzz_die("merge too long", NULL);
        memcpy(both, m, la);
        memcpy(both + la, bar + 1, lb);
        fuzz_json_token(&enc, both, la + lb);
        snprintf(num, sizeof num, ": %d%s\n", 256 + i, i + 1 < n ? "," : "");
        loom_byte_buf_append(&enc, num, strlen(num));
        if (loom_bytes_spell((const unsigned char *)m, la, &voc) != 0 ||
            loom_byte_buf_append(&voc, " ", 1) != 0 ||
            loom_bytes_spell((const unsigned char *)bar + 1, lb, &voc) != 0)
            fuzz_die("spell", NULL);
        loom_byte_buf_append(&voc, "\n", 1);
    }
    loom_byte_buf_append(&enc, "}", 1);
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    fuzz_write(path, enc.data, enc.n);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    fuzz_write(path, voc.data, voc.n);
    free(enc.data);
    free(voc.data);
}

static inline void fuzz_encode(loom_tokenizer *t, const uint8_t *s, size_t n, loom_token_buf *o) {
    loom_error err = {0};
    o->n = 0;
    if (loom_tokenizer_encode(t, s, n, o, &err) != LOOM_OK) fuzz_die("encode", &err);
}

/* An empty, small cache: cheaper than loom_strmap_clear over the default 32K slots. */
static inline void fuzz_reset_cache(loom_tokenizer *t) {
    loom_strmap_free(&t->cache);
    if (loom_strmap_init(&t->cache, 0) != 0) fuzz_die("out of memory", NULL);
    t->cache_n = 0;
}

/* decode(encode(s)) == s with t; for n <= diff_max also the scan-only and heap-only BPE
 * paths must give the same ids: alt[0] / alt[1] when given (tokenizers with heap_min_len
 * SIZE_MAX / 1 and caches of their own), else t itself with its cache reset around them. */
static inline void fuzz_check(loom_tokenizer *t, const uint8_t *s, size_t n, size_t diff_max,
                              loom_tokenizer *const *alt) {
    loom_token_buf a = {0}, b = {0};
    loom_byte_buf back = {0};
    loom_error err = {0};
    fuzz_encode(t, s, n, &a);
    if (loom_tokenizer_decode(t, a.ids, a.n, &back, &err) != LOOM_OK) fuzz_die("decode", &err);
    if (back.n != n || (n && memcmp(back.data, s, n) != 0)) fuzz_die("decode(encode(x)) != x", 0);
    size_t keep = t->heap_min_len;
    for (int heap = 0; heap < 2 && n <= diff_max; heap++) {
        loom_tokenizer *u = alt ? alt[heap] : t;
        if (!alt) {
            fuzz_reset_cache(t);
            t->heap_min_len = heap ? 1 : SIZE_MAX;
        }
        fuzz_encode(u, s, n, &b);
        if (b.n != a.n || (a.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) != 0))
            fuzz_die(heap ? "heap BPE != default" : "scan BPE != default", NULL);
    }
    if (!alt && n <= diff_max) {
        t->heap_min_len = keep;
        fuzz_reset_cache(t);
    }
    free(a.ids);
    free(b.ids);
    free(back.data);
}

#endif
