/* The backend arena: bump allocation over one mem_alloc of the backend, the same on
 * every device (only the allocation and the alignment come from the table). */
#include "kernels/backend.h"

#include <string.h>

/* ---- the registered device backends (one per kind; the CPU's is built in) ---- */

static struct {
    loom_backend_open_fn open;
    loom_backend_close_fn close;
} registered[LOOM_DEVICE_CUDA + 1];

void loom_backend_register(loom_device_kind kind, loom_backend_open_fn open,
                           loom_backend_close_fn close) {
    if (kind == LOOM_DEVICE_CPU || kind > LOOM_DEVICE_CUDA) return;
    registered[kind].open = open;
    registered[kind].close = close;
}

const char *loom_device_name(loom_device_kind kind) {
    return kind == LOOM_DEVICE_CUDA ? "cuda" : "cpu";
}

loom_status loom_device_parse(const char *s, const char *flag, loom_device_kind *out,
                              loom_error *err) {
    if (s && (strcmp(s, "cpu") == 0 || s[0] == 0)) {
        *out = LOOM_DEVICE_CPU;
        return LOOM_OK;
    }
    if (s && strcmp(s, "cuda") == 0) {
        *out = LOOM_DEVICE_CUDA;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected cpu or cuda", flag, s ? s : "");
}

loom_status loom_backend_open(loom_device_kind kind, int ordinal, const loom_backend **out,
                              loom_error *err) {
    *out = NULL;
    if (kind == LOOM_DEVICE_CPU) {
        *out = loom_backend_cpu();
        return LOOM_OK;
    }
    if (kind > LOOM_DEVICE_CUDA || !registered[kind].open)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--device %s: this loom was built without it (configure with "
                              "-DLOOM_CUDA=ON on a machine with the CUDA toolkit)",
                              loom_device_name(kind));
    loom_backend *be = NULL;
    loom_status st = registered[kind].open(&be, ordinal, err);
    if (!st) *out = be;
    return st;
}

void loom_backend_cpu_bf16_close(const loom_backend *be); /* kernels/cpu/backend_cpu_bf16.c */

loom_status loom_precision_parse(const char *s, const char *flag, loom_precision *out,
                                 loom_error *err) {
    if (s && (strcmp(s, "fp32") == 0 || s[0] == 0)) {
        *out = LOOM_PRECISION_FP32;
        return LOOM_OK;
    }
    if (s && strcmp(s, "bf16") == 0) {
        *out = LOOM_PRECISION_BF16;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected fp32 or bf16", flag, s ? s : "");
}

loom_precision loom_backend_precision(const loom_backend *be) {
    return (loom_precision)be->ops->linear_precision;
}

const char *loom_precision_name(loom_precision p) {
    return p == LOOM_PRECISION_BF16 ? "bf16" : "fp32";
}

void loom_backend_close(const loom_backend *be) {
    if (be && be->device == LOOM_DEVICE_CPU && loom_backend_precision(be) == LOOM_PRECISION_BF16) {
        loom_backend_cpu_bf16_close(be);
        return;
    }
    if (!be || be->device == LOOM_DEVICE_CPU || !registered[be->device].close) return;
    registered[be->device].close((loom_backend *)be);
}

size_t loom_backend_piece_bytes(const loom_backend *be, size_t bytes) {
    const size_t a = be->align ? be->align : 1;
    return (bytes + a - 1) / a * a;
}

loom_status loom_backend_arena_create(loom_backend_arena *a, const loom_backend *be, size_t bytes,
                                      const char *what, loom_error *err) {
    memset(a, 0, sizeof *a);
    a->be = be;
    a->base = loom_backend_alloc(be, bytes);
    if (!a->base)
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: cannot allocate %.1f MiB on %s", what,
                              (double)bytes / (1 << 20), be->name);
    a->size = bytes;
    return LOOM_OK;
}

void loom_backend_arena_destroy(loom_backend_arena *a) {
    if (a->base) loom_backend_free(a->be, a->base);
    const loom_backend *be = a->be;
    memset(a, 0, sizeof *a);
    a->be = be;
}

void *loom_backend_arena_alloc(loom_backend_arena *a, size_t bytes, const char *what,
                               loom_error *err) {
    const size_t at = loom_backend_piece_bytes(a->be, a->used);
    if (at > a->size || bytes > a->size - at) {
        loom_error_set(err, LOOM_ERR_NOMEM, "arena on %s: %s needs %zu bytes, %zu of %zu left",
                       a->be->name, what, bytes, a->size - (a->used < a->size ? a->used : a->size),
                       a->size);
        return NULL;
    }
    a->used = at + bytes;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + at;
}

size_t loom_backend_arena_mark(const loom_backend_arena *a) {
    return a->used;
}

void loom_backend_arena_release(loom_backend_arena *a, size_t mark) {
    if (mark <= a->used) a->used = mark;
}
