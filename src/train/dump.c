#include "train/dump.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    for (int d = 0; d < ndim && d < LOOM_TENSOR_MAX_DIMS; d++) v.shape[d] = dims[d];
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return loom_safetensors_write(path, &v, 1, err);
}

loom_status loom_dump_flow_batches(const char *dir, const loom_model_config *mc,
                                   const int32_t *records, int steps, int global_batch,
                                   loom_error *err) {
    const size_t n = (size_t)steps * global_batch, S = (size_t)loom_model_dit_sample_floats(mc);
    const size_t words = 2 + 2 * S;
    float *x0 = malloc(n * S * sizeof(float)), *noise = malloc(n * S * sizeof(float));
    float *t = malloc(n * sizeof(float));
    int32_t *labels = malloc(n * sizeof(int32_t));
    loom_status st = LOOM_OK;
    if (!x0 || !noise || !t || !labels) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "--dump-dir: out of memory");
    } else {
        for (size_t i = 0; i < n; i++) { /* the record layout of data/flow_batch.h */
            const int32_t *rec = records + i * words;
            labels[i] = rec[0];
            memcpy(&t[i], &rec[1], sizeof(float));
            memcpy(x0 + i * S, rec + 2, S * sizeof(float));
            memcpy(noise + i * S, rec + 2 + S, S * sizeof(float));
        }
        const int64_t g = global_batch;
        loom_tensor_view v[4] = {{"x0",
                                  LOOM_DTYPE_F32,
                                  6,
                                  {steps, g, mc->frames, mc->channels, mc->height, mc->width},
                                  x0},
                                 {"noise",
                                  LOOM_DTYPE_F32,
                                  6,
                                  {steps, g, mc->frames, mc->channels, mc->height, mc->width},
                                  noise},
                                 {"t", LOOM_DTYPE_F32, 2, {steps, g}, t},
                                 {"labels", LOOM_DTYPE_I32, 2, {steps, g}, labels}};
        char path[2048];
        snprintf(path, sizeof path, "%s/flow_batch.safetensors", dir);
        st = loom_safetensors_write(path, v, 4, err);
    }
    free(x0);
    free(noise);
    free(t);
    free(labels);
    return st;
}
