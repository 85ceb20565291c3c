/* Moving-object clips from an image dataset (see moving_clips.h). */
#include "data/moving_clips.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"

loom_status loom_moving_check(const loom_image_dataset *src, const loom_moving_options *o,
                              loom_error *err) {
    if (src->frames != 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "the source shards hold %d frames per sample, expected 1 (images)",
                              src->frames);
    if (o->frames < 1 || o->frames > LOOM_IMAGE_MAX_DIM)
        return loom_error_set(err, LOOM_ERR_INPUT, "--frames %d: expected 1..%d", o->frames,
                              LOOM_IMAGE_MAX_DIM);
    if (o->objects < 1 || o->objects > LOOM_MOVING_MAX_OBJECTS)
        return loom_error_set(err, LOOM_ERR_INPUT, "--objects %d: expected 1..%d", o->objects,
                              LOOM_MOVING_MAX_OBJECTS);
    int side = src->height > src->width ? src->height : src->width;
    if (o->size < side || o->size > LOOM_MOVING_MAX_SIZE)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--size %d: expected %d..%d (at least the %dx%d source images)",
                              o->size, side, LOOM_MOVING_MAX_SIZE, src->height, src->width);
    loom_image_shape shape = {o->frames, src->channels, o->size, o->size, src->n_classes};
    if (loom_image_sample_bytes(&shape) < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--frames %d x %d channels x --size %d^2: %lld bytes per clip, "
                              "expected at most %d",
                              o->frames, src->channels, o->size,
                              (long long)o->frames * src->channels * o->size * o->size,
                              LOOM_IMAGE_MAX_SAMPLE_BYTES);
    return LOOM_OK;
}

void loom_moving_plan(const loom_image_dataset *src, const loom_moving_options *o, int64_t clip,
                      loom_moving_object *objs) {
    const uint64_t c = (uint64_t)clip;
    const int lx = o->size - src->width, ly = o->size - src->height;
    for (int j = 0; j < o->objects; j++) {
        uint64_t r = loom_philox_u64(o->seed, o->stream, c, (uint32_t)j);
        objs[j].image = (int64_t)(r % (uint64_t)src->n);
        r = loom_philox_u64(o->seed, o->stream ^ LOOM_MOVING_POS, c, (uint32_t)j);
        objs[j].x0 = (int)((uint32_t)r % (uint32_t)(lx + 1));
        objs[j].y0 = (int)((uint32_t)(r >> 32) % (uint32_t)(ly + 1));
        r = loom_philox_u64(o->seed, o->stream ^ LOOM_MOVING_VEL, c, (uint32_t)j);
        objs[j].vx = (int)(1 + (r & 0xffff) % 3) * ((r >> 16) & 1 ? -1 : 1);
        objs[j].vy = (int)(1 + ((r >> 32) & 0xffff) % 3) * ((r >> 48) & 1 ? -1 : 1);
    }
}

int loom_moving_position(int p0, int v, int limit, int f) {
    if (limit <= 0) return 0;
    int64_t period = 2 * (int64_t)limit;
    int64_t m = ((int64_t)p0 + (int64_t)v * f) % period;
    if (m < 0) m += period;
    return (int)(m <= limit ? m : period - m);
}

int32_t loom_moving_render(const loom_image_dataset *src, const loom_moving_options *o,
                           int64_t clip, loom_moving_object *objs, uint8_t *out) {
    const int S = o->size, C = src->channels, H = src->height, W = src->width;
    const size_t frame = (size_t)C * S * S, canvas = (size_t)S * S, plane = (size_t)H * W;
    memset(out, 0, frame * (size_t)o->frames);
    loom_moving_plan(src, o, clip, objs);
    for (int j = 0; j < o->objects; j++) {
        const uint8_t *img = loom_image_dataset_pixels(src, objs[j].image);
        for (int f = 0; f < o->frames; f++) {
            int x = loom_moving_position(objs[j].x0, objs[j].vx, S - W, f);
            int y = loom_moving_position(objs[j].y0, objs[j].vy, S - H, f);
            for (int c = 0; c < C; c++) {
                uint8_t *dst = out + f * frame + c * canvas + (size_t)y * S + x;
                const uint8_t *s = img + c * plane;
                for (int dy = 0; dy < H; dy++)
                    for (int dx = 0; dx < W; dx++) {
                        uint8_t v = s[dy * W + dx];
                        uint8_t *d = dst + (size_t)dy * S + dx;
                        if (v > *d) *d = v;
                    }
            }
        }
    }
    return loom_image_dataset_label(src, objs[0].image);
}

loom_status loom_moving_write(const loom_image_dataset *src, const loom_moving_options *o,
                              int64_t n_clips, const char *dir, const char *split,
                              int64_t shard_samples, loom_error *err) {
    loom_status st = loom_moving_check(src, o, err);
    if (st != LOOM_OK) return st;
    loom_image_shape shape = {o->frames, src->channels, o->size, o->size, src->n_classes};
    loom_image_writer w;
    st = loom_image_writer_open(&w, dir, split, &shape, n_clips, shard_samples, err);
    if (st != LOOM_OK) return st;
    uint8_t *clip = malloc((size_t)w.sample_bytes);
    loom_moving_object *objs = malloc((size_t)o->objects * sizeof *objs);
    if (!clip || !objs)
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for a %" PRId64 "-byte clip",
                            dir, w.sample_bytes);
    for (int64_t i = 0; st == LOOM_OK && i < n_clips; i++) {
        int32_t label = loom_moving_render(src, o, i, objs, clip);
        st = loom_image_writer_put(&w, label, clip, err);
    }
    free(clip);
    free(objs);
    if (st != LOOM_OK) {
        loom_image_writer_abort(&w);
        return st;
    }
    return loom_image_writer_finish(&w, err);
}
