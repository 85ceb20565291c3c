/* Text -> token shards (`loom data prepare`), streaming with bounded memory.
 *
 * Documents: with LOOM_DOC_SEP_FILE each non-empty input file is one document; with
 * LOOM_DOC_SEP_BLANK_LINE the input is split into lines at '\n', a line is blank when it
 * is empty or holds only "\r", and a document is a maximal run of non-blank lines joined
 * by '\n' (blank lines and the newline after a document's last line are dropped).
 * Documents never span two input files.
 *
 * Output: every document is preceded by the end-of-text token (the tokenizer's last id,
 * which must spell "<|endoftext|>") and goes whole to one split. Splits are written as
 * DIR/train_000000.bin, ... and DIR/val_000000.bin, ... (llm.c format, dataset.h) of at
 * most shard_tokens tokens each; uint16 tokens when the vocabulary has <= 65536 ids, else
 * uint32. A split with no tokens has no file. Numbered shards of an earlier run past the
 * last one written are removed, so DIR/train_*.bin is exactly this run's output.
 *
 * Validation rule (deterministic, streaming): document k (k = 1, 2, ... in input order)
 * goes to val when floor(k * F) > floor((k - 1) * F). With F = 1/K that is every K-th
 * document; of n documents floor(n * F) go to val; the first is always train.
 *
 * Memory: input is read in chunks of chunk_bytes. A document is encoded piece by piece:
 * once its pending text reaches chunk_bytes it is cut at the last point of the form
 * "x| y" (x, y ASCII letters or digits, cut before the space). GPT-2's pre-tokeniser
 * always has a piece boundary there, so the tokens equal those of the whole document.
 * Where no such point exists within 4 * chunk_bytes (e.g. text without spaces), the
 * text is cut at a UTF-8 character boundary; the tokens may then differ from whole-
 * document encoding but still decode to the same bytes. Shards are written through a
 * small buffer into DIR/NAME.tmp, whose header is patched when the shard is full, then
 * fsync'd and renamed. Memory is O(chunk_bytes) whatever the input or shard size. */
#ifndef LOOM_DATA_PREPARE_H
#define LOOM_DATA_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "data/shard_stream.h"
#include "data/tokenizer.h"

typedef enum { LOOM_DOC_SEP_FILE = 0, LOOM_DOC_SEP_BLANK_LINE = 1 } loom_doc_sep;

typedef struct {
    int64_t n_files;
    int64_t bytes_read;
    int64_t bytes_total; /* -1 when unknown (a pipe on stdin) */
    int64_t n_docs, n_val_docs;
    int64_t train_tokens, val_tokens;
    int train_shards, val_shards;
    int stale_removed; /* old shard files removed from DIR */
    double seconds;
} loom_prepare_stats;

/* Called after every chunk read (the stats so far); printing is the caller's business. */
typedef void (*loom_prepare_progress_fn)(void *ctx, const loom_prepare_stats *stats);

typedef struct {
    const char *const *inputs; /* globs (matches sorted) or "-" for stdin */
    int n_inputs;
    const char *out_dir;
    double val_fraction;  /* in [0, 1) */
    int64_t shard_tokens; /* 1 .. INT32_MAX */
    loom_doc_sep doc_sep;
    size_t chunk_bytes; /* 0: 1 MiB */
    loom_prepare_progress_fn progress;
    void *progress_ctx;
} loom_prepare_options;

/* Runs the whole preparation. Errors name the flag or file and what was expected: no
 * file matching a glob, an unreadable file or a folder, no documents, bad options
 * (LOOM_ERR_INPUT); failed writes (LOOM_ERR_IO). */
loom_status loom_prepare_run(loom_tokenizer *tok, const loom_prepare_options *opt,
                             loom_prepare_stats *stats, loom_error *err);

/* 1 when document index k0 (0-based) goes to val under the rule above. */
int loom_prepare_is_val(double val_fraction, int64_t k0);

#endif
