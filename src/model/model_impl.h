/* Internal to model/: what the families' forward/backward share (transformer.c for the
 * language models, dit.c for the diffusion transformer; model.c runs their tables): the
 * arena carver that plans activations, and the Megatron linear layers over the
 * tensor-parallel group. */
#ifndef LOOM_MODEL_MODEL_IMPL_H
#define LOOM_MODEL_MODEL_IMPL_H

#include <stddef.h>

#include "model/linear_backward.h"
#include "model/model.h"

/* Carves the arena twice: first without one to size it, then from the backend arena.
 * Pieces are rounded to the backend's alignment (64 bytes on the CPU), so the sizing
 * pass and the arena's bump allocation agree piece by piece. */
typedef struct loom_carver {
    const loom_backend *be;
    loom_backend_arena *arena; /* NULL: sizing */
    size_t used;               /* bytes */
} loom_carver;

float *loom_carve(loom_carver *cv, size_t floats);
/* n bf16 values (half as many floats, rounded up). */
loom_bf16 *loom_carve_bf16(loom_carver *cv, size_t n);
/* n values of an activation kept for backward: bf16 (*h) when bf16, else fp32 (*f); the
 * other NULL. */
void loom_carve_kept(loom_carver *cv, int bf16, size_t n, float **f, loom_bf16 **h);
/* 1 when activations only bf16 GEMMs read are kept in bf16 (docs/precision.md): the
 * backend's GEMMs are bf16 and the residual stream is not split (split: 1 under sequence
 * parallelism over tp > 1, whose gathers move fp32 rows). */
int loom_model_bf16_activations(const loom_model *m, int split);
/* --precision bf16 (docs/precision.md): 1 when the language models' qkv (after RoPE) and
 * MLP pre-activation are rounded to bf16 values (every layout: the function of a bf16
 * run); loom_model_keep_bf16_pre: 1 when they are also kept as bf16 (else as fp32 values,
 * LOOM_BF16_FP32_ACTIVATIONS=1). */
int loom_model_bf16_pre_activations(const loom_model *m);
int loom_model_keep_bf16_pre(const loom_model *m);
/* An activation kept for backward, for a kernel that reads fp32: x itself, or (kept in
 * bf16: x NULL) its copy x16 widened into scratch (n values). */
const float *loom_model_widen_kept(const loom_model *m, const float *x, const loom_bf16 *x16,
                                   float *scratch, size_t n);
/* GELU of a pre-activation kept for backward (n values): from its bf16 copy x16 when
 * there is one, else from x; backward adds d(x) into dx. */
void loom_model_gelu_forward_kept(const loom_backend *be, float *out, const float *x,
                                  const loom_bf16 *x16, size_t n);
void loom_model_gelu_backward_kept(const loom_backend *be, float *dx, const float *x,
                                   const loom_bf16 *x16, const float *dout, size_t n);
/* x[n], the fp32 output of qkv's or fc's GEMM, rounded as loom_model_bf16_pre_activations
 * says: into kept (when not NULL; then x keeps its fp32 value unless widen, which writes
 * the rounded values back), else in place when the model rounds them, else untouched. */
void loom_model_round_pre(const loom_model *m, loom_bf16 *kept, float *x, size_t n, int widen);
/* 1 when the language model's logits are bf16 values (docs/precision.md): the backend has
 * the bf16-logit ops, not a vlm (its loss weighs the rows in place) and not
 * cfg.fp32_logits (loom rl). */
int loom_model_bf16_logits(const loom_model *m);
/* 1 when they are also kept as bf16 (with their gradient): loom_model_bf16_logits and one
 * tensor-parallel rank (the vocabulary-parallel loss reads fp32 logits, which the head
 * then rounds to bf16 values in place: the same function, fp32's bytes). */
int loom_model_keep_bf16_logits(const loom_model *m);
/* Sizes the arena with plan(m, sizing, sequence_parallel), allocates it on the backend
 * and carves it with the same plan. */
loom_status loom_model_arena_allocate(loom_model *m, void (*plan)(loom_model *, loom_carver *, int),
                                      loom_error *err);
/* The bytes plan() would carve, without touching m. */
size_t loom_model_arena_plan_bytes(const loom_model *m,
                                   void (*plan)(loom_model *, loom_carver *, int),
                                   int sequence_parallel);

/* 1 when the residual stream is split over tp (sequence parallelism on, tp > 1). */
int loom_model_seq_parallel(const loom_model *m);
/* The residual stream's local rows gathered into m->full (sequence parallelism; else
 * *inp = local). */
loom_status loom_model_tp_gather(const loom_model *m, const float *local, const float **inp);
/* LOOM_BF16_ROUND_TP (model/tp_round.c): parsed at creation (LOOM_ERR_INPUT for a value or
 * model it cannot emulate), the row-parallel forward out[N, C] and the column-parallel input
 * gradient dx[N, C] as tp's rounded partial sums. */
loom_status loom_model_round_tp_open(loom_model *m, loom_error *err);
void loom_model_round_tp_close(loom_model *m);
loom_status loom_model_round_tp_row_forward(loom_model *m, float *out, loom_act inp, const float *w,
                                            const float *b, int IC);
loom_status loom_model_round_tp_column_input(loom_model *m, float *dx, loom_act dy, const float *w,
                                             int OC);
/* The same for an input whose only readers are bf16 GEMMs: under --precision bf16 it
 * travels as bf16 (loom_tp_gather_linear), which the GEMMs read unchanged. */
loom_status loom_model_tp_gather_gemm(const loom_model *m, const float *local, const float **inp);
/* The same for a loom_act (GEMM inputs: loom_model_tp_gather_gemm) (a bf16 one is never split: it
 * is its own gathered input). */
loom_status loom_model_tp_gather_act(const loom_model *m, loom_act local, loom_act *inp);
/* Partial sums over tp: all-reduced (out = partial) or reduce-scattered to this rank's
 * rows (sequence parallelism); nothing on one rank. */
loom_status loom_model_tp_reduce(const loom_model *m, float *partial, float *out);
/* Row-parallel linear: out[Ns, C] = the sum over ranks of inp[N, IC] @ w^T, + bias once
 * (m->dnorm is the partial sum's scratch with sequence parallelism). */
loom_status loom_model_row_forward(loom_model *m, float *out, loom_act inp, const float *w,
                                   const float *b, int IC);
/* A linear layer's forward out[N, OC] = inp @ w^T + b on this rank (no tp): the bf16
 * backend's bf16-input op for a bf16 activation, else the fp32-signature op. */
void loom_model_linear_forward(const loom_model *m, float *out, loom_act inp, const float *w,
                               const float *b, int N, int IC, int OC);
/* Activations kept in bf16 (docs/precision.md): dst = src rounded to nearest even, the bits
 * the GEMMs would round src to (nothing when dst is NULL: kept in fp32). */
void loom_model_keep_bf16(const loom_model *m, loom_bf16 *dst, const float *src, size_t n);
/* Column-parallel linear backward: dw, db from dout [N, OC] and the (gathered) input
 * (none under split backward: loom_model_column_weight gives them later); *dinp = this
 * rank's rows of d(input), summed over the ranks (in m->dnorm or m->full). */
loom_status loom_model_column_backward(loom_model *m, const float *dout, const float *w, float *dw,
                                       float *db, loom_act inp_local, int OC, const float **dinp);
/* Its weight gradient alone (split backward's W). */
loom_status loom_model_column_weight(loom_model *m, const float *dout, float *dw, float *db,
                                     loom_act inp_local, int OC);
/* Row-parallel linear backward from this rank's rows of d(out) (dout_local [Ns, C],
 * gathered here): dinp [N, IC] = d(input) of this rank's columns; dw, db from the gathered
 * d(out) and inp [N, IC], or under split backward that d(out) copied into keep [N, C] for
 * loom_model_row_weight. */
loom_status loom_model_row_backward(loom_model *m, const float *dout_local, const float *w,
                                    float *dw, float *db, loom_act inp, int IC, float *dinp,
                                    float *keep);
/* Split backward's W of a block's branch y = out(f(in(x))) (the MLP: fc then proj; the
 * attention: qkv then attn_out), flat offsets into g (a bias may be LOOM_NO_PARAM): the
 * row-parallel output linear's weight gradient from its d(out) [N, C] kept by
 * loom_model_row_backward and its input mid [N, IC], then the column-parallel input
 * linear's from its kept d(output) [N, OC] and this rank's rows of x. */
loom_status loom_model_branch_weight(loom_model *m, float *g, size_t out_w, size_t out_b,
                                     const float *d_out, loom_act mid, int IC, size_t in_w,
                                     size_t in_b, const float *d_in, loom_act x_local, int OC);

/* Pointer to a tensor in a flat buffer, NULL when the family has none. */
static inline float *loom_at(float *flat, size_t offset) {
    return offset == LOOM_NO_PARAM ? NULL : flat + offset;
}
static inline const float *loom_cat(const float *flat, size_t offset) {
    return offset == LOOM_NO_PARAM ? NULL : flat + offset;
}

/* Runs the block hook (before: after 0, after: 1) around block `layer`'s forward
 * (backward 0) or backward (1), if one is set. */
static inline loom_status loom_model_hook(const loom_model *m, int after, int layer, int backward) {
    const loom_block_hooks *h = &m->hooks;
    loom_status (*fn)(void *, int, int) = after ? h->after_block : h->before_block;
    return fn ? fn(h->ctx, layer, backward) : LOOM_OK;
}

/* Context parallelism (context.c): 1 when the sequence is split over a cp group. */
int loom_model_cp_on(const loom_model *m);
/* This rank's chunks of every sample: returns their number n (1 without context
 * parallelism) and their first global positions in pos; each is m->T / n tokens long and
 * the rows are ordered [chunk][sample][token]. */
int loom_model_chunks(const loom_model *m, int pos[2]);
/* A language model's records [first, first + B) (windows of T_seq + 1 tokens): this rank's
 * tokens and next-token targets into m->inputs / m->targets. */
void loom_model_load_tokens(loom_model *m, const int32_t *batch, int first);
/* RoPE at the rows' global positions, in place (backward: the inverse rotation). */
void loom_model_rope(const loom_model *m, float *qkv, int H, int KV, int hd, int backward);
/* Attention of m->B samples (causal or bidirectional), through the cp group when there is
 * one; the same contracts as the backend's attention (backward accumulates into dqkv). */
loom_status loom_model_attention_forward(loom_model *m, float *out, float *lse, const float *qkv,
                                         int H, int KV, int hd, int causal);
loom_status loom_model_attention_backward(loom_model *m, float *dqkv, const float *dout,
                                          const float *qkv, const float *out, const float *lse,
                                          int H, int KV, int hd, int causal);
/* Floats of the arena's attention scratch (none with context parallelism: cp has its own). */
size_t loom_model_attention_scratch_floats(const loom_model *m, int H);

/* The language models' table of pieces (transformer.c): every model starts with it. */
const loom_model_ops *loom_lm_ops(void);
/* The diffusion transformer's side (dit.c): sets m->ops, the conditioning and the arena. */
loom_status loom_dit_attach(loom_model *m, loom_error *err);
void loom_dit_detach(loom_model *m);
/* The multimodal LLM's side (vlm.c): the language models' table with the encoder, the
 * projector, the image rows and the masked loss; its arena. */
loom_status loom_vlm_attach(loom_model *m, loom_error *err);
void loom_vlm_detach(loom_model *m);
/* Words of a vlm batch record (also in model/vlm.h, which would include back into here). */
int loom_vlm_record_words(const loom_model_config *cfg);

#endif
