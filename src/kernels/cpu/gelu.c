/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * Evaluated as x * sigmoid(2u), since 0.5 (1 + tanh(u)) = sigmoid(2u): accurate, and
 * with the vectorisable exp the loops vectorise. */
#include "kernels/kernels.h"

#include "vecmath.h"

#define LOOM_GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define LOOM_GELU_K 0.044715f

/* The loop bodies, one source for the fp32 and the bf16-input loops (LOAD reads element i
 * as a float): the same arithmetic on the same values gives the same bits. */
#define GELU_FORWARD_BODY(LOAD)                                                                    \
    for (size_t i = lo; i < hi; i++) {                                                             \
        float x = LOAD(i);                                                                         \
        float u = LOOM_GELU_S * (x + LOOM_GELU_K * x * x * x);                                     \
        out[i] = x / (1.0f + loom_expf(-2.0f * u));                                                \
    }

/* d/dx: 0.5 (1 + tanh u) + 0.5 x sech^2(u) u', with 1 - tanh^2 = 4 sig (1 - sig); e * sig
 * is 1 - sig without cancellation */
#define GELU_BACKWARD_BODY(LOAD, STORE)                                                            \
    for (size_t i = lo; i < hi; i++) {                                                             \
        float x = LOAD(i);                                                                         \
        float u = LOOM_GELU_S * (x + LOOM_GELU_K * x * x * x);                                     \
        float e = loom_expf(-2.0f * u);                                                            \
        float sig = 1.0f / (1.0f + e), one_minus_sig = e * sig;                                    \
        float du = LOOM_GELU_S * (1.0f + 3.0f * LOOM_GELU_K * x * x);                              \
        STORE(i, sig + 2.0f * x * sig * one_minus_sig * du);                                       \
    }

#define LOAD_F32(i) inp[i]
#define LOAD_BF16(i) loom_bf16_to_f32(inp[i])
/* dinp += local * dout, or in place on a zeroed dinp: d = 0 + local * d (the same
 * expression as the accumulation into zero, so the same bits) */
#define STORE_ADD(i, local) dinp[i] += (local)*dout[i]
#define STORE_SET(i, local) d[i] = 0.0f + (local)*d[i]

LOOM_SIMD static void gelu_forward_range(float *restrict out, const float *restrict inp, size_t lo,
                                         size_t hi) {
    GELU_FORWARD_BODY(LOAD_F32);
}

LOOM_SIMD static void gelu_backward_range(float *restrict dinp, const float *restrict inp,
                                          const float *restrict dout, size_t lo, size_t hi) {
    GELU_BACKWARD_BODY(LOAD_F32, STORE_ADD);
}

LOOM_SIMD static void gelu_forward_range_bf16(float *restrict out, const loom_bf16 *restrict inp,
                                              size_t lo, size_t hi) {
    GELU_FORWARD_BODY(LOAD_BF16);
}

LOOM_SIMD static void gelu_backward_range_bf16(float *restrict dinp, const loom_bf16 *restrict inp,
                                               const float *restrict dout, size_t lo, size_t hi) {
    GELU_BACKWARD_BODY(LOAD_BF16, STORE_ADD);
}

LOOM_SIMD static void gelu_backward_range_bf16_inplace(float *restrict d,
                                                       const loom_bf16 *restrict inp, size_t lo,
                                                       size_t hi) {
    GELU_BACKWARD_BODY(LOAD_BF16, STORE_SET);
}

void loom_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        gelu_forward_range(out, inp, lo, hi);
    }
}

void loom_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        gelu_backward_range(dinp, inp, dout, lo, hi);
    }
}

void loom_gelu_forward_bf16(float *out, const loom_bf16 *inp, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        gelu_forward_range_bf16(out, inp, lo, hi);
    }
}

void loom_gelu_backward_bf16(float *dinp, const loom_bf16 *inp, const float *dout, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        gelu_backward_range_bf16(dinp, inp, dout, lo, hi);
    }
}

void loom_gelu_backward_bf16_inplace(float *d, const loom_bf16 *inp, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        gelu_backward_range_bf16_inplace(d, inp, lo, hi);
    }
}
