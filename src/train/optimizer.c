#include "train/optimizer.h"

#include <math.h>

#include "kernels/kernels.h"

double loom_grad_norm(const loom_param_table *t, const float *grads) {
    return sqrt(loom_sum_squares(grads, t->total));
}

void loom_grad_clip(const loom_param_table *t, float *grads, double norm, float max_norm) {
    if (max_norm <= 0.0f) return;
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) loom_scale(grads, (float)coef, t->total);
}

void loom_adamw_step(const loom_param_table *t, float *params, const float *grads, float *m,
                     float *v, float lr, const loom_adamw_config *c, int step) {
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        loom_adamw_update(params + p->offset, grads + p->offset, m + p->offset, v + p->offset,
                          p->numel, lr, c->beta1, c->beta2, c->eps,
                          p->decay ? c->weight_decay : 0.0f, step);
    }
}
