/* Elementwise helpers: residual add, sum of squares (gradient clipping), scaling. */
#include "kernels/cpu/vecmath.h"
#include "kernels/kernels.h"

void loom_add(float *out, const float *a, const float *b, size_t n) {
    /* No restrict: out may alias a or b, which is safe for an elementwise loop. */
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* The sum of squares is cut into parts that depend on n only, each part summed in
 * SUMSQ_LANES float64 accumulators (they vectorise: one accumulator is a chain of
 * dependent adds, about 1.3 ns an element here, 12 ms a step for 10 M gradients), the
 * lanes and then the parts added in a fixed order: the same bits at any --threads (an
 * OpenMP reduction adds the threads' sums in the order they finish). */
#define SUMSQ_LANES 8
#define SUMSQ_PARTS 64
#define SUMSQ_PART_MIN 16384 /* below parts x this, one part and no OpenMP region */

LOOM_SIMD static double sum_squares_part(const float *x, size_t n) {
    double lane[SUMSQ_LANES] = {0};
    size_t i = 0;
    for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES)
        for (int j = 0; j < SUMSQ_LANES; j++) lane[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) lane[j] += (double)x[i] * x[i];
    for (int w = SUMSQ_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) lane[j] += lane[j + w];
    return lane[0];
}

double loom_sum_squares(const float *x, size_t n) {
    if (n < (size_t)SUMSQ_PARTS * SUMSQ_PART_MIN) return sum_squares_part(x, n);
    double part[SUMSQ_PARTS];
#pragma omp parallel for schedule(static)
    for (int p = 0; p < SUMSQ_PARTS; p++) {
        const size_t lo = n * (size_t)p / SUMSQ_PARTS, hi = n * (size_t)(p + 1) / SUMSQ_PARTS;
        part[p] = sum_squares_part(x + lo, hi - lo);
    }
    double acc = 0.0;
    for (int p = 0; p < SUMSQ_PARTS; p++) acc += part[p];
    return acc;
}

void loom_scale(float *x, float s, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
