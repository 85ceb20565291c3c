/* The linear layers' GEMM shapes from the registry (gemm_shapes.h). */
#include "model/gemm_shapes.h"

#include "kernels/backend_bf16.h"

loom_status loom_model_prepare_gemms(const loom_backend *be, const loom_param_table *t,
                                     const int *rows, int n_rows, int bf16_logits,
                                     loom_error *err) {
    if (!be->ops->linear_prepare) return LOOM_OK;
    loom_status st;
    for (int i = 0; i < t->n_params; i++) {
        int64_t oc = 0;
        const loom_param *p = &t->params[i];
        /* the language models' head (tied or not) with its logits kept in bf16 */
        if (bf16_logits && t->has_head && t->lm_head != LOOM_NO_PARAM && p->offset == t->lm_head &&
            p->ndim == 2) {
            if (n_rows > 0 && (st = loom_backend_linear_prepare_out_bf16(
                                   be, rows[0], (int)p->shape[1], (int)p->shape[0], err)))
                return loom_error_prefix(err, "--precision bf16: bf16 logits' GEMM of %s", p->name);
            continue;
        }
        /* the untied embedding is looked up, not multiplied: no N x V operand either */
        if (bf16_logits && t->has_embed && p->offset == t->wte) continue;
        for (int j = i; j < t->n_params && j < i + 3; j++) {
            const loom_param *q = &t->params[j];
            if (q->ndim != 2 || q->shape[1] != p->shape[1] ||
                (j > i && q->offset != t->params[j - 1].offset + t->params[j - 1].numel))
                break;
            oc += q->shape[0];
            for (int k = 0; k < n_rows; k++)
                if ((st = loom_backend_linear_prepare(be, rows[k], (int)p->shape[1], (int)oc, err)))
                    return loom_error_prefix(err, "--precision bf16: GEMM of %s", q->name);
        }
    }
    return LOOM_OK;
}
