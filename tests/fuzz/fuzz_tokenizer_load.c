/* libFuzzer target: the input is split at its first 0 byte into encoder.json (before) and
 * vocab.bpe (after; empty when there is no 0 byte), written to scratch files and loaded
 * with loom_tokenizer_load_files. Any error status is fine; crashes, leaks, UB are not.
 * When a load succeeds, the fuzzed vocabulary must still round-trip text and its heap and
 * scan BPE paths must agree. Built and run by tests/fuzz/run_fuzz.sh. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fuzz_common.h"

static char enc_path[PATH_MAX + 16], voc_path[PATH_MAX + 16];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[PATH_MAX];
    fuzz_make_dir(dir, sizeof dir, "load");
    snprintf(enc_path, sizeof enc_path, "%s/encoder.json", dir);
    snprintf(voc_path, sizeof voc_path, "%s/vocab.bpe", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *zero = memchr(data, 0, size);
    size_t enc_n = zero ? (size_t)(zero - data) : size;
    const uint8_t *voc = zero ? zero + 1 : data + size;
    size_t voc_n = size - (size_t)(voc - data);
    fuzz_write(enc_path, data, enc_n);
    fuzz_write(voc_path, voc, voc_n);
    loom_tokenizer *t = NULL;
    loom_error err = {0};
    loom_status st = loom_tokenizer_load_files(&t, enc_path, voc_path, &err);
    if (st != LOOM_OK) {
        if (t) fuzz_die("failed load left a tokenizer", NULL);
        if (!err.msg[0]) fuzz_die("failed load without a message", NULL);
        return 0;
    }
    if (loom_tokenizer_vocab_size(t) < 256) fuzz_die("vocabulary under 256 tokens", NULL);
    static const char sample[] = "the aaaa!! abab'sll \xC3\xA9\xE6\x97\xA5 \xFF\x80 123\r\n\n  x";
    fuzz_check(t, (const uint8_t *)sample, sizeof sample - 1, 1024, NULL);
    fuzz_check(t, voc, voc_n < 512 ? voc_n : 512, 1024, NULL); /* text shaped like its merges */
    loom_tokenizer_free(t);
    return 0;
}
