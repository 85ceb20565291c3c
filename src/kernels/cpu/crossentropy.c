/* Fused softmax + cross-entropy over V classes, numerically stable (row max
 * subtracted), sums in double. */
#include "kernels/kernels.h"

#include <math.h>

#include "vecmath.h"

#define LOOM_CE_CHUNK 256

LOOM_SIMD static void forward_rows(float *losses, const float *logits, const int32_t *targets,
                                   int V, size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) {
        const float *restrict x = logits + n * V;
        float m = loom_max_f32(x, V);
        double sum = 0.0;
        for (int j0 = 0; j0 < V; j0 += LOOM_CE_CHUNK) { /* chunked so exp vectorises */
            float e[LOOM_CE_CHUNK];
            int nj = V - j0 < LOOM_CE_CHUNK ? V - j0 : LOOM_CE_CHUNK;
            for (int j = 0; j < nj; j++) e[j] = loom_expf(x[j0 + j] - m);
            sum += loom_sum_f64(e, nj);
        }
        losses[n] = (float)((double)m + log(sum) - (double)x[targets[n]]);
    }
}

LOOM_SIMD static void forward_backward_rows(float *losses, float *logits, const int32_t *targets,
                                            int V, float dloss, size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) {
        float *restrict x = logits + n * V;
        int tgt = targets[n];
        float xt = x[tgt];
        float m = loom_max_f32(x, V);
        for (int j = 0; j < V; j++) x[j] = loom_expf(x[j] - m); /* normalised below */
        double sum = loom_sum_f64(x, V);
        losses[n] = (float)((double)m + log(sum) - (double)xt);
        float s = (float)(dloss / sum);
        for (int j = 0; j < V; j++) x[j] *= s;
        x[tgt] -= dloss;
    }
}

void loom_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        forward_rows(losses, logits, targets, V, lo, hi);
    }
}

void loom_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets, int N,
                                        int V, float dloss) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        forward_backward_rows(losses, logits, targets, V, dloss, lo, hi);
    }
}
