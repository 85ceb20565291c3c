/* Fused softmax + cross-entropy over bf16 logits (--precision bf16: the LM head writes its
 * logits in bf16, as autocast does): each row is widened to fp32 a chunk at a time, the
 * softmax and the loss are computed in fp32 with sums in double as in crossentropy.c, and
 * the backward variant writes dlogits rounded to nearest even into the same bf16 slot. */
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>

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

/* The same row with its exp values kept in fp32 (e: V floats): one exp an element where
 * row_sum + backward_row take two (the bf16 step's loss took twice fp32's: llama-tiny's
 * 32,000-token rows, 21.9 against 10.6 ms a micro-batch). The same sums, chunk by chunk,
 * so the same bits. */
LOOM_SIMD static float row_with_exp(loom_bf16 *x, float *e, int tgt, int V, float dloss) {
    loom_bf16_to_f32_n(e, x, (size_t)V);
    const float m = loom_max_f32(e, V), xt = e[tgt];
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += LOOM_CE_CHUNK) {
        const int nj = V - j0 < LOOM_CE_CHUNK ? V - j0 : LOOM_CE_CHUNK;
        for (int j = 0; j < nj; j++) e[j0 + j] = loom_expf(e[j0 + j] - m);
        sum += loom_sum_f64(e + j0, nj);
    }
    const float s = (float)(dloss / sum);
    for (int j = 0; j < V; j++) e[j] *= s;
    e[tgt] -= dloss;
    loom_bf16_from_f32_n(x, e, (size_t)V);
    return (float)((double)m + log(sum) - (double)xt);
}

/* Each thread's row of exp values, grown to the largest vocabulary met and kept for the
 * thread's life (not per call: the step's loss runs every micro-batch). */
static _Thread_local float *g_row;
static _Thread_local int g_row_cap;

void loom_crossentropy_forward_backward_bf16(float *losses, loom_bf16 *logits,
                                             const int32_t *targets, int N, int V, float dloss) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        if (lo < hi && g_row_cap < V) {
            float *grown = realloc(g_row, sizeof(float) * (size_t)V);
            if (grown) g_row = grown, g_row_cap = V;
        }
        for (size_t n = lo; n < hi && g_row_cap >= V; n++)
            losses[n] = row_with_exp(logits + n * V, g_row, targets[n], V, dloss);
        for (size_t n = lo; n < hi && g_row_cap < V; n++) { /* no room: two exps an element */
            loom_bf16 *x = logits + n * V;
            const int tgt = targets[n];
            float m;
            const double sum = row_sum(x, V, &m);
            losses[n] = (float)((double)m + log(sum) - (double)loom_bf16_to_f32(x[tgt]));
            backward_row(x, tgt, V, m, (float)(dloss / sum), dloss);
        }
    }
}
