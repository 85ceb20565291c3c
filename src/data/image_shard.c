/* Image shards: the streaming writer and the memory-mapped reader (see image_shard.h). */
#include "data/image_shard.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/philox.h"
#include "data/dataset.h"
#include "data/shard_files.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "loom's image shard format is read in place: it assumes a little-endian host"
#endif

int64_t loom_image_sample_bytes(const loom_image_shape *s) {
    const int d[4] = {s->frames, s->channels, s->height, s->width};
    int64_t bytes = 1;
    for (int i = 0; i < 4; i++) {
        if (d[i] < 1 || d[i] > LOOM_IMAGE_MAX_DIM) return -1;
        bytes *= d[i];
        if (bytes > LOOM_IMAGE_MAX_SAMPLE_BYTES) return -1;
    }
    return bytes;
}

static loom_status check_shape(const char *where, const loom_image_shape *s, loom_error *err) {
    if (loom_image_sample_bytes(s) < 0 || s->n_classes < 1 || s->n_classes > LOOM_IMAGE_MAX_DIM)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: shape F %d, C %d, H %d, W %d, n_classes %d: expected each in "
                              "1..%d and F*C*H*W <= %d",
                              where, s->frames, s->channels, s->height, s->width, s->n_classes,
                              LOOM_IMAGE_MAX_DIM, LOOM_IMAGE_MAX_SAMPLE_BYTES);
    return LOOM_OK;
}

/* ---- writer ---- */

static void fill_header(int32_t h[LOOM_IMAGE_SHARD_HEADER_BYTES / 4], int64_t n,
                        const loom_image_shape *s) {
    memset(h, 0, LOOM_IMAGE_SHARD_HEADER_BYTES);
    h[0] = LOOM_IMAGE_SHARD_MAGIC;
    h[1] = LOOM_IMAGE_SHARD_VERSION;
    h[2] = (int32_t)n;
    h[3] = s->frames;
    h[4] = s->channels;
    h[5] = s->height;
    h[6] = s->width;
    h[7] = s->n_classes;
}

static void writer_free(loom_image_writer *w) {
    free(w->dir);
    free(w->split);
    free(w->path);
    free(w->tmp);
    free(w->labels);
    free(w->buf);
    w->dir = w->split = w->path = w->tmp = NULL;
    w->labels = NULL;
    w->buf = NULL;
}

void loom_image_writer_abort(loom_image_writer *w) {
    loom_shard_tmp_discard(&w->fd, w->tmp);
    writer_free(w);
}

loom_status loom_image_writer_open(loom_image_writer *w, const char *dir, const char *split,
                                   const loom_image_shape *shape, int64_t n_total,
                                   int64_t shard_samples, loom_error *err) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    loom_status st = check_shape(dir, shape, err);
    if (st != LOOM_OK) return st;
    if (n_total < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s/%s: %" PRId64 " samples (expected >= 0)",
                              dir, split, n_total);
    if (shard_samples < 1 || shard_samples > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "shard size %" PRId64 " samples (expected 1 to %d)", shard_samples,
                              INT32_MAX);
    w->shape = *shape;
    w->sample_bytes = loom_image_sample_bytes(shape);
    w->n_total = n_total;
    w->shard_samples = shard_samples;
    int64_t labels_n = shard_samples < n_total ? shard_samples : n_total;
    w->path_cap = strlen(dir) + strlen(split) + 32;
    w->buf_cap = (size_t)1 << 20;
    w->dir = strdup(dir);
    w->split = strdup(split);
    w->path = malloc(w->path_cap);
    w->tmp = malloc(w->path_cap);
    w->labels = malloc((size_t)(labels_n > 0 ? labels_n : 1) * sizeof *w->labels);
    w->buf = malloc(w->buf_cap);
    if (w->dir && w->split && w->path && w->tmp && w->labels && w->buf) return LOOM_OK;
    loom_image_writer_abort(w);
    return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for an image shard writer", dir);
}

static loom_status writer_flush(loom_image_writer *w, loom_error *err) {
    loom_status st = loom_shard_tmp_write(w->fd, w->tmp, w->buf, w->buf_n, err);
    if (st == LOOM_OK) w->buf_n = 0;
    return st;
}

static loom_status shard_begin(loom_image_writer *w, loom_error *err) {
    loom_shard_numbered_path(w->path, w->path_cap, w->dir, w->split, w->n_shards);
    int64_t left = w->n_total - w->done;
    w->shard_n = left < w->shard_samples ? left : w->shard_samples;
    w->in_shard = 0;
    loom_status st = loom_shard_tmp_open(w->path, w->tmp, w->path_cap, &w->fd, err);
    if (st != LOOM_OK) return st;
    off_t pixels_at = LOOM_IMAGE_SHARD_HEADER_BYTES + (off_t)4 * w->shard_n;
    if (lseek(w->fd, pixels_at, SEEK_SET) != pixels_at)
        return loom_error_set(err, LOOM_ERR_IO, "%s: seek failed: %s", w->tmp, strerror(errno));
    return LOOM_OK;
}

/* Flush, write header and labels, fsync, close, rename into place, fsync the folder. */
static loom_status shard_end(loom_image_writer *w, loom_error *err) {
    int32_t h[LOOM_IMAGE_SHARD_HEADER_BYTES / 4];
    fill_header(h, w->shard_n, &w->shape);
    size_t label_bytes = (size_t)w->shard_n * 4;
    loom_status st = writer_flush(w, err);
    if (st == LOOM_OK) st = loom_shard_tmp_pwrite(w->fd, w->tmp, h, sizeof h, 0, err);
    if (st == LOOM_OK)
        st = loom_shard_tmp_pwrite(w->fd, w->tmp, w->labels, label_bytes,
                                   LOOM_IMAGE_SHARD_HEADER_BYTES, err);
    if (st == LOOM_OK) st = loom_shard_tmp_commit(&w->fd, w->tmp, w->path, w->dir, err);
    if (st == LOOM_OK) w->n_shards++;
    return st;
}

loom_status loom_image_writer_put(loom_image_writer *w, int32_t label, const uint8_t *pixels,
                                  loom_error *err) {
    if (w->done >= w->n_total)
        return loom_error_set(err, LOOM_ERR_STATE,
                              "%s/%s: more than the %" PRId64 " samples planned", w->dir, w->split,
                              w->n_total);
    if (label < 0 || label >= w->shape.n_classes)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "%s/%s: sample %" PRId64 ": label %" PRId32 ", expected 0..%d (n_classes %d)", w->dir,
            w->split, w->done, label, w->shape.n_classes - 1, w->shape.n_classes);
    loom_status st = w->fd < 0 ? shard_begin(w, err) : LOOM_OK;
    if (st != LOOM_OK) return st;
    size_t sb = (size_t)w->sample_bytes;
    if (w->buf_n + sb > w->buf_cap) st = writer_flush(w, err);
    if (st != LOOM_OK) return st;
    if (sb > w->buf_cap) {
        st = loom_shard_tmp_write(w->fd, w->tmp, pixels, sb, err);
        if (st != LOOM_OK) return st;
    } else {
        memcpy(w->buf + w->buf_n, pixels, sb);
        w->buf_n += sb;
    }
    w->labels[w->in_shard++] = label;
    w->done++;
    if (w->in_shard == w->shard_n) st = shard_end(w, err);
    return st;
}

/* Removes DIR/SPLIT_NNNNNN.bin from index `first` on, up to the first missing one. */
static int remove_stale(const loom_image_writer *w, int first) {
    int removed = 0;
    for (;; removed++) {
        loom_shard_numbered_path(w->path, w->path_cap, w->dir, w->split, first + removed);
        if (unlink(w->path) != 0) break;
    }
    return removed;
}

loom_status loom_image_writer_finish(loom_image_writer *w, loom_error *err) {
    loom_status st = LOOM_OK;
    if (w->done != w->n_total)
        st = loom_error_set(err, LOOM_ERR_STATE,
                            "%s/%s: %" PRId64 " samples written, %" PRId64 " planned", w->dir,
                            w->split, w->done, w->n_total);
    if (st == LOOM_OK && w->fd >= 0) st = shard_end(w, err);
    if (st != LOOM_OK) {
        loom_image_writer_abort(w);
        return st;
    }
    w->stale_removed = remove_stale(w, w->n_shards);
    writer_free(w);
    return LOOM_OK;
}

loom_status loom_image_shard_write(const char *path, const loom_image_shape *shape, int64_t n,
                                   const int32_t *labels, const uint8_t *pixels, loom_error *err) {
    loom_status st = check_shape(path, shape, err);
    if (st != LOOM_OK) return st;
    if (n < 0 || n > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: %" PRId64 " samples (expected 0..%d)", path,
                              n, INT32_MAX);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= shape->n_classes)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: sample %" PRId64 ": label %" PRId32
                                  ", expected 0..%d (n_classes %d)",
                                  path, i, labels[i], shape->n_classes - 1, shape->n_classes);
    size_t cap = strlen(path) + 8;
    char *tmp = malloc(cap);
    if (!tmp) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    int32_t h[LOOM_IMAGE_SHARD_HEADER_BYTES / 4];
    fill_header(h, n, shape);
    size_t pixel_bytes = (size_t)n * (size_t)loom_image_sample_bytes(shape);
    int fd = -1;
    st = loom_shard_tmp_open(path, tmp, cap, &fd, err);
    if (st == LOOM_OK) st = loom_shard_tmp_write(fd, tmp, h, sizeof h, err);
    if (st == LOOM_OK) st = loom_shard_tmp_write(fd, tmp, labels, (size_t)n * 4, err);
    if (st == LOOM_OK) st = loom_shard_tmp_write(fd, tmp, pixels, pixel_bytes, err);
    if (st == LOOM_OK) st = loom_shard_tmp_commit(&fd, tmp, path, NULL, err);
    loom_shard_tmp_discard(&fd, tmp); /* after an error */
    free(tmp);
    return st;
}

/* ---- reader ---- */

/* Maps and validates one shard; fills its shape into *shape. */
static loom_status shard_open(loom_image_shard *sh, const char *path, loom_image_shape *shape,
                              loom_error *err) {
    loom_status s = loom_shard_map(path, LOOM_IMAGE_SHARD_HEADER_BYTES, " (an image shard)",
                                   &sh->path, &sh->map, &sh->map_bytes, err);
    if (s != LOOM_OK) return s;
    const void *map = sh->map;
    int64_t size = (int64_t)sh->map_bytes;
    int32_t h[8];
    memcpy(h, map, sizeof h);
    if (h[0] != LOOM_IMAGE_SHARD_MAGIC)
        return loom_error_set(
            err, LOOM_ERR_INPUT, "%s: bad magic %" PRId32 " (expected %d, an image shard%s)", path,
            h[0], LOOM_IMAGE_SHARD_MAGIC,
            h[0] == LOOM_SHARD_MAGIC_U16 || h[0] == LOOM_SHARD_MAGIC_U32 ? "; this is a token shard"
                                                                         : "");
    if (h[1] != LOOM_IMAGE_SHARD_VERSION)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: bad version %" PRId32 " (expected %d)",
                              path, h[1], LOOM_IMAGE_SHARD_VERSION);
    if (h[2] < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: bad sample count %" PRId32 " in header (expected >= 0)", path,
                              h[2]);
    *shape = (loom_image_shape){h[3], h[4], h[5], h[6], h[7]};
    s = check_shape(path, shape, err);
    if (s != LOOM_OK) return s;
    int64_t n = h[2], sb = loom_image_sample_bytes(shape);
    int64_t want = LOOM_IMAGE_SHARD_HEADER_BYTES + 4 * n + n * sb;
    if (size != want)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %s: %" PRId64 " bytes, expected exactly %" PRId64
                              " (1024 + 4*%" PRId64 " + %" PRId64 "*%" PRId64 ")",
                              path, size < want ? "truncated" : "trailing bytes", size, want, n, n,
                              sb);
    const int32_t *labels = (const int32_t *)((const char *)map + LOOM_IMAGE_SHARD_HEADER_BYTES);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= shape->n_classes)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: label %" PRId32 " of sample %" PRId64
                                  " is out of range (expected 0..%d, n_classes %d)",
                                  path, labels[i], i, shape->n_classes - 1, shape->n_classes);
    sh->n = n;
    return LOOM_OK;
}

static loom_status same_shape(const loom_image_dataset *ds, const char *path,
                              const loom_image_shape *s, loom_error *err) {
    const char *first = ds->shards[0].path;
    const struct {
        const char *name;
        int have, want;
    } f[5] = {{"frames", s->frames, ds->frames},
              {"channels", s->channels, ds->channels},
              {"height", s->height, ds->height},
              {"width", s->width, ds->width},
              {"n_classes", s->n_classes, ds->n_classes}};
    for (int i = 0; i < 5; i++)
        if (f[i].have != f[i].want)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s: %s %d, expected %d like %s", path,
                                  f[i].name, f[i].have, f[i].want, first);
    return LOOM_OK;
}

loom_status loom_image_dataset_open(loom_image_dataset *ds, const char *pattern, loom_error *err) {
    memset(ds, 0, sizeof *ds);
    glob_t g;
    loom_status st = loom_shard_glob(pattern, "", &g, err);
    if (st != LOOM_OK) return st;
    if (g.gl_pathc == 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "no image shard matches '%s'", pattern);
    ds->shards = calloc(g.gl_pathc, sizeof *ds->shards);
    if (!ds->shards) {
        globfree(&g);
        return loom_error_set(err, LOOM_ERR_NOMEM, "'%s': out of memory for %zu shards", pattern,
                              g.gl_pathc);
    }
    for (size_t i = 0; i < g.gl_pathc && st == LOOM_OK; i++) {
        loom_image_shard *sh = &ds->shards[ds->n_shards++]; /* counted now so close frees it */
        loom_image_shape shape;
        st = shard_open(sh, g.gl_pathv[i], &shape, err);
        if (st == LOOM_OK && i == 0) {
            ds->frames = shape.frames;
            ds->channels = shape.channels;
            ds->height = shape.height;
            ds->width = shape.width;
            ds->n_classes = shape.n_classes;
            ds->sample_bytes = loom_image_sample_bytes(&shape);
        }
        if (st == LOOM_OK) st = same_shape(ds, sh->path, &shape, err);
        sh->first = ds->n;
        ds->n += sh->n;
    }
    globfree(&g);
    if (st == LOOM_OK && ds->n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "'%s': the %d matching shard(s) hold no sample (expected at least 1)",
                            pattern, ds->n_shards);
    if (st != LOOM_OK) loom_image_dataset_close(ds);
    return st;
}

void loom_image_dataset_close(loom_image_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++)
        loom_shard_unmap(ds->shards[i].path, ds->shards[i].map, ds->shards[i].map_bytes);
    free(ds->shards);
    memset(ds, 0, sizeof *ds);
}

/* The shard holding sample i: the last with first <= i (empty shards share `first` with
 * their successor, so "last" skips them). */
static const loom_image_shard *find_shard(const loom_image_dataset *ds, int64_t i) {
    return &ds->shards[loom_shard_find(&ds->shards[0].first, sizeof *ds->shards, ds->n_shards, i)];
}

const uint8_t *loom_image_dataset_pixels(const loom_image_dataset *ds, int64_t i) {
    const loom_image_shard *sh = find_shard(ds, i);
    const uint8_t *base = (const uint8_t *)sh->map + LOOM_IMAGE_SHARD_HEADER_BYTES + 4 * sh->n;
    return base + (i - sh->first) * ds->sample_bytes;
}

int32_t loom_image_dataset_label(const loom_image_dataset *ds, int64_t i) {
    const loom_image_shard *sh = find_shard(ds, i);
    const int32_t *labels =
        (const int32_t *)((const char *)sh->map + LOOM_IMAGE_SHARD_HEADER_BYTES);
    return labels[i - sh->first];
}

int64_t loom_image_dataset_pick(const loom_image_dataset *ds, uint64_t seed, int64_t step,
                                int64_t seq) {
    uint64_t r = loom_philox_u64(seed, LOOM_DATA_STREAM, (uint64_t)step, (uint32_t)seq);
    return (int64_t)(r % (uint64_t)ds->n);
}
