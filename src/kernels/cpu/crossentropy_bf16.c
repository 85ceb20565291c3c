/* Fused softmax + cross-entropy over bf16 logits (--precision bf16: the LM head writes its
 * logits in bf16, as autocast does): each row is widened to fp32 a chunk at a time, the
 * softmax and the loss are computed in fp32 with sums in double as in crossentropy.c, and
 * the backward variant writes dlogits rounded to nearest even into the same bf16 slot. */
#include "kernels/kernels.h"

#include <math.h>

#include "vecmath.h"

#define LOOM_CE_CHUNK 256

/* The row's maximum and sum of exp(x - max), chunk by chunk. */
LOOM_SIMD static double row_sum(const loom_bf16 *x, int V, float *max) {
    float e[LOOM_CE_CHUNK];
    float m = -INFINITY;
    for (int j0 = 0; j0 < V; j0 += LOOM_CE_CHUNK) {
        const int nj = V - j0 < LOOM_CE_CHUNK ? V - j0 : LOOM_CE_CHUNK;
        loom_bf16_to_f32_n(e, x + j0, (size_t)nj);
        const float cm = loom_max_f32(e, nj);
        if (cm > m) m = cm;
    }
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += LOOM_CE_CHUNK) { /* chunked so exp vectorises */
        const int nj = V - j0 < LOOM_CE_CHUNK ? V - j0 : LOOM_CE_CHUNK;
        loom_bf16_to_f32_n(e, x + j0, (size_t)nj);
        for (int j = 0; j < nj; j++) e[j] = loom_expf(e[j] - m);
        sum += loom_sum_f64(e, nj);
    }
    *max = m;
    return sum;
}

void loom_crossentropy_forward_bf16(float *losses, const loom_bf16 *logits, const int32_t *targets,
                                    int N, int V) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        for (size_t n = lo; n < hi; n++) {
            const loom_bf16 *x = logits + n * V;
            float m;
            const double sum = row_sum(x, V, &m);
            const double xt = loom_bf16_to_f32(x[targets[n]]);
            losses[n] = (float)((double)m + log(sum) - xt);
        }
    }
}

LOOM_SIMD static void backward_row(loom_bf16 *x, int tgt, int V, float m, float s, float dloss) {
    float e[LOOM_CE_CHUNK];
    for (int j0 = 0; j0 < V; j0 += LOOM_CE_CHUNK) {
        const int nj = V - j0 < LOOM_CE_CHUNK ? V - j0 : LOOM_CE_CHUNK;
        loom_bf16_to_f32_n(e, x + j0, (size_t)nj);
        for (int j = 0; j < nj; j++) e[j] = loom_expf(e[j] - m) * s;
        if (tgt >= j0 && tgt < j0 + nj) e[tgt - j0] -= dloss;
        loom_bf16_from_f32_n(x + j0, e, (size_t)nj);
    }
}

void loom_crossentropy_forward_backward_bf16(float *losses, loom_bf16 *logits,
                                             const int32_t *targets, int N, int V, float dloss) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        for (size_t n = lo; n < hi; n++) {
            loom_bf16 *x = logits + n * V;
            const int tgt = targets[n];
            float m;
            const double sum = row_sum(x, V, &m);
            losses[n] = (float)((double)m + log(sum) - (double)loom_bf16_to_f32(x[tgt]));
            backward_row(x, tgt, V, m, (float)(dloss / sum), dloss);
        }
    }
}
