/* Image and video shards: labelled uint8 samples [F][C][H][W], memory-mapped.
 *
 * File DIR/SPLIT_NNNNNN.bin (SPLIT = train or val): a 1024-byte header of 256
 * little-endian int32
 *   [0] magic 20261202  [1] version 1  [2] n samples  [3] frames F  [4] channels C
 *   [5] height H        [6] width W    [7] n_classes  [8..255] 0
 * then n int32 labels (0 <= label < n_classes), then n*F*C*H*W uint8 pixels, sample-major,
 * each sample [F][C][H][W] (F = 1 for images). The file size is exactly
 * 1024 + 4n + n*F*C*H*W. Limits: F, C, H, W, n_classes in 1..65535, F*C*H*W <= 2^30.
 *
 * Sampling: sample `seq` of step `step` is loom_image_dataset_pick(ds, seed, step, seq) =
 * loom_philox_u64(seed, LOOM_DATA_STREAM, step, seq) mod n over all shards (sorted path
 * order), the same draw as the token sampler (dataset.h), so the global batch of a step is
 * a function of (seed, step) whatever the layout. */
#ifndef LOOM_DATA_IMAGE_SHARD_H
#define LOOM_DATA_IMAGE_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define LOOM_IMAGE_SHARD_MAGIC 20261202
#define LOOM_IMAGE_SHARD_VERSION 1
#define LOOM_IMAGE_SHARD_HEADER_BYTES 1024
#define LOOM_IMAGE_MAX_DIM 65535
#define LOOM_IMAGE_MAX_SAMPLE_BYTES (1 << 30)

typedef struct {
    int frames, channels, height, width, n_classes;
} loom_image_shape;

/* F*C*H*W, or -1 when a dimension is out of 1..65535 or the product exceeds 2^30. */
int64_t loom_image_sample_bytes(const loom_image_shape *shape);

/* ---- writer ---- */

/* Writes the numbered shards DIR/SPLIT_000000.bin, ... of one split holding n_total
 * samples, at most shard_samples each (the count of every shard is known up front, so
 * labels are kept in memory for one shard and pixels are streamed). Each shard is
 * written as NAME.tmp, fsync'd and renamed. finish() removes numbered shards of an
 * earlier run past the last one written (all of them when n_total is 0), so
 * DIR/SPLIT_*.bin is exactly this run's output. */
typedef struct {
    char *dir, *split, *path, *tmp;
    size_t path_cap;
    loom_image_shape shape;
    int64_t sample_bytes, n_total, shard_samples, done;
    int64_t in_shard, shard_n; /* samples put into / planned for the open shard */
    int n_shards, fd, stale_removed;
    int32_t *labels; /* shard_samples */
    unsigned char *buf;
    size_t buf_n, buf_cap;
} loom_image_writer;

loom_status loom_image_writer_open(loom_image_writer *w, const char *dir, const char *split,
                                   const loom_image_shape *shape, int64_t n_total,
                                   int64_t shard_samples, loom_error *err);
/* Appends one sample (sample_bytes pixels [F][C][H][W]) with its label. */
loom_status loom_image_writer_put(loom_image_writer *w, int32_t label, const uint8_t *pixels,
                                  loom_error *err);
/* Checks that n_total samples were put, closes the last shard, removes stale shards and
 * frees the writer (also on error). */
loom_status loom_image_writer_finish(loom_image_writer *w, loom_error *err);
/* Drops the open shard's .tmp file and frees the writer. */
void loom_image_writer_abort(loom_image_writer *w);

/* Writes n samples as one file (tmp + rename). */
loom_status loom_image_shard_write(const char *path, const loom_image_shape *shape, int64_t n,
                                   const int32_t *labels, const uint8_t *pixels, loom_error *err);

/* ---- reader ---- */

typedef struct {
    char *path;
    void *map; /* whole file, mmap'd read-only */
    size_t map_bytes;
    int64_t n, first; /* samples in this shard; global index of its first sample */
} loom_image_shard;

typedef struct {
    loom_image_shard *shards;
    int n_shards;
    int64_t n; /* total samples */
    int frames, channels, height, width, n_classes;
    int64_t sample_bytes; /* F*C*H*W */
} loom_image_dataset;

/* Opens every file matching glob (sorted bytewise) and validates each: header magic,
 * version, dimensions, exact file size, every label < n_classes, and that all shards have
 * the same F, C, H, W and n_classes. At least one sample must exist. Errors
 * (LOOM_ERR_INPUT) name the file and what was expected; a pattern that matches nothing
 * gives "no image shard matches 'GLOB'" (callers prefix the flag). */
loom_status loom_image_dataset_open(loom_image_dataset *ds, const char *glob, loom_error *err);
void loom_image_dataset_close(loom_image_dataset *ds);

/* Sample i (0 <= i < n): pixels [F][C][H][W] and label. */
const uint8_t *loom_image_dataset_pixels(const loom_image_dataset *ds, int64_t i);
int32_t loom_image_dataset_label(const loom_image_dataset *ds, int64_t i);

/* The sample index of sequence `seq` of step `step` (see the top of this file). */
int64_t loom_image_dataset_pick(const loom_image_dataset *ds, uint64_t seed, int64_t step,
                                int64_t seq);

#endif
