/* LayerNorm and RMSNorm on the GPU: one warp per row, row statistics in double as on the
 * CPU; the weight/bias gradients are column reductions by (32 columns x 16 row lanes)
 * blocks with a fixed summation order (deterministic, no atomics). Activations are T
 * (fp32 or bf16); weights, statistics and weight gradients are fp32. */
#include "kernels/cuda/common.cuh"

#define ROWS_PER_BLOCK 8 /* warps per block, one row each */
#define COL_LANES 16

template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp,
                                         const float *weight, const float *bias, int N, int C,
                                         float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;
    double sum = 0.0;
    for (int c = lane; c < C; c += 32) sum += ld(x + c);
    double mu = warp_sum(sum) / C;
    double var = 0.0; /* two-pass variance, as the CPU */
    for (int c = lane; c < C; c += 32) {
        double d = ld(x + c) - mu;
        var += d * d;
    }
    var = warp_sum(var);
    float m = (float)mu, r = (float)(1.0 / sqrt(var / C + eps));
    for (int c = lane; c < C; c += 32) st(o + c, (ld(x + c) - m) * r * weight[c] + bias[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

template <typename T>
__global__ void layernorm_backward_rows(T *dinp, const T *dout, const T *inp, const float *weight,
                                        const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    T *dx = dinp + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    double sg = 0.0, sgx = 0.0;
    for (int c = lane; c < C; c += 32) {
        float g = ld(dy + c) * weight[c];
        sg += g;
        sgx += g * ((ld(x + c) - m) * r);
    }
    float mg = (float)(warp_sum(sg) / C), mgx = (float)(warp_sum(sgx) / C);
    for (int c = lane; c < C; c += 32) {
        float xhat = (ld(x + c) - m) * r;
        st(dx + c, ld(dx + c) + r * (ld(dy + c) * weight[c] - mg - xhat * mgx));
    }
}

/* dweight[c] += sum_n dy * xhat, dbias[c] += sum_n dy (dbias NULL for RMSNorm, where
 * xhat = x * rstd: mean == NULL). */
template <typename T>
__global__ void norm_backward_cols(float *dweight, float *dbias, const T *dout, const T *inp,
                                   const float *mean, const float *rstd, int N, int C) {
    __shared__ double sw[COL_LANES][33], sb[COL_LANES][33];
    int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    double aw = 0.0, ab = 0.0;
    if (c < C)
        for (int n = y; n < N; n += COL_LANES) {
            float dy = ld(dout + (size_t)n * C + c), x = ld(inp + (size_t)n * C + c);
            float xhat = mean ? (x - mean[n]) * rstd[n] : x * rstd[n];
            aw += dy * xhat;
            ab += dy;
        }
    sw[y][threadIdx.x] = aw;
    sb[y][threadIdx.x] = ab;
    __syncthreads();
    if (y != 0 || c >= C) return;
    for (int k = 1; k < COL_LANES; k++) {
        aw += sw[k][threadIdx.x];
        ab += sb[k][threadIdx.x];
    }
    dweight[c] += (float)aw;
    if (dbias) dbias[c] += (float)ab;
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const float *weight,
                                       int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;
    double ss = 0.0;
    for (int c = lane; c < C; c += 32) {
        double v = ld(x + c);
        ss += v * v;
    }
    float r = (float)(1.0 / sqrt(warp_sum(ss) / C + eps));
    for (int c = lane; c < C; c += 32) st(o + c, ld(x + c) * r * weight[c]);
    if (lane == 0) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_backward_rows(T *dinp, const T *dout, const T *inp, const float *weight,
                                      const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    T *dx = dinp + (size_t)row * C;
    float r = rstd[row];
    double sgx = 0.0;
    for (int c = lane; c < C; c += 32) sgx += (ld(dy + c) * weight[c]) * (ld(x + c) * r);
    float mgx = (float)(warp_sum(sgx) / C);
    for (int c = lane; c < C; c += 32)
        st(dx + c, ld(dx + c) + r * (ld(dy + c) * weight[c] - (ld(x + c) * r) * mgx));
}

static unsigned row_grid(int N) {
    return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}
static dim3 col_grid(int C) {
    return dim3((unsigned)((C + 31) / 32));
}

template <typename T>
static void layernorm_backward(T *dinp, float *dweight, float *dbias, const T *dout, const T *inp,
                               const float *weight, const float *mean, const float *rstd, int N,
                               int C, cudaStream_t s) {
    if (N <= 0) return;
    layernorm_backward_rows<<<row_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(dinp, dout, inp, weight,
                                                                        mean, rstd, N, C);
    norm_backward_cols<<<col_grid(C), dim3(32, COL_LANES), 0, s>>>(dweight, dbias, dout, inp, mean,
                                                                   rstd, N, C);
}

template <typename T>
static void rmsnorm_backward(T *dinp, float *dweight, const T *dout, const T *inp,
                             const float *weight, const float *rstd, int N, int C, cudaStream_t s) {
    if (N <= 0) return;
    rmsnorm_backward_rows<<<row_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(dinp, dout, inp, weight, rstd,
                                                                      N, C);
    norm_backward_cols<<<col_grid(C), dim3(32, COL_LANES), 0, s>>>(
        dweight, (float *)NULL, dout, inp, (const float *)NULL, rstd, N, C);
}

extern "C" {

void loom_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int N, int C, float eps,
                                 cudaStream_t s) {
    if (N <= 0) return;
    layernorm_forward_kernel<<<row_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(out, mean, rstd, inp,
                                                                         weight, bias, N, C, eps);
}
void loom_cuda_layernorm_forward_bf16(loom_bf16 *out, float *mean, float *rstd,
                                      const loom_bf16 *inp, const float *weight, const float *bias,
                                      int N, int C, float eps, cudaStream_t s) {
    if (N <= 0) return;
    layernorm_forward_kernel<<<row_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(
        as_bf16(out), mean, rstd, as_bf16(inp), weight, bias, N, C, eps);
}
void loom_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int N, int C, cudaStream_t s) {
    layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, s);
}
void loom_cuda_layernorm_backward_bf16(loom_bf16 *dinp, float *dweight, float *dbias,
                                       const loom_bf16 *dout, const loom_bf16 *inp,
                                       const float *weight, const float *mean, const float *rstd,
                                       int N, int C, cudaStream_t s) {
    layernorm_backward(as_bf16(dinp), dweight, dbias, as_bf16(dout), as_bf16(inp), weight, mean,
                       rstd, N, C, s);
}

void loom_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                               int N, int C, float eps, cudaStream_t s) {
    if (N <= 0) return;
    rmsnorm_forward_kernel<<<row_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(out, rstd, inp, weight, N, C,
                                                                       eps);
}
void loom_cuda_rmsnorm_forward_bf16(loom_bf16 *out, float *rstd, const loom_bf16 *inp,
                                    const float *weight, int N, int C, float eps, cudaStream_t s) {
    if (N <= 0) return;
    rmsnorm_forward_kernel<<<row_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(
        as_bf16(out), rstd, as_bf16(inp), weight, N, C, eps);
}
void loom_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, const float *rstd, int N, int C,
                                cudaStream_t s) {
    rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, s);
}
void loom_cuda_rmsnorm_backward_bf16(loom_bf16 *dinp, float *dweight, const loom_bf16 *dout,
                                     const loom_bf16 *inp, const float *weight, const float *rstd,
                                     int N, int C, cudaStream_t s) {
    rmsnorm_backward(as_bf16(dinp), dweight, as_bf16(dout), as_bf16(inp), weight, rstd, N, C, s);
}

} /* extern "C" */
