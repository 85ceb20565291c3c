/* The CUDA backend table (kernels/cuda/backend_cuda.h): every op of kernels/backend.h
 * on the context's stream, the kernels of kernels_cuda.h underneath. Failures (CUDA
 * calls, cuBLAS, ops not implemented here) are kept as the context's sticky first error
 * and reported by the table's status op. The bf16 table (loom_backend_cuda_bf16_create)
 * is this one with the ops of kernels/backend_bf16.h set and the fp32-signature linear
 * ops rounding their operands to bf16, as kernels/cpu/backend_cpu_bf16.c does. */
#include "kernels/cuda/backend_cuda.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kernels_cuda.h"

#define LOOM_CUDA_ALIGN 256 /* cudaMalloc's alignment: vector loads and cuBLAS like it */

typedef struct {
    loom_backend be; /* first: the backend is the state */
    loom_cuda_ctx cuda;
    double *sumsq; /* device: the result, then LOOM_CUDA_SUMSQ_BLOCKS partial sums */
    /* The bf16 table's operand scratch: the bf16 roundings of a GEMM's fp32 operands (A,
     * then B), carved afresh by each call (stream order keeps calls apart). Sized by
     * linear_prepare before the step; a call that needs more grows it (counted). */
    loom_cuda_arena scratch;
    size_t scratch_grown, prepared; /* calls that grew it; linear_prepare calls */
    char name[32];
} cuda_state;

struct loom_backend_stream {
    cudaStream_t s;
};
struct loom_backend_event {
    cudaEvent_t e;
};

static cuda_state *state(const loom_backend *be) {
    return (cuda_state *)be->ctx;
}
static cudaStream_t stream(const loom_backend *be) {
    return state(be)->cuda.stream;
}
static cudaStream_t stream_of(const loom_backend *be, const loom_backend_stream *s) {
    return s ? s->s : stream(be);
}

/* Keeps the first failure (sticky). */
static void fail(const loom_backend *be, loom_status code, const char *fmt, const char *what,
                 const char *why) {
    loom_cuda_ctx *c = &state(be)->cuda;
    if (c->status != LOOM_OK) return;
    c->status = loom_error_set(&c->error, code, fmt, what, why);
}
static void check(const loom_backend *be, cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail(be, LOOM_ERR_STATE, "%s: %s", what, cudaGetErrorString(e));
}
static void refuse(const loom_backend *be, const char *op) {
    fail(be, LOOM_ERR_STATE, "not implemented on %s: %s", "cuda", op);
}

/* ---- memory, streams, events ---- */
static void *cu_alloc(const loom_backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is the caller's NULL, not sticky */
        return NULL;
    }
    (void)be;
    return p;
}
static void cu_free(const loom_backend *be, void *p) {
    if (p) check(be, cudaFree(p), "cudaFree");
}
static void cu_memset(const loom_backend *be, void *p, int v, size_t bytes) {
    check(be, cudaMemsetAsync(p, v, bytes, stream(be)), "cudaMemsetAsync");
}
static void cu_to_device(const loom_backend *be, void *dst, const void *src, size_t bytes) {
    check(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(be)),
          "copy to device");
}
static void cu_to_host(const loom_backend *be, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(be));
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream(be));
    check(be, e, "copy to host");
}
static void cu_copy(const loom_backend *be, void *dst, const void *src, size_t bytes) {
    check(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(be)),
          "copy on device");
}
static void cu_synchronize(const loom_backend *be) {
    check(be, cudaStreamSynchronize(stream(be)), "cudaStreamSynchronize");
}
static loom_status cu_stream_create(const loom_backend *be, loom_backend_stream **out,
                                    loom_error *err) {
    (void)be;
    *out = calloc(1, sizeof **out);
    if (!*out) return loom_error_set(err, LOOM_ERR_NOMEM, "cuda stream: out of memory");
    cudaError_t e = cudaStreamCreateWithFlags(&(*out)->s, cudaStreamNonBlocking);
    if (e == cudaSuccess) return LOOM_OK;
    free(*out);
    *out = NULL;
    return loom_error_set(err, LOOM_ERR_STATE, "cudaStreamCreate: %s", cudaGetErrorString(e));
}
static void cu_stream_destroy(const loom_backend *be, loom_backend_stream *s) {
    if (!s) return;
    check(be, cudaStreamDestroy(s->s), "cudaStreamDestroy");
    free(s);
}
static loom_status cu_event_create(const loom_backend *be, loom_backend_event **out,
                                   loom_error *err) {
    (void)be;
    *out = calloc(1, sizeof **out);
    if (!*out) return loom_error_set(err, LOOM_ERR_NOMEM, "cuda event: out of memory");
    cudaError_t e = cudaEventCreateWithFlags(&(*out)->e, cudaEventDisableTiming);
    if (e == cudaSuccess) return LOOM_OK;
    free(*out);
    *out = NULL;
    return loom_error_set(err, LOOM_ERR_STATE, "cudaEventCreate: %s", cudaGetErrorString(e));
}
static void cu_event_destroy(const loom_backend *be, loom_backend_event *e) {
    if (!e) return;
    check(be, cudaEventDestroy(e->e), "cudaEventDestroy");
    free(e);
}
static void cu_event_record(const loom_backend *be, loom_backend_event *e, loom_backend_stream *s) {
    check(be, cudaEventRecord(e->e, stream_of(be, s)), "cudaEventRecord");
}
static void cu_stream_wait_event(const loom_backend *be, loom_backend_stream *s,
                                 loom_backend_event *e) {
    check(be, cudaStreamWaitEvent(stream_of(be, s), e->e, 0), "cudaStreamWaitEvent");
}
static void cu_event_synchronize(const loom_backend *be, loom_backend_event *e) {
    check(be, cudaEventSynchronize(e->e), "cudaEventSynchronize");
}
static loom_status cu_status(const loom_backend *be, loom_error *err) {
    return loom_cuda_ctx_status(&state(be)->cuda, 0, err);
}

/* ---- ops ---- */
static void linear_forward(const loom_backend *be, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int IC, int OC) {
    loom_cuda_linear_forward(&state(be)->cuda, out, inp, weight, bias, N, IC, OC);
}
static void linear_backward_input(const loom_backend *be, float *dinp, const float *dout,
                                  const float *weight, int N, int IC, int OC) {
    loom_cuda_linear_backward_input(&state(be)->cuda, dinp, dout, weight, N, IC, OC);
}
static void linear_backward_weight(const loom_backend *be, float *dweight, float *dbias,
                                   const float *dout, const float *inp, int N, int IC, int OC) {
    loom_cuda_linear_backward_weight(&state(be)->cuda, dweight, dbias, dout, inp, N, IC, OC);
}
/* The unsharded embedding is the shard [0, INT_MAX): every token owned. */
static void embedding_forward(const loom_backend *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int B, int T, int C) {
    loom_cuda_embedding_forward(out, tokens, wte, wpe, 0, INT_MAX, B, T, C, stream(be));
}
static void embedding_backward(const loom_backend *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C) {
    loom_cuda_embedding_backward(dwte, dwpe, dout, tokens, 0, INT_MAX, B, T, C, stream(be));
}
static void layernorm_forward(const loom_backend *be, float *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C, float eps) {
    loom_cuda_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, stream(be));
}
static void layernorm_backward(const loom_backend *be, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C) {
    loom_cuda_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                 stream(be));
}
static void rmsnorm_forward(const loom_backend *be, float *out, float *rstd, const float *inp,
                            const float *weight, int N, int C, float eps) {
    loom_cuda_rmsnorm_forward(out, rstd, inp, weight, N, C, eps, stream(be));
}
static void rmsnorm_backward(const loom_backend *be, float *dinp, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C) {
    loom_cuda_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, stream(be));
}
static void gelu_forward(const loom_backend *be, float *out, const float *inp, size_t n) {
    loom_cuda_gelu_forward(out, inp, n, stream(be));
}
static void gelu_backward(const loom_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n) {
    loom_cuda_gelu_backward(dinp, inp, dout, n, stream(be));
}
static void swiglu_forward(const loom_backend *be, float *out, const float *inp, int N, int F) {
    loom_cuda_swiglu_forward(out, inp, N, F, stream(be));
}
static void swiglu_backward(const loom_backend *be, float *dinp, const float *dout,
                            const float *inp, int N, int F) {
    loom_cuda_swiglu_backward(dinp, dout, inp, N, F, stream(be));
}
static void add(const loom_backend *be, float *out, const float *a, const float *b, size_t n) {
    loom_cuda_add(out, a, b, n, stream(be));
}
static void rope_forward(const loom_backend *be, float *qkv, int B, int T, int H, int KV, int hd,
                         float theta) {
    loom_cuda_rope_forward(qkv, B, T, H, KV, hd, theta, 0, stream(be));
}
static void rope_forward_at(const loom_backend *be, float *qkv, int B, int T, int H, int KV, int hd,
                            float theta, int pos0) {
    loom_cuda_rope_forward(qkv, B, T, H, KV, hd, theta, pos0, stream(be));
}
static void rope_backward(const loom_backend *be, float *dqkv, int B, int T, int H, int KV, int hd,
                          float theta) {
    loom_cuda_rope_backward(dqkv, B, T, H, KV, hd, theta, stream(be));
}
static void rope_backward_at(const loom_backend *be, float *dqkv, int B, int T, int H, int KV,
                             int hd, float theta, int pos0) {
    loom_cuda_rope_backward_at(dqkv, B, T, H, KV, hd, theta, pos0, stream(be));
}
/* Up to 2 T^2 <= LOOM_CUDA_ATTN_GEMM_TT_FLOATS: cuBLAS's GEMMs (attention_gemm.cu; sized
 * for KV = H, the most a group takes); above, the fused kernel (no T x T scratch). */
static size_t attention_scratch_floats(const loom_backend *be, int B, int T, int H) {
    (void)be;
    size_t fused = loom_cuda_attention_scratch_floats(B, T, H);
    if (!loom_cuda_attention_gemm_fits(T)) return fused;
    size_t gemm = loom_cuda_attention_gemm_scratch_floats(B, T, H, H);
    return gemm > fused ? gemm : fused;
}
static int attention_fits(const loom_backend *be, int hd) {
    if (hd <= LOOM_CUDA_ATTN_MAX_HD) return 1;
    fail(be, LOOM_ERR_INPUT, "%s: head dimension above %s", "cuda attention", "256");
    return 0;
}
/* The fused kernel keeps no T x T scores: its forward needs no scratch. */
static void attention_forward(const loom_backend *be, float *out, float *lse, const float *qkv,
                              float *scratch, int B, int T, int H, int KV, int hd) {
    if (loom_cuda_attention_gemm_fits(T))
        loom_cuda_attention_gemm_forward(&state(be)->cuda, out, lse, qkv, scratch, B, T, H, KV, hd,
                                         1);
    else if (attention_fits(be, hd))
        loom_cuda_attention_forward(out, lse, qkv, B, T, H, KV, hd, stream(be));
}
static void attention_backward(const loom_backend *be, float *dqkv, float *scratch,
                               const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int H, int KV, int hd) {
    if (loom_cuda_attention_gemm_fits(T))
        loom_cuda_attention_gemm_backward(&state(be)->cuda, dqkv, scratch, dout, qkv, out, lse, B,
                                          T, H, KV, hd, 1);
    else if (attention_fits(be, hd))
        loom_cuda_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd,
                                     stream(be));
}
/* Bidirectional (DiT): the cuBLAS path only (the fused kernel is causal). */
static void attention_bidir_forward(const loom_backend *be, float *out, float *lse,
                                    const float *qkv, float *scratch, int B, int T, int H, int KV,
                                    int hd) {
    if (loom_cuda_attention_gemm_fits(T))
        loom_cuda_attention_gemm_forward(&state(be)->cuda, out, lse, qkv, scratch, B, T, H, KV, hd,
                                         0);
    else
        fail(be, LOOM_ERR_INPUT, "%s: %s", "cuda bidirectional attention",
             "sequence too long for the T x T scratch");
}
static void attention_bidir_backward(const loom_backend *be, float *dqkv, float *scratch,
                                     const float *dout, const float *qkv, const float *out,
                                     const float *lse, int B, int T, int H, int KV, int hd) {
    if (loom_cuda_attention_gemm_fits(T))
        loom_cuda_attention_gemm_backward(&state(be)->cuda, dqkv, scratch, dout, qkv, out, lse, B,
                                          T, H, KV, hd, 0);
    else
        fail(be, LOOM_ERR_INPUT, "%s: %s", "cuda bidirectional attention",
             "sequence too long for the T x T scratch");
}
static void crossentropy_forward(const loom_backend *be, float *losses, const float *logits,
                                 const int32_t *targets, int N, int V) {
    loom_cuda_crossentropy_forward(losses, logits, targets, N, V, stream(be));
}
static void crossentropy_forward_backward(const loom_backend *be, float *losses, float *logits,
                                          const int32_t *targets, int N, int V, float dloss) {
    loom_cuda_crossentropy_forward_backward(losses, logits, targets, N, V, dloss, stream(be));
}
static void embedding_forward_shard(const loom_backend *be, float *out, const int32_t *tokens,
                                    const float *wte, const float *wpe, int v0, int V, int B, int T,
                                    int C) {
    loom_cuda_embedding_forward(out, tokens, wte, wpe, v0, V, B, T, C, stream(be));
}
static void embedding_backward_shard(const loom_backend *be, float *dwte, float *dwpe,
                                     const float *dout, const int32_t *tokens, int v0, int V, int B,
                                     int T, int C) {
    loom_cuda_embedding_backward(dwte, dwpe, dout, tokens, v0, V, B, T, C, stream(be));
}
/* ---- not implemented on CUDA yet: the sticky error says which op ---- */
static void crossentropy_shard_max(const loom_backend *be, float *maxes, const float *logits, int N,
                                   int V) {
    (void)maxes, (void)logits, (void)N, (void)V;
    refuse(be, "crossentropy_shard_max");
}
static void crossentropy_shard_sums(const loom_backend *be, double *sums, double *target_logit,
                                    const float *logits, const int32_t *targets, const float *maxes,
                                    int N, int V, int v0) {
    (void)sums, (void)target_logit, (void)logits, (void)targets, (void)maxes, (void)N, (void)V;
    (void)v0;
    refuse(be, "crossentropy_shard_sums");
}
static void crossentropy_shard_exp(const loom_backend *be, double *sums, double *target_logit,
                                   float *logits, const int32_t *targets, const float *maxes, int N,
                                   int V, int v0) {
    (void)sums, (void)target_logit, (void)logits, (void)targets, (void)maxes, (void)N, (void)V;
    (void)v0;
    refuse(be, "crossentropy_shard_exp");
}
static void crossentropy_shard_losses(const loom_backend *be, float *losses, const float *maxes,
                                      const double *sums, const double *target_logit, int N) {
    (void)losses, (void)maxes, (void)sums, (void)target_logit, (void)N;
    refuse(be, "crossentropy_shard_losses");
}
static void crossentropy_shard_backward(const loom_backend *be, float *probs,
                                        const int32_t *targets, const double *sums, int N, int V,
                                        int v0, float dloss) {
    (void)probs, (void)targets, (void)sums, (void)N, (void)V, (void)v0, (void)dloss;
    refuse(be, "crossentropy_shard_backward");
}
static void moe_router_forward(const loom_backend *be, float *probs, int32_t *idx, float *w,
                               float *lse, const float *logits, int N, int E, int K) {
    (void)probs, (void)idx, (void)w, (void)lse, (void)logits, (void)N, (void)E, (void)K;
    refuse(be, "moe_router_forward");
}
static int moe_capacity(const loom_backend *be, int32_t *pos, int32_t *load, int32_t *kept,
                        const int32_t *idx, int N, int K, int E, int cap) {
    (void)pos, (void)load, (void)kept, (void)idx, (void)N, (void)K, (void)E, (void)cap;
    refuse(be, "moe_capacity");
    return 0;
}
static void moe_permute(const loom_backend *be, float *send, const float *x, const int32_t *idx,
                        const int32_t *pos, const int32_t *offs, int N, int K, int C) {
    (void)send, (void)x, (void)idx, (void)pos, (void)offs, (void)N, (void)K, (void)C;
    refuse(be, "moe_permute");
}
static void moe_combine(const loom_backend *be, float *out, const float *ret, const float *w,
                        const int32_t *idx, const int32_t *pos, const int32_t *offs, int N, int K,
                        int C) {
    (void)out, (void)ret, (void)w, (void)idx, (void)pos, (void)offs, (void)N, (void)K, (void)C;
    refuse(be, "moe_combine");
}
static void moe_combine_backward(const loom_backend *be, float *dret, float *dw, const float *dout,
                                 const float *ret, const float *w, const int32_t *idx,
                                 const int32_t *pos, const int32_t *offs, int N, int K, int C) {
    (void)dret, (void)dw, (void)dout, (void)ret, (void)w, (void)idx, (void)pos, (void)offs;
    (void)N, (void)K, (void)C;
    refuse(be, "moe_combine_backward");
}
static void moe_unpermute_add(const loom_backend *be, float *dx, const float *dsend,
                              const int32_t *idx, const int32_t *pos, const int32_t *offs, int N,
                              int K, int C) {
    (void)dx, (void)dsend, (void)idx, (void)pos, (void)offs, (void)N, (void)K, (void)C;
    refuse(be, "moe_unpermute_add");
}
static void moe_router_backward(const loom_backend *be, float *dlogits, const float *probs,
                                const int32_t *idx, const float *w, const float *dw,
                                const float *lse, const float *dprob, float z, int N, int E,
                                int K) {
    (void)dlogits, (void)probs, (void)idx, (void)w, (void)dw, (void)lse, (void)dprob, (void)z;
    (void)N, (void)E, (void)K;
    refuse(be, "moe_router_backward");
}
/* diffusion transformer (DiT) pieces: not on CUDA yet either */
static void layernorm_plain_forward(const loom_backend *be, float *out, float *mean, float *rstd,
                                    const float *inp, int N, int C, float eps) {
    (void)out, (void)mean, (void)rstd, (void)inp, (void)N, (void)C, (void)eps;
    refuse(be, "layernorm_plain_forward");
}
static void layernorm_plain_backward(const loom_backend *be, float *dinp, const float *dout,
                                     const float *inp, const float *mean, const float *rstd, int N,
                                     int C) {
    (void)dinp, (void)dout, (void)inp, (void)mean, (void)rstd, (void)N, (void)C;
    refuse(be, "layernorm_plain_backward");
}
static void silu_forward(const loom_backend *be, float *out, const float *inp, size_t n) {
    (void)out, (void)inp, (void)n;
    refuse(be, "silu_forward");
}
static void silu_backward(const loom_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n) {
    (void)dinp, (void)inp, (void)dout, (void)n;
    refuse(be, "silu_backward");
}
static void mse_forward(const loom_backend *be, float *losses, const float *pred,
                        const float *target, int N, int P) {
    (void)losses, (void)pred, (void)target, (void)N, (void)P;
    refuse(be, "mse_forward");
}
static void mse_forward_backward(const loom_backend *be, float *losses, float *pred,
                                 const float *target, int N, int P, float dloss) {
    (void)losses, (void)pred, (void)target, (void)N, (void)P, (void)dloss;
    refuse(be, "mse_forward_backward");
}
static void modulate_forward(const loom_backend *be, float *out, const float *x, const float *shift,
                             const float *scale, int ld, int N, int C, int T, int row0) {
    (void)out, (void)x, (void)shift, (void)scale, (void)ld, (void)N, (void)C, (void)T, (void)row0;
    refuse(be, "modulate_forward");
}
static void modulate_backward(const loom_backend *be, float *dx, float *dshift, float *dscale,
                              const float *dout, const float *x, const float *scale, int ld, int N,
                              int C, int T, int row0) {
    (void)dx, (void)dshift, (void)dscale, (void)dout, (void)x, (void)scale, (void)ld, (void)N;
    (void)C, (void)T, (void)row0;
    refuse(be, "modulate_backward");
}
static void gate_add_forward(const loom_backend *be, float *out, const float *res, const float *y,
                             const float *gate, int ld, int N, int C, int T, int row0) {
    (void)out, (void)res, (void)y, (void)gate, (void)ld, (void)N, (void)C, (void)T, (void)row0;
    refuse(be, "gate_add_forward");
}
static void gate_add_backward(const loom_backend *be, float *dy, float *dgate, const float *dout,
                              const float *y, const float *gate, int ld, int N, int C, int T,
                              int row0) {
    (void)dy, (void)dgate, (void)dout, (void)y, (void)gate, (void)ld, (void)N, (void)C, (void)T;
    (void)row0;
    refuse(be, "gate_add_backward");
}
static void add_position(const loom_backend *be, float *x, const float *pos, int N, int C, int T,
                         int row0) {
    (void)x, (void)pos, (void)N, (void)C, (void)T, (void)row0;
    refuse(be, "add_position");
}
static void timestep_embedding(const loom_backend *be, float *out, const float *t, int B, int dim) {
    (void)out, (void)t, (void)B, (void)dim;
    refuse(be, "timestep_embedding");
}
/* ---- optimizer and clipping ---- */
static void adamw_update(const loom_backend *be, float *param, const float *grad, float *m,
                         float *v, size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t) {
    loom_cuda_adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                           stream(be));
}
/* Fixed block partition on the device, the total copied back (synchronous). */
static double sum_squares(const loom_backend *be, const float *x, size_t n) {
    cuda_state *S = state(be);
    double out = 0.0;
    loom_cuda_sum_squares(S->sumsq, S->sumsq + 1, x, n, stream(be));
    cu_to_host(be, &out, S->sumsq, sizeof out);
    return out;
}
static void scale(const loom_backend *be, float *x, float s, size_t n) {
    loom_cuda_scale(x, s, n, stream(be));
}

/* ---- --precision bf16 (kernels/backend_bf16.h, docs/precision.md): the ops of
 * kernels/cpu/backend_cpu_bf16.c, the same shapes, += rules and rounding points ---- */
static size_t pad(size_t bytes) {
    return (bytes + LOOM_CUDA_ALIGN - 1) / LOOM_CUDA_ALIGN * LOOM_CUDA_ALIGN;
}
/* Scratch bytes of na + nb bf16 values carved as two pieces. */
static size_t operand_bytes(size_t na, size_t nb) {
    return pad(na * sizeof(loom_bf16)) + pad(nb * sizeof(loom_bf16));
}
/* Makes the scratch at least `bytes` (a new cudaMalloc only when it grows: after the
 * stream's work that may still read the old one). */
static loom_status scratch_reserve(const loom_backend *be, size_t bytes, loom_error *err) {
    cuda_state *S = state(be);
    if (bytes <= S->scratch.size) return LOOM_OK;
    cudaError_t e = cudaStreamSynchronize(stream(be));
    if (e != cudaSuccess)
        return loom_error_set(err, LOOM_ERR_STATE, "cudaStreamSynchronize: %s",
                              cudaGetErrorString(e));
    loom_cuda_arena_destroy(&S->scratch);
    return loom_cuda_arena_create(&S->scratch, bytes, err);
}
/* Pieces A (na values) and B (nb values) of the scratch; NULL (and a sticky error) when it
 * cannot grow. */
static loom_bf16 *operands(const loom_backend *be, size_t na, size_t nb, loom_bf16 **b) {
    cuda_state *S = state(be);
    const size_t bytes = operand_bytes(na, nb);
    if (bytes > S->scratch.size) {
        loom_error e = {0};
        if (scratch_reserve(be, bytes, &e)) {
            fail(be, e.code, "%s: %s", "cuda bf16 operand scratch", e.msg);
            return NULL;
        }
        S->scratch_grown++;
    }
    loom_cuda_arena_release(&S->scratch, 0);
    loom_error e = {0};
    loom_bf16 *a = loom_cuda_arena_alloc(&S->scratch, na * sizeof(loom_bf16), "bf16 A", &e);
    *b = loom_cuda_arena_alloc(&S->scratch, nb * sizeof(loom_bf16), "bf16 B", &e);
    return a && *b ? a : NULL; /* both fit: bytes <= size */
}
static const loom_bf16 *rounded(const loom_backend *be, loom_bf16 *dst, const float *src,
                                size_t n) {
    loom_cuda_f32_to_bf16(dst, src, n, stream(be));
    return dst;
}

static void linear_forward_bf16(const loom_backend *be, float *out, const loom_bf16 *inp,
                                const loom_bf16 *weight, const float *bias, int N, int IC, int OC) {
    loom_cuda_linear_forward_bf16_f32(&state(be)->cuda, out, inp, weight, bias, N, IC, OC);
}
/* dout rounded into A */
static void linear_backward_input_bf16(const loom_backend *be, float *dinp, const float *dout,
                                       const loom_bf16 *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    loom_bf16 *b, *a = operands(be, (size_t)N * OC, 0, &b);
    if (!a) return;
    loom_cuda_linear_backward_input_bf16_f32(
        &state(be)->cuda, dinp, rounded(be, a, dout, (size_t)N * OC), weight, N, IC, OC);
}
/* dout rounded into A for the GEMM; the bias gradient is the fp32 op's (column sums of the
 * fp32 dout, in double), as on the CPU */
static void linear_backward_weight_bf16(const loom_backend *be, float *dweight, float *dbias,
                                        const float *dout, const loom_bf16 *inp, int N, int IC,
                                        int OC) {
    if (N <= 0 || OC <= 0) return;
    loom_cuda_ctx *c = &state(be)->cuda;
    if (IC > 0) {
        loom_bf16 *b, *a = operands(be, (size_t)N * OC, 0, &b);
        if (!a) return;
        loom_cuda_linear_backward_weight_bf16(c, dweight, NULL,
                                              rounded(be, a, dout, (size_t)N * OC), inp, N, IC, OC);
    }
    if (dbias) loom_cuda_linear_backward_weight(c, NULL, dbias, dout, NULL, N, 0, OC);
}
/* The fp32 signatures: inp (or dout) rounded into A, the weight (or inp) into B. */
static void linear_forward_r(const loom_backend *be, float *out, const float *inp,
                             const float *weight, const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC <= 0) { /* no product: out = bias or 0 */
        linear_forward_bf16(be, out, NULL, NULL, bias, N, IC, OC);
        return;
    }
    loom_bf16 *b, *a = operands(be, (size_t)N * IC, (size_t)OC * IC, &b);
    if (!a) return;
    linear_forward_bf16(be, out, rounded(be, a, inp, (size_t)N * IC),
                        rounded(be, b, weight, (size_t)OC * IC), bias, N, IC, OC);
}
static void linear_backward_input_r(const loom_backend *be, float *dinp, const float *dout,
                                    const float *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    loom_bf16 *b, *a = operands(be, (size_t)N * OC, (size_t)OC * IC, &b);
    if (!a) return;
    loom_cuda_linear_backward_input_bf16_f32(&state(be)->cuda, dinp,
                                             rounded(be, a, dout, (size_t)N * OC),
                                             rounded(be, b, weight, (size_t)OC * IC), N, IC, OC);
}
static void linear_backward_weight_r(const loom_backend *be, float *dweight, float *dbias,
                                     const float *dout, const float *inp, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    loom_cuda_ctx *c = &state(be)->cuda;
    if (IC > 0) {
        loom_bf16 *b, *a = operands(be, (size_t)N * OC, (size_t)N * IC, &b);
        if (!a) return;
        loom_cuda_linear_backward_weight_bf16(c, dweight, NULL,
                                              rounded(be, a, dout, (size_t)N * OC),
                                              rounded(be, b, inp, (size_t)N * IC), N, IC, OC);
    }
    if (dbias) loom_cuda_linear_backward_weight(c, NULL, dbias, dout, NULL, N, 0, OC);
}
/* A bf16 activation as the input; the weight rounded into B. */
static void linear_forward_in_bf16(const loom_backend *be, float *out, const loom_bf16 *inp,
                                   const float *weight, const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC <= 0) {
        linear_forward_bf16(be, out, NULL, NULL, bias, N, IC, OC);
        return;
    }
    loom_bf16 *b, *a = operands(be, 0, (size_t)OC * IC, &b);
    if (!a) return;
    linear_forward_bf16(be, out, inp, rounded(be, b, weight, (size_t)OC * IC), bias, N, IC, OC);
}
static void round_bf16(const loom_backend *be, loom_bf16 *dst, const float *src, size_t n) {
    loom_cuda_f32_to_bf16(dst, src, n, stream(be));
}
static void widen_bf16(const loom_backend *be, float *dst, const loom_bf16 *src, size_t n) {
    loom_cuda_bf16_to_f32(dst, src, n, stream(be));
}
static void round_bf16_values(const loom_backend *be, float *x, size_t n) {
    loom_cuda_bf16_round_values(x, n, stream(be));
}
/* The LM head's logits in bf16: out = the fp32 accumulator rounded once, by cuBLAS's
 * bf16 output (round to nearest even); the input (unless inp16) into A, the weight into B. */
static void linear_forward_out_bf16(const loom_backend *be, loom_bf16 *out, const float *inp,
                                    const loom_bf16 *inp16, const float *weight, int N, int IC,
                                    int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    loom_bf16 *b, *a = operands(be, inp16 ? 0 : (size_t)N * IC, (size_t)OC * IC, &b);
    if (!a) return;
    const loom_bf16 *x = inp16 ? inp16 : rounded(be, a, inp, (size_t)N * IC);
    loom_cuda_linear_forward_bf16(&state(be)->cuda, out, x, rounded(be, b, weight, (size_t)OC * IC),
                                  NULL, N, IC, OC);
}
static void linear_backward_input_dbf16(const loom_backend *be, float *dinp, const loom_bf16 *dout,
                                        const float *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    loom_bf16 *b, *a = operands(be, 0, (size_t)OC * IC, &b);
    if (!a) return;
    loom_cuda_linear_backward_input_bf16_f32(&state(be)->cuda, dinp, dout,
                                             rounded(be, b, weight, (size_t)OC * IC), N, IC, OC);
}
static void linear_backward_weight_dbf16(const loom_backend *be, float *dweight,
                                         const loom_bf16 *dout, const float *inp,
                                         const loom_bf16 *inp16, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    loom_bf16 *b, *a = operands(be, 0, inp16 ? 0 : (size_t)N * IC, &b);
    if (!a) return;
    const loom_bf16 *x = inp16 ? inp16 : rounded(be, b, inp, (size_t)N * IC);
    loom_cuda_linear_backward_weight_bf16(&state(be)->cuda, dweight, NULL, dout, x, N, IC, OC);
}
/* Before the step: the scratch the ops of shape (N, IC, OC) carve (the largest of them). */
static loom_status reserve_for(const loom_backend *be, const size_t (*ab)[2], int n,
                               loom_error *err) {
    size_t most = 0;
    for (int i = 0; i < n; i++) {
        const size_t bytes = operand_bytes(ab[i][0], ab[i][1]);
        most = bytes > most ? bytes : most;
    }
    state(be)->prepared++;
    return scratch_reserve(be, most, err);
}
static loom_status linear_prepare(const loom_backend *be, int N, int IC, int OC, loom_error *err) {
    if (N <= 0 || IC <= 0 || OC <= 0) return LOOM_OK;
    const size_t x = (size_t)N * IC, w = (size_t)OC * IC, d = (size_t)N * OC;
    const size_t ab[3][2] = {{x, w}, {d, w}, {d, x}}; /* forward, input grad, weight grad */
    return reserve_for(be, ab, 3, err);
}
static loom_status linear_prepare_out_bf16(const loom_backend *be, int N, int IC, int OC,
                                           loom_error *err) {
    if (N <= 0 || IC <= 0 || OC <= 0) return LOOM_OK;
    const size_t x = (size_t)N * IC, w = (size_t)OC * IC;
    const size_t ab[2][2] = {{x, w}, {0, x}}; /* the logits, their weight gradient */
    return reserve_for(be, ab, 2, err);
}
static void crossentropy_forward_bf16(const loom_backend *be, float *losses,
                                      const loom_bf16 *logits, const int32_t *targets, int N,
                                      int V) {
    loom_cuda_crossentropy_forward_bf16(losses, logits, targets, N, V, stream(be));
}
static void crossentropy_forward_backward_bf16(const loom_backend *be, float *losses,
                                               loom_bf16 *logits, const int32_t *targets, int N,
                                               int V, float dloss) {
    loom_cuda_crossentropy_forward_backward_bf16(losses, logits, targets, N, V, dloss, stream(be));
}
static void gelu_forward_in_bf16(const loom_backend *be, float *out, const loom_bf16 *inp,
                                 size_t n) {
    loom_cuda_gelu_forward_in_bf16(out, inp, n, stream(be));
}
static void gelu_backward_in_bf16(const loom_backend *be, float *dinp, const loom_bf16 *inp,
                                  const float *dout, size_t n) {
    loom_cuda_gelu_backward_in_bf16(dinp, inp, dout, n, stream(be));
}
static void gelu_backward_in_bf16_inplace(const loom_backend *be, float *d, const loom_bf16 *inp,
                                          size_t n) {
    loom_cuda_gelu_backward_in_bf16_inplace(d, inp, n, stream(be));
}
static void swiglu_forward_in_bf16(const loom_backend *be, float *out, const loom_bf16 *inp, int N,
                                   int F) {
    loom_cuda_swiglu_forward_in_bf16(out, inp, N, F, stream(be));
}
static void swiglu_backward_in_bf16(const loom_backend *be, float *dinp, const float *dout,
                                    const loom_bf16 *inp, int N, int F) {
    loom_cuda_swiglu_backward_in_bf16(dinp, dout, inp, N, F, stream(be));
}

static const loom_backend_ops cuda_ops = {
    .mem_alloc = cu_alloc,
    .mem_free = cu_free,
    .mem_set = cu_memset,
    .copy_to_device = cu_to_device,
    .copy_to_host = cu_to_host,
    .copy_device = cu_copy,
    .synchronize = cu_synchronize,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .event_synchronize = cu_event_synchronize,
    .status = cu_status,
    .linear_forward = linear_forward,
    .linear_backward_input = linear_backward_input,
    .linear_backward_weight = linear_backward_weight,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .layernorm_plain_forward = layernorm_plain_forward,
    .layernorm_plain_backward = layernorm_plain_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .silu_forward = silu_forward,
    .silu_backward = silu_backward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .add = add,
    .rope_forward = rope_forward,
    .rope_forward_at = rope_forward_at,
    .rope_backward = rope_backward,
    .rope_backward_at = rope_backward_at,
    .attention_scratch_floats = attention_scratch_floats,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .attention_bidir_forward = attention_bidir_forward,
    .attention_bidir_backward = attention_bidir_backward,
    /* attention_block_*, copy_2d, add_2d (context parallelism): no CUDA kernels yet, left
     * NULL; loom_cp_create refuses --cp on this backend. */
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_forward_backward = crossentropy_forward_backward,
    .mse_forward = mse_forward,
    .mse_forward_backward = mse_forward_backward,
    .modulate_forward = modulate_forward,
    .modulate_backward = modulate_backward,
    .gate_add_forward = gate_add_forward,
    .gate_add_backward = gate_add_backward,
    .add_position = add_position,
    .timestep_embedding = timestep_embedding,
    .embedding_forward_shard = embedding_forward_shard,
    .embedding_backward_shard = embedding_backward_shard,
    .crossentropy_shard_max = crossentropy_shard_max,
    .crossentropy_shard_sums = crossentropy_shard_sums,
    .crossentropy_shard_exp = crossentropy_shard_exp,
    .crossentropy_shard_losses = crossentropy_shard_losses,
    .crossentropy_shard_backward = crossentropy_shard_backward,
    .adamw_update = adamw_update,
    .moe_router_forward = moe_router_forward,
    .moe_capacity = moe_capacity,
    .moe_permute = moe_permute,
    .moe_combine = moe_combine,
    .moe_combine_backward = moe_combine_backward,
    .moe_unpermute_add = moe_unpermute_add,
    .moe_router_backward = moe_router_backward,
    .sum_squares = sum_squares,
    .scale = scale,
};

loom_status loom_backend_cuda_create(loom_backend **out, int device, loom_error *err) {
    *out = NULL;
    cuda_state *S = calloc(1, sizeof *S);
    if (!S) return loom_error_set(err, LOOM_ERR_NOMEM, "cuda backend: out of memory");
    loom_status st = loom_cuda_ctx_create(&S->cuda, device, err);
    if (st) {
        free(S);
        return st;
    }
    cudaError_t e = cudaMalloc((void **)&S->sumsq, (1 + LOOM_CUDA_SUMSQ_BLOCKS) * sizeof(double));
    if (e != cudaSuccess) {
        loom_cuda_ctx_destroy(&S->cuda);
        free(S);
        return loom_error_set(err, LOOM_ERR_NOMEM, "cuda backend scratch: %s",
                              cudaGetErrorString(e));
    }
    snprintf(S->name, sizeof S->name, "cuda:%d", device);
    S->be.ops = &cuda_ops;
    S->be.ctx = S;
    S->be.device = LOOM_DEVICE_CUDA;
    S->be.name = S->name;
    S->be.align = LOOM_CUDA_ALIGN;
    *out = &S->be;
    return LOOM_OK;
}

void loom_backend_cuda_destroy(loom_backend *be) {
    if (!be) return;
    cuda_state *S = state(be);
    if (S->sumsq) cudaFree(S->sumsq);
    loom_cuda_arena_destroy(&S->scratch);
    loom_cuda_ctx_destroy(&S->cuda);
    free(S);
}

/* The fp32 table with the bf16 ops set (the CPU bf16 table's set, but the causal
 * attention's bf16 backward and its scratch size: NULL, so the model keeps its shared
 * backward scratch off on CUDA). Filled once; every bf16 backend points at it. */
static loom_backend_ops cuda_bf16_ops;

loom_status loom_backend_cuda_bf16_create(loom_backend **out, int device, loom_error *err) {
    loom_status st = loom_backend_cuda_create(out, device, err);
    if (st) return st;
    loom_backend_ops *o = &cuda_bf16_ops;
    *o = cuda_ops;
    o->linear_forward = linear_forward_r;
    o->linear_backward_input = linear_backward_input_r;
    o->linear_backward_weight = linear_backward_weight_r;
    o->linear_backward_weight_ld = NULL; /* as the CPU's bf16 table: computed whole */
    o->linear_forward_bf16 = linear_forward_bf16;
    o->linear_backward_input_bf16 = linear_backward_input_bf16;
    o->linear_backward_weight_bf16 = linear_backward_weight_bf16;
    o->linear_forward_in_bf16 = linear_forward_in_bf16;
    o->round_bf16 = round_bf16;
    o->linear_forward_out_bf16 = linear_forward_out_bf16;
    o->linear_backward_input_dbf16 = linear_backward_input_dbf16;
    o->linear_backward_weight_dbf16 = linear_backward_weight_dbf16;
    o->linear_prepare_out_bf16 = linear_prepare_out_bf16;
    o->crossentropy_forward_bf16 = crossentropy_forward_bf16;
    o->crossentropy_forward_backward_bf16 = crossentropy_forward_backward_bf16;
    o->round_bf16_values = round_bf16_values;
    o->gelu_forward_in_bf16 = gelu_forward_in_bf16;
    o->gelu_backward_in_bf16 = gelu_backward_in_bf16;
    o->swiglu_forward_in_bf16 = swiglu_forward_in_bf16;
    o->swiglu_backward_in_bf16 = swiglu_backward_in_bf16;
    o->widen_bf16 = widen_bf16;
    o->gelu_backward_in_bf16_inplace = gelu_backward_in_bf16_inplace;
    o->linear_prepare = linear_prepare;
    o->linear_precision = LOOM_PRECISION_BF16;
    cuda_state *S = state(*out);
    snprintf(S->name, sizeof S->name, "cuda:%d:bf16", device);
    S->be.ops = o;
    return LOOM_OK;
}

void loom_backend_cuda_bf16_describe(const loom_backend *be, char *buf, size_t size) {
    const cuda_state *S = state(be);
    snprintf(buf, size,
             "cuBLAS bf16 GEMMs (fp32 accumulation), %zu linear_prepare calls, operand "
             "scratch %.1f MiB, grown %zu times in calls",
             S->prepared, (double)S->scratch.size / (1024.0 * 1024.0), S->scratch_grown);
}
