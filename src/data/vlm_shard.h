/* Image-text shards for multimodal LLMs (family vlm), memory-mapped, and the batch records
 * a vlm trains on.
 *
 * File DIR/SPLIT_NNNNNN.bin (SPLIT = train or val): a 1024-byte header of 256 little-endian
 * int32
 *   [0] magic 20261205  [1] version 1  [2] n samples  [3] channels C  [4] height H
 *   [5] width W         [6] image token (the <image> marker's id)  [7] end-of-text id
 *   [8] vocabulary the tokens need (every token < this)  [9] total tokens  [10] total
 *   images  [11..255] 0
 * then n sample entries of 4 int32 (first token, tokens, first image, images; samples in
 * order, each starting where the previous ended), the tokens (int32), one loss-mask byte
 * per token (1: an answer token, predicted and counted in the loss; 0: prompt, marker or
 * caption prefix), and the images' pixels, uint8 [C][H][W] each. The file size is exactly
 * 1024 + 16 n + 5 tokens + images * C*H*W. A sample holds exactly as many <image>
 * markers as images (0, 1 or several). Limits: C 1..4, H and W 1..4096, n, tokens and
 * images below 2^31.
 *
 * A batch record (loom_vlm_record_words words, model family vlm with sequence length T,
 * image_tokens P per image, max_images slots of S = C*H*W floats):
 *   [0, T]       T + 1 tokens: the sample with each marker expanded into P slots
 *                (LOOM_VLM_SLOT), padded with end-of-text; inputs are [0, T), targets
 *                [1, T]
 *   [T+1, 2T]    the loss weight of targets 1..T as float bits: T / (answer targets of
 *                the sample) on answer targets, 0 elsewhere (slots and padding too)
 *   [2T+1]       the number of images
 *   [2T+2, ...)  max_images images of S floats (bits): pixel / 127.5 - 1, [C][H][W];
 *                unused slots 0
 * Sampling: record `seq` of step `step` is sample philox(seed, LOOM_DATA_STREAM, step,
 * seq) mod n over every shard (sorted path order), as for token and image shards: a
 * function of (seed, step) whatever the layout. */
#ifndef LOOM_DATA_VLM_SHARD_H
#define LOOM_DATA_VLM_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define LOOM_VLM_SHARD_MAGIC 20261205
#define LOOM_VLM_SHARD_VERSION 1
#define LOOM_VLM_SHARD_HEADER_BYTES 1024
#define LOOM_VLM_SLOT (-1) /* an image token's place in a record */
/* Byte-level tokens: bytes 0..255, then the marker and end-of-text. */
#define LOOM_VLM_BYTE_IMAGE 256
#define LOOM_VLM_BYTE_EOT 257

/* What the model the records are built for looks like. */
typedef struct {
    int seq_len;      /* T */
    int image_tokens; /* P per image */
    int max_images;
    int channels, height, width;
} loom_vlm_record_shape;

static inline int loom_vlm_record_size(const loom_vlm_record_shape *r) {
    return 2 * r->seq_len + 2 + r->max_images * r->channels * r->height * r->width;
}

/* ---- writer: one shard file from samples in memory ---- */
typedef struct {
    int channels, height, width, image_token, eot_token, vocab;
    int64_t n, n_tokens, n_images;        /* so far */
    int32_t *entries, *tokens;            /* 4 n, n_tokens */
    uint8_t *mask, *pixels;               /* n_tokens, n_images * C*H*W */
    size_t cap_n, cap_tokens, cap_images; /* capacities */
} loom_vlm_writer;

void loom_vlm_writer_init(loom_vlm_writer *w, int channels, int height, int width, int image_token,
                          int eot_token);
/* Appends a sample: n_tokens tokens with their mask bytes and n_images images. */
loom_status loom_vlm_writer_put(loom_vlm_writer *w, const int32_t *tokens, const uint8_t *mask,
                                int n_tokens, const uint8_t *pixels, int n_images, loom_error *err);
/* Writes the shard (NAME.tmp, renamed) and frees the writer (also on error). */
loom_status loom_vlm_writer_finish(loom_vlm_writer *w, const char *path, loom_error *err);
void loom_vlm_writer_free(loom_vlm_writer *w);

/* ---- reader ---- */
typedef struct {
    char *path;
    void *map;
    size_t map_bytes;
    int64_t n, first;
    const int32_t *entries, *tokens;
    const uint8_t *mask, *pixels;
} loom_vlm_shard;

typedef struct {
    loom_vlm_shard *shards;
    int n_shards;
    int64_t n;
    int channels, height, width, image_token, eot_token, vocab;
    loom_vlm_record_shape rec;
} loom_vlm_dataset;

/* Opens and validates every shard matching glob (sorted): magic, version, exact size,
 * entries, tokens < vocab_size, markers == images per sample, the same header in every
 * shard, images of the model's channels x height x width, and every sample fitting T + 1
 * tokens with its images expanded (its images' slots inside the first T). Errors name the
 * file (LOOM_ERR_INPUT); callers prefix the flag. */
loom_status loom_vlm_dataset_open(loom_vlm_dataset *ds, const char *glob,
                                  const loom_vlm_record_shape *shape, int vocab_size,
                                  loom_error *err);
void loom_vlm_dataset_close(loom_vlm_dataset *ds);
/* Sample i's record (loom_vlm_record_size words). */
void loom_vlm_dataset_record(const loom_vlm_dataset *ds, int64_t i, int32_t *out);
/* Images of sample i. */
int loom_vlm_dataset_images(const loom_vlm_dataset *ds, int64_t i);
/* The sample at position seq of step `step`'s global batch (the order above). */
int64_t loom_vlm_dataset_index(const loom_vlm_dataset *ds, uint64_t seed, int64_t step,
                               int64_t seq);
/* Records [first, first + n) of step `step`. */
void loom_vlm_dataset_sample(const loom_vlm_dataset *ds, uint64_t seed, int64_t step, int64_t first,
                             int n, int32_t *out);
/* Builds a record from one sample held in memory (inference: loom generate's prompt).
 * tokens may hold markers (image_token) for the n_images images of pixels [C][H][W] u8;
 * mask NULL: no answer tokens. Fails when the sample does not fit. */
loom_status loom_vlm_record_build(const loom_vlm_record_shape *shape, int image_token,
                                  int eot_token, const int32_t *tokens, const uint8_t *mask,
                                  int n_tokens, const uint8_t *pixels, int n_images, int32_t *out,
                                  int *expanded, loom_error *err);

#endif
