/* Token + position embedding and its backward over a vocabulary shard [v0, v0 + V) (the
 * unsharded case is v0 = 0). The dwte scatter-add is one thread per channel walking the
 * tokens in order: no atomics, so repeated tokens sum in a fixed order (deterministic). */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const float *wte,
                                         const float *wpe, int v0, int V, int B, int T_, int C) {
    size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C, c = i % C;
        int tok = tokens[bt] - v0;
        float e = tok >= 0 && tok < V ? wte[(size_t)tok * C + c] : 0.0f;
        if (wpe) e += wpe[(bt % T_) * C + c];
        st(out + i, e);
    }
}

template <typename T>
__global__ void embedding_backward_wte(float *dwte, const T *dout, const int32_t *tokens, int v0,
                                       int V, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int bt = 0; bt < N; bt++) {
        int tok = tokens[bt] - v0;
        if (tok < 0 || tok >= V) continue;
        dwte[(size_t)tok * C + c] += ld(dout + (size_t)bt * C + c);
    }
}

template <typename T>
__global__ void embedding_backward_wpe(float *dwpe, const T *dout, int B, int T_, int C) {
    size_t n = (size_t)T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C, c = i % C;
        float acc = 0.0f;
        for (int b = 0; b < B; b++) acc += ld(dout + ((size_t)b * T_ + t) * C + c);
        dwpe[i] += acc;
    }
}

template <typename T>
static void embedding_backward(float *dwte, float *dwpe, const T *dout, const int32_t *tokens,
                               int v0, int V, int B, int T_, int C, cudaStream_t s) {
    if (B * T_ <= 0 || C <= 0) return;
    embedding_backward_wte<<<(C + 127) / 128, 128, 0, s>>>(dwte, dout, tokens, v0, V, B * T_, C);
    if (dwpe)
        embedding_backward_wpe<<<grid_for((size_t)T_ * C, 256), 256, 0, s>>>(dwpe, dout, B, T_, C);
}

extern "C" {

void loom_cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                                 const float *wpe, int v0, int V, int B, int T, int C,
                                 cudaStream_t s) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    embedding_forward_kernel<<<grid_for(n, 256), 256, 0, s>>>(out, tokens, wte, wpe, v0, V, B, T,
                                                              C);
}
void loom_cuda_embedding_forward_bf16(loom_bf16 *out, const int32_t *tokens, const float *wte,
                                      const float *wpe, int v0, int V, int B, int T, int C,
                                      cudaStream_t s) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    embedding_forward_kernel<<<grid_for(n, 256), 256, 0, s>>>(as_bf16(out), tokens, wte, wpe, v0, V,
                                                              B, T, C);
}
void loom_cuda_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int v0, int V, int B, int T, int C,
                                  cudaStream_t s) {
    embedding_backward(dwte, dwpe, dout, tokens, v0, V, B, T, C, s);
}
void loom_cuda_embedding_backward_bf16(float *dwte, float *dwpe, const loom_bf16 *dout,
                                       const int32_t *tokens, int v0, int V, int B, int T, int C,
                                       cudaStream_t s) {
    embedding_backward(dwte, dwpe, as_bf16(dout), tokens, v0, V, B, T, C, s);
}

} /* extern "C" */
