/* Token datasets in llm.c's shard format, memory-mapped, and the deterministic sampler.
 *
 * Shard file: a 1024-byte header of 256 little-endian int32 (header[0] = magic,
 * header[1] = version 1, header[2] = token count), then the tokens: uint16 when
 * magic == 20240520, uint32 when magic == 20240801.
 *
 * Sampling: the global batch of step s is a function of (seed, s) alone. Sequence i
 * (0 <= i < global batch) of step s starts at window w = philox_u64(seed, stream
 * LOOM_DATA_STREAM, s, i) mod W, where W is the number of windows of seq_len+1 tokens
 * over all shards (a shard of n tokens has n - seq_len windows, windows never cross
 * shards; shards in sorted path order). Any layout that asks for sequences
 * [first, first + count) of step s gets the same tokens. */
#ifndef LOOM_DATA_DATASET_H
#define LOOM_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define LOOM_SHARD_MAGIC_U16 20240520
#define LOOM_SHARD_MAGIC_U32 20240801
#define LOOM_SHARD_HEADER_BYTES 1024
#define LOOM_DATA_STREAM 0x64617461u /* "data" */

typedef struct {
    char *path;
    void *map; /* whole file, mmap'd read-only */
    size_t map_bytes;
    int token_bytes; /* 2 or 4 */
    int64_t n_tokens;
    int64_t n_windows;    /* max(0, n_tokens - seq_len) */
    int64_t first_window; /* global index of this shard's first window */
} loom_shard;

typedef struct {
    loom_shard *shards;
    int n_shards;
    int seq_len;
    int64_t total_tokens;
    int64_t total_windows;
} loom_dataset;

/* Opens every file matching glob_pattern (sorted), validates each header, size and
 * every token id (< vocab_size), and that at least one window of seq_len+1 tokens
 * exists. Errors name the flag or file and what was expected. */
loom_status loom_dataset_open(loom_dataset *ds, const char *glob_pattern, int vocab_size,
                              int seq_len, loom_error *err);
void loom_dataset_close(loom_dataset *ds);

/* Writes sequences [first_seq, first_seq + n_seqs) of step `step` into
 * out[n_seqs][seq_len + 1] (inputs are out[i][0..T), targets out[i][1..T]). */
void loom_dataset_sample(const loom_dataset *ds, uint64_t seed, int64_t step, int64_t first_seq,
                         int n_seqs, int32_t *out);

/* Where sequence `seq` of step `step` comes from (the window sample() reads): the shard
 * and the index of its first token in that shard's token array. */
const loom_shard *loom_dataset_locate(const loom_dataset *ds, uint64_t seed, int64_t step,
                                      int64_t seq, int64_t *token_offset);

/* Writes one shard file (magic chosen by token_bytes: 2 -> 20240520, 4 -> 20240801). */
loom_status loom_shard_write(const char *path, const int32_t *tokens, int64_t n_tokens,
                             int token_bytes, loom_error *err);

#endif
