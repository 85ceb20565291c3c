/* Causal attention (GQA) as fused flash-attention-style kernels with an online softmax:
 * no T x T matrix exists anywhere. A block owns ROWS consecutive query rows of one
 * (batch, head), one warp per row, and streams key/value tiles of TILE rows through
 * shared memory; lane j scores key j of the tile, the warp keeps the running max and
 * sum, and lane d accumulates output dims d, d+32, ... Forward saves lse per row.
 * Backward (FlashAttention-2 style) recomputes P = exp(S - lse) from lse:
 *   1. D_i = dot(dO_i, O_i) per query row (into scratch);
 *   2. dQ: per query row, over its keys: dS = scale * P * (dO V^T - D), dQ += dS K;
 *   3. dK, dV: per key row of a key/value head, over every query row of every query head
 *      of its group: dV += P^T dO, dK += dS^T Q.
 * Each output row is written by exactly one warp (no atomics): deterministic. The
 * arithmetic is fp32 for fp32 and bf16 inputs. These kernels are correct-first CUDA-core
 * code; a tensor-core (wgmma/mma) version is future work. */
#include "kernels/cuda/common.cuh"

#define ROWS 8  /* warps per block: query (or key) rows per block */
#define TILE 32 /* key (or query) rows per shared-memory tile: one per lane */
#define NPL (LOOM_CUDA_ATTN_MAX_HD / 32) /* output dims per lane */

typedef struct {
    int B, T, H, KV, hd;
    size_t R, OC; /* qkv and out row strides */
    float scale;
} attn_shape;

static attn_shape shape_make(int B, int T, int H, int KV, int hd) {
    attn_shape a = {B,
                    T,
                    H,
                    KV,
                    hd,
                    (size_t)(H + 2 * KV) * hd,
                    (size_t)H * hd,
                    (float)(1.0 / sqrt((double)hd))};
    return a;
}

static __host__ __device__ int ks_stride(int hd) {
    return hd | 1;
} /* odd row stride: lane-per-row reads spread over banks */

/* Loads rows [r0, r0 + TILE) (those < T) of one head slice into tile[TILE][KS]. */
template <typename T>
__device__ void load_tile(float *tile, const T *base, size_t stride, int r0, int T_, int hd,
                          int KS) {
    for (int e = threadIdx.x; e < TILE * hd; e += blockDim.x) {
        int r = e / hd, d = e % hd;
        tile[r * KS + d] = r0 + r < T_ ? ld(base + (size_t)(r0 + r) * stride + d) : 0.0f;
    }
}

__device__ __forceinline__ float dot_row(const float *a, const float *b, int hd) {
    float acc = 0.0f;
    for (int d = 0; d < hd; d++) acc += a[d] * b[d];
    return acc;
}

template <typename T>
__global__ void attn_forward_kernel(T *out, float *lse, const T *qkv, attn_shape a) {
    extern __shared__ float sm[];
    const int KS = ks_stride(a.hd), hd = a.hd;
    float *Ks = sm, *Vs = Ks + TILE * KS, *Qs = Vs + TILE * KS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.y / a.H, h = blockIdx.y % a.H, kvh = h / (a.H / a.KV);
    int i = blockIdx.x * ROWS + warp;
    int last = min(a.T, (int)(blockIdx.x + 1) * ROWS) - 1; /* last query row of the block */
    const T *base = qkv + (size_t)b * a.T * a.R;
    const T *kb = base + (size_t)(a.H + kvh) * hd, *vb = base + (size_t)(a.H + a.KV + kvh) * hd;
    float *q = Qs + warp * hd;
    if (i < a.T)
        for (int d = lane; d < hd; d += 32) q[d] = ld(base + (size_t)i * a.R + (size_t)h * hd + d);
    float m = -INFINITY, l = 0.0f, o[NPL];
#pragma unroll
    for (int u = 0; u < NPL; u++) o[u] = 0.0f;
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        __syncthreads();
        load_tile(Ks, kb, a.R, j0, a.T, hd, KS);
        load_tile(Vs, vb, a.R, j0, a.T, hd, KS);
        __syncthreads();
        if (i >= a.T || j0 > i) continue;
        int j = j0 + lane;
        float s = j <= i ? a.scale * dot_row(q, Ks + lane * KS, hd) : -INFINITY;
        float m_new = fmaxf(m, warp_max(s));
        float p = j <= i ? expf(s - m_new) : 0.0f;
        float corr = expf(m - m_new); /* 0 on the first tile (m = -inf) */
        l = l * corr + warp_sum(p);
        int nj = min(TILE, i - j0 + 1);
#pragma unroll
        for (int u = 0; u < NPL; u++) o[u] *= corr;
        for (int jj = 0; jj < nj; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
            for (int u = 0; u < NPL; u++) {
                int d = lane + 32 * u;
                if (d < hd) o[u] += pj * Vs[jj * KS + d];
            }
        }
        m = m_new;
    }
    if (i >= a.T) return;
    T *orow = out + ((size_t)b * a.T + i) * a.OC + (size_t)h * hd;
    float inv = 1.0f / l;
#pragma unroll
    for (int u = 0; u < NPL; u++) {
        int d = lane + 32 * u;
        if (d < hd) st(orow + d, o[u] * inv);
    }
    if (lane == 0) lse[((size_t)b * a.H + h) * a.T + i] = m + logf(l);
}

/* D[b, h, i] = dot(dout row, out row) of head h; one warp per row. */
template <typename T>
__global__ void attn_delta_kernel(float *D, const T *dout, const T *out, attn_shape a) {
    size_t row = (size_t)blockIdx.x * ROWS + (threadIdx.x >> 5); /* over B*H*T rows */
    int lane = threadIdx.x & 31;
    if (row >= (size_t)a.B * a.H * a.T) return;
    int i = (int)(row % a.T);
    size_t bh = row / a.T;
    int b = (int)(bh / a.H), h = (int)(bh % a.H);
    size_t off = ((size_t)b * a.T + i) * a.OC + (size_t)h * a.hd;
    float acc = 0.0f;
    for (int d = lane; d < a.hd; d += 32) acc += ld(dout + off + d) * ld(out + off + d);
    acc = warp_sum(acc);
    if (lane == 0) D[row] = acc;
}

template <typename T>
__global__ void attn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                               const float *D, attn_shape a) {
    extern __shared__ float sm[];
    const int KS = ks_stride(a.hd), hd = a.hd;
    float *Ks = sm, *Vs = Ks + TILE * KS, *Qs = Vs + TILE * KS, *dOs = Qs + ROWS * hd;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.y / a.H, h = blockIdx.y % a.H, kvh = h / (a.H / a.KV);
    int i = blockIdx.x * ROWS + warp;
    int last = min(a.T, (int)(blockIdx.x + 1) * ROWS) - 1;
    const T *base = qkv + (size_t)b * a.T * a.R;
    const T *kb = base + (size_t)(a.H + kvh) * hd, *vb = base + (size_t)(a.H + a.KV + kvh) * hd;
    float *q = Qs + warp * hd, *dy = dOs + warp * hd;
    float li = 0.0f, Di = 0.0f;
    if (i < a.T) {
        for (int d = lane; d < hd; d += 32) {
            q[d] = ld(base + (size_t)i * a.R + (size_t)h * hd + d);
            dy[d] = ld(dout + ((size_t)b * a.T + i) * a.OC + (size_t)h * hd + d);
        }
        size_t r = ((size_t)b * a.H + h) * a.T + i;
        li = lse[r];
        Di = D[r];
    }
    float dq[NPL];
#pragma unroll
    for (int u = 0; u < NPL; u++) dq[u] = 0.0f;
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        __syncthreads();
        load_tile(Ks, kb, a.R, j0, a.T, hd, KS);
        load_tile(Vs, vb, a.R, j0, a.T, hd, KS);
        __syncthreads();
        if (i >= a.T || j0 > i) continue;
        int j = j0 + lane;
        float ds = 0.0f;
        if (j <= i) {
            float p = expf(a.scale * dot_row(q, Ks + lane * KS, hd) - li);
            float dp = dot_row(dy, Vs + lane * KS, hd);
            ds = a.scale * p * (dp - Di);
        }
        int nj = min(TILE, i - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
            for (int u = 0; u < NPL; u++) {
                int d = lane + 32 * u;
                if (d < hd) dq[u] += dsj * Ks[jj * KS + d];
            }
        }
    }
    if (i >= a.T) return;
    T *row = dqkv + ((size_t)b * a.T + i) * a.R + (size_t)h * hd;
#pragma unroll
    for (int u = 0; u < NPL; u++) {
        int d = lane + 32 * u;
        if (d < hd) st(row + d, ld(row + d) + dq[u]);
    }
}

template <typename T>
__global__ void attn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                                const float *D, attn_shape a) {
    extern __shared__ float sm[];
    const int KS = ks_stride(a.hd), hd = a.hd;
    float *Qs = sm, *dOs = Qs + TILE * KS, *kw = dOs + TILE * KS, *vw = kw + ROWS * hd;
    float *ls = vw + ROWS * hd, *Ds = ls + TILE;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.y / a.KV, g = blockIdx.y % a.KV, group = a.H / a.KV;
    int j = blockIdx.x * ROWS + warp;
    int first = blockIdx.x * ROWS; /* first key row of the block: queries i >= first */
    const T *base = qkv + (size_t)b * a.T * a.R;
    float *k = kw + warp * hd, *v = vw + warp * hd;
    if (j < a.T)
        for (int d = lane; d < hd; d += 32) {
            k[d] = ld(base + (size_t)j * a.R + (size_t)(a.H + g) * hd + d);
            v[d] = ld(base + (size_t)j * a.R + (size_t)(a.H + a.KV + g) * hd + d);
        }
    float dk[NPL], dv[NPL];
#pragma unroll
    for (int u = 0; u < NPL; u++) dk[u] = dv[u] = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) {
        const T *qb = base + (size_t)h * hd;
        const T *ob = dout + (size_t)b * a.T * a.OC + (size_t)h * hd;
        const float *lrow = lse + ((size_t)b * a.H + h) * a.T,
                    *Drow = D + ((size_t)b * a.H + h) * a.T;
        for (int i0 = first; i0 < a.T; i0 += TILE) {
            __syncthreads();
            load_tile(Qs, qb, a.R, i0, a.T, hd, KS);
            load_tile(dOs, ob, a.OC, i0, a.T, hd, KS);
            if (threadIdx.x < TILE) {
                int r = i0 + threadIdx.x;
                ls[threadIdx.x] = r < a.T ? lrow[r] : 0.0f;
                Ds[threadIdx.x] = r < a.T ? Drow[r] : 0.0f;
            }
            __syncthreads();
            if (j >= a.T || i0 + TILE - 1 < j) continue;
            int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i >= j && i < a.T) {
                p = expf(a.scale * dot_row(Qs + lane * KS, k, hd) - ls[lane]);
                float dp = dot_row(dOs + lane * KS, v, hd);
                ds = a.scale * p * (dp - Ds[lane]);
            }
            int ii0 = max(0, j - i0), ii1 = min(TILE, a.T - i0);
            for (int ii = ii0; ii < ii1; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
                for (int u = 0; u < NPL; u++) {
                    int d = lane + 32 * u;
                    if (d < hd) {
                        dv[u] += pi * dOs[ii * KS + d];
                        dk[u] += dsi * Qs[ii * KS + d];
                    }
                }
            }
        }
    }
    if (j >= a.T) return;
    T *krow = dqkv + ((size_t)b * a.T + j) * a.R + (size_t)(a.H + g) * hd;
    T *vrow = dqkv + ((size_t)b * a.T + j) * a.R + (size_t)(a.H + a.KV + g) * hd;
#pragma unroll
    for (int u = 0; u < NPL; u++) {
        int d = lane + 32 * u;
        if (d < hd) {
            st(krow + d, ld(krow + d) + dk[u]);
            st(vrow + d, ld(vrow + d) + dv[u]);
        }
    }
}

/* Dynamic shared memory above 48 KiB must be opted into per kernel. */
template <typename K> static void smem_opt_in(K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

static unsigned row_blocks(int T) {
    return (unsigned)((T + ROWS - 1) / ROWS);
}

template <typename T>
static void attention_forward(T *out, float *lse, const T *qkv, int B, int T_, int H, int KV,
                              int hd, cudaStream_t s) {
    if (B * T_ * H <= 0 || hd <= 0 || hd > LOOM_CUDA_ATTN_MAX_HD) return;
    attn_shape a = shape_make(B, T_, H, KV, hd);
    size_t smem = (2 * (size_t)TILE * ks_stride(hd) + (size_t)ROWS * hd) * sizeof(float);
    smem_opt_in(attn_forward_kernel<T>, smem);
    attn_forward_kernel<T><<<dim3(row_blocks(T_), B * H), 32 * ROWS, smem, s>>>(out, lse, qkv, a);
}

template <typename T>
static void attention_backward(T *dqkv, float *D, const T *dout, const T *qkv, const T *out,
                               const float *lse, int B, int T_, int H, int KV, int hd,
                               cudaStream_t s) {
    if (B * T_ * H <= 0 || hd <= 0 || hd > LOOM_CUDA_ATTN_MAX_HD) return;
    attn_shape a = shape_make(B, T_, H, KV, hd);
    size_t rows = (size_t)B * H * T_;
    attn_delta_kernel<T>
        <<<(unsigned)((rows + ROWS - 1) / ROWS), 32 * ROWS, 0, s>>>(D, dout, out, a);
    size_t tiles = 2 * (size_t)TILE * ks_stride(hd) + 2 * (size_t)ROWS * hd;
    size_t smem_dq = tiles * sizeof(float), smem_dkv = (tiles + 2 * TILE) * sizeof(float);
    smem_opt_in(attn_dq_kernel<T>, smem_dq);
    smem_opt_in(attn_dkv_kernel<T>, smem_dkv);
    attn_dq_kernel<T>
        <<<dim3(row_blocks(T_), B * H), 32 * ROWS, smem_dq, s>>>(dqkv, dout, qkv, lse, D, a);
    attn_dkv_kernel<T>
        <<<dim3(row_blocks(T_), B * KV), 32 * ROWS, smem_dkv, s>>>(dqkv, dout, qkv, lse, D, a);
}

extern "C" {

size_t loom_cuda_attention_scratch_floats(int B, int T, int H) {
    return (size_t)B * H * T;
}

void loom_cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int H,
                                 int KV, int hd, cudaStream_t s) {
    attention_forward(out, lse, qkv, B, T, H, KV, hd, s);
}
void loom_cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int H, int KV,
                                  int hd, cudaStream_t s) {
    attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd, s);
}
void loom_cuda_attention_forward_bf16(loom_bf16 *out, float *lse, const loom_bf16 *qkv, int B,
                                      int T, int H, int KV, int hd, cudaStream_t s) {
    attention_forward(as_bf16(out), lse, as_bf16(qkv), B, T, H, KV, hd, s);
}
void loom_cuda_attention_backward_bf16(loom_bf16 *dqkv, float *scratch, const loom_bf16 *dout,
                                       const loom_bf16 *qkv, const loom_bf16 *out, const float *lse,
                                       int B, int T, int H, int KV, int hd, cudaStream_t s) {
    attention_backward(as_bf16(dqkv), scratch, as_bf16(dout), as_bf16(qkv), as_bf16(out), lse, B, T,
                       H, KV, hd, s);
}

} /* extern "C" */
