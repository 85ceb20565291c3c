/* Linear layer on OpenBLAS: weights are [OC, IC] (PyTorch layout), so the forward is
 * inp @ weight^T. The GEMMs are threaded by OpenBLAS itself. */
#include "kernels/kernels.h"

#include <cblas.h>
#include <string.h>

/* Columns summed per task in the bias gradient; a stack accumulator of this size. */
#define LOOM_BIAS_COLS 64

void loom_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    float beta = 0.0f;
    if (bias) {
        /* Seed every row with the bias, then let sgemm accumulate onto it. */
#pragma omp parallel for
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    if (IC <= 0) {
        if (!bias) memset(out, 0, sizeof(float) * (size_t)N * OC);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, beta,
                out, OC);
}

void loom_linear_backward_input(float *dinp, const float *dout, const float *weight, int N, int IC,
                                int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                1.0f, dinp, IC);
}

void loom_linear_backward_weight_ld(float *dweight, const float *dout, int ld, const float *inp,
                                    int N, int IC, int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, ld, inp, IC, 1.0f,
                dweight, IC);
}

void loom_linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                                 int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    1.0f, dweight, IC);
    if (!dbias) return;
    /* Column sums: each task owns a block of columns, so there is no race and the
     * summation order is fixed (deterministic). Double keeps long sums accurate. */
    int nblocks = (OC + LOOM_BIAS_COLS - 1) / LOOM_BIAS_COLS;
#pragma omp parallel for
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * LOOM_BIAS_COLS;
        int nc = OC - c0 < LOOM_BIAS_COLS ? OC - c0 : LOOM_BIAS_COLS;
        double acc[LOOM_BIAS_COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * OC + c0;
            for (int j = 0; j < nc; j++) acc[j] += row[j];
        }
        for (int j = 0; j < nc; j++) dbias[c0 + j] += (float)acc[j];
    }
}
