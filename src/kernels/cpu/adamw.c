/* AdamW in the operation order of PyTorch 1.13's single-tensor torch.optim.AdamW:
 * scalar coefficients in double (as Python computes them), elementwise math in float. */
#include "kernels/kernels.h"

#include <math.h>

#include "vecmath.h"

typedef struct {
    float decay, b1, a1, b2, a2, step_size, bc2_sqrt, eps;
} adamw_coeffs;

LOOM_SIMD static void update_range(float *restrict param, const float *restrict grad,
                                   float *restrict m, float *restrict v, adamw_coeffs c, size_t lo,
                                   size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        float g = grad[i];
        float p = param[i] * c.decay;
        float mi = m[i] * c.b1 + c.a1 * g;
        float vi = v[i] * c.b2 + c.a2 * g * g;
        float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
        param[i] = p - c.step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void loom_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t) {
    double bc1 = 1.0 - pow((double)beta1, t);
    double bc2 = 1.0 - pow((double)beta2, t);
    adamw_coeffs c = {(float)(1.0 - (double)lr * weight_decay),
                      beta1,
                      (float)(1.0 - (double)beta1),
                      beta2,
                      (float)(1.0 - (double)beta2),
                      (float)((double)lr / bc1),
                      (float)sqrt(bc2),
                      eps};
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range(n, &lo, &hi);
        update_range(param, grad, m, v, c, lo, hi);
    }
}
