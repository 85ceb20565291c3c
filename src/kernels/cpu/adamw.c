/* AdamW in the operation order of PyTorch 1.13's single-tensor torch.optim.AdamW:
 * scalar coefficients in double (as Python computes them), elementwise math in float. */
#include "kernels/kernels.h"

#include <math.h>

void loom_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t) {
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float b1 = beta1, a1 = (float)(1.0 - (double)beta1);
    float b2 = beta2, a2 = (float)(1.0 - (double)beta2);
    double bc1 = 1.0 - pow((double)beta1, t);
    double bc2 = 1.0 - pow((double)beta2, t);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float p = param[i] * decay;
        float mi = m[i] * b1 + a1 * g;
        float vi = v[i] * b2 + a2 * g * g;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = p - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}
