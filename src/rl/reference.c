#include "rl/reference.h"

#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt_plan.h"
#include "ckpt/safetensors.h"
#include "core/fs.h"
#include "model/weights.h"
#include "train/ckpt_tensors.h"

void loom_rl_reference_path(const char *ckpt_dir, char *path, size_t n) {
    snprintf(path, n, "%s/rl_reference.safetensors", ckpt_dir);
}

loom_status loom_rl_reference_save(loom_run *r, const float *ref, const char *path,
                                   loom_error *err) {
    const loom_param_table *et;
    const float *ep;
    loom_status st = loom_run_export_flat(r, ref, &et, &ep, err);
    if (st || r->mesh->rank != 0) return st;
    char tmp[LOOM_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    loom_mkdir_parent(path);
    if ((st = loom_weights_save(tmp, r->mc, et, ep, err))) return st;
    if (rename(tmp, path) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "loom rl: cannot rename %s to %s", tmp, path);
    return LOOM_OK;
}

loom_status loom_rl_reference_load(loom_run *r, float *ref, const char *path, loom_error *err) {
    loom_ckpt_descs d = {0};
    loom_ckpt_plan plan = {0};
    loom_safetensors f;
    loom_status st = loom_safetensors_open(&f, path, err);
    if (st) return loom_error_prefix(err, "--resume: the reference model");
    if (!(st = loom_ckpt_tensors_describe(&d, &r->model.table, err)))
        st = loom_ckpt_plan_range(&plan, &d, LOOM_CKPT_PARAMS, 0, r->model.table.total, 0, 0, err);
    for (int i = 0; i < plan.n && !st; i++) {
        const loom_ckpt_piece *q = &plan.items[i];
        const loom_ckpt_desc *p = &d.items[q->tensor];
        const int64_t *g = p->global_shape;
        const void *src;
        loom_dtype dtype;
        if ((st =
                 loom_safetensors_get_float(&f, p->name, (size_t)(g[0] * g[1]), &dtype, &src, err)))
            break;
        if (dtype != LOOM_DTYPE_F32) {
            st = loom_error_set(err, LOOM_ERR_INPUT, "%s: %s is not F32", path, p->name);
            break;
        }
        for (int64_t row = 0; row < q->box.len[0]; row++)
            memcpy(ref + q->local + (size_t)(row * q->stride),
                   (const float *)src + (size_t)((q->box.off[0] + row) * g[1] + q->box.off[1]),
                   (size_t)q->box.len[1] * sizeof(float));
    }
    loom_ckpt_plan_free(&plan);
    loom_ckpt_descs_free(&d);
    loom_safetensors_close(&f);
    return st;
}
