/* The kernel contract: every op of the transformer as a forward/backward pair over
 * plain row-major fp32 buffers with explicit shapes (llm.c style). The CPU backend
 * (kernels/cpu/) implements it with OpenBLAS for GEMMs and OpenMP-parallel C loops
 * for the rest; a CUDA backend implements the same contract. Code above kernels/ calls
 * these through the backend table of kernels/backend.h (loom_backend_cpu() points here).
 *
 * Conventions:
 *  - N = rows = B*T tokens; C = model width; buffers are row-major.
 *  - Backward functions ACCUMULATE (+=) into every gradient they write (dinp, dweight,
 *    dbias), so residual branches and gradient accumulation need no extra adds.
 *    The one exception is loom_rope_backward, which works in place (documented there).
 *  - Kernels never allocate; scratch space is passed in by the caller.
 *  - Linear weights are stored [out_features, in_features] (PyTorch nn.Linear layout).
 */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h" /* loom_bf16 */

/* ---- linear: out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be NULL) ---- */
void loom_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC);
/* dinp[N,IC] += dout[N,OC] @ weight[OC,IC] */
void loom_linear_backward_input(float *dinp, const float *dout, const float *weight, int N, int IC,
                                int OC);
/* dweight[OC,IC] += dout^T @ inp; dbias[OC] += column sums of dout (dbias may be NULL) */
void loom_linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                                 int N, int IC, int OC);
/* dweight[OC,IC] += dout^T @ inp, dout's rows ld floats apart (ld >= OC): the weight
 * gradient of a block of output rows, dout pointing at the block's first column */
void loom_linear_backward_weight_ld(float *dweight, const float *dout, int ld, const float *inp,
                                    int N, int IC, int OC);

/* ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (wpe may be NULL) ---- */
void loom_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
/* dwte[tok] += dout; dwpe[t] += sum over b of dout (dwpe may be NULL) */
void loom_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C);

/* ---- LayerNorm over the last dim; mean/rstd [N] saved for backward ---- */
void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);

/* ---- LayerNorm without weight/bias (PyTorch elementwise_affine=False):
 * out = (inp - mean) * rstd; the same numerics as loom_layernorm_forward (two-pass row
 * statistics in double), so it equals that kernel with weight 1 and bias 0. ---- */
void loom_layernorm_plain_forward(float *out, float *mean, float *rstd, const float *inp, int N,
                                  int C, float eps);
void loom_layernorm_plain_backward(float *dinp, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, int N, int C);

/* ---- RMSNorm: out = inp * rsqrt(mean(inp^2) + eps) * weight; rstd [N] saved ---- */
void loom_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps);
void loom_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

/* ---- GELU, tanh approximation (GPT-2), elementwise over n values ---- */
void loom_gelu_forward(float *out, const float *inp, size_t n);
void loom_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* The same from a bf16 input (--precision bf16's pre-activation kept in bf16): each value
 * widened exactly and the fp32 arithmetic above, bit for bit the fp32 kernel on the
 * widened input. */
void loom_gelu_forward_bf16(float *out, const loom_bf16 *inp, size_t n);
void loom_gelu_backward_bf16(float *dinp, const loom_bf16 *inp, const float *dout, size_t n);
/* In place: d = d(input) from d = d(output), bit for bit loom_gelu_backward_bf16 into a
 * zeroed dinp (the MLP's backward of --precision bf16 needs no second buffer). */
void loom_gelu_backward_bf16_inplace(float *d, const loom_bf16 *inp, size_t n);

/* ---- SwiGLU: inp[N, 2F] holds [gate | up] per row; out[N,F] = silu(gate) * up ---- */
void loom_swiglu_forward(float *out, const float *inp, int N, int F);
void loom_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F);
/* The same from a bf16 inp (bit for bit the fp32 kernel on the widened input). */
void loom_swiglu_forward_bf16(float *out, const loom_bf16 *inp, int N, int F);
void loom_swiglu_backward_bf16(float *dinp, const float *dout, const loom_bf16 *inp, int N, int F);

/* ---- SiLU: out = inp * sigmoid(inp), elementwise over n values ---- */
void loom_silu_forward(float *out, const float *inp, size_t n);
void loom_silu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* ---- residual add: out[i] = a[i] + b[i] (out may alias a or b) ---- */
void loom_add(float *out, const float *a, const float *b, size_t n);

/* ---- per-sample modulation (DiT's adaLN) ----
 * Rows are tokens of samples of T rows each: local row i (of N) is global row row0 + i,
 * of sample b = (row0 + i) / T; a sample's rows may be split at the first and last local
 * row (row0 and N need not be multiples of T). Per-sample vectors of C values are rows
 * of stride ld, indexed by the global sample: shift[b*ld + c] (ld = 6*C for slices of a
 * [B, 6C] adaLN output). The per-sample gradient sums run over the local rows of each
 * sample, in row order in double (deterministic), and are ADDED to the float buffers. */
/* out[i][c] = x[i][c] * (1 + scale[b*ld + c]) + shift[b*ld + c]; out does not alias x. */
void loom_modulate_forward(float *out, const float *x, const float *shift, const float *scale,
                           int ld, int N, int C, int T, int row0);
/* dx += dout * (1 + scale[b]); dshift[b*ld + c] += sum over b's rows of dout;
 * dscale[b*ld + c] += sum over b's rows of dout * x. */
void loom_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout,
                            const float *x, const float *scale, int ld, int N, int C, int T,
                            int row0);
/* Gated residual: out[i][c] = res[i][c] + gate[b*ld + c] * y[i][c] (out may alias res). */
void loom_gate_add_forward(float *out, const float *res, const float *y, const float *gate, int ld,
                           int N, int C, int T, int row0);
/* dy += dout * gate[b]; dgate[b*ld + c] += sum over b's rows of dout * y. (The residual's
 * gradient is dout itself: nothing to compute.) */
void loom_gate_add_backward(float *dy, float *dgate, const float *dout, const float *y,
                            const float *gate, int ld, int N, int C, int T, int row0);
/* Fixed position table: x[i][c] += pos[((row0 + i) % T)*C + c] (pos is [T, C]). */
void loom_add_position(float *x, const float *pos, int N, int C, int T, int row0);

/* ---- DiT's timestep_embedding of t * 1000, max period 10000 ----
 * out[b] (dim floats) = concat(cos(a), sin(a)), a_j = t[b]*1000 * exp(-ln(10000) * j /
 * half), j < half = dim / 2; computed in double, stored as float. dim odd: the last
 * column is 0 (DiT's padding). */
void loom_timestep_embedding(float *out, const float *t, int B, int dim);

/* ---- Attention input layout ----
 * qkv[B, T, (H + 2*KV) * hd]: per token, H query heads, then KV key heads, then KV
 * value heads, each hd wide. Query head h uses key/value head h / (H / KV) (grouped-
 * query attention; KV divides H). out[B, T, H*hd]. */

/* RoPE (Hugging Face Llama convention, "rotate_half": dims i and i + hd/2 form a pair,
 * angle = t * theta^(-2i/hd), t = 0..T-1) applied IN PLACE to the query and key heads of
 * qkv; value heads untouched. hd must be even. */
void loom_rope_forward(float *qkv, int B, int T, int H, int KV, int hd, float theta);
/* The same with positions pos0 .. pos0+T-1 (incremental decoding with a KV cache). */
void loom_rope_forward_at(float *qkv, int B, int T, int H, int KV, int hd, float theta, int pos0);
/* IN PLACE on dqkv: rotates the query/key gradients back by the inverse rotation. */
void loom_rope_backward(float *dqkv, int B, int T, int H, int KV, int hd, float theta);
/* The same with positions pos0 .. pos0+T-1 (a context-parallel rank's chunk). */
void loom_rope_backward_at(float *dqkv, int B, int T, int H, int KV, int hd, float theta, int pos0);

/* Causal scaled-dot-product attention, scale 1/sqrt(hd). Saves only out and the
 * per-row log-sum-exp lse[B, H, T]; the T x T scores are recomputed in backward, so
 * activation memory is O(T) per head, not O(T^2). scratch: caller-provided,
 * loom_attention_scratch_floats(T) floats, reused across layers. */
size_t loom_attention_scratch_floats(int T);
void loom_attention_forward(float *out, float *lse, const float *qkv, float *scratch, int B, int T,
                            int H, int KV, int hd);
/* dqkv[B,T,(H+2KV)*hd] += gradient w.r.t. qkv (queries, keys, values). */
void loom_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *out, const float *lse, int B, int T, int H, int KV,
                             int hd);
/* The causal backward from a bf16 qkv and out (--precision bf16 keeps both in bf16): each
 * (batch, key/value head) task widens its heads' columns into its part of scratch
 * (loom_attention_scratch_floats_bf16(T, hd) floats) and runs the fp32 arithmetic: bit for
 * bit loom_attention_backward on the widened tensors. */
size_t loom_attention_scratch_floats_bf16(int T, int hd);
void loom_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                  const loom_bf16 *qkv, const loom_bf16 *out, const float *lse,
                                  int B, int T, int H, int KV, int hd);
/* Bidirectional (non-causal) attention: the same layout, lse, scratch size
 * (loom_attention_scratch_floats(T)) and grouped-query rule, but every query attends
 * to all T keys of its sample (DiT). One implementation with the causal pair. */
void loom_attention_bidir_forward(float *out, float *lse, const float *qkv, float *scratch, int B,
                                  int T, int H, int KV, int hd);
void loom_attention_bidir_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                   const float *out, const float *lse, int B, int T, int H, int KV,
                                   int hd);

/* ---- Blockwise attention (ring context parallelism, src/cp) ----
 * A rank's queries against one key/value block at a time, merged with the log-sum-exp
 * rule, so the whole sequence's keys never sit in one place. The local rows are nq (or,
 * for a key/value block, nk) chunks of `chunk` tokens of each of B samples, ordered
 * [chunk j][sample b][t]: row (j*B + b)*chunk + t is token pos[j] + t of sample b.
 *  - queries: qkv rows as in the layout above ((H + 2*KV)*hd each); out rows H*hd.
 *  - a key/value block kv: 2*KV*hd per token, the KV key heads then the KV value heads
 *    (the contiguous tail of a qkv row, see loom_copy_2d); dkv the same layout.
 *  - lse and D: [nq*B segments][H][chunk] (segment j*B + b), B*H*nq*chunk floats.
 * Causally a key at position p is visible to a query at position q when p <= q; a
 * (query chunk, key chunk) pair with no visible key is skipped, a fully visible one is
 * computed without a mask, only partially visible pairs are masked (in 64-row blocks,
 * so most of the masked triangle is not computed). Rows that see no key of the block
 * get lse = -inf and out = 0 (they take no part in a merge). */
typedef struct loom_attention_blocks {
    int B, chunk;         /* samples; tokens per chunk */
    int H, KV, hd;        /* query heads, key/value heads (KV divides H), head width */
    int causal;           /* 1: causal by global position; 0: every key visible */
    int nq, nk;           /* chunks of the queries, of the key/value block (1 or 2) */
    int qpos[2], kpos[2]; /* global position of each chunk's first token */
} loom_attention_blocks;

/* Floats of scratch for a block of nk chunks: P and dS of one query chunk per thread. */
size_t loom_attention_block_scratch_floats(int chunk, int nk);
/* out[nq*B*chunk, H*hd], lse (overwritten): attention of the queries over the block only. */
void loom_attention_block_forward(float *out, float *lse, const float *qkv, const float *kv,
                                  float *scratch, const loom_attention_blocks *g);
/* The running result (out, lse) absorbs a partial one (out_b, lse_b) over other keys:
 * lse = log(e^lse + e^lse_b), out = out e^(lse_old - lse) + out_b e^(lse_b - lse). */
void loom_attention_block_merge(float *out, float *lse, const float *out_b, const float *lse_b,
                                const loom_attention_blocks *g);
/* D[segment][h][t] = dot(dout, out) over head h's hd columns (the softmax Jacobian term). */
void loom_attention_block_delta(float *D, const float *dout, const float *out,
                                const loom_attention_blocks *g);
/* The block's share of the gradient given the FINAL lse and D of the queries:
 * dqkv's query columns += dS K; dkv[nk*B*chunk, 2*KV*hd] += (dS^T Q, P^T dO). Tasks own one
 * (sample, key/value head), so the result does not depend on the thread count. */
void loom_attention_block_backward(float *dqkv, float *dkv, float *scratch, const float *dout,
                                   const float *qkv, const float *kv, const float *lse,
                                   const float *D, const loom_attention_blocks *g);

/* ---- strided 2-D copies (re-layout for the context-parallel exchanges) ----
 * rows x width floats: dst[r*dst_ld + c] = (or +=) src[r*src_ld + c]. No overlap. */
void loom_copy_2d(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                  size_t width);
void loom_add_2d(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                 size_t width);

/* ---- fused softmax + cross-entropy over V classes ----
 * losses[N] = logsumexp(logits[n]) - logits[n][targets[n]].
 * In the _backward variant logits[N,V] is overwritten in place with
 * dlogits = (softmax(logits) - onehot(target)) * dloss (dloss is the weight of each
 * row's loss in the total, e.g. 1 / global token count). */
void loom_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V);
void loom_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets, int N,
                                        int V, float dloss);
/* The same over bf16 logits (--precision bf16's LM head, docs/precision.md): softmax and
 * loss in fp32 from the widened logits (sums in double); dlogits overwrite them rounded to
 * bf16 (nearest even: the bits a bf16 GEMM would round fp32 dlogits to). */
void loom_crossentropy_forward_bf16(float *losses, const loom_bf16 *logits, const int32_t *targets,
                                    int N, int V);
void loom_crossentropy_forward_backward_bf16(float *losses, loom_bf16 *logits,
                                             const int32_t *targets, int N, int V, float dloss);

/* ---- mean squared error over P values per row (flow matching's velocity loss) ----
 * losses[n] = mean over j < P of (pred[n][j] - target[n][j])^2, accumulated in double.
 * In the _backward variant pred[N,P] is overwritten in place with
 * dpred = 2 * (pred - target) / P * dloss (dloss: the weight of each row's loss in the
 * total, as for the cross-entropy); its losses are bitwise those of the forward. */
void loom_mse_forward(float *losses, const float *pred, const float *target, int N, int P);
void loom_mse_forward_backward(float *losses, float *pred, const float *target, int N, int P,
                               float dloss);

/* ---- vocabulary-parallel pieces (tensor parallelism): this rank holds rows
 * [v0, v0 + V) of the embedding / output head, and logits[N, V] are columns [v0, v0 + V)
 * of the full logits. Summed over the ranks (and with the global row maxima), they give
 * exactly what the unsharded kernels give. ---- */
/* out[bt] = wte[tok - v0] if this shard owns tok, else 0; + wpe[t] when wpe != NULL. */
void loom_embedding_forward_shard(float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int v0, int V, int B, int T, int C);
/* dwte[tok - v0] += dout for owned tokens; dwpe[t] += sum over b of dout (may be NULL). */
void loom_embedding_backward_shard(float *dwte, float *dwpe, const float *dout,
                                   const int32_t *tokens, int v0, int V, int B, int T, int C);
/* maxes[n] = max over the shard's columns of row n. */
void loom_crossentropy_shard_max(float *maxes, const float *logits, int N, int V);
/* sums[n] = sum_j exp(logits[n][j] - maxes[n]) (maxes: the global row maxima);
 * target_logit[n] = logits[n][targets[n] - v0] if owned, else 0. */
void loom_crossentropy_shard_sums(double *sums, double *target_logit, const float *logits,
                                  const int32_t *targets, const float *maxes, int N, int V, int v0);
/* The same, and logits are replaced by exp(logits - maxes) (for the backward). */
void loom_crossentropy_shard_exp(double *sums, double *target_logit, float *logits,
                                 const int32_t *targets, const float *maxes, int N, int V, int v0);
/* losses[n] = maxes[n] + log(sums[n]) - target_logit[n] (global sums and target logits). */
void loom_crossentropy_shard_losses(float *losses, const float *maxes, const double *sums,
                                    const double *target_logit, int N);
/* probs (the exponentials of _exp) become dlogits = (probs / sums - onehot) * dloss. */
void loom_crossentropy_shard_backward(float *probs, const int32_t *targets, const double *sums,
                                      int N, int V, int v0, float dloss);

/* ---- AdamW (PyTorch's torch.optim.AdamW semantics, decoupled weight decay) ----
 * param *= 1 - lr * weight_decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * param -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). t >= 1. */
void loom_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t);

/* ---- mixture-of-experts routing (kernels/cpu/moe_route.c) ----
 * Router: probs[N,E] = softmax(logits[N,E]); idx[N,K] the K largest probabilities per
 * row in decreasing order (ties: lower expert index first); w[N,K] those probabilities
 * renormalised to sum 1 (Mixtral: softmax, then top-k, then renormalise);
 * lse[N] = logsumexp of the row (router z-loss). E <= 1024. */
void loom_moe_router_forward(float *probs, int32_t *idx, float *w, float *lse, const float *logits,
                             int N, int E, int K);
/* Capacity: assignments (token t, slot j) are visited slot-major (every token's first
 * choice, in token order, then every second choice, ...); pos[t*K+j] = the
 * assignment's row among its expert's kept rows, or -1 when the expert already holds
 * cap rows (cap <= 0: no limit). load[E] counts all assignments, kept[E] the kept ones
 * (both overwritten). Returns the number dropped. */
int loom_moe_capacity(int32_t *pos, int32_t *load, int32_t *kept, const int32_t *idx, int N, int K,
                      int E, int cap);
/* Dispatch layout: expert e's kept rows start at row offs[e]; the row of (t, j) is
 * offs[idx] + pos. send[row] = x[t] for every kept assignment. */
void loom_moe_permute(float *send, const float *x, const int32_t *idx, const int32_t *pos,
                      const int32_t *offs, int N, int K, int C);
/* out[t] = sum over kept j (in slot order) of w[t,j] * ret[row(t, j)] (overwrites out). */
void loom_moe_combine(float *out, const float *ret, const float *w, const int32_t *idx,
                      const int32_t *pos, const int32_t *offs, int N, int K, int C);
/* Backward of the combine: dret[row(t, j)] = w[t,j] * dout[t]; dw[t,j] = <dout[t],
 * ret[row(t, j)]> (0 for a dropped assignment). */
void loom_moe_combine_backward(float *dret, float *dw, const float *dout, const float *ret,
                               const float *w, const int32_t *idx, const int32_t *pos,
                               const int32_t *offs, int N, int K, int C);
/* dx[t] += sum over kept j (in slot order) of dsend[row(t, j)]. */
void loom_moe_unpermute_add(float *dx, const float *dsend, const int32_t *idx, const int32_t *pos,
                            const int32_t *offs, int N, int K, int C);
/* Router backward: dlogits[N,E] (overwritten) from dw[N,K] (the gradient of the
 * renormalised weights), plus dprob[e] added to d(probs[t,e]) for every token (the
 * load-balancing loss) and z * 2 * lse[t] * probs[t,e] (the z-loss, z its weight per
 * token). */
void loom_moe_router_backward(float *dlogits, const float *probs, const int32_t *idx,
                              const float *w, const float *dw, const float *lse, const float *dprob,
                              float z, int N, int E, int K);

/* ---- sum of squares in double (for global-norm gradient clipping) and scaling ---- */
double loom_sum_squares(const float *x, size_t n);
void loom_scale(float *x, float s, size_t n);

#endif
