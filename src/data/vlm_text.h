/* The tokens of a multimodal LLM's text (family vlm: loom data vlm writes them, loom generate
 * --image reads and writes them), in one of two vocabularies:
 * - bytes (the default): 0..255, <image> 256 (LOOM_VLM_BYTE_IMAGE) and <|endoftext|> 257
 *   (LOOM_VLM_BYTE_EOT), 258 tokens;
 * - a BPE (--tokenizer DIR, data/tokenizer.h) of V tokens whose last is <|endoftext|> (as
 *   loom tokenizer train and GPT-2's encoder.json have it): its ids, <|endoftext|> V - 1
 *   and <image> V, one past the tokenizer's: V + 1 tokens.
 * The model's --vocab-size must hold them (the shard header's vocabulary says how many). */
#ifndef LOOM_DATA_VLM_TEXT_H
#define LOOM_DATA_VLM_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "data/tokenizer.h"

typedef struct {
    loom_tokenizer *bpe; /* NULL: bytes */
    int32_t image, eot;  /* the <image> marker's and <|endoftext|>'s ids */
    int32_t vocab;       /* every id < vocab */
} loom_vlm_text;

/* tokenizer NULL or "bytes": bytes; else a tokenizer's name or folder (loom_tokenizer_load).
 * Errors name --tokenizer and what was expected. */
loom_status loom_vlm_text_open(loom_vlm_text *t, const char *tokenizer, loom_error *err);
void loom_vlm_text_close(loom_vlm_text *t);

/* Appends the tokens of s[0..len) to out. Not thread-safe with a BPE (its cache). */
loom_status loom_vlm_text_encode(loom_vlm_text *t, const char *s, size_t len, loom_token_buf *out,
                                 loom_error *err);

/* The bytes a text token stands for; NULL for <image>, <|endoftext|> and ids outside the
 * vocabulary (a model's padding ids past it): where generated text ends. */
const unsigned char *loom_vlm_text_bytes(const loom_vlm_text *t, int32_t id, size_t *len);

#endif
