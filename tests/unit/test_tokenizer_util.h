/* Helpers for the tokenizer tests: temp folders, small encoder.json/vocab.bpe pairs,
 * a seeded RNG (seed printed, LOOM_TEST_SEED overrides). */
#ifndef LOOM_TEST_TOKENIZER_UTIL_H
#define LOOM_TEST_TOKENIZER_UTIL_H

#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tokenizer_impl.h"
#include "test_common.h"

static inline void seed_rng(void) {
    const char *s = getenv("LOOM_TEST_SEED");
    g_rng = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %" PRIu64 " (LOOM_TEST_SEED overrides)\n", g_rng);
}

static inline void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Appends the JSON string spelling of token bytes. */
static inline void json_token(loom_byte_buf *out, const char *bytes, size_t n) {
    loom_byte_buf s = {0};
    assert_int_equal(loom_bytes_spell((const unsigned char *)bytes, n, &s), 0);
    loom_byte_buf_append(out, "\"", 1);
    for (size_t i = 0; i < s.n; i++) {
        if (s.data[i] == '"' || s.data[i] == '\\') loom_byte_buf_append(out, "\\", 1);
        loom_byte_buf_append(out, s.data + i, 1);
    }
    loom_byte_buf_append(out, "\"", 1);
    free(s.data);
}

/* Writes DIR/encoder.json (the 256 bytes, then the merge results) and DIR/vocab.bpe
 * from merges given as "left|right" byte strings ('|' separates; bytes only printable
 * ASCII here). */
static inline void write_vocab(const char *dir, const char *const *merges, int n_merges) {
    loom_byte_buf enc = {0}, voc = {0};
    loom_byte_buf_append(&enc, "{", 1);
    int id = 0;
    char num[32];
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if (id) loom_byte_buf_append(&enc, ", ", 2);
        json_token(&enc, &c, 1);
        int k = snprintf(num, sizeof num, ": %d", id++);
        loom_byte_buf_append(&enc, num, (size_t)k);
    }
    loom_byte_buf_append(&voc, "#version: 0.2\n", 14);
    for (int m = 0; m < n_merges; m++) {
        const char *bar = strchr(merges[m], '|');
        size_t la = (size_t)(bar - merges[m]), lb = strlen(bar + 1);
        char both[256];
        snprintf(both, sizeof both, "%.*s%s", (int)la, merges[m], bar + 1);
        loom_byte_buf sa = {0}, sb = {0};
        loom_bytes_spell((const unsigned char *)merges[m], la, &sa);
        loom_bytes_spell((const unsigned char *)bar + 1, lb, &sb);
        loom_byte_buf_append(&voc, sa.data, sa.n);
        loom_byte_buf_append(&voc, " ", 1);
        loom_byte_buf_append(&voc, sb.data, sb.n);
        loom_byte_buf_append(&voc, "\n", 1);
        free(sa.data);
        free(sb.data);
        int dup = 0; /* a result may be produced twice; list it once */
        for (int k = 0; k < m; k++) {
            const char *b2 = strchr(merges[k], '|');
            char prev[256];
            snprintf(prev, sizeof prev, "%.*s%s", (int)(b2 - merges[k]), merges[k], b2 + 1);
            dup |= strcmp(prev, both) == 0 || strlen(both) == 1;
        }
        if (dup) continue;
        loom_byte_buf_append(&enc, ", ", 2);
        json_token(&enc, both, strlen(both));
        int k = snprintf(num, sizeof num, ": %d", id++);
        loom_byte_buf_append(&enc, num, (size_t)k);
    }
    loom_byte_buf_append(&enc, "}\0", 2);
    loom_byte_buf_append(&voc, "\0", 1);
    write_text(dir, "encoder.json", (const char *)enc.data);
    write_text(dir, "vocab.bpe", (const char *)voc.data);
    free(enc.data);
    free(voc.data);
}

#endif
