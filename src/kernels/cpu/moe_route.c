/* Mixture-of-experts routing: router softmax + top-k, capacity, and the permutations
 * between token order and expert-contiguous order (the rows of one expert contiguous,
 * so each expert runs one GEMM). Rows are independent: loops split tokens over threads;
 * every sum runs in a fixed order, so results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "vecmath.h"

#define MAX_E 1024

void loom_moe_router_forward(float *probs, int32_t *idx, float *w, float *lse, const float *logits,
                             int N, int E, int K) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        for (size_t t = lo; t < hi; t++) {
            const float *l = logits + t * E;
            float *p = probs + t * E;
            float m = l[0];
            for (int e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
            double s = 0.0;
            for (int e = 0; e < E; e++) s += exp((double)l[e] - m);
            for (int e = 0; e < E; e++) p[e] = (float)(exp((double)l[e] - m) / s);
            lse[t] = (float)(m + log(s));
            unsigned char taken[MAX_E];
            memset(taken, 0, (size_t)E);
            double sum = 0.0;
            for (int j = 0; j < K; j++) {
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
                taken[best] = 1;
                idx[t * K + j] = best;
                sum += p[best];
            }
            for (int j = 0; j < K; j++) w[t * K + j] = (float)(p[idx[t * K + j]] / sum);
        }
    }
}

int loom_moe_capacity(int32_t *pos, int32_t *load, int32_t *kept, const int32_t *idx, int N, int K,
                      int E, int cap) {
    memset(load, 0, (size_t)E * sizeof *load);
    memset(kept, 0, (size_t)E * sizeof *kept);
    int dropped = 0;
    for (int j = 0; j < K; j++)
        for (int t = 0; t < N; t++) {
            const int e = idx[t * K + j];
            load[e]++;
            if (cap <= 0 || kept[e] < cap) {
                pos[t * K + j] = kept[e]++;
            } else {
                pos[t * K + j] = -1;
                dropped++;
            }
        }
    return dropped;
}

void loom_moe_permute(float *send, const float *x, const int32_t *idx, const int32_t *pos,
                      const int32_t *offs, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int a = t * K + j;
            if (pos[a] < 0) continue;
            memcpy(send + (size_t)(offs[idx[a]] + pos[a]) * C, x + (size_t)t * C,
                   (size_t)C * sizeof(float));
        }
}

static double dot(const float *a, const float *b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

LOOM_SIMD static void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

LOOM_SIMD static void scaled(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] = a * x[i];
}

void loom_moe_combine(float *out, const float *ret, const float *w, const int32_t *idx,
                      const int32_t *pos, const int32_t *offs, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < K; j++) {
            const int a = t * K + j;
            if (pos[a] >= 0) axpy(o, w[a], ret + (size_t)(offs[idx[a]] + pos[a]) * C, C);
        }
    }
}

void loom_moe_combine_backward(float *dret, float *dw, const float *dout, const float *ret,
                               const float *w, const int32_t *idx, const int32_t *pos,
                               const int32_t *offs, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *dy = dout + (size_t)t * C;
        for (int j = 0; j < K; j++) {
            const int a = t * K + j;
            if (pos[a] < 0) {
                dw[a] = 0.0f;
                continue;
            }
            const size_t row = (size_t)(offs[idx[a]] + pos[a]) * C;
            dw[a] = (float)dot(dy, ret + row, C);
            scaled(dret + row, w[a], dy, C);
        }
    }
}

void loom_moe_unpermute_add(float *dx, const float *dsend, const int32_t *idx, const int32_t *pos,
                            const int32_t *offs, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int a = t * K + j;
            if (pos[a] >= 0)
                axpy(dx + (size_t)t * C, 1.0f, dsend + (size_t)(offs[idx[a]] + pos[a]) * C, C);
        }
}

void loom_moe_router_backward(float *dlogits, const float *probs, const int32_t *idx,
                              const float *w, const float *dw, const float *lse, const float *dprob,
                              float z, int N, int E, int K) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        double dp[MAX_E];
        for (size_t t = lo; t < hi; t++) {
            const float *p = probs + t * E;
            const int32_t *ix = idx + t * K;
            for (int e = 0; e < E; e++) dp[e] = dprob ? dprob[e] : 0.0;
            /* w_j = p_j / S over the chosen j: dp_j = (dw_j - sum_i dw_i w_i) / S. */
            double S = 0.0, sdw = 0.0;
            for (int j = 0; j < K; j++) {
                S += p[ix[j]];
                sdw += (double)dw[t * K + j] * w[t * K + j];
            }
            for (int j = 0; j < K; j++) dp[ix[j]] += ((double)dw[t * K + j] - sdw) / S;
            double dot = 0.0;
            for (int e = 0; e < E; e++) dot += (double)p[e] * dp[e];
            const double zl = 2.0 * (double)z * lse[t];
            for (int e = 0; e < E; e++)
                dlogits[t * E + e] = (float)(p[e] * (dp[e] - dot) + zl * p[e]);
        }
    }
}
