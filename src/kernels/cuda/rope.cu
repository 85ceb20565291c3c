/* RoPE, Hugging Face "rotate_half" convention, in place on the H query and KV key heads
 * of each qkv row (value heads untouched). Angles in double, as on the CPU. Backward is
 * the rotation by -angle (the transpose of an orthogonal rotation). */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void rope_kernel(T *x, int B, int T_, int H, int KV, int hd, float theta, float sign,
                            int pos0) {
    int half = hd / 2, heads = H + KV;
    size_t row = (size_t)(H + 2 * KV) * hd;
    size_t n = (size_t)B * T_ * heads * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int k = (int)(i % half);
        size_t rest = i / half;
        int h = (int)(rest % heads);
        size_t bt = rest / heads;
        int t = (int)(bt % T_);
        double inv_freq = pow((double)theta, -2.0 * k / hd);
        double ang = (double)(pos0 + t) * inv_freq;
        float cs = (float)cos(ang), sn = sign * (float)sin(ang);
        T *lo = x + bt * row + (size_t)h * hd + k, *hi = lo + half;
        float a = ld(lo), c = ld(hi);
        st(lo, a * cs - c * sn);
        st(hi, c * cs + a * sn);
    }
}

template <typename T>
static void rope(T *x, int B, int T_, int H, int KV, int hd, float theta, float sign, int pos0,
                 cudaStream_t s) {
    size_t n = (size_t)B * T_ * (H + KV) * (hd / 2);
    if (n == 0) return;
    rope_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, B, T_, H, KV, hd, theta, sign, pos0);
}

extern "C" {

void loom_cuda_rope_forward(float *qkv, int B, int T, int H, int KV, int hd, float theta, int pos0,
                            cudaStream_t s) {
    rope(qkv, B, T, H, KV, hd, theta, 1.0f, pos0, s);
}
void loom_cuda_rope_backward(float *dqkv, int B, int T, int H, int KV, int hd, float theta,
                             cudaStream_t s) {
    rope(dqkv, B, T, H, KV, hd, theta, -1.0f, 0, s);
}
void loom_cuda_rope_backward_at(float *dqkv, int B, int T, int H, int KV, int hd, float theta,
                                int pos0, cudaStream_t s) {
    rope(dqkv, B, T, H, KV, hd, theta, -1.0f, pos0, s);
}
void loom_cuda_rope_forward_bf16(loom_bf16 *qkv, int B, int T, int H, int KV, int hd, float theta,
                                 int pos0, cudaStream_t s) {
    rope(as_bf16(qkv), B, T, H, KV, hd, theta, 1.0f, pos0, s);
}
void loom_cuda_rope_backward_bf16(loom_bf16 *dqkv, int B, int T, int H, int KV, int hd, float theta,
                                  cudaStream_t s) {
    rope(as_bf16(dqkv), B, T, H, KV, hd, theta, -1.0f, 0, s);
}

} /* extern "C" */
