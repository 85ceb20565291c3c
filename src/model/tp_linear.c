/* The Megatron linear layers every family's blocks use (model/model_impl.h): column- and
 * row-parallel over the tensor-parallel group, with sequence parallelism's gather and
 * reduce-scatter; on one rank they are the plain linear layer. */
#include <stdlib.h>
#include <string.h>

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

loom_status loom_model_tp_reduce(const loom_model *m, float *partial, float *out) {
    return m->tp && m->tp->size > 1 ? loom_tp_reduce(m->tp, partial, out) : LOOM_OK;
}

static int tp_rank(const loom_model *m) {
    return m->tp ? m->tp->rank : 0;
}

loom_status loom_model_row_forward(loom_model *m, float *out, const float *inp, const float *w,
                                   const float *b, int IC) {
    float *part = loom_model_seq_parallel(m) ? m->dnorm : out;
    loom_backend_linear_forward(m->be, part, inp, w, tp_rank(m) == 0 ? b : NULL, m->B * m->T, IC,
                                m->cfg.d_model);
    return loom_model_tp_reduce(m, part, out);
}

loom_status loom_model_column_backward(loom_model *m, const float *dout, const float *w, float *dw,
                                       float *db, const float *inp_local, int OC,
                                       const float **dinp) {
    const int N = m->B * m->T, C = m->cfg.d_model;
    const float *inp = NULL;
    loom_status st = m->split_backward ? LOOM_OK : loom_model_tp_gather(m, inp_local, &inp);
    if (st) return st;
    loom_linear_backward(m->be, m->dnorm, LOOM_DX_SET, dout, w, m->split_backward ? NULL : dw, db,
                         inp, N, C, OC);
    float *out = loom_model_seq_parallel(m) ? m->full : m->dnorm;
    *dinp = out;
    return loom_model_tp_reduce(m, m->dnorm, out);
}

loom_status loom_model_column_weight(loom_model *m, const float *dout, float *dw, float *db,
                                     const float *inp_local, int OC) {
    const float *inp;
    loom_status st = loom_model_tp_gather(m, inp_local, &inp);
    if (!st)
        loom_linear_backward(m->be, NULL, LOOM_DX_SET, dout, NULL, dw, db, inp, m->B * m->T,
                             m->cfg.d_model, OC);
    return st;
}

loom_status loom_model_row_backward(loom_model *m, const float *dout_local, const float *w,
                                    float *dw, float *db, const float *inp, int IC, float *dinp,
                                    float *keep) {
    const int N = m->B * m->T, C = m->cfg.d_model;
    const float *dy;
    loom_status st = loom_model_tp_gather(m, dout_local, &dy);
    if (st) return st;
    loom_linear_backward(m->be, dinp, LOOM_DX_SET, dy, w, m->split_backward ? NULL : dw, db, inp, N,
                         IC, C);
    if (m->split_backward) loom_backend_copy(m->be, keep, dy, (size_t)N * C * sizeof(float));
    return LOOM_OK;
}

loom_status loom_model_branch_weight(loom_model *m, float *g, size_t out_w, size_t out_b,
                                     const float *d_out, const float *mid, int IC, size_t in_w,
                                     size_t in_b, const float *d_in, const float *x_local, int OC) {
    loom_linear_backward(m->be, NULL, LOOM_DX_SET, d_out, NULL, g + out_w, loom_at(g, out_b), mid,
                         m->B * m->T, IC, m->cfg.d_model);
    return loom_model_column_weight(m, d_in, g + in_w, loom_at(g, in_b), x_local, OC);
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
