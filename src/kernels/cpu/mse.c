/* Mean squared error per row, sums in double (eight partial sums in a fixed order, so
 * the loop vectorises and the result does not depend on the thread count). The fused
 * variant overwrites pred with its gradient after the loss pass, so both give bitwise
 * the same losses. */
#include "kernels/kernels.h"

#include "vecmath.h"

static inline __attribute__((always_inline)) double sq_diff_sum(const float *restrict p,
                                                                const float *restrict t, int P) {
    double part[8] = {0};
    int j = 0;
    for (; j + 8 <= P; j += 8)
        for (int k = 0; k < 8; k++) {
            double d = (double)p[j + k] - t[j + k];
            part[k] += d * d;
        }
    double s = 0.0;
    for (; j < P; j++) {
        double d = (double)p[j] - t[j];
        s += d * d;
    }
    for (int k = 0; k < 8; k++) s += part[k];
    return s;
}

LOOM_SIMD static void forward_rows(float *losses, const float *pred, const float *target, int P,
                                   size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++)
        losses[n] = (float)(sq_diff_sum(pred + n * P, target + n * P, P) / P);
}

LOOM_SIMD static void forward_backward_rows(float *losses, float *pred, const float *target, int P,
                                            float dloss, size_t lo, size_t hi) {
    const float s = (float)(2.0 * (double)dloss / P);
    for (size_t n = lo; n < hi; n++) {
        float *restrict p = pred + n * P;
        const float *restrict t = target + n * P;
        losses[n] = (float)(sq_diff_sum(p, t, P) / P);
        for (int j = 0; j < P; j++) p[j] = (p[j] - t[j]) * s;
    }
}

void loom_mse_forward(float *losses, const float *pred, const float *target, int N, int P) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        forward_rows(losses, pred, target, P, lo, hi);
    }
}

void loom_mse_forward_backward(float *losses, float *pred, const float *target, int N, int P,
                               float dloss) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        forward_backward_rows(losses, pred, target, P, dloss, lo, hi);
    }
}
