#include "train/dump.h"

#include <stdio.h>
#include <stdlib.h>

#include "ckpt/safetensors.h"
#include "model/weights.h"

loom_status loom_dump_flat(const char *dir, const char *file, const loom_param_table *t,
                           const float *flat, loom_error *err) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return loom_params_write_safetensors(path, t, flat, NULL, NULL, 0, err);
}

loom_status loom_dump_tensor(const char *dir, const char *file, const char *name, int is_int,
                             const void *data, int ndim, const int64_t *dims, loom_error *err) {
    loom_tensor_view v = {name, is_int ? LOOM_DTYPE_I32 : LOOM_DTYPE_F32, ndim, {0}, data};
    for (int d = 0; d < ndim && d < 4; d++) v.shape[d] = dims[d];
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return loom_safetensors_write(path, &v, 1, err);
}
