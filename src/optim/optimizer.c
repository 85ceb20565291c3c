#include "optim/optimizer.h"

void loom_grad_clip(const loom_backend *be, float *grads, size_t n, double norm, float max_norm) {
    if (max_norm <= 0.0f) return;
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) loom_backend_scale(be, grads, (float)coef, n);
}

void loom_adamw_step(const loom_backend *be, const loom_param_table *t, float *params,
                     const float *grads, float *m, float *v, size_t lo, size_t hi, float lr,
                     const loom_adamw_config *c, int step) {
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        if (p->frozen) continue; /* --freeze: neither updated nor decayed */
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a >= b) continue;
        loom_backend_adamw_update(be, params + (a - lo), grads + (a - lo), m + (a - lo),
                                  v + (a - lo), b - a, lr, c->beta1, c->beta2, c->eps,
                                  p->decay ? c->weight_decay : 0.0f, step);
    }
}
