/* LayerNorm over the last dimension, with weight/bias (GPT-2) or without (DiT's
 * elementwise_affine=False). Row statistics in double; the weight/bias gradients are
 * column reductions done per column block (no races, deterministic). */
#include "kernels/kernels.h"

#include <math.h>

#define LOOM_LN_COLS 64

/* Mean and 1/sqrt(var + eps) of one row, in double, rounded to float. */
static inline void row_stats(const float *restrict x, int C, float eps, float *m, float *r) {
    double sum = 0.0;
    for (int c = 0; c < C; c++) sum += x[c];
    double mu = sum / C;
    double var = 0.0; /* two-pass variance: no cancellation for large means */
    for (int c = 0; c < C; c++) var += (x[c] - mu) * (x[c] - mu);
    double rs = 1.0 / sqrt(var / C + eps);
    *m = (float)mu;
    *r = (float)rs;
}

void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        float m, r;
        row_stats(x, C, eps, &m, &r);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

void loom_layernorm_plain_forward(float *out, float *mean, float *rstd, const float *inp, int N,
                                  int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        float m, r;
        row_stats(x, C, eps, &m, &r);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r;
        mean[n] = m;
        rstd[n] = r;
    }
}

void loom_layernorm_plain_backward(float *dinp, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, int N, int C) {
    /* dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat)); no parameters to reduce. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict dy = dout + (size_t)n * C;
        float *restrict dx = dinp + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double sg = 0.0, sgx = 0.0;
        for (int c = 0; c < C; c++) {
            sg += dy[c];
            sgx += dy[c] * ((x[c] - m) * r);
        }
        float mg = (float)(sg / C), mgx = (float)(sgx / C);
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * r;
            dx[c] += r * (dy[c] - mg - xhat * mgx);
        }
    }
}

void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
    /* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict dy = dout + (size_t)n * C;
        float *restrict dx = dinp + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double sg = 0.0, sgx = 0.0;
        for (int c = 0; c < C; c++) {
            float g = dy[c] * weight[c];
            sg += g;
            sgx += g * ((x[c] - m) * r);
        }
        float mg = (float)(sg / C), mgx = (float)(sgx / C);
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * r;
            dx[c] += r * (dy[c] * weight[c] - mg - xhat * mgx);
        }
    }
    int nblocks = (C + LOOM_LN_COLS - 1) / LOOM_LN_COLS;
#pragma omp parallel for
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * LOOM_LN_COLS;
        int nc = C - c0 < LOOM_LN_COLS ? C - c0 : LOOM_LN_COLS;
        double aw[LOOM_LN_COLS] = {0}, ab[LOOM_LN_COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict x = inp + (size_t)n * C + c0;
            const float *restrict dy = dout + (size_t)n * C + c0;
            float m = mean[n], r = rstd[n];
            for (int j = 0; j < nc; j++) {
                aw[j] += dy[j] * ((x[j] - m) * r);
                ab[j] += dy[j];
            }
        }
        for (int j = 0; j < nc; j++) {
            dweight[c0 + j] += (float)aw[j];
            dbias[c0 + j] += (float)ab[j];
        }
    }
}
