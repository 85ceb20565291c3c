/* Vocabulary-parallel loss pieces: a rank holds rows [v0, v0 + V) of the embedding/head,
 * so it sees only columns [v0, v0 + V) of the logits (its embedding lookups are the shard
 * kernels of embedding.c).
 * The caller combines the per-rank partial results (sums, maxima) across the group; the
 * arithmetic per element is the same as the unsharded kernels', so one rank (v0 = 0, V =
 * full vocabulary) gives their results exactly. */
#include "kernels/kernels.h"

#include <math.h>

#include "vecmath.h"

LOOM_SIMD static void max_rows(float *maxes, const float *logits, int V, size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) maxes[n] = loom_max_f32(logits + n * V, V);
}

void loom_crossentropy_shard_max(float *maxes, const float *logits, int N, int V) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        max_rows(maxes, logits, V, lo, hi);
    }
}

#define LOOM_CE_CHUNK 256

/* Per row: sum of exp(x - max) over the shard's columns and the target's logit (0 when
 * another rank owns the target). With `in_place` the exponentials replace the logits
 * (the training path, as loom_crossentropy_forward_backward does). */
LOOM_SIMD static void sum_rows(double *sums, double *target_logit, float *logits,
                               const int32_t *targets, const float *maxes, int V, int v0,
                               int in_place, size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) {
        float *restrict x = logits + n * V;
        const int tgt = targets[n] - v0;
        target_logit[n] = tgt >= 0 && tgt < V ? (double)x[tgt] : 0.0;
        const float m = maxes[n];
        if (in_place) {
            for (int j = 0; j < V; j++) x[j] = loom_expf(x[j] - m);
            sums[n] = loom_sum_f64(x, V);
            continue;
        }
        double sum = 0.0;
        for (int j0 = 0; j0 < V; j0 += LOOM_CE_CHUNK) {
            float e[LOOM_CE_CHUNK];
            int nj = V - j0 < LOOM_CE_CHUNK ? V - j0 : LOOM_CE_CHUNK;
            for (int j = 0; j < nj; j++) e[j] = loom_expf(x[j0 + j] - m);
            sum += loom_sum_f64(e, nj);
        }
        sums[n] = sum;
    }
}

static void sums_parallel(double *sums, double *target_logit, float *logits, const int32_t *targets,
                          const float *maxes, int N, int V, int v0, int in_place) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        sum_rows(sums, target_logit, logits, targets, maxes, V, v0, in_place, lo, hi);
    }
}

void loom_crossentropy_shard_sums(double *sums, double *target_logit, const float *logits,
                                  const int32_t *targets, const float *maxes, int N, int V,
                                  int v0) {
    sums_parallel(sums, target_logit, (float *)logits, targets, maxes, N, V, v0, 0);
}

void loom_crossentropy_shard_exp(double *sums, double *target_logit, float *logits,
                                 const int32_t *targets, const float *maxes, int N, int V, int v0) {
    sums_parallel(sums, target_logit, logits, targets, maxes, N, V, v0, 1);
}

void loom_crossentropy_shard_losses(float *losses, const float *maxes, const double *sums,
                                    const double *target_logit, int N) {
    for (int n = 0; n < N; n++)
        losses[n] = (float)((double)maxes[n] + log(sums[n]) - target_logit[n]);
}

LOOM_SIMD static void scale_rows(float *probs, const int32_t *targets, const double *sums, int V,
                                 int v0, float dloss, size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) {
        float *restrict x = probs + n * V;
        const float s = (float)(dloss / sums[n]);
        for (int j = 0; j < V; j++) x[j] *= s;
        const int tgt = targets[n] - v0;
        if (tgt >= 0 && tgt < V) x[tgt] -= dloss;
    }
}

void loom_crossentropy_shard_backward(float *probs, const int32_t *targets, const double *sums,
                                      int N, int V, int v0, float dloss) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        scale_rows(probs, targets, sums, V, v0, dloss, lo, hi);
    }
}
