/* AdamW on fp32 master weights and fp32 m/v, in the operation order of
 * kernels/cpu/adamw.c (PyTorch's single-tensor AdamW): scalar coefficients in double on
 * the host exactly as the CPU computes them, elementwise math in float with explicitly
 * rounded intrinsics, so nvcc cannot contract a*b+c into an FMA (the CPU build has
 * contraction off) and each element gets the CPU's result. */
#include <math.h>

#include "kernels/cuda/common.cuh"

typedef struct {
    float decay, b1, a1, b2, a2, step_size, bc2_sqrt, eps;
} adamw_coeffs;

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             adamw_coeffs c) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        float p = __fmul_rn(param[i], c.decay);
        float mi = __fadd_rn(__fmul_rn(m[i], c.b1), __fmul_rn(c.a1, g));
        float vi = __fadd_rn(__fmul_rn(v[i], c.b2), __fmul_rn(__fmul_rn(c.a2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        param[i] = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" void loom_cuda_adamw_update(float *param, const float *grad, float *m, float *v,
                                       size_t n, float lr, float beta1, float beta2, float eps,
                                       float weight_decay, int t, cudaStream_t s) {
    if (n == 0) return;
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
    adamw_kernel<<<grid_for(n, 256), 256, 0, s>>>(param, grad, m, v, n, c);
}
