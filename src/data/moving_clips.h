/* "Moving Fashion-MNIST": video clips made from an image dataset (like Moving MNIST).
 *
 * Clip i of (seed, stream) has F frames on an S x S canvas (black) with k objects, each
 * an image [C][H][W] of the source dataset (F = 1 there):
 *   image of object j:   loom_philox_u64(seed, stream, i, j) mod n
 *   start position:      r = loom_philox_u64(seed, stream ^ LOOM_MOVING_POS, i, j):
 *                        x0 = (r mod 2^32) mod (S-W+1), y0 = (r div 2^32) mod (S-H+1)
 *   velocity per axis:   r = loom_philox_u64(seed, stream ^ LOOM_MOVING_VEL, i, j):
 *                        vx = (1 + (r mod 2^16) mod 3) * (bit 16 of r ? -1 : 1),
 *                        vy = (1 + (bits 32..47 of r) mod 3) * (bit 48 of r ? -1 : 1)
 * so |v| is 1..3 px/frame on each axis, never 0. The top-left corner moves with constant
 * velocity and bounces off the borders: position and velocity are reflected so the object
 * stays inside the canvas (0 <= x <= S-W, 0 <= y <= S-H); at frame f the position is
 * the triangle wave of p0 + v*f with period 2L (L = S-W or S-H), which is exactly
 * step-by-step reflection. Objects are drawn by max-blending (canvas = max(canvas,
 * image)) in object order. The clip's label is the class of object 0. Deterministic from
 * (seed, stream, i): any subset of clips can be made independently. */
#ifndef LOOM_DATA_MOVING_CLIPS_H
#define LOOM_DATA_MOVING_CLIPS_H

#include <stdint.h>

#include "core/error.h"
#include "data/image_shard.h"

#define LOOM_MOVING_STREAM_TRAIN 0x6d6f7674u /* "movt" */
#define LOOM_MOVING_STREAM_VAL 0x6d6f7676u   /* "movv" */
#define LOOM_MOVING_POS 0x00010000u
#define LOOM_MOVING_VEL 0x00020000u
#define LOOM_MOVING_MAX_SIZE 4096
#define LOOM_MOVING_MAX_OBJECTS 64

typedef struct {
    int frames, size, objects;
    uint64_t seed;
    uint32_t stream;
} loom_moving_options;

typedef struct {
    int64_t image; /* index in the source dataset */
    int x0, y0, vx, vy;
} loom_moving_object;

/* Checks the options against the source: source frames 1, frames 1..65535, objects
 * 1..64, size S in max(H, W)..4096, and the clip within the shard limits. */
loom_status loom_moving_check(const loom_image_dataset *src, const loom_moving_options *o,
                              loom_error *err);

/* Object j's image, start and velocity in clip `clip` (objs[o->objects]). */
void loom_moving_plan(const loom_image_dataset *src, const loom_moving_options *o, int64_t clip,
                      loom_moving_object *objs);

/* Position at frame f of a coordinate starting at p0 with velocity v in [0, limit]. */
int loom_moving_position(int p0, int v, int limit, int f);

/* Renders clip `clip` into out [F][C][S][S] (objs: scratch of o->objects); returns its
 * label. Does not allocate. */
int32_t loom_moving_render(const loom_image_dataset *src, const loom_moving_options *o,
                           int64_t clip, loom_moving_object *objs, uint8_t *out);

/* Writes clips [0, n_clips) as DIR/SPLIT_NNNNNN.bin shards (image_shard.h) of
 * F frames, C x S x S, the source's n_classes; at most shard_samples clips per shard. */
loom_status loom_moving_write(const loom_image_dataset *src, const loom_moving_options *o,
                              int64_t n_clips, const char *dir, const char *split,
                              int64_t shard_samples, loom_error *err);

#endif
