/* AdamW over the flat buffers, with weight decay only on tensors the registry marks
 * (matrices), and global-norm gradient clipping. */
#ifndef LOOM_OPTIM_OPTIMIZER_H
#define LOOM_OPTIM_OPTIMIZER_H

#include "kernels/backend.h"
#include "model/params.h"

typedef struct {
    float beta1, beta2, eps, weight_decay, grad_clip;
} loom_adamw_config;

/* Scales n gradients so the global norm is at most max_norm, as
 * torch.nn.utils.clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6), capped at 1).
 * max_norm <= 0 disables clipping. Both run on the backend that holds the buffers. */
void loom_grad_clip(const loom_backend *be, float *grads, size_t n, double norm, float max_norm);
/* One AdamW step (step = 1-based count) on the flat range [lo, hi) of the parameters:
 * params, grads, m and v hold only the range (their element 0 is flat element lo).
 * [0, total) updates everything; a ZeRO shard updates its own range. Each tensor keeps
 * its own weight-decay rule inside the range. */
void loom_adamw_step(const loom_backend *be, const loom_param_table *t, float *params,
                     const float *grads, float *m, float *v, size_t lo, size_t hi, float lr,
                     const loom_adamw_config *cfg, int step);

#endif
