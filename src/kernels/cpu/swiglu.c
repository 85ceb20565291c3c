/* SwiGLU: each row of inp is [gate | up] (2F wide); out = silu(gate) * up. */
#include "kernels/kernels.h"

#include "vecmath.h"

LOOM_SIMD static void forward_rows(float *out, const float *inp, int F, size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) {
        const float *restrict g = inp + n * 2 * F;
        const float *restrict u = g + F;
        float *restrict o = out + n * F;
        for (int f = 0; f < F; f++) o[f] = g[f] / (1.0f + loom_expf(-g[f])) * u[f];
    }
}

LOOM_SIMD static void backward_rows(float *dinp, const float *dout, const float *inp, int F,
                                    size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; n++) {
        const float *restrict g = inp + n * 2 * F;
        const float *restrict u = g + F;
        const float *restrict dy = dout + n * F;
        float *restrict dg = dinp + n * 2 * F;
        float *restrict du = dg + F;
        for (int f = 0; f < F; f++) {
            float e = loom_expf(-g[f]);
            float sig = 1.0f / (1.0f + e), one_minus_sig = e * sig; /* no cancellation */
            float silu = g[f] * sig;
            /* d silu/dg = sig * (1 + g * (1 - sig)) */
            dg[f] += dy[f] * u[f] * sig * (1.0f + g[f] * one_minus_sig);
            du[f] += dy[f] * silu;
        }
    }
}

void loom_swiglu_forward(float *out, const float *inp, int N, int F) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        forward_rows(out, inp, F, lo, hi);
    }
}

void loom_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        backward_rows(dinp, dout, inp, F, lo, hi);
    }
}
