/* Elementwise helpers: residual add, sum of squares (gradient clipping), scaling. */
#include "kernels/kernels.h"

void loom_add(float *out, const float *a, const float *b, size_t n) {
    /* No restrict: out may alias a or b, which is safe for an elementwise loop. */
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

double loom_sum_squares(const float *x, size_t n) {
    double acc = 0.0;
#pragma omp parallel for reduction(+ : acc)
    for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
    return acc;
}

void loom_scale(float *x, float s, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
