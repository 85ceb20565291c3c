/* libFuzzer target: the fuzz input is text for loom_tokenizer_encode. Checks that
 * decode(encode(x)) == x byte for byte and that the heap and scan BPE paths agree, with a
 * small hand-written vocabulary and, when LOOM_FUZZ_GPT2_DIR holds encoder.json +
 * vocab.bpe, with GPT-2's. Built and run by tests/fuzz/run_fuzz.sh. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"

/* Merges chosen to hit GPT-2's tricky cases: runs of one byte (non-overlapping, left to
 * right), ranks out of creation order, multi-byte UTF-8 and a leading space. */
static const char *const merges[] = {
    "t|h", "th|e",      " |t",  " t|he",     "a|a",           "aa|aa", "aa|a",   "i|n",    "in|g",
    " |a", "e|r",       "h|e",  "l|l",       "o|w",           "ll|o",  "he|llo", "1|2",    "12|3",
    "!|!", "!!|!!",     " | ",  "'|s",       "\xC3|\xA9",     "ab|ab", "b|a",    "a|b",    "ab|a",
    "b|b", "abab|abab", "bb|a", "\xE6|\x97", "\xE6\x97|\xA5", "\n|\n", "\r|\n",  " |\xC3",
};

/* Per vocabulary: the default tokenizer, then scan-only and heap-only copies. Each keeps
 * its cache across inputs, so cached results are checked against fresh ones too. */
static loom_tokenizer *toks[2][3];
static int n_toks;

static void load(const char *enc, const char *voc) {
    for (int k = 0; k < 3; k++) {
        loom_error err = {0};
        if (loom_tokenizer_load_files(&toks[n_toks][k], enc, voc, &err) != LOOM_OK)
            fuzz_die("load", &err);
    }
    toks[n_toks][1]->heap_min_len = SIZE_MAX;
    toks[n_toks][2]->heap_min_len = 1;
    n_toks++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[PATH_MAX], enc[PATH_MAX + 16], voc[PATH_MAX + 16];
    fuzz_make_dir(dir, sizeof dir, "encode");
    fuzz_write_vocab(dir, merges, (int)(sizeof merges / sizeof *merges));
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
    load(enc, voc);
    remove(enc);
    remove(voc);
    rmdir(dir);
    const char *gpt2 = getenv("LOOM_FUZZ_GPT2_DIR");
    if (gpt2 && *gpt2) {
        snprintf(enc, sizeof enc, "%s/encoder.json", gpt2);
        snprintf(voc, sizeof voc, "%s/vocab.bpe", gpt2);
        load(enc, voc);
        fprintf(stderr, "fuzz_tokenizer_encode: also GPT-2's vocabulary from %s\n", gpt2);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The O(n^2) scan path is only compared on inputs up to 1 KiB. */
    for (int i = 0; i < n_toks; i++) fuzz_check(toks[i][0], data, size, 1024, toks[i] + 1);
    return 0;
}
