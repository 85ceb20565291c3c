#include "train/dump.h"

#include <stdio.h>
#include <stdlib.h>

#include "ckpt/safetensors.h"

loom_status loom_dump_flat(const char *dir, const char *file, const loom_param_table *t,
                           const float *flat, loom_error *err) {
    loom_tensor_view *views = calloc((size_t)t->n_params, sizeof *views);
    if (!views) return loom_error_set(err, LOOM_ERR_NOMEM, "dump: out of memory");
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        views[i] = (loom_tensor_view){
            p->name, LOOM_DTYPE_F32, p->ndim, {p->shape[0], p->shape[1]}, flat + p->offset};
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    loom_status st = loom_safetensors_write(path, views, t->n_params, err);
    free(views);
    return st;
}

loom_status loom_dump_tensor(const char *dir, const char *file, const char *name, int is_int,
                             const void *data, int ndim, const int64_t *dims, loom_error *err) {
    loom_tensor_view v = {name, is_int ? LOOM_DTYPE_I32 : LOOM_DTYPE_F32, ndim, {0}, data};
    for (int d = 0; d < ndim && d < 4; d++) v.shape[d] = dims[d];
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return loom_safetensors_write(path, &v, 1, err);
}
