/* Elementwise kernels: fp32 <-> bf16, GELU (tanh), SwiGLU, residual add, scaling and the
 * sum of squares for gradient clipping. Formulas follow kernels/cpu/ term by term. The
 * GELU and SwiGLU kernels take the input's type (TI) apart from the output's (TO): the
 * fp32 ops, the all-bf16 ones, and the bf16-input fp32-output ones of the backend table's
 * --precision bf16 (kernels/backend_bf16.h), which run the fp32 instantiation's arithmetic
 * on the exactly widened input. */
#include "kernels/cuda/common.cuh"

#define LOOM_GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define LOOM_GELU_K 0.044715f
#define EW_BLOCK 256

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

template <typename A, typename B> __global__ void convert_kernel(A *out, const B *inp, size_t n) {
    GRID_STRIDE(i, n) st(out + i, ld(inp + i));
}

/* x = widen(round_bf16(x)): the fp32 value of x's bf16 (loom's rule, common.cuh). */
__global__ void round_values_kernel(float *x, size_t n) {
    GRID_STRIDE(i, n) x[i] = __uint_as_float((unsigned)bf16_bits_rne(x[i]) << 16);
}

template <typename TO, typename TI>
__global__ void gelu_forward_kernel(TO *out, const TI *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = ld(inp + i);
        float u = LOOM_GELU_S * (x + LOOM_GELU_K * x * x * x);
        st(out + i, x / (1.0f + expf(-2.0f * u)));
    }
}

/* d gelu / dx at x (the CPU's GELU_BACKWARD_BODY) */
__device__ __forceinline__ float gelu_local_grad(float x) {
    float u = LOOM_GELU_S * (x + LOOM_GELU_K * x * x * x);
    float e = expf(-2.0f * u);
    float sig = 1.0f / (1.0f + e), one_minus_sig = e * sig;
    float du = LOOM_GELU_S * (1.0f + 3.0f * LOOM_GELU_K * x * x);
    return sig + 2.0f * x * sig * one_minus_sig * du;
}

template <typename TO, typename TI>
__global__ void gelu_backward_kernel(TO *dinp, const TI *inp, const TO *dout, size_t n) {
    GRID_STRIDE(i, n) st(dinp + i, ld(dinp + i) + gelu_local_grad(ld(inp + i)) * ld(dout + i));
}

/* In place: d = 0 + local * d, the accumulation into a zeroed dinp (kernels.h). */
__global__ void gelu_backward_inplace_kernel(float *d, const bf16 *inp, size_t n) {
    GRID_STRIDE(i, n) d[i] = 0.0f + gelu_local_grad(ld(inp + i)) * d[i];
}

template <typename TO, typename TI>
__global__ void swiglu_forward_kernel(TO *out, const TI *inp, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, f = i % F;
        float g = ld(inp + r * 2 * F + f), u = ld(inp + r * 2 * F + F + f);
        st(out + i, g / (1.0f + expf(-g)) * u);
    }
}

template <typename TO, typename TI>
__global__ void swiglu_backward_kernel(TO *dinp, const TO *dout, const TI *inp, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, f = i % F;
        size_t gi = r * 2 * F + f, ui = gi + F;
        float g = ld(inp + gi), u = ld(inp + ui), dy = ld(dout + i);
        float e = expf(-g);
        float sig = 1.0f / (1.0f + e), one_minus_sig = e * sig;
        float silu = g * sig;
        st(dinp + gi, ld(dinp + gi) + dy * u * sig * (1.0f + g * one_minus_sig));
        st(dinp + ui, ld(dinp + ui) + dy * silu);
    }
}

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) st(out + i, ld(a + i) + ld(b + i));
}

__global__ void scale_kernel(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}

/* Fixed grid of LOOM_CUDA_SUMSQ_BLOCKS blocks, each a fixed slice: deterministic. */
__global__ void sumsq_partial_kernel(double *partial, const float *x, size_t n) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * x[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sumsq_final_kernel(double *out, const double *partial, int np) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) *out = acc;
}

extern "C" {

void loom_cuda_f32_to_bf16(loom_bf16 *out, const float *inp, size_t n, cudaStream_t s) {
    convert_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(as_bf16(out), inp, n);
}
void loom_cuda_bf16_to_f32(float *out, const loom_bf16 *inp, size_t n, cudaStream_t s) {
    convert_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(out, as_bf16(inp), n);
}

void loom_cuda_gelu_forward(float *out, const float *inp, size_t n, cudaStream_t s) {
    gelu_forward_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(out, inp, n);
}
void loom_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                             cudaStream_t s) {
    gelu_backward_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(dinp, inp, dout, n);
}
void loom_cuda_gelu_forward_bf16(loom_bf16 *out, const loom_bf16 *inp, size_t n, cudaStream_t s) {
    gelu_forward_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(as_bf16(out), as_bf16(inp), n);
}
void loom_cuda_gelu_backward_bf16(loom_bf16 *dinp, const loom_bf16 *inp, const loom_bf16 *dout,
                                  size_t n, cudaStream_t s) {
    gelu_backward_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(as_bf16(dinp), as_bf16(inp),
                                                                    as_bf16(dout), n);
}

void loom_cuda_swiglu_forward(float *out, const float *inp, int N, int F, cudaStream_t s) {
    swiglu_forward_kernel<<<grid_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, s>>>(out, inp, N, F);
}
void loom_cuda_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F,
                               cudaStream_t s) {
    swiglu_backward_kernel<<<grid_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, s>>>(dinp, dout, inp,
                                                                                  N, F);
}
void loom_cuda_swiglu_forward_bf16(loom_bf16 *out, const loom_bf16 *inp, int N, int F,
                                   cudaStream_t s) {
    swiglu_forward_kernel<<<grid_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, s>>>(
        as_bf16(out), as_bf16(inp), N, F);
}
void loom_cuda_swiglu_backward_bf16(loom_bf16 *dinp, const loom_bf16 *dout, const loom_bf16 *inp,
                                    int N, int F, cudaStream_t s) {
    swiglu_backward_kernel<<<grid_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, s>>>(
        as_bf16(dinp), as_bf16(dout), as_bf16(inp), N, F);
}

/* The bf16-input, fp32-output variants (kernels/backend.h's *_in_bf16 ops). */
void loom_cuda_gelu_forward_in_bf16(float *out, const loom_bf16 *inp, size_t n, cudaStream_t s) {
    gelu_forward_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(out, as_bf16(inp), n);
}
void loom_cuda_gelu_backward_in_bf16(float *dinp, const loom_bf16 *inp, const float *dout, size_t n,
                                     cudaStream_t s) {
    gelu_backward_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(dinp, as_bf16(inp), dout, n);
}
void loom_cuda_gelu_backward_in_bf16_inplace(float *d, const loom_bf16 *inp, size_t n,
                                             cudaStream_t s) {
    gelu_backward_inplace_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(d, as_bf16(inp), n);
}
void loom_cuda_swiglu_forward_in_bf16(float *out, const loom_bf16 *inp, int N, int F,
                                      cudaStream_t s) {
    swiglu_forward_kernel<<<grid_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, s>>>(out, as_bf16(inp),
                                                                                 N, F);
}
void loom_cuda_swiglu_backward_in_bf16(float *dinp, const float *dout, const loom_bf16 *inp, int N,
                                       int F, cudaStream_t s) {
    swiglu_backward_kernel<<<grid_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, s>>>(
        dinp, dout, as_bf16(inp), N, F);
}
void loom_cuda_bf16_round_values(float *x, size_t n, cudaStream_t s) {
    round_values_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(x, n);
}

void loom_cuda_add(float *out, const float *a, const float *b, size_t n, cudaStream_t s) {
    add_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(out, a, b, n);
}
void loom_cuda_add_bf16(loom_bf16 *out, const loom_bf16 *a, const loom_bf16 *b, size_t n,
                        cudaStream_t s) {
    add_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(as_bf16(out), as_bf16(a), as_bf16(b), n);
}

void loom_cuda_scale(float *x, float scale, size_t n, cudaStream_t s) {
    scale_kernel<<<grid_for(n, EW_BLOCK), EW_BLOCK, 0, s>>>(x, scale, n);
}

void loom_cuda_sum_squares(double *out, double *scratch, const float *x, size_t n, cudaStream_t s) {
    sumsq_partial_kernel<<<LOOM_CUDA_SUMSQ_BLOCKS, EW_BLOCK, 0, s>>>(scratch, x, n);
    sumsq_final_kernel<<<1, EW_BLOCK, 0, s>>>(out, scratch, LOOM_CUDA_SUMSQ_BLOCKS);
}

} /* extern "C" */
