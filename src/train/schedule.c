#include "train/schedule.h"

#include <math.h>

float loom_lr_at(int step, int steps, int warmup, float lr, float min_lr) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    int span = steps - warmup > 1 ? steps - warmup : 1;
    double ratio = (double)(step - warmup) / span;
    if (ratio > 1.0) ratio = 1.0;
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)(min_lr + coeff * (lr - min_lr));
}
