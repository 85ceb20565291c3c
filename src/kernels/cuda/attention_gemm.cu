/* Attention through cuBLAS (fp32), causal or bidirectional. Per sample and per group of
 * heads: the T x T scores S = Q K^T as one strided-batched SGEMM, a row-softmax kernel
 * (mask, scale 1/sqrt(hd), lse saved), then O = P V. Backward recomputes P from lse and
 * runs dV += P^T dO, dP = dO V^T, dS = P (dP - D) / sqrt(hd) with D = rowsum(dO * O),
 * dQ += dS K, dK += dS^T Q, the products as SGEMMs again.
 *
 * Why: the fused kernel of attention.cu (CUDA cores, one warp per query row) measured
 * 2.7 TFLOP/s on an H200, against 40+ for cuBLAS's fp32 GEMMs; this path costs T x T
 * scratch for one group of heads (at most LOOM_CUDA_ATTN_GEMM_TT_FLOATS for S and dP
 * together) and, causally, the masked half of the products.
 *
 * Layout (kernels.h): qkv[B, T, (H + 2KV) hd] rows, out/dout[B, T, H hd], lse[B, H, T].
 * A row-major T x hd head slice with row stride ld is a column-major hd x T matrix with
 * leading dimension ld, so the heads are read in place, nothing is transposed. Query
 * head h uses key/value head h / rep (rep = H / KV); one call takes the heads
 * h = g rep + r for a fixed r and a range of g, so every item of a call writes its own
 * rows of dqkv, and the sums over a key/value head's rep query heads are issued in order
 * r = 0, 1, ... on one stream.
 *
 * Deterministic: cuBLAS gives the same bits on the same GPU and toolkit (its documented
 * rule), the kernels reduce in a fixed order and use no atomics. */
#include <cublas_v2.h>
#include <math.h>

#include "kernels/cuda/common.cuh"

#define ROW_THREADS 256

/* Heads per call (items of the batched GEMMs): as many of the KV as fit the T x T bound. */
static int group_heads(int T, int KV) {
    size_t per = 2 * (size_t)T * (size_t)T;
    size_t n = LOOM_CUDA_ATTN_GEMM_TT_FLOATS / per;
    if (n < 1) n = 1;
    return n < (size_t)KV ? (int)n : KV;
}

/* Softmax of row i of item g over its visible keys (j <= i causally, else all T), scaled;
 * P = 0 for the masked keys; lse[lse0 + g * lse_stride + i]. One block per row. */
__global__ void softmax_rows_kernel(float *S, float *lse, int T, float scale, int causal,
                                    size_t lse0, size_t lse_stride) {
    const int i = blockIdx.x, g = blockIdx.y, n = causal ? i + 1 : T;
    float *row = S + ((size_t)g * T + i) * T;
    __shared__ float sh[32];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, row[j] * scale);
    m = block_max(m, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(row[j] * scale - m);
    sum = block_sum<float>(sum, sh);
    const float l = m + logf(sum);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        row[j] = j < n ? expf(row[j] * scale - l) : 0.0f;
    if (threadIdx.x == 0) lse[lse0 + (size_t)g * lse_stride + i] = l;
}

/* P = exp(S scale - lse) on the visible keys, 0 on the masked ones (ng items). */
__global__ void probs_from_lse_kernel(float *S, const float *lse, int T, int ng, float scale,
                                      int causal, size_t lse0, size_t lse_stride) {
    const size_t n = (size_t)ng * T * T;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n;
         x += (size_t)gridDim.x * blockDim.x) {
        const int j = (int)(x % T), i = (int)(x / T % T), g = (int)(x / ((size_t)T * T));
        S[x] =
            !causal || j <= i ? expf(S[x] * scale - lse[lse0 + (size_t)g * lse_stride + i]) : 0.0f;
    }
}

/* dS = P (dP - D_i) scale, in place over dP (0 where P is: the masked keys). */
__global__ void scores_grad_kernel(float *dP, const float *P, const float *D, int T, int ng,
                                   float scale, size_t d0, size_t d_stride) {
    const size_t n = (size_t)ng * T * T;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n;
         x += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(x / T % T), g = (int)(x / ((size_t)T * T));
        dP[x] = P[x] * (dP[x] - D[d0 + (size_t)g * d_stride + i]) * scale;
    }
}

/* D[b, h, i] = dot(dout row, out row) of head h, in a fixed order. */
__global__ void rows_dot_kernel(float *D, const float *dout, const float *out, int B, int T, int H,
                                int hd) {
    const size_t rows = (size_t)B * H * T;
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < rows;
         r += (size_t)gridDim.x * blockDim.x) {
        const size_t i = r % T, h = r / T % H, b = r / ((size_t)T * H);
        const size_t at = (b * T + i) * (size_t)H * hd + h * hd;
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc += dout[at + d] * out[at + d];
        D[r] = acc;
    }
}

/* C = op(A) op(B) + beta C over `batch` items, column-major, fp32 (the handle's math
 * mode: CUBLAS_DEFAULT_MATH, no TF32). */
static cublasStatus_t gemm(loom_cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *A, int lda, long long sa, const float *Bm,
                           int ldb, long long sb, float beta, float *C, int ldc, long long sc,
                           int batch) {
    const float one = 1.0f;
    return cublasSgemmStridedBatched((cublasHandle_t)ctx->blas, ta, tb, m, n, k, &one, A, lda, sa,
                                     Bm, ldb, sb, &beta, C, ldc, sc, batch);
}

static void keep(loom_cuda_ctx *ctx, cublasStatus_t st, const char *what, int T, int hd) {
    if (st == CUBLAS_STATUS_SUCCESS || ctx->status != LOOM_OK) return;
    ctx->status = loom_error_set(&ctx->error, LOOM_ERR_STATE,
                                 "cuBLAS attention %s failed (status %d) for T=%d hd=%d", what,
                                 (int)st, T, hd);
}

/* One call's heads: h = (g0 + g) rep + r for g < ng, of sample b. */
typedef struct {
    size_t q, k, v, o; /* offsets of the first item's query/key/value rows and out rows */
    size_t lse0;       /* its first lse row */
} heads;

static heads heads_of(int b, int r, int g0, int T, int H, int KV, int hd) {
    const int rep = H / KV;
    const size_t ld = (size_t)(H + 2 * KV) * hd, row0 = (size_t)b * T;
    const int h0 = g0 * rep + r;
    return {row0 * ld + (size_t)h0 * hd, row0 * ld + (size_t)(H + g0) * hd,
            row0 * ld + (size_t)(H + KV + g0) * hd, row0 * H * hd + (size_t)h0 * hd,
            ((size_t)b * H + h0) * T};
}

extern "C" {

size_t loom_cuda_attention_gemm_scratch_floats(int B, int T, int H, int KV) {
    return (size_t)B * H * T + 2 * (size_t)group_heads(T, KV) * T * T;
}

int loom_cuda_attention_gemm_fits(int T) {
    return 2 * (size_t)T * T <= LOOM_CUDA_ATTN_GEMM_TT_FLOATS;
}

void loom_cuda_attention_gemm_forward(loom_cuda_ctx *ctx, float *out, float *lse, const float *qkv,
                                      float *scratch, int B, int T, int H, int KV, int hd,
                                      int causal) {
    const int rep = H / KV, ld = (H + 2 * KV) * hd, oc = H * hd, G = group_heads(T, KV);
    const float scale = 1.0f / sqrtf((float)hd);
    const long long tt = (long long)T * T;
    float *S = scratch + (size_t)B * H * T;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < rep; r++)
            for (int g0 = 0; g0 < KV; g0 += G) {
                const int ng = KV - g0 < G ? KV - g0 : G;
                const heads x = heads_of(b, r, g0, T, H, KV, hd);
                keep(ctx,
                     gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, qkv + x.k, ld, hd, qkv + x.q, ld,
                          (long long)rep * hd, 0.0f, S, T, tt, ng),
                     "scores", T, hd);
                softmax_rows_kernel<<<dim3((unsigned)T, (unsigned)ng), ROW_THREADS, 0,
                                      ctx->stream>>>(S, lse, T, scale, causal, x.lse0,
                                                     (size_t)rep * T);
                keep(ctx,
                     gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, qkv + x.v, ld, hd, S, T, tt,
                          0.0f, out + x.o, oc, (long long)rep * hd, ng),
                     "P V", T, hd);
            }
}

void loom_cuda_attention_gemm_backward(loom_cuda_ctx *ctx, float *dqkv, float *scratch,
                                       const float *dout, const float *qkv, const float *out,
                                       const float *lse, int B, int T, int H, int KV, int hd,
                                       int causal) {
    const int rep = H / KV, ld = (H + 2 * KV) * hd, oc = H * hd, G = group_heads(T, KV);
    const float scale = 1.0f / sqrtf((float)hd);
    const long long tt = (long long)T * T, qs = (long long)rep * hd;
    float *D = scratch, *P = scratch + (size_t)B * H * T, *dP = P + (size_t)G * T * T;
    rows_dot_kernel<<<grid_for((size_t)B * H * T, 256), 256, 0, ctx->stream>>>(D, dout, out, B, T,
                                                                               H, hd);
    for (int b = 0; b < B; b++)
        for (int r = 0; r < rep; r++)
            for (int g0 = 0; g0 < KV; g0 += G) {
                const int ng = KV - g0 < G ? KV - g0 : G;
                const heads x = heads_of(b, r, g0, T, H, KV, hd);
                const size_t n = (size_t)ng * T * T;
                keep(ctx,
                     gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, qkv + x.k, ld, hd, qkv + x.q, ld,
                          qs, 0.0f, P, T, tt, ng),
                     "scores", T, hd);
                probs_from_lse_kernel<<<grid_for(n, 256), 256, 0, ctx->stream>>>(
                    P, lse, T, ng, scale, causal, x.lse0, (size_t)rep * T);
                keep(ctx, /* dV += dO P^T (as columns: dVc = dOc Pc^T) */
                     gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, dout + x.o, oc, qs, P, T, tt,
                          1.0f, dqkv + x.v, ld, hd, ng),
                     "dV", T, hd);
                keep(ctx, /* dP = dO V^T */
                     gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, qkv + x.v, ld, hd, dout + x.o,
                          oc, qs, 0.0f, dP, T, tt, ng),
                     "dP", T, hd);
                scores_grad_kernel<<<grid_for(n, 256), 256, 0, ctx->stream>>>(
                    dP, P, D, T, ng, scale, x.lse0, (size_t)rep * T);
                keep(ctx, /* dQ += dS K */
                     gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, qkv + x.k, ld, hd, dP, T, tt,
                          1.0f, dqkv + x.q, ld, qs, ng),
                     "dQ", T, hd);
                keep(ctx, /* dK += dS^T Q */
                     gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, qkv + x.q, ld, qs, dP, T, tt,
                          1.0f, dqkv + x.k, ld, hd, ng),
                     "dK", T, hd);
            }
}

} /* extern "C" */
