/* SiLU (swish): x * sigmoid(x) = x / (1 + exp(-x)), with the vectorisable exp; the
 * loops are split statically across threads (as GELU). */
#include "kernels/kernels.h"

#include "vecmath.h"

LOOM_SIMD static void silu_forward_range(float *restrict out, const float *restrict inp, size_t lo,
                                         size_t hi) {
    for (size_t i = lo; i < hi; i++) out[i] = inp[i] / (1.0f + loom_expf(-inp[i]));
}

LOOM_SIMD static void silu_backward_range(float *restrict dinp, const float *restrict inp,
                                          const float *restrict dout, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        float x = inp[i], e = loom_expf(-x);
        float sig = 1.0f / (1.0f + e), one_minus_sig = e * sig; /* no cancellation */
        /* d/dx x sig(x) = sig (1 + x (1 - sig)) */
        dinp[i] += dout[i] * sig * (1.0f + x * one_minus_sig);
    }
}

void loom_silu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        silu_forward_range(out, inp, lo, hi);
    }
}

void loom_silu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        silu_backward_range(dinp, inp, dout, lo, hi);
    }
}
