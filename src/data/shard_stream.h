/* Streaming token-shard writer used by `loom data prepare` (prepare.h): tokens go through
 * a small buffer into DIR/NAME.tmp, whose llm.c header (dataset.h) is patched when the
 * shard is full or the stream finishes, then fsync'd and renamed, so a shard file either
 * does not exist or is complete. Memory is O(1) in the shard size. */
#ifndef LOOM_DATA_SHARD_STREAM_H
#define LOOM_DATA_SHARD_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Writes DIR/SPLIT_NNNNNN.bin into path[cap]; -1 when it does not fit. */
int loom_prepare_shard_path(char *path, size_t cap, const char *dir, const char *split, int index);

/* Streaming shard writer: numbered shards DIR/SPLIT_NNNNNN.bin of at most max_tokens
 * tokens, each written as .tmp, header patched, fsync'd and renamed when full or closed. */
typedef struct {
    char *dir;
    const char *split;
    int token_bytes;
    int64_t max_tokens;
    int fd;
    char *path, *tmp;
    size_t path_cap;
    int64_t in_shard, total;
    int n_shards;
    unsigned char *buf;
    size_t buf_n, buf_cap;
} loom_shard_stream;

loom_status loom_shard_stream_open(loom_shard_stream *s, const char *dir, const char *split,
                                   int token_bytes, int64_t max_tokens, loom_error *err);
/* Appends ids (each must fit token_bytes), starting new shards as needed. */
loom_status loom_shard_stream_put(loom_shard_stream *s, const int32_t *ids, size_t n,
                                  loom_error *err);
/* Finishes the open shard (if any) and frees the stream. */
loom_status loom_shard_stream_finish(loom_shard_stream *s, loom_error *err);
/* Drops the open shard's .tmp file and frees the stream (after an error). */
void loom_shard_stream_abort(loom_shard_stream *s);

#endif
