/* RMSNorm: out = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps). */
#include "kernels/kernels.h"

#include <math.h>

#define LOOM_RMS_COLS 64

void loom_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

void loom_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C) {
    /* dx = rstd * (g - xhat * mean(g * xhat)) with g = dout * weight, xhat = x * rstd. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict dy = dout + (size_t)n * C;
        float *restrict dx = dinp + (size_t)n * C;
        float r = rstd[n];
        double sgx = 0.0;
        for (int c = 0; c < C; c++) sgx += (dy[c] * weight[c]) * (x[c] * r);
        float mgx = (float)(sgx / C);
        for (int c = 0; c < C; c++) dx[c] += r * (dy[c] * weight[c] - (x[c] * r) * mgx);
    }
    int nblocks = (C + LOOM_RMS_COLS - 1) / LOOM_RMS_COLS;
#pragma omp parallel for
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * LOOM_RMS_COLS;
        int nc = C - c0 < LOOM_RMS_COLS ? C - c0 : LOOM_RMS_COLS;
        double aw[LOOM_RMS_COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict x = inp + (size_t)n * C + c0;
            const float *restrict dy = dout + (size_t)n * C + c0;
            float r = rstd[n];
            for (int j = 0; j < nc; j++) aw[j] += dy[j] * (x[j] * r);
        }
        for (int j = 0; j < nc; j++) dweight[c0 + j] += (float)aw[j];
    }
}
