/* SwiGLU: each row of inp is [gate | up] (2F wide); out = silu(gate) * up. */
#include "kernels/kernels.h"

#include "vecmath.h"

/* The loop bodies, one source for the fp32 and the bf16-input loops (T: the input's
 * element type, LOAD(p, f) reads p[f] as a float): the same arithmetic on the same values
 * gives the same bits. */
#define SWIGLU_FORWARD_BODY(T, LOAD)                                                               \
    for (size_t n = lo; n < hi; n++) {                                                             \
        const T *restrict g = inp + n * 2 * F;                                                     \
        const T *restrict u = g + F;                                                               \
        float *restrict o = out + n * F;                                                           \
        for (int f = 0; f < F; f++)                                                                \
            o[f] = LOAD(g, f) / (1.0f + loom_expf(-LOAD(g, f))) * LOAD(u, f);                      \
    }

/* d silu/dg = sig * (1 + g * (1 - sig)); e * sig is 1 - sig without cancellation */
#define SWIGLU_BACKWARD_BODY(T, LOAD)                                                              \
    for (size_t n = lo; n < hi; n++) {                                                             \
        const T *restrict g = inp + n * 2 * F;                                                     \
        const T *restrict u = g + F;                                                               \
        const float *restrict dy = dout + n * F;                                                   \
        float *restrict dg = dinp + n * 2 * F;                                                     \
        float *restrict du = dg + F;                                                               \
        for (int f = 0; f < F; f++) {                                                              \
            float e = loom_expf(-LOAD(g, f));                                                      \
            float sig = 1.0f / (1.0f + e), one_minus_sig = e * sig;                                \
            float silu = LOAD(g, f) * sig;                                                         \
            dg[f] += dy[f] * LOAD(u, f) * sig * (1.0f + LOAD(g, f) * one_minus_sig);               \
            du[f] += dy[f] * silu;                                                                 \
        }                                                                                          \
    }

#define LOAD_F32(p, f) p[f]
#define LOAD_BF16(p, f) loom_bf16_to_f32(p[f])

LOOM_SIMD static void forward_rows(float *out, const float *inp, int F, size_t lo, size_t hi) {
    SWIGLU_FORWARD_BODY(float, LOAD_F32);
}

LOOM_SIMD static void backward_rows(float *dinp, const float *dout, const float *inp, int F,
                                    size_t lo, size_t hi) {
    SWIGLU_BACKWARD_BODY(float, LOAD_F32);
}

LOOM_SIMD static void forward_rows_bf16(float *out, const loom_bf16 *inp, int F, size_t lo,
                                        size_t hi) {
    SWIGLU_FORWARD_BODY(loom_bf16, LOAD_BF16);
}

LOOM_SIMD static void backward_rows_bf16(float *dinp, const float *dout, const loom_bf16 *inp,
                                         int F, size_t lo, size_t hi) {
    SWIGLU_BACKWARD_BODY(loom_bf16, LOAD_BF16);
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

void loom_swiglu_forward_bf16(float *out, const loom_bf16 *inp, int N, int F) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        forward_rows_bf16(out, inp, F, lo, hi);
    }
}

void loom_swiglu_backward_bf16(float *dinp, const float *dout, const loom_bf16 *inp, int N, int F) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        backward_rows_bf16(dinp, dout, inp, F, lo, hi);
    }
}
