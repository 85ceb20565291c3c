#include "ckpt/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t dtype_bytes(loom_dtype d) {
    return d == LOOM_DTYPE_BF16 ? 2 : 4;
}

static const char *dtype_name(loom_dtype d) {
    return d == LOOM_DTYPE_F32 ? "F32" : d == LOOM_DTYPE_I32 ? "I32" : "BF16";
}

static size_t tensor_bytes(const loom_tensor_view *t) {
    size_t n = dtype_bytes(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

char *loom_safetensors_header(const loom_tensor_view *tensors, int n, const char *const *meta_keys,
                              const char *const *meta_values, int n_meta) {
    json_t *root = json_object();
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (int i = 0; i < n_meta; i++)
            json_object_set_new(meta, meta_keys[i], json_string(meta_values[i]));
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const loom_tensor_view *t = &tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        size_t bytes = tensor_bytes(t);
        json_t *entry =
            json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtype_name(t->dtype), "shape", shape,
                      "data_offsets", (json_int_t)offset, (json_int_t)(offset + bytes));
        json_object_set_new(root, t->name, entry);
        offset += bytes;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

loom_status loom_safetensors_write(const char *path, const loom_tensor_view *tensors, int n,
                                   loom_error *err) {
    return loom_safetensors_write_meta(path, tensors, n, NULL, NULL, 0, err);
}

loom_status loom_safetensors_write_meta(const char *path, const loom_tensor_view *tensors, int n,
                                        const char *const *meta_keys,
                                        const char *const *meta_values, int n_meta,
                                        loom_error *err) {
    char *header = loom_safetensors_header(tensors, n, meta_keys, meta_values, n_meta);
    if (!header) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: cannot build header", path);
    size_t len = strlen(header);
    size_t padded = (len + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(header);
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint64_t hlen = padded; /* x86-64 is little-endian, as the format requires */
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(header, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++) {
        size_t bytes = tensor_bytes(&tensors[i]);
        ok = fwrite(tensors[i].data, 1, bytes, f) == bytes;
    }
    free(header);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved_errno = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", path,
                              strerror(saved_errno ? saved_errno : errno));
    }
    return LOOM_OK;
}

static loom_status bad(loom_safetensors *f, loom_error *err, const char *what) {
    loom_status st = loom_error_set(err, LOOM_ERR_INPUT, "%s: not a valid safetensors file: %s",
                                    f->path ? f->path : "?", what);
    loom_safetensors_close(f);
    return st;
}

loom_status loom_safetensors_open(loom_safetensors *f, const char *path, loom_error *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        loom_status st =
            loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
        loom_safetensors_close(f);
        return st;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        close(fd);
        return bad(f, err, "shorter than its 8-byte header length");
    }
    f->map_bytes = (size_t)sb.st_size;
    f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return bad(f, err, "cannot be mapped");
    }
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->map_bytes - 8) return bad(f, err, "header length beyond the end of the file");
    json_error_t jerr;
    f->header = json_loadb((const char *)f->map + 8, (size_t)hlen, 0, &jerr);
    if (!f->header || !json_is_object((json_t *)f->header))
        return bad(f, err, "header is not a JSON object");
    f->data = (const uint8_t *)f->map + 8 + hlen;
    f->data_bytes = f->map_bytes - 8 - (size_t)hlen;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)f->header, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        json_t *off = json_object_get(v, "data_offsets");
        json_int_t a = json_integer_value(json_array_get(off, 0));
        json_int_t b = json_integer_value(json_array_get(off, 1));
        if (!json_is_string(json_object_get(v, "dtype")) ||
            !json_is_array(json_object_get(v, "shape")) || json_array_size(off) != 2 ||
            !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)) ||
            a < 0 || b < a || (uint64_t)b > f->data_bytes)
            return bad(f, err, "a tensor entry has bad dtype, shape or data_offsets");
        /* Shape entries non-negative and small enough that their product cannot overflow;
         * 4- and 2-byte dtypes must fill their byte range exactly. */
        json_t *shape = json_object_get(v, "shape");
        uint64_t numel = 1;
        for (size_t d = 0; d < json_array_size(shape); d++) {
            json_t *s = json_array_get(shape, d);
            json_int_t x = json_integer_value(s);
            if (!json_is_integer(s) || x < 0 || x > ((json_int_t)1 << 40) ||
                (x > 0 && numel > ((uint64_t)1 << 50) / (uint64_t)x))
                return bad(f, err, "a tensor entry has a negative or huge shape");
            numel *= (uint64_t)x;
        }
        const char *dtype = json_string_value(json_object_get(v, "dtype"));
        if ((strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0) &&
            numel * 4 != (uint64_t)(b - a))
            return bad(f, err, "a tensor's shape disagrees with its data_offsets");
        if (strcmp(dtype, "BF16") == 0 && numel * 2 != (uint64_t)(b - a))
            return bad(f, err, "a tensor's shape disagrees with its data_offsets");
    }
    return LOOM_OK;
}

void loom_safetensors_close(loom_safetensors *f) {
    if (f->header) json_decref((json_t *)f->header);
    if (f->map) munmap(f->map, f->map_bytes);
    free(f->path);
    memset(f, 0, sizeof *f);
}

loom_status loom_safetensors_get_float(const loom_safetensors *f, const char *name, size_t numel,
                                       loom_dtype *dtype, const void **data, loom_error *err) {
    /* "__metadata__" is not a tensor entry (open validated only the tensor entries). */
    json_t *v = strcmp(name, "__metadata__") == 0 ? NULL : json_object_get(f->header, name);
    if (!v) return loom_error_set(err, LOOM_ERR_INPUT, "%s: no tensor '%s'", f->path, name);
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    if (strcmp(dt, "F32") != 0 && strcmp(dt, "BF16") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: tensor '%s' is %s (expected F32 or BF16)",
                              f->path, name, dt);
    *dtype = strcmp(dt, "F32") == 0 ? LOOM_DTYPE_F32 : LOOM_DTYPE_BF16;
    const size_t size = dtype_bytes(*dtype);
    json_t *shape = json_object_get(v, "shape");
    size_t n = 1;
    for (size_t i = 0; i < json_array_size(shape); i++)
        n *= (size_t)json_integer_value(json_array_get(shape, i));
    json_t *off = json_object_get(v, "data_offsets");
    size_t a = (size_t)json_integer_value(json_array_get(off, 0));
    size_t b = (size_t)json_integer_value(json_array_get(off, 1));
    if (n != numel || b - a != numel * size)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: tensor '%s' has %zu elements (%zu bytes); expected %zu", f->path,
                              name, n, b - a, numel);
    /* The data section starts after a header whose length the file chooses. */
    if ((uintptr_t)(f->data + a) % size != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: tensor '%s' is not %zu-byte aligned in the file (header length "
                              "not padded to a multiple of 8?)",
                              f->path, name, size);
    *data = f->data + a;
    return LOOM_OK;
}

loom_status loom_safetensors_get_f32(const loom_safetensors *f, const char *name, size_t numel,
                                     const float **data, loom_error *err) {
    loom_dtype dtype;
    const void *p;
    loom_status st = loom_safetensors_get_float(f, name, numel, &dtype, &p, err);
    if (st) return st;
    if (dtype != LOOM_DTYPE_F32)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: tensor '%s' is BF16 (expected F32)",
                              f->path, name);
    *data = p;
    return LOOM_OK;
}

const char *loom_safetensors_meta(const loom_safetensors *f, const char *key) {
    json_t *meta = json_object_get((json_t *)f->header, "__metadata__");
    return json_string_value(json_object_get(meta, key));
}
