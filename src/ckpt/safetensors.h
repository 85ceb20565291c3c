/* safetensors files (Hugging Face's format): an 8-byte little-endian header length, a
 * JSON header mapping each tensor name to dtype, shape and byte range, then raw data. */
#ifndef LOOM_CKPT_SAFETENSORS_H
#define LOOM_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum { LOOM_DTYPE_F32, LOOM_DTYPE_I32 } loom_dtype;

typedef struct {
    const char *name;
    loom_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* numel * 4 bytes, little-endian */
} loom_tensor_view;

/* Writes the tensors to path (through path.tmp + rename, so a reader never sees half a
 * file). */
loom_status loom_safetensors_write(const char *path, const loom_tensor_view *tensors, int n,
                                   loom_error *err);

#endif
