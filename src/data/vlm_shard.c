/* Image-text shards and vlm batch records (see vlm_shard.h). */
#include "data/vlm_shard.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "data/dataset.h"
#include "data/shard_files.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "loom's vlm shard format is read in place: it assumes a little-endian host"
#endif

#define HEADER_WORDS (LOOM_VLM_SHARD_HEADER_BYTES / 4)

static int64_t image_bytes(int channels, int height, int width) {
    return (int64_t)channels * height * width;
}

/* ---- writer ---- */

void loom_vlm_writer_init(loom_vlm_writer *w, int channels, int height, int width, int image_token,
                          int eot_token) {
    memset(w, 0, sizeof *w);
    w->channels = channels;
    w->height = height;
    w->width = width;
    w->image_token = image_token;
    w->eot_token = eot_token;
    w->vocab = (image_token > eot_token ? image_token : eot_token) + 1;
}

void loom_vlm_writer_free(loom_vlm_writer *w) {
    free(w->entries);
    free(w->tokens);
    free(w->mask);
    free(w->pixels);
    memset(w, 0, sizeof *w);
}

/* Grows *p (elem bytes each, *cap of them) to hold need. */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

loom_status loom_vlm_writer_put(loom_vlm_writer *w, const int32_t *tokens, const uint8_t *mask,
                                int n_tokens, const uint8_t *pixels, int n_images,
                                loom_error *err) {
    const size_t ib = (size_t)image_bytes(w->channels, w->height, w->width);
    int markers = 0;
    for (int i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0)
            return loom_error_set(err, LOOM_ERR_INPUT, "vlm shard: token %" PRId32 " < 0",
                                  tokens[i]);
        markers += tokens[i] == w->image_token;
        if (tokens[i] + 1 > w->vocab) w->vocab = tokens[i] + 1;
    }
    if (markers != n_images)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "vlm shard: sample %" PRId64 " has %d <image> markers and %d images "
                              "(expected one marker per image)",
                              w->n, markers, n_images);
    size_t cn = w->cap_n, ct = w->cap_tokens, ci = w->cap_images, ct2 = w->cap_tokens;
    if (!grow((void **)&w->entries, &cn, 4 * (size_t)(w->n + 1), sizeof(int32_t)) ||
        !grow((void **)&w->tokens, &ct, (size_t)(w->n_tokens + n_tokens), sizeof(int32_t)) ||
        !grow((void **)&w->mask, &ct2, (size_t)(w->n_tokens + n_tokens), 1) ||
        !grow((void **)&w->pixels, &ci, (size_t)(w->n_images + n_images) * ib, 1))
        return loom_error_set(err, LOOM_ERR_NOMEM, "vlm shard: out of memory");
    w->cap_n = cn;
    w->cap_tokens = ct < ct2 ? ct : ct2;
    w->cap_images = ci;
    int32_t *e = w->entries + 4 * w->n;
    e[0] = (int32_t)w->n_tokens;
    e[1] = n_tokens;
    e[2] = (int32_t)w->n_images;
    e[3] = n_images;
    memcpy(w->tokens + w->n_tokens, tokens, (size_t)n_tokens * sizeof(int32_t));
    memcpy(w->mask + w->n_tokens, mask, (size_t)n_tokens);
    if (n_images > 0) /* no pixels yet: NULL, which memcpy may not see even for 0 bytes */
        memcpy(w->pixels + (size_t)w->n_images * ib, pixels, (size_t)n_images * ib);
    w->n++;
    w->n_tokens += n_tokens;
    w->n_images += n_images;
    return LOOM_OK;
}

loom_status loom_vlm_writer_finish(loom_vlm_writer *w, const char *path, loom_error *err) {
    int32_t h[HEADER_WORDS];
    memset(h, 0, sizeof h);
    h[0] = LOOM_VLM_SHARD_MAGIC;
    h[1] = LOOM_VLM_SHARD_VERSION;
    h[2] = (int32_t)w->n;
    h[3] = w->channels;
    h[4] = w->height;
    h[5] = w->width;
    h[6] = w->image_token;
    h[7] = w->eot_token;
    h[8] = w->vocab;
    h[9] = (int32_t)w->n_tokens;
    h[10] = (int32_t)w->n_images;
    const size_t ib = (size_t)image_bytes(w->channels, w->height, w->width);
    size_t cap = strlen(path) + 8;
    char *tmp = malloc(cap);
    loom_status st = tmp ? LOOM_OK : loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    int fd = -1;
    if (!st) st = loom_shard_tmp_open(path, tmp, cap, &fd, err);
    if (!st) st = loom_shard_tmp_write(fd, tmp, h, sizeof h, err);
    if (!st) st = loom_shard_tmp_write(fd, tmp, w->entries, 16 * (size_t)w->n, err);
    if (!st) st = loom_shard_tmp_write(fd, tmp, w->tokens, 4 * (size_t)w->n_tokens, err);
    if (!st) st = loom_shard_tmp_write(fd, tmp, w->mask, (size_t)w->n_tokens, err);
    if (!st) st = loom_shard_tmp_write(fd, tmp, w->pixels, (size_t)w->n_images * ib, err);
    if (!st) st = loom_shard_tmp_commit(&fd, tmp, path, NULL, err);
    if (tmp) loom_shard_tmp_discard(&fd, tmp);
    free(tmp);
    loom_vlm_writer_free(w);
    return st;
}

/* ---- records ---- */

loom_status loom_vlm_record_build(const loom_vlm_record_shape *r, int image_token, int eot_token,
                                  const int32_t *tokens, const uint8_t *mask, int n_tokens,
                                  const uint8_t *pixels, int n_images, int32_t *out, int *expanded,
                                  loom_error *err) {
    const int T = r->seq_len, P = r->image_tokens;
    const size_t S = (size_t)r->channels * r->height * r->width;
    memset(out, 0, (size_t)loom_vlm_record_size(r) * sizeof(int32_t));
    if (n_images > r->max_images)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "a sample holds %d images, the model at most %d (--max-images)",
                              n_images, r->max_images);
    int len = 0, answers = 0, last_slot = -1;
    for (int i = 0; i < n_tokens; i++) {
        const int img = tokens[i] == image_token;
        const int need = img ? P : 1;
        if (len + need > T + 1)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "a sample of %d tokens does not fit --seq-len %d with its images "
                                  "expanded (%d tokens each)",
                                  n_tokens, T, P);
        for (int j = 0; j < need; j++) {
            out[len] = img ? LOOM_VLM_SLOT : tokens[i];
            /* target position len - 1 predicts token len */
            if (len > 0 && !img && mask && mask[i]) answers++;
            len++;
        }
        if (img) last_slot = len - 1;
    }
    if (last_slot >= T)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "a sample ends with an image: its last image token must be an input "
                              "(followed by at least one token within --seq-len %d)",
                              T);
    if (expanded) *expanded = len;
    for (int t = len; t <= T; t++) out[t] = eot_token;
    /* the weights of targets 1..T */
    const float w = answers > 0 ? (float)T / (float)answers : 0.0f;
    float *wt = (float *)(out + T + 1);
    for (int i = 0, pos = 0; i < n_tokens; i++) {
        const int img = tokens[i] == image_token;
        if (!img && pos > 0 && mask && mask[i]) wt[pos - 1] = w;
        pos += img ? P : 1;
    }
    out[2 * T + 1] = n_images;
    float *px = (float *)(out + 2 * T + 2);
    for (size_t k = 0; k < (size_t)n_images * S; k++) px[k] = (float)pixels[k] / 127.5f - 1.0f;
    return LOOM_OK;
}

/* ---- reader ---- */

typedef struct {
    int32_t h[11];
} header;

static loom_status shard_open(loom_vlm_shard *sh, const char *path, header *hd, loom_error *err) {
    loom_status s = loom_shard_map(path, LOOM_VLM_SHARD_HEADER_BYTES, " (a vlm shard)", &sh->path,
                                   &sh->map, &sh->map_bytes, err);
    if (s) return s;
    const int32_t *h = sh->map;
    memcpy(hd->h, h, sizeof hd->h);
    if (h[0] != LOOM_VLM_SHARD_MAGIC)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: bad magic %" PRId32 " (expected %d, a vlm shard from loom data "
                              "vlm)",
                              path, h[0], LOOM_VLM_SHARD_MAGIC);
    if (h[1] != LOOM_VLM_SHARD_VERSION)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: bad version %" PRId32 " (expected %d)",
                              path, h[1], LOOM_VLM_SHARD_VERSION);
    for (int i = 2; i <= 10; i++)
        if (h[i] < 0 || (i >= 3 && i <= 5 && (h[i] < 1 || h[i] > (i == 3 ? 4 : 4096))))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: header word %d is %" PRId32
                                  " (expected counts >= 0, channels 1..4, height and width "
                                  "1..4096)",
                                  path, i, h[i]);
    const int64_t n = h[2], nt = h[9], ni = h[10], ib = image_bytes(h[3], h[4], h[5]);
    const int64_t want = LOOM_VLM_SHARD_HEADER_BYTES + 16 * n + 5 * nt + ni * ib;
    const int64_t size = (int64_t)sh->map_bytes;
    if (size != want)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %s: %" PRId64 " bytes, expected exactly %" PRId64
                              " (1024 + 16*%" PRId64 " + 5*%" PRId64 " + %" PRId64 "*%" PRId64 ")",
                              path, size < want ? "truncated" : "trailing bytes", size, want, n, nt,
                              ni, ib);
    const char *base = (const char *)sh->map + LOOM_VLM_SHARD_HEADER_BYTES;
    sh->entries = (const int32_t *)base;
    sh->tokens = (const int32_t *)(base + 16 * n);
    sh->mask = (const uint8_t *)(base + 16 * n + 4 * nt);
    sh->pixels = (const uint8_t *)(base + 16 * n + 5 * nt);
    sh->n = n;
    int64_t tok = 0, img = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t *e = sh->entries + 4 * i;
        if (e[0] != tok || e[1] < 0 || e[2] != img || e[3] < 0 || tok + e[1] > nt ||
            img + e[3] > ni)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: sample %" PRId64 ": entry (%" PRId32 ", %" PRId32
                                  ", %" PRId32 ", %" PRId32
                                  ") does not follow the previous sample (expected tokens from "
                                  "%" PRId64 " and images from %" PRId64 ")",
                                  path, i, e[0], e[1], e[2], e[3], tok, img);
        int markers = 0;
        for (int32_t j = 0; j < e[1]; j++) {
            const int32_t t = sh->tokens[tok + j];
            if (t < 0 || t >= h[8])
                return loom_error_set(err, LOOM_ERR_INPUT,
                                      "%s: sample %" PRId64 ": token %" PRId32
                                      " outside the header's vocabulary 0..%" PRId32,
                                      path, i, t, h[8] - 1);
            markers += t == h[6];
        }
        if (markers != e[3])
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: sample %" PRId64 ": %d <image> markers and %" PRId32
                                  " images (expected one marker per image)",
                                  path, i, markers, e[3]);
        tok += e[1];
        img += e[3];
    }
    if (tok != nt || img != ni)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: the samples hold %" PRId64 " tokens and %" PRId64
                              " images, the header says %" PRId64 " and %" PRId64,
                              path, tok, img, nt, ni);
    return LOOM_OK;
}

static const loom_vlm_shard *find_shard(const loom_vlm_dataset *ds, int64_t i) {
    return &ds->shards[loom_shard_find(&ds->shards[0].first, sizeof *ds->shards, ds->n_shards, i)];
}

static loom_status record_of(const loom_vlm_dataset *ds, int64_t i, int32_t *out, loom_error *err) {
    const loom_vlm_shard *sh = find_shard(ds, i);
    const int32_t *e = sh->entries + 4 * (i - sh->first);
    const size_t ib = (size_t)image_bytes(ds->channels, ds->height, ds->width);
    return loom_vlm_record_build(&ds->rec, ds->image_token, ds->eot_token, sh->tokens + e[0],
                                 sh->mask + e[0], e[1], sh->pixels + (size_t)e[2] * ib, e[3], out,
                                 NULL, err);
}

loom_status loom_vlm_dataset_open(loom_vlm_dataset *ds, const char *pattern,
                                  const loom_vlm_record_shape *shape, int vocab_size,
                                  loom_error *err) {
    memset(ds, 0, sizeof *ds);
    glob_t g;
    loom_status st = loom_shard_glob(pattern, "", &g, err);
    if (st) return st;
    if (g.gl_pathc == 0) {
        globfree(&g);
        return loom_error_set(err, LOOM_ERR_INPUT, "no vlm shard matches '%s'", pattern);
    }
    ds->shards = calloc(g.gl_pathc, sizeof *ds->shards);
    if (!ds->shards) {
        globfree(&g);
        return loom_error_set(err, LOOM_ERR_NOMEM, "'%s': out of memory", pattern);
    }
    ds->rec = *shape;
    header first = {{0}};
    for (size_t i = 0; i < g.gl_pathc && !st; i++) {
        loom_vlm_shard *sh = &ds->shards[ds->n_shards++];
        header h;
        st = shard_open(sh, g.gl_pathv[i], &h, err);
        if (!st && i == 0) first = h;
        if (!st && (h.h[3] != first.h[3] || h.h[4] != first.h[4] || h.h[5] != first.h[5] ||
                    h.h[6] != first.h[6] || h.h[7] != first.h[7]))
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s: images %dx%dx%d and tokens <image> %d / end %d differ from "
                                "%s's",
                                sh->path, h.h[3], h.h[4], h.h[5], h.h[6], h.h[7],
                                ds->shards[0].path);
        if (!st && h.h[8] > vocab_size)
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s: tokens up to %d, the model's --vocab-size is %d", sh->path,
                                h.h[8] - 1, vocab_size);
        if (!st && (h.h[3] != shape->channels || h.h[4] != shape->height || h.h[5] != shape->width))
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s: images are %d x %d x %d (channels x height x width), the "
                                "model expects %d x %d x %d (--channels, --height, --width)",
                                sh->path, h.h[3], h.h[4], h.h[5], shape->channels, shape->height,
                                shape->width);
        sh->first = ds->n;
        ds->n += sh->n;
    }
    globfree(&g);
    if (!st) {
        ds->channels = first.h[3];
        ds->height = first.h[4];
        ds->width = first.h[5];
        ds->image_token = first.h[6];
        ds->eot_token = first.h[7];
        ds->vocab = first.h[8];
    }
    if (!st && ds->n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT, "'%s': no sample in the matching shards", pattern);
    /* every sample must make a record for this model */
    int32_t *rec = st ? NULL : malloc((size_t)loom_vlm_record_size(shape) * sizeof(int32_t));
    if (!st && !rec) st = loom_error_set(err, LOOM_ERR_NOMEM, "'%s': out of memory", pattern);
    for (int64_t i = 0; i < ds->n && !st; i++)
        if ((st = record_of(ds, i, rec, err)))
            st = loom_error_prefix(err, "%s: sample %" PRId64, find_shard(ds, i)->path,
                                   i - find_shard(ds, i)->first);
    free(rec);
    if (st) loom_vlm_dataset_close(ds);
    return st;
}

void loom_vlm_dataset_close(loom_vlm_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++)
        loom_shard_unmap(ds->shards[i].path, ds->shards[i].map, ds->shards[i].map_bytes);
    free(ds->shards);
    memset(ds, 0, sizeof *ds);
}

void loom_vlm_dataset_record(const loom_vlm_dataset *ds, int64_t i, int32_t *out) {
    loom_error e;
    record_of(ds, i, out, &e); /* validated at open */
}

int loom_vlm_dataset_images(const loom_vlm_dataset *ds, int64_t i) {
    const loom_vlm_shard *sh = find_shard(ds, i);
    return sh->entries[4 * (i - sh->first) + 3];
}

int64_t loom_vlm_dataset_index(const loom_vlm_dataset *ds, uint64_t seed, int64_t step,
                               int64_t seq) {
    const uint64_t r = loom_philox_u64(seed, LOOM_DATA_STREAM, (uint64_t)step, (uint32_t)seq);
    return (int64_t)(r % (uint64_t)ds->n);
}

void loom_vlm_dataset_sample(const loom_vlm_dataset *ds, uint64_t seed, int64_t step, int64_t first,
                             int n, int32_t *out) {
    const size_t words = (size_t)loom_vlm_record_size(&ds->rec);
    for (int k = 0; k < n; k++)
        loom_vlm_dataset_record(ds, loom_vlm_dataset_index(ds, seed, step, first + k),
                                out + k * words);
}
