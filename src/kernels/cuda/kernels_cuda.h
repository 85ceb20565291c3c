/* The kernel contract of kernels/kernels.h on CUDA device pointers (GPU backend, in
 * progress: compiled and linked in CI, verified on a GPU only by scripts/gpu_check.sh).
 *
 * Same shapes, layouts and accumulate (+=) conventions as the CPU kernels; every call
 * is asynchronous on the given stream (or ctx's) and never allocates; every op returns
 * void like the CPU contract. Launch errors are collected by loom_cuda_check
 * (cudaGetLastError); GEMM (cuBLAS) failures stay in the context as its sticky first
 * error (loom_cuda_ctx_status). kernels/cuda/backend_cuda.c puts these behind the
 * backend table of kernels/backend.h (loom_backend_cuda_create).
 *
 * Precision: the plain names take fp32 buffers. The _bf16 variants take bf16
 * activations (loom_bf16, the bits of __nv_bfloat16) and keep everything that is a
 * parameter, a parameter gradient or a statistic (mean, rstd, lse, losses) in fp32;
 * arithmetic is fp32 throughout. GEMMs: fp32 with TF32 off, or bf16 inputs with fp32
 * accumulation. */
#ifndef LOOM_KERNELS_CUDA_H
#define LOOM_KERNELS_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* core/error.h has no C++ guards of its own */
#endif

#include "core/error.h"

typedef uint16_t loom_bf16; /* bit pattern of __nv_bfloat16 */

/* ---- device, context ---- */
typedef struct {
    int index;
    char name[256];
    int cc_major, cc_minor, sm_count;
    size_t total_bytes, free_bytes;
} loom_cuda_device;

/* Fills up to max devices; *count = number found. No driver / no device: LOOM_ERR_STATE
 * with "no CUDA device: <reason>". */
loom_status loom_cuda_devices(loom_cuda_device *out, int max, int *count, loom_error *err);

/* One stream, one cuBLAS and one cuBLASLt handle and the Lt workspace (allocated once). */
typedef struct {
    int device;
    cudaStream_t stream;
    void *blas;   /* cublasHandle_t */
    void *blaslt; /* cublasLtHandle_t */
    void *workspace;
    size_t workspace_bytes;
    /* The first failure of an op on this context (LOOM_OK: none), kept until read. */
    loom_status status;
    loom_error error;
} loom_cuda_ctx;

loom_status loom_cuda_ctx_create(loom_cuda_ctx *ctx, int device, loom_error *err);
void loom_cuda_ctx_destroy(loom_cuda_ctx *ctx);
/* The sticky first error of ctx's ops, and launch/asynchronous errors (cudaGetLastError,
 * after synchronizing ctx's stream when sync); copied to err. */
loom_status loom_cuda_ctx_status(loom_cuda_ctx *ctx, int sync, loom_error *err);
/* Reports the first pending launch/asynchronous error (after synchronizing when sync). */
loom_status loom_cuda_check(const char *what, int sync, loom_error *err);

/* ---- device memory arena: one cudaMalloc at start-up, carved by bump allocation ---- */
typedef struct {
    char *base;
    size_t size, used, peak;
} loom_cuda_arena;

loom_status loom_cuda_arena_create(loom_cuda_arena *a, size_t bytes, loom_error *err);
void loom_cuda_arena_destroy(loom_cuda_arena *a);
/* 256-byte aligned; NULL with LOOM_ERR_NOMEM naming what did not fit. */
void *loom_cuda_arena_alloc(loom_cuda_arena *a, size_t bytes, const char *what, loom_error *err);
/* Scratch scopes: mark, carve, release back to the mark (peak is kept). */
size_t loom_cuda_arena_mark(const loom_cuda_arena *a);
void loom_cuda_arena_release(loom_cuda_arena *a, size_t mark);
/* "arena 1.50 GiB: peak 1.20 GiB used; device 139.8 GiB total, 120.1 GiB free" */
void loom_cuda_arena_report(const loom_cuda_arena *a, char *buf, size_t len);

/* ---- conversions ----
 * fp32 -> bf16 by loom's rule, bit for bit kernels/bf16.h's loom_bf16_from_f32 (nearest
 * even; NaN kept quiet; fp32 subnormals to signed zero): every bf16 these kernels store is
 * rounded so. bf16 -> fp32 is exact. round_values: x = widen(round(x)) in place. */
void loom_cuda_f32_to_bf16(loom_bf16 *out, const float *inp, size_t n, cudaStream_t s);
void loom_cuda_bf16_to_f32(float *out, const loom_bf16 *inp, size_t n, cudaStream_t s);
void loom_cuda_bf16_round_values(float *x, size_t n, cudaStream_t s);

/* ---- linear (cuBLAS / cuBLASLt): weight [OC, IC]; shapes as kernels.h ----
 * The first cuBLAS failure is kept in ctx (sticky: loom_cuda_ctx_status). */
void loom_cuda_linear_forward(loom_cuda_ctx *ctx, float *out, const float *inp, const float *weight,
                              const float *bias, int N, int IC, int OC);
void loom_cuda_linear_backward_input(loom_cuda_ctx *ctx, float *dinp, const float *dout,
                                     const float *weight, int N, int IC, int OC);
void loom_cuda_linear_backward_weight(loom_cuda_ctx *ctx, float *dweight, float *dbias,
                                      const float *dout, const float *inp, int N, int IC, int OC);
/* bf16 inputs/weights (the bf16 copy of the fp32 master weights), fp32 accumulation;
 * out/dinp bf16, dweight/dbias fp32 (+=), bias bf16 (may be NULL). */
void loom_cuda_linear_forward_bf16(loom_cuda_ctx *ctx, loom_bf16 *out, const loom_bf16 *inp,
                                   const loom_bf16 *weight, const loom_bf16 *bias, int N, int IC,
                                   int OC);
void loom_cuda_linear_backward_input_bf16(loom_cuda_ctx *ctx, loom_bf16 *dinp,
                                          const loom_bf16 *dout, const loom_bf16 *weight, int N,
                                          int IC, int OC);
void loom_cuda_linear_backward_weight_bf16(loom_cuda_ctx *ctx, float *dweight, float *dbias,
                                           const loom_bf16 *dout, const loom_bf16 *inp, int N,
                                           int IC, int OC);
/* bf16 operands, fp32 accumulation and fp32 results (the backend table's bf16 GEMMs,
 * kernels/backend.h): out[N, OC] = bias (fp32, may be NULL) + inp @ weight^T (overwritten);
 * dinp[N, IC] += dout @ weight. The weight gradient with fp32 dweight is
 * loom_cuda_linear_backward_weight_bf16 above. */
void loom_cuda_linear_forward_bf16_f32(loom_cuda_ctx *ctx, float *out, const loom_bf16 *inp,
                                       const loom_bf16 *weight, const float *bias, int N, int IC,
                                       int OC);
void loom_cuda_linear_backward_input_bf16_f32(loom_cuda_ctx *ctx, float *dinp,
                                              const loom_bf16 *dout, const loom_bf16 *weight, int N,
                                              int IC, int OC);

/* ---- embedding (vocabulary shard [v0, v0 + V); v0 = 0, V = vocab: unsharded) ---- */
void loom_cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                                 const float *wpe, int v0, int V, int B, int T, int C,
                                 cudaStream_t s);
void loom_cuda_embedding_forward_bf16(loom_bf16 *out, const int32_t *tokens, const float *wte,
                                      const float *wpe, int v0, int V, int B, int T, int C,
                                      cudaStream_t s);
void loom_cuda_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int v0, int V, int B, int T, int C,
                                  cudaStream_t s);
void loom_cuda_embedding_backward_bf16(float *dwte, float *dwpe, const loom_bf16 *dout,
                                       const int32_t *tokens, int v0, int V, int B, int T, int C,
                                       cudaStream_t s);

/* ---- LayerNorm / RMSNorm (weights, stats, weight grads fp32) ---- */
void loom_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int N, int C, float eps,
                                 cudaStream_t s);
void loom_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int N, int C, cudaStream_t s);
void loom_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                               int N, int C, float eps, cudaStream_t s);
void loom_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, const float *rstd, int N, int C,
                                cudaStream_t s);
void loom_cuda_layernorm_forward_bf16(loom_bf16 *out, float *mean, float *rstd,
                                      const loom_bf16 *inp, const float *weight, const float *bias,
                                      int N, int C, float eps, cudaStream_t s);
void loom_cuda_layernorm_backward_bf16(loom_bf16 *dinp, float *dweight, float *dbias,
                                       const loom_bf16 *dout, const loom_bf16 *inp,
                                       const float *weight, const float *mean, const float *rstd,
                                       int N, int C, cudaStream_t s);
void loom_cuda_rmsnorm_forward_bf16(loom_bf16 *out, float *rstd, const loom_bf16 *inp,
                                    const float *weight, int N, int C, float eps, cudaStream_t s);
void loom_cuda_rmsnorm_backward_bf16(loom_bf16 *dinp, float *dweight, const loom_bf16 *dout,
                                     const loom_bf16 *inp, const float *weight, const float *rstd,
                                     int N, int C, cudaStream_t s);

/* ---- GELU (tanh), SwiGLU, residual add ---- */
void loom_cuda_gelu_forward(float *out, const float *inp, size_t n, cudaStream_t s);
void loom_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                             cudaStream_t s);
void loom_cuda_swiglu_forward(float *out, const float *inp, int N, int F, cudaStream_t s);
void loom_cuda_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F,
                               cudaStream_t s);
void loom_cuda_add(float *out, const float *a, const float *b, size_t n, cudaStream_t s);
void loom_cuda_gelu_forward_bf16(loom_bf16 *out, const loom_bf16 *inp, size_t n, cudaStream_t s);
void loom_cuda_gelu_backward_bf16(loom_bf16 *dinp, const loom_bf16 *inp, const loom_bf16 *dout,
                                  size_t n, cudaStream_t s);
void loom_cuda_swiglu_forward_bf16(loom_bf16 *out, const loom_bf16 *inp, int N, int F,
                                   cudaStream_t s);
void loom_cuda_swiglu_backward_bf16(loom_bf16 *dinp, const loom_bf16 *dout, const loom_bf16 *inp,
                                    int N, int F, cudaStream_t s);
void loom_cuda_add_bf16(loom_bf16 *out, const loom_bf16 *a, const loom_bf16 *b, size_t n,
                        cudaStream_t s);
/* bf16 input, fp32 output and gradients (kernels.h's loom_gelu_forward_bf16 ...): each
 * value widened exactly, then the fp32 kernels' arithmetic. _inplace: d = 0 + gelu'(x) d. */
void loom_cuda_gelu_forward_in_bf16(float *out, const loom_bf16 *inp, size_t n, cudaStream_t s);
void loom_cuda_gelu_backward_in_bf16(float *dinp, const loom_bf16 *inp, const float *dout, size_t n,
                                     cudaStream_t s);
void loom_cuda_gelu_backward_in_bf16_inplace(float *d, const loom_bf16 *inp, size_t n,
                                             cudaStream_t s);
void loom_cuda_swiglu_forward_in_bf16(float *out, const loom_bf16 *inp, int N, int F,
                                      cudaStream_t s);
void loom_cuda_swiglu_backward_in_bf16(float *dinp, const float *dout, const loom_bf16 *inp, int N,
                                       int F, cudaStream_t s);

/* ---- RoPE (HF rotate_half), in place on the query and key heads of qkv ---- */
void loom_cuda_rope_forward(float *qkv, int B, int T, int H, int KV, int hd, float theta, int pos0,
                            cudaStream_t s);
void loom_cuda_rope_backward(float *dqkv, int B, int T, int H, int KV, int hd, float theta,
                             cudaStream_t s);
void loom_cuda_rope_backward_at(float *dqkv, int B, int T, int H, int KV, int hd, float theta,
                                int pos0, cudaStream_t s);
void loom_cuda_rope_forward_bf16(loom_bf16 *qkv, int B, int T, int H, int KV, int hd, float theta,
                                 int pos0, cudaStream_t s);
void loom_cuda_rope_backward_bf16(loom_bf16 *dqkv, int B, int T, int H, int KV, int hd, float theta,
                                  cudaStream_t s);

/* ---- causal attention, fused (flash-attention style, online softmax) ----
 * Layout as kernels.h (qkv[B,T,(H+2KV)*hd], out[B,T,H*hd], lse[B,H,T] fp32). No T x T
 * matrix exists in memory: forward keeps running max/sum per query row and saves lse;
 * backward recomputes probabilities from lse. scratch: loom_cuda_attention_scratch_floats
 * floats (the per-row D = dot(dout, out) of the backward). hd <= LOOM_CUDA_ATTN_MAX_HD.
 * Backward accumulates (+=) into dqkv without atomics (deterministic). */
#define LOOM_CUDA_ATTN_MAX_HD 256
size_t loom_cuda_attention_scratch_floats(int B, int T, int H);
void loom_cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int H,
                                 int KV, int hd, cudaStream_t s);
void loom_cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int H, int KV,
                                  int hd, cudaStream_t s);
void loom_cuda_attention_forward_bf16(loom_bf16 *out, float *lse, const loom_bf16 *qkv, int B,
                                      int T, int H, int KV, int hd, cudaStream_t s);
void loom_cuda_attention_backward_bf16(loom_bf16 *dqkv, float *scratch, const loom_bf16 *dout,
                                       const loom_bf16 *qkv, const loom_bf16 *out, const float *lse,
                                       int B, int T, int H, int KV, int hd, cudaStream_t s);

/* ---- attention through cuBLAS (fp32; attention_gemm.cu): causal (causal = 1) or
 * bidirectional, the same layout, lse and += rule as above, the T x T scores of a group
 * of heads in scratch (loom_cuda_attention_gemm_scratch_floats). For T with
 * loom_cuda_attention_gemm_fits(T) (2 T^2 <= LOOM_CUDA_ATTN_GEMM_TT_FLOATS); the CUDA
 * backend uses it there and the fused kernel beyond. Errors stay in ctx (sticky). */
#define LOOM_CUDA_ATTN_GEMM_TT_FLOATS ((size_t)1 << 28) /* 1 GiB: S and dP of a group */
size_t loom_cuda_attention_gemm_scratch_floats(int B, int T, int H, int KV);
int loom_cuda_attention_gemm_fits(int T);
void loom_cuda_attention_gemm_forward(loom_cuda_ctx *ctx, float *out, float *lse, const float *qkv,
                                      float *scratch, int B, int T, int H, int KV, int hd,
                                      int causal);
void loom_cuda_attention_gemm_backward(loom_cuda_ctx *ctx, float *dqkv, float *scratch,
                                       const float *dout, const float *qkv, const float *out,
                                       const float *lse, int B, int T, int H, int KV, int hd,
                                       int causal);

/* ---- fused softmax + cross-entropy (losses fp32; _backward overwrites logits) ---- */
void loom_cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                    int N, int V, cudaStream_t s);
void loom_cuda_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                             int N, int V, float dloss, cudaStream_t s);
void loom_cuda_crossentropy_forward_bf16(float *losses, const loom_bf16 *logits,
                                         const int32_t *targets, int N, int V, cudaStream_t s);
void loom_cuda_crossentropy_forward_backward_bf16(float *losses, loom_bf16 *logits,
                                                  const int32_t *targets, int N, int V, float dloss,
                                                  cudaStream_t s);

/* ---- AdamW on fp32 master weights and state, loom_adamw_update's operation order ---- */
void loom_cuda_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int t,
                            cudaStream_t s);

/* ---- global-norm clipping: *out (device double) = sum of squares; scale in place ----
 * scratch: LOOM_CUDA_SUMSQ_BLOCKS doubles (fixed block partition: deterministic). */
#define LOOM_CUDA_SUMSQ_BLOCKS 264
void loom_cuda_sum_squares(double *out, double *scratch, const float *x, size_t n, cudaStream_t s);
void loom_cuda_scale(float *x, float scale, size_t n, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
