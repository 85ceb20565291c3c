#include "ckpt/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t tensor_bytes(const loom_tensor_view *t) {
    size_t n = 4;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static char *build_header(const loom_tensor_view *tensors, int n) {
    json_t *root = json_object();
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const loom_tensor_view *t = &tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        size_t bytes = tensor_bytes(t);
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype",
                                  t->dtype == LOOM_DTYPE_F32 ? "F32" : "I32", "shape", shape,
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
    char *header = build_header(tensors, n);
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
