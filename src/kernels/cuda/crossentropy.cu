/* Fused softmax + cross-entropy, one block per row: row max, sum of exp(x - max) in
 * double (as the CPU), loss = max + log(sum) - x[target]. The _backward variant
 * overwrites the logits with (softmax - onehot) * dloss, recomputing each exponential
 * from the logit it replaces (so bf16 logits do not round the probabilities twice). */
#include "kernels/cuda/common.cuh"

#define CE_BLOCK 512

template <typename T>
__global__ void crossentropy_kernel(float *losses, T *logits, const int32_t *targets, int V,
                                    float dloss, int backward) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    T *x = logits + (size_t)blockIdx.x * V;
    int tgt = targets[blockIdx.x];
    float xt = ld(x + tgt);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, ld(x + j));
    m = block_max(m, shf);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(ld(x + j) - m);
    sum = block_sum(sum, shd); /* ends with every thread past a barrier: xt already read */
    if (threadIdx.x == 0) losses[blockIdx.x] = (float)((double)m + log(sum) - (double)xt);
    if (!backward) return;
    float s = (float)(dloss / sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(ld(x + j) - m) * s;
        st(x + j, j == tgt ? p - dloss : p);
    }
}

extern "C" {

void loom_cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                    int N, int V, cudaStream_t s) {
    if (N <= 0) return;
    crossentropy_kernel<<<N, CE_BLOCK, 0, s>>>(losses, (float *)logits, targets, V, 0.0f, 0);
}
void loom_cuda_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                             int N, int V, float dloss, cudaStream_t s) {
    if (N <= 0) return;
    crossentropy_kernel<<<N, CE_BLOCK, 0, s>>>(losses, logits, targets, V, dloss, 1);
}
void loom_cuda_crossentropy_forward_bf16(float *losses, const loom_bf16 *logits,
                                         const int32_t *targets, int N, int V, cudaStream_t s) {
    if (N <= 0) return;
    crossentropy_kernel<<<N, CE_BLOCK, 0, s>>>(losses, (bf16 *)as_bf16(logits), targets, V, 0.0f,
                                               0);
}
void loom_cuda_crossentropy_forward_backward_bf16(float *losses, loom_bf16 *logits,
                                                  const int32_t *targets, int N, int V, float dloss,
                                                  cudaStream_t s) {
    if (N <= 0) return;
    crossentropy_kernel<<<N, CE_BLOCK, 0, s>>>(losses, as_bf16(logits), targets, V, dloss, 1);
}

} /* extern "C" */
