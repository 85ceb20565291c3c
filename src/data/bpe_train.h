/* Learning a byte-level BPE (GPT-2 style) from text.
 *
 * The text is split with GPT-2's pre-tokenisation (tokenizer.h); distinct pieces are
 * counted; then the most frequent adjacent pair (ties: smaller left id, then smaller right
 * id) is merged, repeatedly, with pair counts updated incrementally (only the words that
 * hold the merged pair are touched). Ids: 0..255 are the bytes in GPT-2's encoder.json
 * order, then one id per merge, then "<|endoftext|>" last. If a merge spells an existing
 * token, that token's id is reused (the merge is still recorded).
 *
 * Output: DIR/encoder.json and DIR/vocab.bpe in GPT-2's format, loadable by
 * loom_tokenizer_load(DIR). */
#ifndef LOOM_DATA_BPE_TRAIN_H
#define LOOM_DATA_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct {
    int64_t n_pieces; /* pre-tokenised pieces in the text */
    int64_t n_words;  /* distinct pieces */
    int32_t n_merges; /* merges learned (fewer than asked when no pair is left) */
    int32_t n_tokens; /* vocabulary size written, <|endoftext|> included */
} loom_bpe_train_stats;

/* vocab_size counts all tokens: 256 bytes + merges + <|endoftext|> (so >= 257). */
loom_status loom_bpe_train(const unsigned char *text, size_t len, int32_t vocab_size,
                           const char *out_dir, loom_bpe_train_stats *stats, loom_error *err);

#endif
