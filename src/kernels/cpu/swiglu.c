/* SwiGLU: each row of inp is [gate | up] (2F wide); out = silu(gate) * up. */
#include "kernels/kernels.h"

#include <math.h>

void loom_swiglu_forward(float *out, const float *inp, int N, int F) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict g = inp + (size_t)n * 2 * F;
        const float *restrict u = g + F;
        float *restrict o = out + (size_t)n * F;
        for (int f = 0; f < F; f++) o[f] = g[f] / (1.0f + expf(-g[f])) * u[f];
    }
}

void loom_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict g = inp + (size_t)n * 2 * F;
        const float *restrict u = g + F;
        const float *restrict dy = dout + (size_t)n * F;
        float *restrict dg = dinp + (size_t)n * 2 * F;
        float *restrict du = dg + F;
        for (int f = 0; f < F; f++) {
            float sig = 1.0f / (1.0f + expf(-g[f]));
            float silu = g[f] * sig;
            /* d silu/dg = sig * (1 + g * (1 - sig)) */
            dg[f] += dy[f] * u[f] * sig * (1.0f + g[f] * (1.0f - sig));
            du[f] += dy[f] * silu;
        }
    }
}
