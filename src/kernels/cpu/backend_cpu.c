/* The CPU backend: the table of kernels/backend.h over host memory, every op the kernel
 * of kernels/kernels.h of the same name (so a call through the table is bitwise the
 * direct call). Memory is aligned_alloc (64 bytes: a cache line, AVX-512 loads), memset
 * and memcpy; streams and events are real objects but trivially synchronous, since every
 * op has finished when it returns. */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/kernels.h"

#define LOOM_CPU_ALIGN 64

struct loom_backend_stream {
    int id; /* never read: a stream is only a name for "in issue order" on the CPU */
};
struct loom_backend_event {
    int recorded; /* 1 once recorded: complete at once, the work before it has finished */
};

static void *cpu_alloc(const loom_backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + LOOM_CPU_ALIGN - 1) / LOOM_CPU_ALIGN * LOOM_CPU_ALIGN;
    return aligned_alloc(LOOM_CPU_ALIGN, n ? n : LOOM_CPU_ALIGN);
}
static void cpu_free(const loom_backend *be, void *p) {
    (void)be;
    free(p);
}
static void cpu_memset(const loom_backend *be, void *p, int v, size_t bytes) {
    (void)be;
    memset(p, v, bytes);
}
static void cpu_copy(const loom_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}
static void cpu_synchronize(const loom_backend *be) {
    (void)be;
}
static loom_status cpu_stream_create(const loom_backend *be, loom_backend_stream **out,
                                     loom_error *err) {
    (void)be;
    *out = calloc(1, sizeof **out);
    return *out ? LOOM_OK : loom_error_set(err, LOOM_ERR_NOMEM, "cpu stream: out of memory");
}
static void cpu_stream_destroy(const loom_backend *be, loom_backend_stream *s) {
    (void)be;
    free(s);
}
static loom_status cpu_event_create(const loom_backend *be, loom_backend_event **out,
                                    loom_error *err) {
    (void)be;
    *out = calloc(1, sizeof **out);
    return *out ? LOOM_OK : loom_error_set(err, LOOM_ERR_NOMEM, "cpu event: out of memory");
}
static void cpu_event_destroy(const loom_backend *be, loom_backend_event *e) {
    (void)be;
    free(e);
}
static void cpu_event_record(const loom_backend *be, loom_backend_event *e,
                             loom_backend_stream *s) {
    (void)be, (void)s;
    e->recorded = 1;
}
static void cpu_stream_wait_event(const loom_backend *be, loom_backend_stream *s,
                                  loom_backend_event *e) {
    (void)be, (void)s, (void)e; /* the recorded work is done: nothing to wait for */
}
static void cpu_event_synchronize(const loom_backend *be, loom_backend_event *e) {
    (void)be, (void)e;
}
static loom_status cpu_status(const loom_backend *be, loom_error *err) {
    (void)be, (void)err;
    return LOOM_OK; /* the CPU kernels cannot fail */
}

static void linear_forward(const loom_backend *be, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int IC, int OC) {
    (void)be;
    loom_linear_forward(out, inp, weight, bias, N, IC, OC);
}
static void linear_backward_input(const loom_backend *be, float *dinp, const float *dout,
                                  const float *weight, int N, int IC, int OC) {
    (void)be;
    loom_linear_backward_input(dinp, dout, weight, N, IC, OC);
}
static void linear_backward_weight_ld(const loom_backend *be, float *dweight, const float *dout,
                                      int ld, const float *inp, int N, int IC, int OC) {
    (void)be;
    loom_linear_backward_weight_ld(dweight, dout, ld, inp, N, IC, OC);
}

static void linear_backward_weight(const loom_backend *be, float *dweight, float *dbias,
                                   const float *dout, const float *inp, int N, int IC, int OC) {
    (void)be;
    loom_linear_backward_weight(dweight, dbias, dout, inp, N, IC, OC);
}
static void embedding_forward(const loom_backend *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int B, int T, int C) {
    (void)be;
    loom_embedding_forward(out, tokens, wte, wpe, B, T, C);
}
static void embedding_backward(const loom_backend *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C) {
    (void)be;
    loom_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
}
static void layernorm_forward(const loom_backend *be, float *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C, float eps) {
    (void)be;
    loom_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
}
static void layernorm_backward(const loom_backend *be, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C) {
    (void)be;
    loom_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
static void layernorm_plain_forward(const loom_backend *be, float *out, float *mean, float *rstd,
                                    const float *inp, int N, int C, float eps) {
    (void)be;
    loom_layernorm_plain_forward(out, mean, rstd, inp, N, C, eps);
}
static void layernorm_plain_backward(const loom_backend *be, float *dinp, const float *dout,
                                     const float *inp, const float *mean, const float *rstd, int N,
                                     int C) {
    (void)be;
    loom_layernorm_plain_backward(dinp, dout, inp, mean, rstd, N, C);
}
static void rmsnorm_forward(const loom_backend *be, float *out, float *rstd, const float *inp,
                            const float *weight, int N, int C, float eps) {
    (void)be;
    loom_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}
static void rmsnorm_backward(const loom_backend *be, float *dinp, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C) {
    (void)be;
    loom_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}
static void gelu_forward(const loom_backend *be, float *out, const float *inp, size_t n) {
    (void)be;
    loom_gelu_forward(out, inp, n);
}
static void gelu_backward(const loom_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n) {
    (void)be;
    loom_gelu_backward(dinp, inp, dout, n);
}
static void silu_forward(const loom_backend *be, float *out, const float *inp, size_t n) {
    (void)be;
    loom_silu_forward(out, inp, n);
}
static void silu_backward(const loom_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n) {
    (void)be;
    loom_silu_backward(dinp, inp, dout, n);
}
static void swiglu_forward(const loom_backend *be, float *out, const float *inp, int N, int F) {
    (void)be;
    loom_swiglu_forward(out, inp, N, F);
}
static void swiglu_backward(const loom_backend *be, float *dinp, const float *dout,
                            const float *inp, int N, int F) {
    (void)be;
    loom_swiglu_backward(dinp, dout, inp, N, F);
}
static void add(const loom_backend *be, float *out, const float *a, const float *b, size_t n) {
    (void)be;
    loom_add(out, a, b, n);
}
static void rope_forward(const loom_backend *be, float *qkv, int B, int T, int H, int KV, int hd,
                         float theta) {
    (void)be;
    loom_rope_forward(qkv, B, T, H, KV, hd, theta);
}
static void rope_forward_at(const loom_backend *be, float *qkv, int B, int T, int H, int KV, int hd,
                            float theta, int pos0) {
    (void)be;
    loom_rope_forward_at(qkv, B, T, H, KV, hd, theta, pos0);
}
static void rope_backward(const loom_backend *be, float *dqkv, int B, int T, int H, int KV, int hd,
                          float theta) {
    (void)be;
    loom_rope_backward(dqkv, B, T, H, KV, hd, theta);
}
static void rope_backward_at(const loom_backend *be, float *dqkv, int B, int T, int H, int KV,
                             int hd, float theta, int pos0) {
    (void)be;
    loom_rope_backward_at(dqkv, B, T, H, KV, hd, theta, pos0);
}
static size_t attention_scratch_floats(const loom_backend *be, int B, int T, int H) {
    (void)be, (void)B, (void)H;
    return loom_attention_scratch_floats(T);
}
static void attention_forward(const loom_backend *be, float *out, float *lse, const float *qkv,
                              float *scratch, int B, int T, int H, int KV, int hd) {
    (void)be;
    loom_attention_forward(out, lse, qkv, scratch, B, T, H, KV, hd);
}
static void attention_backward(const loom_backend *be, float *dqkv, float *scratch,
                               const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int H, int KV, int hd) {
    (void)be;
    loom_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd);
}
static void attention_bidir_forward(const loom_backend *be, float *out, float *lse,
                                    const float *qkv, float *scratch, int B, int T, int H, int KV,
                                    int hd) {
    (void)be;
    loom_attention_bidir_forward(out, lse, qkv, scratch, B, T, H, KV, hd);
}
static void attention_bidir_backward(const loom_backend *be, float *dqkv, float *scratch,
                                     const float *dout, const float *qkv, const float *out,
                                     const float *lse, int B, int T, int H, int KV, int hd) {
    (void)be;
    loom_attention_bidir_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd);
}
static size_t attention_block_scratch_floats(const loom_backend *be, int chunk, int nk) {
    (void)be;
    return loom_attention_block_scratch_floats(chunk, nk);
}
static void attention_block_forward(const loom_backend *be, float *out, float *lse,
                                    const float *qkv, const float *kv, float *scratch,
                                    const loom_attention_blocks *g) {
    (void)be;
    loom_attention_block_forward(out, lse, qkv, kv, scratch, g);
}
static void attention_block_merge(const loom_backend *be, float *out, float *lse,
                                  const float *out_b, const float *lse_b,
                                  const loom_attention_blocks *g) {
    (void)be;
    loom_attention_block_merge(out, lse, out_b, lse_b, g);
}
static void attention_block_delta(const loom_backend *be, float *D, const float *dout,
                                  const float *out, const loom_attention_blocks *g) {
    (void)be;
    loom_attention_block_delta(D, dout, out, g);
}
static void attention_block_backward(const loom_backend *be, float *dqkv, float *dkv,
                                     float *scratch, const float *dout, const float *qkv,
                                     const float *kv, const float *lse, const float *D,
                                     const loom_attention_blocks *g) {
    (void)be;
    loom_attention_block_backward(dqkv, dkv, scratch, dout, qkv, kv, lse, D, g);
}
static void copy_2d(const loom_backend *be, float *dst, size_t dst_ld, const float *src,
                    size_t src_ld, size_t rows, size_t width) {
    (void)be;
    loom_copy_2d(dst, dst_ld, src, src_ld, rows, width);
}
static void add_2d(const loom_backend *be, float *dst, size_t dst_ld, const float *src,
                   size_t src_ld, size_t rows, size_t width) {
    (void)be;
    loom_add_2d(dst, dst_ld, src, src_ld, rows, width);
}
static void crossentropy_forward(const loom_backend *be, float *losses, const float *logits,
                                 const int32_t *targets, int N, int V) {
    (void)be;
    loom_crossentropy_forward(losses, logits, targets, N, V);
}
static void crossentropy_forward_backward(const loom_backend *be, float *losses, float *logits,
                                          const int32_t *targets, int N, int V, float dloss) {
    (void)be;
    loom_crossentropy_forward_backward(losses, logits, targets, N, V, dloss);
}
static void mse_forward(const loom_backend *be, float *losses, const float *pred,
                        const float *target, int N, int P) {
    (void)be;
    loom_mse_forward(losses, pred, target, N, P);
}
static void mse_forward_backward(const loom_backend *be, float *losses, float *pred,
                                 const float *target, int N, int P, float dloss) {
    (void)be;
    loom_mse_forward_backward(losses, pred, target, N, P, dloss);
}
static void modulate_forward(const loom_backend *be, float *out, const float *x, const float *shift,
                             const float *scale, int ld, int N, int C, int T, int row0) {
    (void)be;
    loom_modulate_forward(out, x, shift, scale, ld, N, C, T, row0);
}
static void modulate_backward(const loom_backend *be, float *dx, float *dshift, float *dscale,
                              const float *dout, const float *x, const float *scale, int ld, int N,
                              int C, int T, int row0) {
    (void)be;
    loom_modulate_backward(dx, dshift, dscale, dout, x, scale, ld, N, C, T, row0);
}
static void gate_add_forward(const loom_backend *be, float *out, const float *res, const float *y,
                             const float *gate, int ld, int N, int C, int T, int row0) {
    (void)be;
    loom_gate_add_forward(out, res, y, gate, ld, N, C, T, row0);
}
static void gate_add_backward(const loom_backend *be, float *dy, float *dgate, const float *dout,
                              const float *y, const float *gate, int ld, int N, int C, int T,
                              int row0) {
    (void)be;
    loom_gate_add_backward(dy, dgate, dout, y, gate, ld, N, C, T, row0);
}
static void add_position(const loom_backend *be, float *x, const float *pos, int N, int C, int T,
                         int row0) {
    (void)be;
    loom_add_position(x, pos, N, C, T, row0);
}
static void timestep_embedding(const loom_backend *be, float *out, const float *t, int B, int dim) {
    (void)be;
    loom_timestep_embedding(out, t, B, dim);
}
static void embedding_forward_shard(const loom_backend *be, float *out, const int32_t *tokens,
                                    const float *wte, const float *wpe, int v0, int V, int B, int T,
                                    int C) {
    (void)be;
    loom_embedding_forward_shard(out, tokens, wte, wpe, v0, V, B, T, C);
}
static void embedding_backward_shard(const loom_backend *be, float *dwte, float *dwpe,
                                     const float *dout, const int32_t *tokens, int v0, int V, int B,
                                     int T, int C) {
    (void)be;
    loom_embedding_backward_shard(dwte, dwpe, dout, tokens, v0, V, B, T, C);
}
static void crossentropy_shard_max(const loom_backend *be, float *maxes, const float *logits, int N,
                                   int V) {
    (void)be;
    loom_crossentropy_shard_max(maxes, logits, N, V);
}
static void crossentropy_shard_sums(const loom_backend *be, double *sums, double *target_logit,
                                    const float *logits, const int32_t *targets, const float *maxes,
                                    int N, int V, int v0) {
    (void)be;
    loom_crossentropy_shard_sums(sums, target_logit, logits, targets, maxes, N, V, v0);
}
static void crossentropy_shard_exp(const loom_backend *be, double *sums, double *target_logit,
                                   float *logits, const int32_t *targets, const float *maxes, int N,
                                   int V, int v0) {
    (void)be;
    loom_crossentropy_shard_exp(sums, target_logit, logits, targets, maxes, N, V, v0);
}
static void crossentropy_shard_losses(const loom_backend *be, float *losses, const float *maxes,
                                      const double *sums, const double *target_logit, int N) {
    (void)be;
    loom_crossentropy_shard_losses(losses, maxes, sums, target_logit, N);
}
static void crossentropy_shard_backward(const loom_backend *be, float *probs,
                                        const int32_t *targets, const double *sums, int N, int V,
                                        int v0, float dloss) {
    (void)be;
    loom_crossentropy_shard_backward(probs, targets, sums, N, V, v0, dloss);
}
static void adamw_update(const loom_backend *be, float *param, const float *grad, float *m,
                         float *v, size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t) {
    (void)be;
    loom_adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
}
static void moe_router_forward(const loom_backend *be, float *probs, int32_t *idx, float *w,
                               float *lse, const float *logits, int N, int E, int K) {
    (void)be;
    loom_moe_router_forward(probs, idx, w, lse, logits, N, E, K);
}
static int moe_capacity(const loom_backend *be, int32_t *pos, int32_t *load, int32_t *kept,
                        const int32_t *idx, int N, int K, int E, int cap) {
    (void)be;
    return loom_moe_capacity(pos, load, kept, idx, N, K, E, cap);
}
static void moe_permute(const loom_backend *be, float *send, const float *x, const int32_t *idx,
                        const int32_t *pos, const int32_t *offs, int N, int K, int C) {
    (void)be;
    loom_moe_permute(send, x, idx, pos, offs, N, K, C);
}
static void moe_combine(const loom_backend *be, float *out, const float *ret, const float *w,
                        const int32_t *idx, const int32_t *pos, const int32_t *offs, int N, int K,
                        int C) {
    (void)be;
    loom_moe_combine(out, ret, w, idx, pos, offs, N, K, C);
}
static void moe_combine_backward(const loom_backend *be, float *dret, float *dw, const float *dout,
                                 const float *ret, const float *w, const int32_t *idx,
                                 const int32_t *pos, const int32_t *offs, int N, int K, int C) {
    (void)be;
    loom_moe_combine_backward(dret, dw, dout, ret, w, idx, pos, offs, N, K, C);
}
static void moe_unpermute_add(const loom_backend *be, float *dx, const float *dsend,
                              const int32_t *idx, const int32_t *pos, const int32_t *offs, int N,
                              int K, int C) {
    (void)be;
    loom_moe_unpermute_add(dx, dsend, idx, pos, offs, N, K, C);
}
static void moe_router_backward(const loom_backend *be, float *dlogits, const float *probs,
                                const int32_t *idx, const float *w, const float *dw,
                                const float *lse, const float *dprob, float z, int N, int E,
                                int K) {
    (void)be;
    loom_moe_router_backward(dlogits, probs, idx, w, dw, lse, dprob, z, N, E, K);
}
static double sum_squares(const loom_backend *be, const float *x, size_t n) {
    (void)be;
    return loom_sum_squares(x, n);
}
static void scale(const loom_backend *be, float *x, float s, size_t n) {
    (void)be;
    loom_scale(x, s, n);
}

static const loom_backend_ops cpu_ops = {
    .mem_alloc = cpu_alloc,
    .mem_free = cpu_free,
    .mem_set = cpu_memset,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy_device = cpu_copy,
    .synchronize = cpu_synchronize,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .status = cpu_status,
    .linear_forward = linear_forward,
    .linear_backward_input = linear_backward_input,
    .linear_backward_weight = linear_backward_weight,
    .linear_backward_weight_ld = linear_backward_weight_ld,
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
    .attention_block_scratch_floats = attention_block_scratch_floats,
    .attention_block_forward = attention_block_forward,
    .attention_block_merge = attention_block_merge,
    .attention_block_delta = attention_block_delta,
    .attention_block_backward = attention_block_backward,
    .copy_2d = copy_2d,
    .add_2d = add_2d,
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

static const loom_backend cpu_backend = {
    .ops = &cpu_ops,
    .ctx = NULL,
    .device = LOOM_DEVICE_CPU,
    .name = "cpu",
    .align = LOOM_CPU_ALIGN,
};

const loom_backend *loom_backend_cpu(void) {
    return &cpu_backend;
}
