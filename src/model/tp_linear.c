/* The Megatron linear layers every family's blocks use (model/model_impl.h): column- and
 * row-parallel over the tensor-parallel group, with sequence parallelism's gather and
 * reduce-scatter; on one rank they are the plain linear layer. */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_bf16.h"
#include "model/model_impl.h"

int loom_model_seq_parallel(const loom_model *m) {
    return m->tp && m->tp->size > 1 && m->tp->sequence_parallel;
}

loom_status loom_model_tp_gather(const loom_model *m, const float *local, const float **inp) {
    if (!loom_model_seq_parallel(m)) {
        *inp = local;
        return LOOM_OK;
    }
    return loom_tp_gather(m->tp, local, m->full, inp);
}

loom_status loom_model_tp_gather_gemm(const loom_model *m, const float *local, const float **inp) {
    if (!loom_model_seq_parallel(m)) {
        *inp = local;
        return LOOM_OK;
    }
    return loom_tp_gather_linear(m->tp, local, m->full, inp);
}

/* A bf16 activation is kept only where nothing is gathered (sequence parallelism keeps
 * fp32: transformer.c's plan), so it is its own gathered input. */
loom_status loom_model_tp_gather_act(const loom_model *m, loom_act local, loom_act *inp) {
    if (local.bf16) {
        *inp = local;
        return LOOM_OK;
    }
    inp->bf16 = NULL;
    return loom_model_tp_gather_gemm(m, local.f32, &inp->f32);
}

void loom_model_linear_forward(const loom_model *m, float *out, loom_act inp, const float *w,
                               const float *b, int N, int IC, int OC) {
    if (inp.bf16)
        loom_backend_linear_forward_in_bf16(m->be, out, inp.bf16, w, b, N, IC, OC);
    else
        loom_backend_linear_forward(m->be, out, inp.f32, w, b, N, IC, OC);
}

void loom_model_keep_bf16(const loom_model *m, loom_bf16 *dst, const float *src, size_t n) {
    if (dst) loom_backend_round_bf16(m->be, dst, src, n);
}

loom_status loom_model_tp_reduce(const loom_model *m, float *partial, float *out) {
    return m->tp && m->tp->size > 1 ? loom_tp_reduce(m->tp, partial, out) : LOOM_OK;
}

/* A linear's partial sums (row-parallel output, column-parallel input gradient). */
static loom_status tp_reduce_linear(const loom_model *m, float *partial, float *out) {
    return m->tp && m->tp->size > 1 ? loom_tp_reduce_linear(m->tp, partial, out) : LOOM_OK;
}

static int tp_rank(const loom_model *m) {
    return m->tp ? m->tp->rank : 0;
}

loom_status loom_model_row_forward(loom_model *m, float *out, loom_act inp, const float *w,
                                   const float *b, int IC) {
    if (m->round_tp) return loom_model_round_tp_row_forward(m, out, inp, w, b, IC);
    float *part = loom_model_seq_parallel(m) ? m->dnorm : out;
    loom_model_linear_forward(m, part, inp, w, tp_rank(m) == 0 ? b : NULL, m->B * m->T, IC,
                              m->cfg.d_model);
    return tp_reduce_linear(m, part, out);
}

loom_status loom_model_column_backward(loom_model *m, const float *dout, const float *w, float *dw,
                                       float *db, loom_act inp_local, int OC, const float **dinp) {
    const int N = m->B * m->T, C = m->cfg.d_model;
    loom_act inp = {NULL, NULL};
    loom_status st = m->split_backward ? LOOM_OK : loom_model_tp_gather_act(m, inp_local, &inp);
    if (st) return st;
    if (m->round_tp) { /* the tests' reference (model/tp_round.c) */
        loom_linear_backward_act(m->be, NULL, LOOM_DX_SET, dout, w, m->split_backward ? NULL : dw,
                                 db, inp, N, C, OC);
        *dinp = m->dnorm;
        return loom_model_round_tp_column_input(m, m->dnorm, loom_act_f32(dout), w, OC);
    }
    loom_linear_backward_act(m->be, m->dnorm, LOOM_DX_SET, dout, w, m->split_backward ? NULL : dw,
                             db, inp, N, C, OC);
    float *out = loom_model_seq_parallel(m) ? m->full : m->dnorm;
    *dinp = out;
    return tp_reduce_linear(m, m->dnorm, out);
}

loom_status loom_model_column_weight(loom_model *m, const float *dout, float *dw, float *db,
                                     loom_act inp_local, int OC) {
    loom_act inp;
    loom_status st = loom_model_tp_gather_act(m, inp_local, &inp);
    if (!st)
        loom_linear_backward_act(m->be, NULL, LOOM_DX_SET, dout, NULL, dw, db, inp, m->B * m->T,
                                 m->cfg.d_model, OC);
    return st;
}

loom_status loom_model_row_backward(loom_model *m, const float *dout_local, const float *w,
                                    float *dw, float *db, loom_act inp, int IC, float *dinp,
                                    float *keep) {
    const int N = m->B * m->T, C = m->cfg.d_model;
    const float *dy;
    /* without a bias every reader of the gathered d(out) is a GEMM (bf16 may carry it); the
     * bias gradient sums the fp32 d(out) */
    loom_status st = db ? loom_model_tp_gather(m, dout_local, &dy)
                        : loom_model_tp_gather_gemm(m, dout_local, &dy);
    if (st) return st;
    loom_linear_backward_act(m->be, dinp, LOOM_DX_SET, dy, w, m->split_backward ? NULL : dw, db,
                             inp, N, IC, C);
    if (m->split_backward && keep)
        loom_backend_copy(m->be, keep, dy, (size_t)N * C * sizeof(float));
    return LOOM_OK;
}

loom_status loom_model_branch_weight(loom_model *m, float *g, size_t out_w, size_t out_b,
                                     const float *d_out, loom_act mid, int IC, size_t in_w,
                                     size_t in_b, const float *d_in, loom_act x_local, int OC) {
    loom_linear_backward_act(m->be, NULL, LOOM_DX_SET, d_out, NULL, g + out_w, loom_at(g, out_b),
                             mid, m->B * m->T, IC, m->cfg.d_model);
    return loom_model_column_weight(m, d_in, g + in_w, loom_at(g, in_b), x_local, OC);
}

loom_bf16 *loom_carve_bf16(loom_carver *cv, size_t n) {
    return (loom_bf16 *)loom_carve(cv, (n + 1) / 2);
}

void loom_carve_kept(loom_carver *cv, int bf16, size_t n, float **f, loom_bf16 **h) {
    *f = bf16 ? NULL : loom_carve(cv, n);
    *h = bf16 ? loom_carve_bf16(cv, n) : NULL;
}

int loom_model_bf16_logits(const loom_model *m) {
    return loom_backend_bf16_logits(m->be) && !m->cfg.fp32_logits && !m->vlm;
}

int loom_model_keep_bf16_logits(const loom_model *m) {
    return loom_model_bf16_logits(m) && (!m->tp || m->tp->size == 1);
}

int loom_model_bf16_activations(const loom_model *m, int split) {
    return loom_backend_bf16_activations(m->be) && !split;
}

int loom_model_bf16_pre_activations(const loom_model *m) {
    return loom_backend_precision(m->be) == LOOM_PRECISION_BF16 &&
           m->be->ops->round_bf16_values != NULL;
}

int loom_model_keep_bf16_pre(const loom_model *m) {
    return loom_model_bf16_pre_activations(m) && loom_backend_bf16_pre_activations(m->be);
}

const float *loom_model_widen_kept(const loom_model *m, const float *x, const loom_bf16 *x16,
                                   float *scratch, size_t n) {
    if (!x16) return x;
    loom_backend_widen_bf16(m->be, scratch, x16, n);
    return scratch;
}

void loom_model_gelu_forward_kept(const loom_backend *be, float *out, const float *x,
                                  const loom_bf16 *x16, size_t n) {
    if (x16)
        loom_backend_gelu_forward_in_bf16(be, out, x16, n);
    else
        loom_backend_gelu_forward(be, out, x, n);
}

void loom_model_gelu_backward_kept(const loom_backend *be, float *dx, const float *x,
                                   const loom_bf16 *x16, const float *dout, size_t n) {
    if (x16)
        loom_backend_gelu_backward_in_bf16(be, dx, x16, dout, n);
    else
        loom_backend_gelu_backward(be, dx, x, dout, n);
}

void loom_model_round_pre(const loom_model *m, loom_bf16 *kept, float *x, size_t n, int widen) {
    if (kept) {
        loom_backend_round_bf16(m->be, kept, x, n);
        if (widen) loom_backend_widen_bf16(m->be, x, kept, n);
    } else if (loom_model_bf16_pre_activations(m)) {
        loom_backend_round_bf16_values(m->be, x, n);
    }
}

float *loom_carve(loom_carver *cv, size_t floats) {
    const size_t bytes = loom_backend_piece_bytes(cv->be, floats * sizeof(float));
    /* the arena was sized by the same pieces: the allocation cannot fail */
    float *p = cv->arena ? loom_backend_arena_alloc(cv->arena, bytes, "activations", NULL) : NULL;
    cv->used += bytes;
    return p;
}

loom_status loom_model_arena_allocate(loom_model *m, void (*plan)(loom_model *, loom_carver *, int),
                                      loom_error *err) {
    loom_carver sizing = {m->be, NULL, 0};
    plan(m, &sizing, loom_model_seq_parallel(m));
    m->arena_floats = sizing.used / sizeof(float);
    if (m->size_only) return LOOM_OK; /* measured, never run */
    if (loom_backend_arena_create(&m->arena, m->be, sizing.used, "activations", NULL))
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "activations: cannot allocate %.1f MiB for micro-batch %d x %d",
                              (double)sizing.used / (1 << 20), m->B, m->T);
    loom_carver real = {m->be, &m->arena, 0};
    plan(m, &real, loom_model_seq_parallel(m));
    return LOOM_OK;
}

size_t loom_model_arena_plan_bytes(const loom_model *m,
                                   void (*plan)(loom_model *, loom_carver *, int),
                                   int sequence_parallel) {
    loom_model copy = *m; /* plan() writes pointers: let it write into a copy */
    copy.blocks = calloc((size_t)m->cfg.n_layer, sizeof *copy.blocks);
    if (!copy.blocks) return 0;
    loom_carver sizing = {m->be, NULL, 0};
    plan(&copy, &sizing, sequence_parallel);
    free(copy.blocks);
    return sizing.used;
}
