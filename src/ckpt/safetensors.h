/* safetensors files (Hugging Face's format): an 8-byte little-endian header length, a
 * JSON header mapping each tensor name to dtype, shape and byte range, then raw data. */
#ifndef LOOM_CKPT_SAFETENSORS_H
#define LOOM_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* F32 and I32 are 4 bytes an element, BF16 (bfloat16, kernels/bf16.h) 2. */
typedef enum { LOOM_DTYPE_F32, LOOM_DTYPE_I32, LOOM_DTYPE_BF16 } loom_dtype;

#define LOOM_TENSOR_MAX_DIMS 6
typedef struct {
    const char *name;
    loom_dtype dtype;
    int ndim;
    int64_t shape[LOOM_TENSOR_MAX_DIMS];
    const void *data; /* numel * (4 or 2) bytes, little-endian */
} loom_tensor_view;

/* Writes the tensors to path (through path.tmp + rename, so a reader never sees half a
 * file), with optional string metadata (the format's "__metadata__"; n_meta may be 0). */
loom_status loom_safetensors_write(const char *path, const loom_tensor_view *tensors, int n,
                                   loom_error *err);
loom_status loom_safetensors_write_meta(const char *path, const loom_tensor_view *tensors, int n,
                                        const char *const *meta_keys,
                                        const char *const *meta_values, int n_meta,
                                        loom_error *err);

/* The JSON header for tensors (data offsets back to back in the given order; data is not
 * read), malloc'd; NULL when out of memory. The file is then: 8-byte length of the header
 * padded to a multiple of 8 with spaces, the padded header, the tensors' bytes. */
char *loom_safetensors_header(const loom_tensor_view *tensors, int n, const char *const *meta_keys,
                              const char *const *meta_values, int n_meta);

/* A safetensors file opened for reading (mmap'd; every entry validated at open). */
typedef struct {
    char *path;
    void *map;
    size_t map_bytes;
    const uint8_t *data; /* start of the data section */
    size_t data_bytes;
    void *header; /* parsed JSON header (jansson) */
} loom_safetensors;

loom_status loom_safetensors_open(loom_safetensors *f, const char *path, loom_error *err);
void loom_safetensors_close(loom_safetensors *f);
/* The F32 tensor `name` with exactly `numel` elements, or an error naming the file, the
 * tensor and what was found. */
loom_status loom_safetensors_get_f32(const loom_safetensors *f, const char *name, size_t numel,
                                     const float **data, loom_error *err);
/* The F32 or BF16 tensor `name` with exactly `numel` elements: *dtype says which, *data
 * points at numel * 4 or numel * 2 bytes (aligned to the element size); errors as above. */
loom_status loom_safetensors_get_float(const loom_safetensors *f, const char *name, size_t numel,
                                       loom_dtype *dtype, const void **data, loom_error *err);
/* A metadata string, or NULL. */
const char *loom_safetensors_meta(const loom_safetensors *f, const char *key);

#endif
