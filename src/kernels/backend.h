/* The backend table: a device's memory and every op of kernels/kernels.h behind one
 * struct of function pointers (redis's connection->type, ggml's ggml_backend_i; not a
 * graph). Code above kernels/ holds a `const loom_backend *` and calls the thin wrappers
 * loom_backend_<op>(be, ...) below; which device runs them is decided once, when the
 * backend is chosen.
 *
 * Contract of the ops: the names, shapes, layouts and the accumulate (+=) rule of
 * kernels/kernels.h, on buffers of the backend's memory (mem_alloc / an arena). Ops
 * return what the CPU kernel returns; a backend whose ops can fail (CUDA: launch and
 * cuBLAS errors, ops it does not implement) keeps the FIRST failure inside the backend
 * (sticky) and reports it through loom_backend_status, so calls need no error argument.
 *
 * Implementations: kernels/cpu/backend_cpu.c (loom_backend_cpu(): today's CPU kernels,
 * the same functions, so results are bitwise those of direct calls) and
 * kernels/cuda/backend_cuda.c (CUDA builds; loom_backend_cuda_create). */
#ifndef LOOM_KERNELS_BACKEND_H
#define LOOM_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kernels/bf16.h"    /* loom_bf16 */
#include "kernels/kernels.h" /* loom_attention_blocks */

typedef enum { LOOM_DEVICE_CPU, LOOM_DEVICE_CUDA } loom_device_kind;

typedef struct loom_backend loom_backend;
/* Opaque handles: a second stream (for copies or collectives next to the compute
 * stream) and an event recorded on one stream and waited on by another. On the CPU
 * every op has finished when it returns, so a recorded event is complete at once and a
 * wait returns immediately: the calls are real (objects are created, recorded, waited
 * on) but trivially synchronous. */
typedef struct loom_backend_stream loom_backend_stream;
typedef struct loom_backend_event loom_backend_event;

typedef struct {
    /* ---- memory: raw allocation (NULL when out of memory), memset, copies ---- */
    void *(*mem_alloc)(const loom_backend *be, size_t bytes); /* be->align aligned */
    void (*mem_free)(const loom_backend *be, void *p);        /* NULL: nothing */
    void (*mem_set)(const loom_backend *be, void *p, int value, size_t bytes);
    void (*copy_to_device)(const loom_backend *be, void *dst, const void *host_src, size_t bytes);
    /* Complete when it returns (host_dst may be read at once). */
    void (*copy_to_host)(const loom_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy_device)(const loom_backend *be, void *dst, const void *src, size_t bytes);
    /* Waits for everything issued so far. */
    void (*synchronize)(const loom_backend *be);
    /* ---- overlap: a second stream and events (stream NULL: the compute stream) ---- */
    loom_status (*stream_create)(const loom_backend *be, loom_backend_stream **out,
                                 loom_error *err);
    void (*stream_destroy)(const loom_backend *be, loom_backend_stream *s);
    loom_status (*event_create)(const loom_backend *be, loom_backend_event **out, loom_error *err);
    void (*event_destroy)(const loom_backend *be, loom_backend_event *e);
    void (*event_record)(const loom_backend *be, loom_backend_event *e, loom_backend_stream *s);
    /* Work issued on s after this call waits for e (the host does not wait). */
    void (*stream_wait_event)(const loom_backend *be, loom_backend_stream *s,
                              loom_backend_event *e);
    /* The host waits for e. */
    void (*event_synchronize)(const loom_backend *be, loom_backend_event *e);
    /* The first failure since creation (LOOM_OK: none); copied to err when there is one. */
    loom_status (*status)(const loom_backend *be, loom_error *err);

    /* ---- ops of kernels/kernels.h, same names, same contract ---- */
    void (*linear_forward)(const loom_backend *be, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int IC, int OC);
    void (*linear_backward_input)(const loom_backend *be, float *dinp, const float *dout,
                                  const float *weight, int N, int IC, int OC);
    void (*linear_backward_weight)(const loom_backend *be, float *dweight, float *dbias,
                                   const float *dout, const float *inp, int N, int IC, int OC);
    /* loom_linear_backward_weight_ld (no bias); NULL where a backend has none (then a
     * caller computes the whole weight gradient at once) */
    void (*linear_backward_weight_ld)(const loom_backend *be, float *dweight, const float *dout,
                                      int ld, const float *inp, int N, int IC, int OC);
    void (*embedding_forward)(const loom_backend *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int B, int T, int C);
    void (*embedding_backward)(const loom_backend *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C);
    void (*layernorm_forward)(const loom_backend *be, float *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C, float eps);
    void (*layernorm_backward)(const loom_backend *be, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C);
    void (*layernorm_plain_forward)(const loom_backend *be, float *out, float *mean, float *rstd,
                                    const float *inp, int N, int C, float eps);
    void (*layernorm_plain_backward)(const loom_backend *be, float *dinp, const float *dout,
                                     const float *inp, const float *mean, const float *rstd, int N,
                                     int C);
    void (*rmsnorm_forward)(const loom_backend *be, float *out, float *rstd, const float *inp,
                            const float *weight, int N, int C, float eps);
    void (*rmsnorm_backward)(const loom_backend *be, float *dinp, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C);
    void (*gelu_forward)(const loom_backend *be, float *out, const float *inp, size_t n);
    void (*gelu_backward)(const loom_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n);
    void (*silu_forward)(const loom_backend *be, float *out, const float *inp, size_t n);
    void (*silu_backward)(const loom_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n);
    void (*swiglu_forward)(const loom_backend *be, float *out, const float *inp, int N, int F);
    void (*swiglu_backward)(const loom_backend *be, float *dinp, const float *dout,
                            const float *inp, int N, int F);
    void (*add)(const loom_backend *be, float *out, const float *a, const float *b, size_t n);
    void (*rope_forward)(const loom_backend *be, float *qkv, int B, int T, int H, int KV, int hd,
                         float theta);
    void (*rope_forward_at)(const loom_backend *be, float *qkv, int B, int T, int H, int KV, int hd,
                            float theta, int pos0);
    void (*rope_backward)(const loom_backend *be, float *dqkv, int B, int T, int H, int KV, int hd,
                          float theta);
    /* positions pos0 .. pos0+T-1 (a context-parallel rank's part of the sequence) */
    void (*rope_backward_at)(const loom_backend *be, float *dqkv, int B, int T, int H, int KV,
                             int hd, float theta, int pos0);
    /* Floats of attention scratch for a micro-batch B x T with H heads here (the CPU
     * kernels need T's worth, the CUDA backward B*H*T). */
    size_t (*attention_scratch_floats)(const loom_backend *be, int B, int T, int H);
    void (*attention_forward)(const loom_backend *be, float *out, float *lse, const float *qkv,
                              float *scratch, int B, int T, int H, int KV, int hd);
    void (*attention_backward)(const loom_backend *be, float *dqkv, float *scratch,
                               const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int H, int KV, int hd);
    void (*attention_bidir_forward)(const loom_backend *be, float *out, float *lse,
                                    const float *qkv, float *scratch, int B, int T, int H, int KV,
                                    int hd);
    void (*attention_bidir_backward)(const loom_backend *be, float *dqkv, float *scratch,
                                     const float *dout, const float *qkv, const float *out,
                                     const float *lse, int B, int T, int H, int KV, int hd);
    /* blockwise attention and re-layout for context parallelism (src/cp); a backend
     * without them (NULL: CUDA today) cannot run --cp, which loom_cp_create checks */
    size_t (*attention_block_scratch_floats)(const loom_backend *be, int chunk, int nk);
    void (*attention_block_forward)(const loom_backend *be, float *out, float *lse,
                                    const float *qkv, const float *kv, float *scratch,
                                    const loom_attention_blocks *g);
    void (*attention_block_merge)(const loom_backend *be, float *out, float *lse,
                                  const float *out_b, const float *lse_b,
                                  const loom_attention_blocks *g);
    void (*attention_block_delta)(const loom_backend *be, float *D, const float *dout,
                                  const float *out, const loom_attention_blocks *g);
    void (*attention_block_backward)(const loom_backend *be, float *dqkv, float *dkv,
                                     float *scratch, const float *dout, const float *qkv,
                                     const float *kv, const float *lse, const float *D,
                                     const loom_attention_blocks *g);
    void (*copy_2d)(const loom_backend *be, float *dst, size_t dst_ld, const float *src,
                    size_t src_ld, size_t rows, size_t width);
    void (*add_2d)(const loom_backend *be, float *dst, size_t dst_ld, const float *src,
                   size_t src_ld, size_t rows, size_t width);
    void (*crossentropy_forward)(const loom_backend *be, float *losses, const float *logits,
                                 const int32_t *targets, int N, int V);
    void (*crossentropy_forward_backward)(const loom_backend *be, float *losses, float *logits,
                                          const int32_t *targets, int N, int V, float dloss);
    void (*mse_forward)(const loom_backend *be, float *losses, const float *pred,
                        const float *target, int N, int P);
    void (*mse_forward_backward)(const loom_backend *be, float *losses, float *pred,
                                 const float *target, int N, int P, float dloss);
    /* diffusion transformer (DiT) pieces: per-sample modulation, positions, timesteps */
    void (*modulate_forward)(const loom_backend *be, float *out, const float *x, const float *shift,
                             const float *scale, int ld, int N, int C, int T, int row0);
    void (*modulate_backward)(const loom_backend *be, float *dx, float *dshift, float *dscale,
                              const float *dout, const float *x, const float *scale, int ld, int N,
                              int C, int T, int row0);
    void (*gate_add_forward)(const loom_backend *be, float *out, const float *res, const float *y,
                             const float *gate, int ld, int N, int C, int T, int row0);
    void (*gate_add_backward)(const loom_backend *be, float *dy, float *dgate, const float *dout,
                              const float *y, const float *gate, int ld, int N, int C, int T,
                              int row0);
    void (*add_position)(const loom_backend *be, float *x, const float *pos, int N, int C, int T,
                         int row0);
    void (*timestep_embedding)(const loom_backend *be, float *out, const float *t, int B, int dim);
    /* vocabulary-parallel pieces */
    void (*embedding_forward_shard)(const loom_backend *be, float *out, const int32_t *tokens,
                                    const float *wte, const float *wpe, int v0, int V, int B, int T,
                                    int C);
    void (*embedding_backward_shard)(const loom_backend *be, float *dwte, float *dwpe,
                                     const float *dout, const int32_t *tokens, int v0, int V, int B,
                                     int T, int C);
    void (*crossentropy_shard_max)(const loom_backend *be, float *maxes, const float *logits, int N,
                                   int V);
    void (*crossentropy_shard_sums)(const loom_backend *be, double *sums, double *target_logit,
                                    const float *logits, const int32_t *targets, const float *maxes,
                                    int N, int V, int v0);
    void (*crossentropy_shard_exp)(const loom_backend *be, double *sums, double *target_logit,
                                   float *logits, const int32_t *targets, const float *maxes, int N,
                                   int V, int v0);
    void (*crossentropy_shard_losses)(const loom_backend *be, float *losses, const float *maxes,
                                      const double *sums, const double *target_logit, int N);
    void (*crossentropy_shard_backward)(const loom_backend *be, float *probs,
                                        const int32_t *targets, const double *sums, int N, int V,
                                        int v0, float dloss);
    void (*adamw_update)(const loom_backend *be, float *param, const float *grad, float *m,
                         float *v, size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t);
    /* mixture-of-experts routing pieces */
    void (*moe_router_forward)(const loom_backend *be, float *probs, int32_t *idx, float *w,
                               float *lse, const float *logits, int N, int E, int K);
    int (*moe_capacity)(const loom_backend *be, int32_t *pos, int32_t *load, int32_t *kept,
                        const int32_t *idx, int N, int K, int E, int cap);
    void (*moe_permute)(const loom_backend *be, float *send, const float *x, const int32_t *idx,
                        const int32_t *pos, const int32_t *offs, int N, int K, int C);
    void (*moe_combine)(const loom_backend *be, float *out, const float *ret, const float *w,
                        const int32_t *idx, const int32_t *pos, const int32_t *offs, int N, int K,
                        int C);
    void (*moe_combine_backward)(const loom_backend *be, float *dret, float *dw, const float *dout,
                                 const float *ret, const float *w, const int32_t *idx,
                                 const int32_t *pos, const int32_t *offs, int N, int K, int C);
    void (*moe_unpermute_add)(const loom_backend *be, float *dx, const float *dsend,
                              const int32_t *idx, const int32_t *pos, const int32_t *offs, int N,
                              int K, int C);
    void (*moe_router_backward)(const loom_backend *be, float *dlogits, const float *probs,
                                const int32_t *idx, const float *w, const float *dw,
                                const float *lse, const float *dprob, float z, int N, int E, int K);
    /* global-norm clipping: the sum of squares (returned to the host) and scaling */
    double (*sum_squares)(const loom_backend *be, const float *x, size_t n);
    void (*scale)(const loom_backend *be, float *x, float s, size_t n);

    /* ---- bf16 GEMMs (NULL where the backend has none: the fp32 CPU table, CUDA) ----
     * The linear ops with bf16 operands, fp32 accumulation and fp32 results, the shapes
     * and += rule of the fp32 ones; dout stays fp32 and is rounded to bf16 inside. */
    void (*linear_forward_bf16)(const loom_backend *be, float *out, const loom_bf16 *inp,
                                const loom_bf16 *weight, const float *bias, int N, int IC, int OC);
    void (*linear_backward_input_bf16)(const loom_backend *be, float *dinp, const float *dout,
                                       const loom_bf16 *weight, int N, int IC, int OC);
    void (*linear_backward_weight_bf16)(const loom_backend *be, float *dweight, float *dbias,
                                        const float *dout, const loom_bf16 *inp, int N, int IC,
                                        int OC);
    /* Activations kept in bf16 (docs/precision.md): the forward with a bf16 input and the
     * table's fp32-signature weight (rounded, or read from the weights' bf16 copy), and
     * the round-to-nearest-even of n floats into bf16 that produces such an input (the
     * same bits the fp32-signature ops round to inside). NULL where activations stay
     * fp32 (the fp32 CPU table, CUDA). */
    void (*linear_forward_in_bf16)(const loom_backend *be, float *out, const loom_bf16 *inp,
                                   const float *weight, const float *bias, int N, int IC, int OC);
    void (*round_bf16)(const loom_backend *be, loom_bf16 *dst, const float *src, size_t n);
    /* The LM head's logits kept in bf16 (docs/precision.md; NULL where logits stay fp32:
     * the fp32 CPU table, CUDA). out[N, OC] = round_bf16(inp @ weight^T), no bias, the
     * fp32 accumulator rounded once (inp: fp32, rounded, or inp16 already bf16; exactly
     * one is set); the linear backward ops with a bf16 output gradient (dinp += dout @ w,
     * dweight += dout^T @ inp, no bias), which read the bits the fp32-signature ops would
     * round an fp32 dout to; the cross-entropy over bf16 logits (kernels.h), dlogits
     * rounded into their slot; and the prepare of the head's shape (before the step). */
    void (*linear_forward_out_bf16)(const loom_backend *be, loom_bf16 *out, const float *inp,
                                    const loom_bf16 *inp16, const float *weight, int N, int IC,
                                    int OC);
    void (*linear_backward_input_dbf16)(const loom_backend *be, float *dinp, const loom_bf16 *dout,
                                        const float *weight, int N, int IC, int OC);
    void (*linear_backward_weight_dbf16)(const loom_backend *be, float *dweight,
                                         const loom_bf16 *dout, const float *inp,
                                         const loom_bf16 *inp16, int N, int IC, int OC);
    loom_status (*linear_prepare_out_bf16)(const loom_backend *be, int N, int IC, int OC,
                                           loom_error *err);
    void (*crossentropy_forward_bf16)(const loom_backend *be, float *losses,
                                      const loom_bf16 *logits, const int32_t *targets, int N,
                                      int V);
    void (*crossentropy_forward_backward_bf16)(const loom_backend *be, float *losses,
                                               loom_bf16 *logits, const int32_t *targets, int N,
                                               int V, float dloss);
    /* x = the fp32 value of round_bf16(x), in place: the vocabulary-parallel head's fp32
     * logits rounded as the bf16 ones (the same function on every layout) */
    void (*round_bf16_values)(const loom_backend *be, float *x, size_t n);
    /* The MLP's pre-activation and attention's qkv kept in bf16 (docs/precision.md; NULL
     * where they stay fp32: the fp32 CPU table, CUDA, LOOM_BF16_FP32_ACTIVATIONS=1): GELU
     * and SwiGLU reading a bf16 input (each value widened exactly, then the fp32 kernels'
     * arithmetic: bit for bit the fp32 ops on the widened input), and the exact widening
     * of n bf16 values into fp32 (attention reads its qkv widened). */
    void (*gelu_forward_in_bf16)(const loom_backend *be, float *out, const loom_bf16 *inp,
                                 size_t n);
    void (*gelu_backward_in_bf16)(const loom_backend *be, float *dinp, const loom_bf16 *inp,
                                  const float *dout, size_t n);
    void (*swiglu_forward_in_bf16)(const loom_backend *be, float *out, const loom_bf16 *inp, int N,
                                   int F);
    void (*swiglu_backward_in_bf16)(const loom_backend *be, float *dinp, const float *dout,
                                    const loom_bf16 *inp, int N, int F);
    void (*widen_bf16)(const loom_backend *be, float *dst, const loom_bf16 *src, size_t n);
    /* The same, for the model's backward scratch shared between phases (docs/precision.md;
     * NULL where the ops above are): GELU's backward in place (d = d(input) from
     * d = d(output)), and the causal attention's backward reading bf16 qkv and out (each
     * task widens its heads into its part of scratch, attention_scratch_floats_bf16 floats
     * in all): bit for bit the fp32-signature ops on the widened tensors. */
    void (*gelu_backward_in_bf16_inplace)(const loom_backend *be, float *d, const loom_bf16 *inp,
                                          size_t n);
    size_t (*attention_scratch_floats_bf16)(const loom_backend *be, int T, int hd);
    void (*attention_backward_in_bf16)(const loom_backend *be, float *dqkv, float *scratch,
                                       const float *dout, const loom_bf16 *qkv,
                                       const loom_bf16 *out, const float *lse, int B, int T, int H,
                                       int KV, int hd);
    /* Makes, before the step, what the linear ops of shape (N, IC, OC) will need (the
     * bf16 table: its oneDNN primitives); NULL: nothing to make. */
    loom_status (*linear_prepare)(const loom_backend *be, int N, int IC, int OC, loom_error *err);
    /* The number format of the linear ops' GEMMs (the enum below; 0, the default of a
     * table that does not set it: fp32). In a bf16 table the fp32-signature linear ops
     * round their inputs, weights and output gradients to bf16 and run the bf16 GEMMs. */
    int linear_precision;
} loom_backend_ops;

/* --precision: the number format of the linear layers' GEMMs (docs/precision.md). fp32
 * everywhere else: master weights, optimizer state, gradients, losses, norms, softmax. */
typedef enum { LOOM_PRECISION_FP32 = 0, LOOM_PRECISION_BF16 } loom_precision;
/* "fp32" | "bf16" -> *out; anything else: LOOM_ERR_INPUT naming `flag` and the choices. */
loom_status loom_precision_parse(const char *s, const char *flag, loom_precision *out,
                                 loom_error *err);
const char *loom_precision_name(loom_precision p);             /* "fp32", "bf16" */
loom_precision loom_backend_precision(const loom_backend *be); /* its linear ops' */

struct loom_backend {
    const loom_backend_ops *ops;
    void *ctx; /* the implementation's own state (CUDA: device context, stream, error) */
    loom_device_kind device;
    const char *name; /* "cpu", "cuda:0" */
    size_t align;     /* alignment of mem_alloc and of every arena piece, bytes */
};

/* The CPU backend (kernels/cpu/): one static object, never freed; its ops cannot fail. */
const loom_backend *loom_backend_cpu(void);
/* The CPU backend with bf16 GEMMs (kernels/cpu/backend_cpu_bf16.c): the CPU table with
 * the linear ops on oneDNN bf16 matmuls, or on a CPU without AVX512-BF16 and AMX-BF16
 * widened to fp32 for OpenBLAS (kernels/cpu/gemm_widened.h: the same numerics, fp32's
 * speed); every other op the fp32 CPU kernel. Each linear op rounds its fp32 operands to
 * bf16 (nearest even) into the backend's own buffers, so every caller of the fp32
 * signature computes in bf16 unchanged; the _bf16 ops take operands already in bf16.
 * Freed by loom_backend_close. Prints nothing; see loom_backend_cpu_bf16_describe for the
 * start-up line. */
loom_status loom_backend_cpu_bf16_open(const loom_backend **out, loom_error *err);
/* The bf16 table for sizing only (loom plan, loom_run_size): says which activations a bf16
 * run keeps in bf16 (so a model's arena is planned as the run's) and runs nothing; needs
 * no bf16 CPU. Static; loom_backend_close leaves it. */
const loom_backend *loom_backend_cpu_bf16_sizing(void);
/* "oneDNN 2.6 bf16 matmul brg:avx512_core_bf16, 12 shapes prepared, 0 calls unprepared",
 * or "bf16 matmul widened to fp32 for OpenBLAS sgemm (no AVX512-BF16 or AMX-BF16: bf16's
 * numerics and bytes at fp32's speed), ..." */
void loom_backend_cpu_bf16_describe(const loom_backend *be, char *buf, size_t size);
/* Bytes the backend holds for bf16 copies of operands (its conversion buffers, and the
 * weights' copy as far as it is resident). */
size_t loom_backend_cpu_bf16_bytes(const loom_backend *be);
/* The bf16 compute copy of the flat parameter buffer [base, base + n) (train/
 * compute_weights.c, --bf16-rounding): returns it for the caller to fill (NULL: out of
 * memory; the same one on later calls). While marked valid, a linear op whose weight
 * lies inside [base, base + n) reads the copy instead of rounding the weight per call;
 * any other weight (a temporary) is still rounded per call. */
loom_bf16 *loom_backend_cpu_bf16_weight_copy(const loom_backend *be, const float *base, size_t n);
void loom_backend_cpu_bf16_weight_copy_valid(const loom_backend *be, int valid);
/* How many of the copy's elements are resident at most (n by default; ZeRO-3: those of the
 * gathered blocks), for loom_backend_cpu_bf16_bytes. */
void loom_backend_cpu_bf16_weight_copy_resident(const loom_backend *be, size_t n);
/* The copy's values of the weights [w, w + n) when the copy is valid and holds them, else
 * NULL: for a reference that slices a weight (model/tp_round.c) to read what a linear op
 * given the whole weight reads. */
const loom_bf16 *loom_backend_cpu_bf16_weight_copy_of(const loom_backend *be, const float *w,
                                                      size_t n);

/* ---- choosing the device (--device cpu|cuda) ----
 * A device backend other than the CPU is linked only into builds that have it (CUDA:
 * -DLOOM_CUDA=ON, src/kernels/cuda/); such a build registers its constructor once at
 * start-up (cli/main.c), so code below cli opens a backend by kind without linking it. */
typedef loom_status (*loom_backend_open_fn)(loom_backend **out, int ordinal, loom_error *err);
typedef void (*loom_backend_close_fn)(loom_backend *be);
void loom_backend_register(loom_device_kind kind, loom_backend_open_fn open,
                           loom_backend_close_fn close);
/* "cpu" | "cuda" -> *out; anything else: LOOM_ERR_INPUT naming `flag` and the choices. */
loom_status loom_device_parse(const char *s, const char *flag, loom_device_kind *out,
                              loom_error *err);
const char *loom_device_name(loom_device_kind kind); /* "cpu", "cuda" */
/* The backend of `kind` on device `ordinal`: the CPU's shared object, or a new one that
 * loom_backend_close frees. A kind this build has no backend for: LOOM_ERR_INPUT. */
loom_status loom_backend_open(loom_device_kind kind, int ordinal, const loom_backend **out,
                              loom_error *err);
void loom_backend_close(const loom_backend *be); /* the CPU's or NULL: nothing */

/* ---- arena: one mem_alloc at set-up, carved by bump allocation (kernels/backend.c) ----
 * So the step loop never allocates (cudaMalloc synchronizes the device). Scratch scopes
 * release back to a mark; peak is the high-water mark. */
typedef struct {
    const loom_backend *be;
    char *base;
    size_t size, used, peak;
} loom_backend_arena;

/* The bytes one piece of `bytes` takes in an arena of be (rounded up to be->align). */
size_t loom_backend_piece_bytes(const loom_backend *be, size_t bytes);
loom_status loom_backend_arena_create(loom_backend_arena *a, const loom_backend *be, size_t bytes,
                                      const char *what, loom_error *err);
void loom_backend_arena_destroy(loom_backend_arena *a);
/* be->align aligned; NULL with LOOM_ERR_NOMEM naming what did not fit. */
void *loom_backend_arena_alloc(loom_backend_arena *a, size_t bytes, const char *what,
                               loom_error *err);
size_t loom_backend_arena_mark(const loom_backend_arena *a);
void loom_backend_arena_release(loom_backend_arena *a, size_t mark);

/* ---- call-site wrappers: loom_backend_<op>(be, ...) ---- */
static inline void *loom_backend_alloc(const loom_backend *be, size_t bytes) {
    return be->ops->mem_alloc(be, bytes);
}
static inline void loom_backend_free(const loom_backend *be, void *p) {
    be->ops->mem_free(be, p);
}
static inline void loom_backend_memset(const loom_backend *be, void *p, int v, size_t bytes) {
    be->ops->mem_set(be, p, v, bytes);
}
static inline void loom_backend_copy_to_device(const loom_backend *be, void *dst, const void *src,
                                               size_t bytes) {
    be->ops->copy_to_device(be, dst, src, bytes);
}
static inline void loom_backend_copy_to_host(const loom_backend *be, void *dst, const void *src,
                                             size_t bytes) {
    be->ops->copy_to_host(be, dst, src, bytes);
}
static inline void loom_backend_copy(const loom_backend *be, void *dst, const void *src,
                                     size_t bytes) {
    be->ops->copy_device(be, dst, src, bytes);
}
static inline void loom_backend_synchronize(const loom_backend *be) {
    be->ops->synchronize(be);
}
static inline loom_status loom_backend_stream_create(const loom_backend *be,
                                                     loom_backend_stream **out, loom_error *err) {
    return be->ops->stream_create(be, out, err);
}
static inline void loom_backend_stream_destroy(const loom_backend *be, loom_backend_stream *s) {
    be->ops->stream_destroy(be, s);
}
static inline loom_status loom_backend_event_create(const loom_backend *be,
                                                    loom_backend_event **out, loom_error *err) {
    return be->ops->event_create(be, out, err);
}
static inline void loom_backend_event_destroy(const loom_backend *be, loom_backend_event *e) {
    be->ops->event_destroy(be, e);
}
static inline void loom_backend_event_record(const loom_backend *be, loom_backend_event *e,
                                             loom_backend_stream *s) {
    be->ops->event_record(be, e, s);
}
static inline void loom_backend_stream_wait_event(const loom_backend *be, loom_backend_stream *s,
                                                  loom_backend_event *e) {
    be->ops->stream_wait_event(be, s, e);
}
static inline void loom_backend_event_synchronize(const loom_backend *be, loom_backend_event *e) {
    be->ops->event_synchronize(be, e);
}
static inline loom_status loom_backend_status(const loom_backend *be, loom_error *err) {
    return be->ops->status(be, err);
}

static inline void loom_backend_linear_forward(const loom_backend *be, float *out, const float *inp,
                                               const float *weight, const float *bias, int N,
                                               int IC, int OC) {
    be->ops->linear_forward(be, out, inp, weight, bias, N, IC, OC);
}
static inline void loom_backend_linear_backward_input(const loom_backend *be, float *dinp,
                                                      const float *dout, const float *weight, int N,
                                                      int IC, int OC) {
    be->ops->linear_backward_input(be, dinp, dout, weight, N, IC, OC);
}
static inline void loom_backend_linear_backward_weight(const loom_backend *be, float *dweight,
                                                       float *dbias, const float *dout,
                                                       const float *inp, int N, int IC, int OC) {
    be->ops->linear_backward_weight(be, dweight, dbias, dout, inp, N, IC, OC);
}
/* 0 when be has no linear_backward_weight_ld */
static inline int loom_backend_linear_backward_weight_ld(const loom_backend *be, float *dweight,
                                                         const float *dout, int ld,
                                                         const float *inp, int N, int IC, int OC) {
    if (!be->ops->linear_backward_weight_ld) return 0;
    be->ops->linear_backward_weight_ld(be, dweight, dout, ld, inp, N, IC, OC);
    return 1;
}
static inline void loom_backend_embedding_forward(const loom_backend *be, float *out,
                                                  const int32_t *tokens, const float *wte,
                                                  const float *wpe, int B, int T, int C) {
    be->ops->embedding_forward(be, out, tokens, wte, wpe, B, T, C);
}
static inline void loom_backend_embedding_backward(const loom_backend *be, float *dwte, float *dwpe,
                                                   const float *dout, const int32_t *tokens, int B,
                                                   int T, int C) {
    be->ops->embedding_backward(be, dwte, dwpe, dout, tokens, B, T, C);
}
static inline void loom_backend_layernorm_forward(const loom_backend *be, float *out, float *mean,
                                                  float *rstd, const float *inp,
                                                  const float *weight, const float *bias, int N,
                                                  int C, float eps) {
    be->ops->layernorm_forward(be, out, mean, rstd, inp, weight, bias, N, C, eps);
}
static inline void loom_backend_layernorm_backward(const loom_backend *be, float *dinp,
                                                   float *dweight, float *dbias, const float *dout,
                                                   const float *inp, const float *weight,
                                                   const float *mean, const float *rstd, int N,
                                                   int C) {
    be->ops->layernorm_backward(be, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
static inline void loom_backend_layernorm_plain_forward(const loom_backend *be, float *out,
                                                        float *mean, float *rstd, const float *inp,
                                                        int N, int C, float eps) {
    be->ops->layernorm_plain_forward(be, out, mean, rstd, inp, N, C, eps);
}
static inline void loom_backend_layernorm_plain_backward(const loom_backend *be, float *dinp,
                                                         const float *dout, const float *inp,
                                                         const float *mean, const float *rstd,
                                                         int N, int C) {
    be->ops->layernorm_plain_backward(be, dinp, dout, inp, mean, rstd, N, C);
}
static inline void loom_backend_rmsnorm_forward(const loom_backend *be, float *out, float *rstd,
                                                const float *inp, const float *weight, int N, int C,
                                                float eps) {
    be->ops->rmsnorm_forward(be, out, rstd, inp, weight, N, C, eps);
}
static inline void loom_backend_rmsnorm_backward(const loom_backend *be, float *dinp,
                                                 float *dweight, const float *dout,
                                                 const float *inp, const float *weight,
                                                 const float *rstd, int N, int C) {
    be->ops->rmsnorm_backward(be, dinp, dweight, dout, inp, weight, rstd, N, C);
}
static inline void loom_backend_gelu_forward(const loom_backend *be, float *out, const float *inp,
                                             size_t n) {
    be->ops->gelu_forward(be, out, inp, n);
}
static inline void loom_backend_gelu_backward(const loom_backend *be, float *dinp, const float *inp,
                                              const float *dout, size_t n) {
    be->ops->gelu_backward(be, dinp, inp, dout, n);
}
static inline void loom_backend_silu_forward(const loom_backend *be, float *out, const float *inp,
                                             size_t n) {
    be->ops->silu_forward(be, out, inp, n);
}
static inline void loom_backend_silu_backward(const loom_backend *be, float *dinp, const float *inp,
                                              const float *dout, size_t n) {
    be->ops->silu_backward(be, dinp, inp, dout, n);
}
static inline void loom_backend_swiglu_forward(const loom_backend *be, float *out, const float *inp,
                                               int N, int F) {
    be->ops->swiglu_forward(be, out, inp, N, F);
}
static inline void loom_backend_swiglu_backward(const loom_backend *be, float *dinp,
                                                const float *dout, const float *inp, int N, int F) {
    be->ops->swiglu_backward(be, dinp, dout, inp, N, F);
}
static inline void loom_backend_add(const loom_backend *be, float *out, const float *a,
                                    const float *b, size_t n) {
    be->ops->add(be, out, a, b, n);
}
static inline void loom_backend_rope_forward(const loom_backend *be, float *qkv, int B, int T,
                                             int H, int KV, int hd, float theta) {
    be->ops->rope_forward(be, qkv, B, T, H, KV, hd, theta);
}
static inline void loom_backend_rope_forward_at(const loom_backend *be, float *qkv, int B, int T,
                                                int H, int KV, int hd, float theta, int pos0) {
    be->ops->rope_forward_at(be, qkv, B, T, H, KV, hd, theta, pos0);
}
static inline void loom_backend_rope_backward(const loom_backend *be, float *dqkv, int B, int T,
                                              int H, int KV, int hd, float theta) {
    be->ops->rope_backward(be, dqkv, B, T, H, KV, hd, theta);
}
static inline void loom_backend_rope_backward_at(const loom_backend *be, float *dqkv, int B, int T,
                                                 int H, int KV, int hd, float theta, int pos0) {
    be->ops->rope_backward_at(be, dqkv, B, T, H, KV, hd, theta, pos0);
}
static inline size_t loom_backend_attention_scratch_floats(const loom_backend *be, int B, int T,
                                                           int H) {
    return be->ops->attention_scratch_floats(be, B, T, H);
}
static inline void loom_backend_attention_forward(const loom_backend *be, float *out, float *lse,
                                                  const float *qkv, float *scratch, int B, int T,
                                                  int H, int KV, int hd) {
    be->ops->attention_forward(be, out, lse, qkv, scratch, B, T, H, KV, hd);
}
static inline void loom_backend_attention_backward(const loom_backend *be, float *dqkv,
                                                   float *scratch, const float *dout,
                                                   const float *qkv, const float *out,
                                                   const float *lse, int B, int T, int H, int KV,
                                                   int hd) {
    be->ops->attention_backward(be, dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd);
}
static inline void loom_backend_attention_bidir_forward(const loom_backend *be, float *out,
                                                        float *lse, const float *qkv,
                                                        float *scratch, int B, int T, int H, int KV,
                                                        int hd) {
    be->ops->attention_bidir_forward(be, out, lse, qkv, scratch, B, T, H, KV, hd);
}
static inline void loom_backend_attention_bidir_backward(const loom_backend *be, float *dqkv,
                                                         float *scratch, const float *dout,
                                                         const float *qkv, const float *out,
                                                         const float *lse, int B, int T, int H,
                                                         int KV, int hd) {
    be->ops->attention_bidir_backward(be, dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd);
}
static inline size_t loom_backend_attention_block_scratch_floats(const loom_backend *be, int chunk,
                                                                 int nk) {
    return be->ops->attention_block_scratch_floats(be, chunk, nk);
}
static inline void loom_backend_attention_block_forward(const loom_backend *be, float *out,
                                                        float *lse, const float *qkv,
                                                        const float *kv, float *scratch,
                                                        const loom_attention_blocks *g) {
    be->ops->attention_block_forward(be, out, lse, qkv, kv, scratch, g);
}
static inline void loom_backend_attention_block_merge(const loom_backend *be, float *out,
                                                      float *lse, const float *out_b,
                                                      const float *lse_b,
                                                      const loom_attention_blocks *g) {
    be->ops->attention_block_merge(be, out, lse, out_b, lse_b, g);
}
static inline void loom_backend_attention_block_delta(const loom_backend *be, float *D,
                                                      const float *dout, const float *out,
                                                      const loom_attention_blocks *g) {
    be->ops->attention_block_delta(be, D, dout, out, g);
}
static inline void loom_backend_attention_block_backward(const loom_backend *be, float *dqkv,
                                                         float *dkv, float *scratch,
                                                         const float *dout, const float *qkv,
                                                         const float *kv, const float *lse,
                                                         const float *D,
                                                         const loom_attention_blocks *g) {
    be->ops->attention_block_backward(be, dqkv, dkv, scratch, dout, qkv, kv, lse, D, g);
}
static inline void loom_backend_copy_2d(const loom_backend *be, float *dst, size_t dst_ld,
                                        const float *src, size_t src_ld, size_t rows,
                                        size_t width) {
    be->ops->copy_2d(be, dst, dst_ld, src, src_ld, rows, width);
}
static inline void loom_backend_add_2d(const loom_backend *be, float *dst, size_t dst_ld,
                                       const float *src, size_t src_ld, size_t rows, size_t width) {
    be->ops->add_2d(be, dst, dst_ld, src, src_ld, rows, width);
}
static inline void loom_backend_crossentropy_forward(const loom_backend *be, float *losses,
                                                     const float *logits, const int32_t *targets,
                                                     int N, int V) {
    be->ops->crossentropy_forward(be, losses, logits, targets, N, V);
}
static inline void loom_backend_crossentropy_forward_backward(const loom_backend *be, float *losses,
                                                              float *logits, const int32_t *targets,
                                                              int N, int V, float dloss) {
    be->ops->crossentropy_forward_backward(be, losses, logits, targets, N, V, dloss);
}
static inline void loom_backend_mse_forward(const loom_backend *be, float *losses,
                                            const float *pred, const float *target, int N, int P) {
    be->ops->mse_forward(be, losses, pred, target, N, P);
}
static inline void loom_backend_mse_forward_backward(const loom_backend *be, float *losses,
                                                     float *pred, const float *target, int N, int P,
                                                     float dloss) {
    be->ops->mse_forward_backward(be, losses, pred, target, N, P, dloss);
}
static inline void loom_backend_modulate_forward(const loom_backend *be, float *out, const float *x,
                                                 const float *shift, const float *scale, int ld,
                                                 int N, int C, int T, int row0) {
    be->ops->modulate_forward(be, out, x, shift, scale, ld, N, C, T, row0);
}
static inline void loom_backend_modulate_backward(const loom_backend *be, float *dx, float *dshift,
                                                  float *dscale, const float *dout, const float *x,
                                                  const float *scale, int ld, int N, int C, int T,
                                                  int row0) {
    be->ops->modulate_backward(be, dx, dshift, dscale, dout, x, scale, ld, N, C, T, row0);
}
static inline void loom_backend_gate_add_forward(const loom_backend *be, float *out,
                                                 const float *res, const float *y,
                                                 const float *gate, int ld, int N, int C, int T,
                                                 int row0) {
    be->ops->gate_add_forward(be, out, res, y, gate, ld, N, C, T, row0);
}
static inline void loom_backend_gate_add_backward(const loom_backend *be, float *dy, float *dgate,
                                                  const float *dout, const float *y,
                                                  const float *gate, int ld, int N, int C, int T,
                                                  int row0) {
    be->ops->gate_add_backward(be, dy, dgate, dout, y, gate, ld, N, C, T, row0);
}
static inline void loom_backend_add_position(const loom_backend *be, float *x, const float *pos,
                                             int N, int C, int T, int row0) {
    be->ops->add_position(be, x, pos, N, C, T, row0);
}
static inline void loom_backend_timestep_embedding(const loom_backend *be, float *out,
                                                   const float *t, int B, int dim) {
    be->ops->timestep_embedding(be, out, t, B, dim);
}
static inline void loom_backend_embedding_forward_shard(const loom_backend *be, float *out,
                                                        const int32_t *tokens, const float *wte,
                                                        const float *wpe, int v0, int V, int B,
                                                        int T, int C) {
    be->ops->embedding_forward_shard(be, out, tokens, wte, wpe, v0, V, B, T, C);
}
static inline void loom_backend_embedding_backward_shard(const loom_backend *be, float *dwte,
                                                         float *dwpe, const float *dout,
                                                         const int32_t *tokens, int v0, int V,
                                                         int B, int T, int C) {
    be->ops->embedding_backward_shard(be, dwte, dwpe, dout, tokens, v0, V, B, T, C);
}
static inline void loom_backend_crossentropy_shard_max(const loom_backend *be, float *maxes,
                                                       const float *logits, int N, int V) {
    be->ops->crossentropy_shard_max(be, maxes, logits, N, V);
}
static inline void loom_backend_crossentropy_shard_sums(const loom_backend *be, double *sums,
                                                        double *target_logit, const float *logits,
                                                        const int32_t *targets, const float *maxes,
                                                        int N, int V, int v0) {
    be->ops->crossentropy_shard_sums(be, sums, target_logit, logits, targets, maxes, N, V, v0);
}
static inline void loom_backend_crossentropy_shard_exp(const loom_backend *be, double *sums,
                                                       double *target_logit, float *logits,
                                                       const int32_t *targets, const float *maxes,
                                                       int N, int V, int v0) {
    be->ops->crossentropy_shard_exp(be, sums, target_logit, logits, targets, maxes, N, V, v0);
}
static inline void loom_backend_crossentropy_shard_losses(const loom_backend *be, float *losses,
                                                          const float *maxes, const double *sums,
                                                          const double *target_logit, int N) {
    be->ops->crossentropy_shard_losses(be, losses, maxes, sums, target_logit, N);
}
static inline void loom_backend_crossentropy_shard_backward(const loom_backend *be, float *probs,
                                                            const int32_t *targets,
                                                            const double *sums, int N, int V,
                                                            int v0, float dloss) {
    be->ops->crossentropy_shard_backward(be, probs, targets, sums, N, V, v0, dloss);
}
static inline void loom_backend_adamw_update(const loom_backend *be, float *param,
                                             const float *grad, float *m, float *v, size_t n,
                                             float lr, float beta1, float beta2, float eps,
                                             float weight_decay, int t) {
    be->ops->adamw_update(be, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
}
static inline void loom_backend_moe_router_forward(const loom_backend *be, float *probs,
                                                   int32_t *idx, float *w, float *lse,
                                                   const float *logits, int N, int E, int K) {
    be->ops->moe_router_forward(be, probs, idx, w, lse, logits, N, E, K);
}
static inline int loom_backend_moe_capacity(const loom_backend *be, int32_t *pos, int32_t *load,
                                            int32_t *kept, const int32_t *idx, int N, int K, int E,
                                            int cap) {
    return be->ops->moe_capacity(be, pos, load, kept, idx, N, K, E, cap);
}
static inline void loom_backend_moe_permute(const loom_backend *be, float *send, const float *x,
                                            const int32_t *idx, const int32_t *pos,
                                            const int32_t *offs, int N, int K, int C) {
    be->ops->moe_permute(be, send, x, idx, pos, offs, N, K, C);
}
static inline void loom_backend_moe_combine(const loom_backend *be, float *out, const float *ret,
                                            const float *w, const int32_t *idx, const int32_t *pos,
                                            const int32_t *offs, int N, int K, int C) {
    be->ops->moe_combine(be, out, ret, w, idx, pos, offs, N, K, C);
}
static inline void loom_backend_moe_combine_backward(const loom_backend *be, float *dret, float *dw,
                                                     const float *dout, const float *ret,
                                                     const float *w, const int32_t *idx,
                                                     const int32_t *pos, const int32_t *offs, int N,
                                                     int K, int C) {
    be->ops->moe_combine_backward(be, dret, dw, dout, ret, w, idx, pos, offs, N, K, C);
}
static inline void loom_backend_moe_unpermute_add(const loom_backend *be, float *dx,
                                                  const float *dsend, const int32_t *idx,
                                                  const int32_t *pos, const int32_t *offs, int N,
                                                  int K, int C) {
    be->ops->moe_unpermute_add(be, dx, dsend, idx, pos, offs, N, K, C);
}
static inline void loom_backend_moe_router_backward(const loom_backend *be, float *dlogits,
                                                    const float *probs, const int32_t *idx,
                                                    const float *w, const float *dw,
                                                    const float *lse, const float *dprob, float z,
                                                    int N, int E, int K) {
    be->ops->moe_router_backward(be, dlogits, probs, idx, w, dw, lse, dprob, z, N, E, K);
}
static inline double loom_backend_sum_squares(const loom_backend *be, const float *x, size_t n) {
    return be->ops->sum_squares(be, x, n);
}
static inline void loom_backend_scale(const loom_backend *be, float *x, float s, size_t n) {
    be->ops->scale(be, x, s, n);
}
static inline loom_status loom_backend_linear_prepare(const loom_backend *be, int N, int IC, int OC,
                                                      loom_error *err) {
    return be->ops->linear_prepare ? be->ops->linear_prepare(be, N, IC, OC, err) : LOOM_OK;
}

#endif
