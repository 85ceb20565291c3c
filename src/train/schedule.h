/* Learning-rate schedule: linear warmup, then cosine decay to a minimum. */
#ifndef LOOM_TRAIN_SCHEDULE_H
#define LOOM_TRAIN_SCHEDULE_H

/* LR at 0-based step s of `steps`: lr*(s+1)/warmup during warmup, then
 * min_lr + 0.5*(1 + cos(pi * (s-warmup)/max(1, steps-warmup))) * (lr - min_lr). */
float loom_lr_at(int step, int steps, int warmup, float lr, float min_lr);

#endif
