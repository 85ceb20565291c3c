#include "ckpt/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_field.h"

#define MAX_DIM ((int64_t)1 << 40)    /* per dimension */
#define MAX_BYTES ((uint64_t)1 << 50) /* per chunk or file offset */
#define MAX_NUMEL ((int64_t)1 << 48)  /* per tensor: its F32 bytes stay below MAX_BYTES */
#define MAX_MANIFEST_BYTES ((size_t)256 << 20)

void loom_ckpt_manifest_free(loom_ckpt_manifest *m) {
    for (int i = 0; i < m->n_files; i++) free(m->files[i]);
    free(m->files);
    for (int i = 0; i < m->n_tensors; i++) {
        free(m->tensors[i].name);
        free(m->tensors[i].chunks);
    }
    free(m->tensors);
    if (m->model) json_decref((json_t *)m->model);
    if (m->train) json_decref((json_t *)m->train);
    memset(m, 0, sizeof *m);
}

int loom_ckpt_manifest_add_file(loom_ckpt_manifest *m, const char *name) {
    for (int i = 0; i < m->n_files; i++)
        if (strcmp(m->files[i], name) == 0) return i;
    if (m->n_files == m->files_cap) {
        int cap = m->files_cap ? 2 * m->files_cap : 8;
        char **files = realloc(m->files, (size_t)cap * sizeof *files);
        if (!files) return -1;
        m->files = files;
        m->files_cap = cap;
    }
    if (!(m->files[m->n_files] = strdup(name))) return -1;
    return m->n_files++;
}

const loom_ckpt_tensor *loom_ckpt_manifest_find(const loom_ckpt_manifest *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

static loom_ckpt_tensor *get_tensor(loom_ckpt_manifest *m, const char *name, int ndim,
                                    const int64_t shape[2], loom_error *err) {
    for (int i = 0; i < m->n_tensors; i++) {
        loom_ckpt_tensor *t = &m->tensors[i];
        if (strcmp(t->name, name) != 0) continue;
        if (t->ndim != ndim || t->shape[0] != shape[0] || t->shape[1] != shape[1]) {
            loom_error_set(err, LOOM_ERR_INPUT, "tensor '%s' has two different shapes", name);
            return NULL;
        }
        return t;
    }
    if (m->n_tensors == m->tensors_cap) {
        int cap = m->tensors_cap ? 2 * m->tensors_cap : 64;
        loom_ckpt_tensor *ts = realloc(m->tensors, (size_t)cap * sizeof *ts);
        if (!ts) goto nomem;
        m->tensors = ts;
        m->tensors_cap = cap;
    }
    loom_ckpt_tensor *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) goto nomem;
    t->ndim = ndim;
    t->shape[0] = shape[0];
    t->shape[1] = ndim == 2 ? shape[1] : 0;
    m->n_tensors++;
    return t;
nomem:
    loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint manifest: out of memory");
    return NULL;
}

loom_status loom_ckpt_manifest_add_chunk(loom_ckpt_manifest *m, const char *tensor, int ndim,
                                         const int64_t shape[2], const loom_ckpt_chunk *c,
                                         loom_error *err) {
    loom_ckpt_tensor *t = get_tensor(m, tensor, ndim, shape, err);
    if (!t) return err ? err->code : LOOM_ERR_INPUT;
    if (t->n_chunks == t->cap) {
        int cap = t->cap ? 2 * t->cap : 4;
        loom_ckpt_chunk *cs = realloc(t->chunks, (size_t)cap * sizeof *cs);
        if (!cs) return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint manifest: out of memory");
        t->chunks = cs;
        t->cap = cap;
    }
    t->chunks[t->n_chunks++] = *c;
    return LOOM_OK;
}

loom_status loom_ckpt_manifest_merge(loom_ckpt_manifest *dst, const loom_ckpt_manifest *src,
                                     loom_error *err) {
    loom_status st = LOOM_OK;
    for (int i = 0; i < src->n_tensors && !st; i++) {
        const loom_ckpt_tensor *t = &src->tensors[i];
        for (int k = 0; k < t->n_chunks && !st; k++) {
            loom_ckpt_chunk c = t->chunks[k];
            if ((c.file = loom_ckpt_manifest_add_file(dst, src->files[c.file])) < 0)
                return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint manifest: out of memory");
            st = loom_ckpt_manifest_add_chunk(dst, t->name, t->ndim, t->shape, &c, err);
        }
    }
    return st;
}

/* ---- serialisation ---- */

static json_t *dims_json(int ndim, const int64_t v[2]) {
    json_t *a = json_array();
    for (int d = 0; d < ndim; d++) json_array_append_new(a, json_integer(v[d]));
    return a;
}

char *loom_ckpt_manifest_dump(const loom_ckpt_manifest *m, int index) {
    json_t *root = json_object();
    json_object_set_new(root, "format",
                        json_string(index ? LOOM_CKPT_INDEX_FORMAT : LOOM_CKPT_FORMAT));
    json_object_set_new(root, "checksum", json_string("xxh3-64"));
    if (!index) {
        char seed[32];
        snprintf(seed, sizeof seed, "%" PRIu64, m->seed);
        const loom_ckpt_layout *l = &m->layout;
        json_object_set_new(root, "loom_version", json_string(m->version));
        json_object_set_new(root, "step", json_integer(m->step));
        json_object_set_new(root, "data_position", json_integer(m->step));
        json_object_set_new(root, "lr_schedule_step", json_integer(m->step));
        json_object_set_new(root, "tokens_seen", json_integer(m->tokens_seen));
        json_object_set_new(root, "seed", json_string(seed));
        json_object_set_new(root, "layout",
                            json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "dp", l->dp, "tp",
                                      l->tp, "pp", l->pp, "ep", l->ep, "cp", l->cp > 0 ? l->cp : 1,
                                      "zero", l->zero, "world_size", l->world_size));
        if (m->model) json_object_set(root, "model", (json_t *)m->model);
        if (m->train) json_object_set(root, "train", (json_t *)m->train);
    }
    json_t *files = json_array();
    for (int i = 0; i < m->n_files; i++) json_array_append_new(files, json_string(m->files[i]));
    json_object_set_new(root, "files", files);
    json_t *tensors = json_array();
    for (int i = 0; i < m->n_tensors; i++) {
        const loom_ckpt_tensor *t = &m->tensors[i];
        json_t *chunks = json_array();
        for (int k = 0; k < t->n_chunks; k++) {
            const loom_ckpt_chunk *c = &t->chunks[k];
            char sum[24];
            snprintf(sum, sizeof sum, "%016" PRIx64, c->checksum);
            json_array_append_new(chunks, json_pack("{s:i, s:o, s:o, s:I, s:I, s:s}", "file",
                                                    c->file, "offset", dims_json(t->ndim, c->off),
                                                    "length", dims_json(t->ndim, c->len),
                                                    "byte_offset", (json_int_t)c->byte_offset,
                                                    "bytes", (json_int_t)c->bytes, "xxh3", sum));
        }
        json_array_append_new(tensors,
                              json_pack("{s:s, s:s, s:o, s:o}", "name", t->name, "dtype", "F32",
                                        "shape", dims_json(t->ndim, t->shape), "chunks", chunks));
    }
    json_object_set_new(root, "tensors", tensors);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

/* ---- parsing ---- */

/* A file name that stays inside the checkpoint directory: no '/', not "." or "..". */
static int safe_name(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 256 && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int get_dims(json_t *a, int ndim, int64_t lo, int64_t out[2]) {
    if (!json_is_array(a) || (int)json_array_size(a) != ndim) return 0;
    out[0] = 0;
    out[1] = ndim == 2 ? 0 : 1;
    for (int d = 0; d < ndim; d++)
        if (!loom_json_int_in(json_array_get(a, (size_t)d), lo, MAX_DIM, &out[d])) return 0;
    return 1;
}

static loom_status parse_chunk(const loom_json_reader *c, loom_ckpt_manifest *m, json_t *j,
                               const char *name, int ndim, const int64_t shape2[2],
                               loom_ckpt_chunk *out) {
    int64_t file, bo, bytes;
    const char *sum = json_string_value(json_object_get(j, "xxh3"));
    if (!json_is_object(j) ||
        !loom_json_int_in(json_object_get(j, "file"), 0, m->n_files - 1, &file) ||
        !loom_json_int_in(json_object_get(j, "byte_offset"), 0, (int64_t)MAX_BYTES, &bo) ||
        !loom_json_int_in(json_object_get(j, "bytes"), 1, (int64_t)MAX_BYTES, &bytes) ||
        !get_dims(json_object_get(j, "offset"), ndim, 0, out->off) ||
        !get_dims(json_object_get(j, "length"), ndim, 1, out->len) || !sum || strlen(sum) != 16 ||
        strspn(sum, "0123456789abcdef") != 16)
        return loom_json_fail(
            c,
            "tensor '%s': a chunk needs file (an index into files), offset, length, "
            "byte_offset, bytes and a 16-digit xxh3",
            name);
    if (ndim == 1) out->off[1] = 0, out->len[1] = 1;
    for (int d = 0; d < 2; d++)
        if (out->off[d] + out->len[d] > shape2[d])
            return loom_json_fail(c, "tensor '%s': a chunk reaches outside the tensor's shape",
                                  name);
    if ((uint64_t)bytes != (uint64_t)(out->len[0] * out->len[1]) * 4)
        return loom_json_fail(c, "tensor '%s': a chunk's bytes disagree with its length (F32)",
                              name);
    out->file = (int)file;
    out->byte_offset = (uint64_t)bo;
    out->bytes = (uint64_t)bytes;
    out->checksum = strtoull(sum, NULL, 16);
    return LOOM_OK;
}

static loom_status parse_run_state(const loom_json_reader *c, json_t *root, loom_ckpt_manifest *m) {
    const char *version = json_string_value(json_object_get(root, "loom_version"));
    const char *seed = json_string_value(json_object_get(root, "seed"));
    json_t *l = json_object_get(root, "layout");
    int64_t v[6];
    const char *keys[6] = {"dp", "tp", "pp", "ep", "zero", "world_size"};
    if (!version || !seed || !*seed || strspn(seed, "0123456789") != strlen(seed) ||
        !loom_json_int_in(json_object_get(root, "step"), 0, INT32_MAX, &m->step) ||
        !loom_json_int_in(json_object_get(root, "tokens_seen"), 0, INT64_MAX, &m->tokens_seen) ||
        !json_is_object(l))
        return loom_json_fail(
            c, "%s", "needs loom_version, step, tokens_seen, seed (a decimal string), layout");
    for (int i = 0; i < 6; i++)
        if (!loom_json_int_in(json_object_get(l, keys[i]), i == 4 ? 0 : 1, 1 << 20, &v[i]))
            return loom_json_fail(c, "layout: '%s' must be a positive integer", keys[i]);
    int64_t cp = 1; /* written since context parallelism; older manifests have none */
    json_t *jcp = json_object_get(l, "cp");
    if (jcp && !loom_json_int_in(jcp, 1, 1 << 20, &cp))
        return loom_json_fail(c, "%s", "layout: 'cp' must be a positive integer");
    m->layout = (loom_ckpt_layout){(int)v[0], (int)v[1], (int)v[2], (int)v[3],
                                   (int)v[4], (int)v[5], (int)cp};
    snprintf(m->version, sizeof m->version, "%s", version);
    m->seed = strtoull(seed, NULL, 10);
    json_t *model = json_object_get(root, "model"), *train = json_object_get(root, "train");
    if (!json_is_object(model)) return loom_json_fail(c, "%s", "needs a 'model' object");
    m->model = json_incref(model);
    if (json_is_object(train)) m->train = json_incref(train);
    return LOOM_OK;
}

static loom_status parse_root(const loom_json_reader *c, json_t *root, loom_ckpt_manifest *m,
                              int index) {
    const char *format = json_string_value(json_object_get(root, "format"));
    const char *want = index ? LOOM_CKPT_INDEX_FORMAT : LOOM_CKPT_FORMAT;
    if (!format || strcmp(format, want) != 0) return loom_json_fail(c, "format is not '%s'", want);
    const char *sum = json_string_value(json_object_get(root, "checksum"));
    if (!sum || strcmp(sum, "xxh3-64") != 0)
        return loom_json_fail(c, "%s", "checksum must be 'xxh3-64'");
    loom_status st;
    if (!index && (st = parse_run_state(c, root, m))) return st;
    json_t *files = json_object_get(root, "files"), *tensors = json_object_get(root, "tensors");
    if (!json_is_array(files) || !json_is_array(tensors) || json_array_size(files) > 1 << 20)
        return loom_json_fail(c, "%s", "needs 'files' and 'tensors' arrays");
    size_t i;
    json_t *v;
    json_array_foreach(files, i, v) {
        const char *name = json_string_value(v);
        if (!name || !safe_name(name))
            return loom_json_fail(
                c, "file name '%s' is not a plain name inside the checkpoint directory",
                name ? name : "(not a string)");
        if (loom_ckpt_manifest_add_file(m, name) != (int)i)
            return loom_json_fail(c, "file '%s' is listed twice (or out of memory)", name);
    }
    json_array_foreach(tensors, i, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *dtype = json_string_value(json_object_get(v, "dtype"));
        json_t *shape = json_object_get(v, "shape"), *chunks = json_object_get(v, "chunks");
        if (!name || !*name || strlen(name) > 200)
            return loom_json_fail(c, "%s", "a tensor has no valid name");
        if (!dtype || strcmp(dtype, "F32") != 0)
            return loom_json_fail(c, "tensor '%s': dtype must be F32", name);
        int ndim = json_is_array(shape) ? (int)json_array_size(shape) : 0;
        int64_t s2[2];
        if ((ndim != 1 && ndim != 2) || !get_dims(shape, ndim, 1, s2) || !json_is_array(chunks))
            return loom_json_fail(
                c, "tensor '%s': needs a shape of 1 or 2 positive sizes and chunks", name);
        /* Bounded numel: chunk volumes (within the shape) and their sums cannot overflow. */
        if (s2[0] > MAX_NUMEL / s2[1])
            return loom_json_fail(c, "tensor '%s': shape has more than 2^48 elements", name);
        if (loom_ckpt_manifest_find(m, name))
            return loom_json_fail(c, "tensor '%s' is listed twice", name);
        int64_t sh[2] = {s2[0], ndim == 2 ? s2[1] : 0};
        size_t k;
        json_t *cj;
        json_array_foreach(chunks, k, cj) {
            loom_ckpt_chunk ch;
            if ((st = parse_chunk(c, m, cj, name, ndim, s2, &ch)) ||
                (st = loom_ckpt_manifest_add_chunk(m, name, ndim, sh, &ch, c->err)))
                return st;
        }
        if (!index && json_array_size(chunks) == 0)
            return loom_json_fail(c, "tensor '%s' has no chunks", name);
    }
    return index ? LOOM_OK : loom_ckpt_manifest_check_cover(m, c->origin, c->err);
}

loom_status loom_ckpt_manifest_parse(loom_ckpt_manifest *m, const char *text, size_t len, int index,
                                     const char *origin, loom_error *err) {
    memset(m, 0, sizeof *m);
    loom_json_reader c = {origin, "invalid checkpoint manifest", err};
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        loom_status st = loom_error_set(err, LOOM_ERR_INPUT,
                                        "%s: invalid checkpoint manifest: not a JSON object (%s, "
                                        "line %d)",
                                        origin, root ? "wrong type" : jerr.text, jerr.line);
        json_decref(root);
        return st;
    }
    loom_status st = parse_root(&c, root, m, index);
    json_decref(root);
    if (st) loom_ckpt_manifest_free(m);
    return st;
}

loom_status loom_ckpt_manifest_load(loom_ckpt_manifest *m, const char *path, int index,
                                    loom_error *err) {
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(MAX_MANIFEST_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_MANIFEST_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    loom_status st = n > MAX_MANIFEST_BYTES
                         ? loom_error_set(err, LOOM_ERR_INPUT, "%s: larger than 256 MiB", path)
                         : loom_ckpt_manifest_parse(m, buf, n, index, path, err);
    free(buf);
    return st;
}

/* ---- exact cover ---- */

static int cmp_chunk(const void *a, const void *b) {
    const loom_ckpt_chunk *x = a, *y = b;
    for (int d = 0; d < 2; d++)
        if (x->off[d] != y->off[d]) return x->off[d] < y->off[d] ? -1 : 1;
    return 0;
}

loom_status loom_ckpt_manifest_check_cover(const loom_ckpt_manifest *m, const char *origin,
                                           loom_error *err) {
    for (int i = 0; i < m->n_tensors; i++) {
        const loom_ckpt_tensor *t = &m->tensors[i];
        loom_ckpt_chunk *s = malloc((size_t)(t->n_chunks ? t->n_chunks : 1) * sizeof *s);
        if (!s) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", origin);
        memcpy(s, t->chunks, (size_t)t->n_chunks * sizeof *s);
        qsort(s, (size_t)t->n_chunks, sizeof *s, cmp_chunk);
        /* Sorted by row offset: a chunk can only overlap those starting before its end. */
        int overlap = 0;
        int64_t volume = 0;
        for (int a = 0; a < t->n_chunks && !overlap; a++) {
            volume += s[a].len[0] * s[a].len[1];
            for (int b = a + 1; b < t->n_chunks && s[b].off[0] < s[a].off[0] + s[a].len[0]; b++)
                if (s[b].off[1] < s[a].off[1] + s[a].len[1] &&
                    s[a].off[1] < s[b].off[1] + s[b].len[1])
                    overlap = 1;
        }
        free(s);
        const int64_t numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        if (overlap)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: invalid checkpoint manifest: tensor '%s' has overlapping "
                                  "chunks",
                                  origin, t->name);
        if (volume != numel)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: invalid checkpoint manifest: tensor '%s': chunks cover "
                                  "%" PRId64 " of %" PRId64 " elements (a hole)",
                                  origin, t->name, volume, numel);
    }
    return LOOM_OK;
}
