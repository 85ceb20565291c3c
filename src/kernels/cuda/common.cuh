/* Helpers shared by the CUDA kernels: element loads/stores for fp32 and bf16 (math is
 * always fp32), grid sizing, warp and block reductions in a fixed order (results do not
 * depend on timing, so runs are bitwise reproducible). */
#ifndef LOOM_KERNELS_CUDA_COMMON_CUH
#define LOOM_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#include "kernels/cuda/kernels_cuda.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float ld(const float *p) {
    return *p;
}
/* bf16 -> fp32 by a shift (kernels/bf16.h's loom_bf16_to_f32): exact for every pattern,
 * NaN payloads included (sm_90's __bfloat162float is a cvt, which need not keep them). */
__device__ __forceinline__ float ld(const bf16 *p) {
    return __uint_as_float((unsigned)__bfloat16_as_ushort(*p) << 16);
}
__device__ __forceinline__ void st(float *p, float x) {
    *p = x;
}
/* fp32 -> bf16 bits by loom's rule (kernels/bf16.h: loom_bf16_from_f32), bit for bit the
 * CPU's: round to nearest even by integer addition; +-inf kept; NaN kept and made quiet
 * (top bits, quiet bit 0x0040 set); fp32 zeros and subnormals to a zero of the same sign
 * (where __float2bfloat16_rn would keep a bf16 subnormal and return one canonical NaN). */
__device__ __forceinline__ unsigned short bf16_bits_rne(float x) {
    unsigned u = __float_as_uint(x);
    const unsigned e = u & 0x7F800000u;
    if (e == 0x7F800000u) return (unsigned short)((u >> 16) | ((u & 0x007FFFFFu) ? 0x0040u : 0u));
    if (e == 0) return (unsigned short)((u >> 16) & 0x8000u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
/* Every bf16 store of these kernels rounds by that rule. */
__device__ __forceinline__ void st(bf16 *p, float x) {
    *p = __ushort_as_bfloat16(bf16_bits_rne(x));
}

/* loom_bf16 (the public bit pattern) as the device type. */
static inline bf16 *as_bf16(loom_bf16 *p) {
    return reinterpret_cast<bf16 *>(p);
}
static inline const bf16 *as_bf16(const loom_bf16 *p) {
    return reinterpret_cast<const bf16 *>(p);
}

static inline unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    const size_t cap = 65535u * 32u; /* grid-stride loops cover the rest */
    return (unsigned)(g < 1 ? 1 : (g > cap ? cap : g));
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double warp_sum(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
template <typename R> __device__ R block_sum(R x, R *shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads(); /* shared32 may still be read from a previous call */
    if (lane == 0) shared32[warp] = x;
    __syncthreads();
    R t = lane < nw ? shared32[lane] : (R)0;
    return warp_sum(t);
}

__device__ __forceinline__ float block_max(float x, float *shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) shared32[warp] = x;
    __syncthreads();
    float t = lane < nw ? shared32[lane] : -INFINITY;
    return warp_max(t);
}

#endif
