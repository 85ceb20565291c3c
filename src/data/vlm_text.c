/* The tokens of a vlm's text: bytes or a BPE (data/vlm_text.h). */
#include "data/vlm_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/vlm_shard.h"

loom_status loom_vlm_text_open(loom_vlm_text *t, const char *tokenizer, loom_error *err) {
    *t = (loom_vlm_text){NULL, LOOM_VLM_BYTE_IMAGE, LOOM_VLM_BYTE_EOT, LOOM_VLM_BYTE_EOT + 1};
    if (!tokenizer || strcmp(tokenizer, "bytes") == 0) return LOOM_OK;
    loom_tokenizer *bpe = NULL;
    loom_error e = {0};
    if (loom_tokenizer_load(&bpe, tokenizer, &e))
        return loom_error_set(err, e.code, "--tokenizer %s: %s", tokenizer, e.msg);
    char flag[1100];
    snprintf(flag, sizeof flag, "--tokenizer %.1000s", tokenizer);
    int32_t eot;
    const loom_status st = loom_tokenizer_require_eot(bpe, flag, &eot, err);
    if (st) {
        loom_tokenizer_free(bpe);
        return st;
    }
    *t = (loom_vlm_text){bpe, eot + 1, eot, eot + 2};
    return LOOM_OK;
}

void loom_vlm_text_close(loom_vlm_text *t) {
    loom_tokenizer_free(t->bpe);
    t->bpe = NULL;
}

loom_status loom_vlm_text_encode(loom_vlm_text *t, const char *s, size_t len, loom_token_buf *out,
                                 loom_error *err) {
    if (t->bpe) return loom_tokenizer_encode(t->bpe, (const unsigned char *)s, len, out, err);
    if (out->n + len > out->cap) {
        const size_t cap = 2 * (out->n + len) + 16;
        int32_t *ids = realloc(out->ids, cap * sizeof *ids);
        if (!ids) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for %zu tokens", cap);
        out->ids = ids, out->cap = cap;
    }
    for (size_t i = 0; i < len; i++) out->ids[out->n++] = (unsigned char)s[i];
    return LOOM_OK;
}

/* Byte-level tokens stand for themselves: BYTES[id] is id. */
#define B4(n) n, n + 1, n + 2, n + 3
#define B16(n) B4(n), B4(n + 4), B4(n + 8), B4(n + 12)
#define B64(n) B16(n), B16(n + 16), B16(n + 32), B16(n + 48)
static const unsigned char BYTES[256] = {B64(0), B64(64), B64(128), B64(192)};

const unsigned char *loom_vlm_text_bytes(const loom_vlm_text *t, int32_t id, size_t *len) {
    if (id == t->image || id == t->eot || id < 0 || id >= t->vocab) return NULL;
    if (t->bpe) return loom_tokenizer_token(t->bpe, id, len);
    *len = 1;
    return BYTES + id;
}
