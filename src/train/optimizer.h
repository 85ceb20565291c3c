/* AdamW over the flat buffers, with weight decay only on tensors the registry marks
 * (matrices), and global-norm gradient clipping. */
#ifndef LOOM_TRAIN_OPTIMIZER_H
#define LOOM_TRAIN_OPTIMIZER_H

#include "model/params.h"

typedef struct {
    float beta1, beta2, eps, weight_decay, grad_clip;
} loom_adamw_config;

/* Global L2 norm of all gradients (accumulated in double). */
double loom_grad_norm(const loom_param_table *t, const float *grads);
/* Scales the gradients so their norm is at most max_norm, as
 * torch.nn.utils.clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6), capped at 1).
 * max_norm <= 0 disables clipping. */
void loom_grad_clip(const loom_param_table *t, float *grads, double norm, float max_norm);
/* One AdamW step (t = 1-based step count) on every parameter. */
void loom_adamw_step(const loom_param_table *t, float *params, const float *grads, float *m,
                     float *v, float lr, const loom_adamw_config *cfg, int step);

#endif
