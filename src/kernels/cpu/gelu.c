/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#include "kernels/kernels.h"

#include <math.h>

#define LOOM_GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define LOOM_GELU_K 0.044715f

void loom_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(LOOM_GELU_S * (x + LOOM_GELU_K * x * x * x)));
    }
}

void loom_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanhf(LOOM_GELU_S * (x + LOOM_GELU_K * x * x * x));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * LOOM_GELU_S * (1.0f + 3.0f * LOOM_GELU_K * x * x);
        dinp[i] += local * dout[i];
    }
}
