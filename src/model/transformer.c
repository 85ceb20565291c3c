#include "model/transformer.h"

#include <stdlib.h>
#include <string.h>

static int is_gpt2(const loom_model *m) {
    return m->cfg.family == LOOM_FAMILY_GPT2;
}

/* Shapes on this rank: heads, MLP columns and vocabulary rows are split by tensor
 * parallelism; the residual stream has Ns rows (N/tp with sequence parallelism). */
typedef struct {
    int tp, rank, N, Ns, C, hd, H, KV, A, QKV, F, FC, V, v0;
} dims;

static dims dims_of(const loom_model *m, int sequence_parallel) {
    const loom_model_config *c = &m->cfg;
    dims d;
    d.tp = m->tp ? m->tp->size : 1;
    d.rank = m->tp ? m->tp->rank : 0;
    d.N = m->B * m->T;
    d.Ns = sequence_parallel && d.tp > 1 ? d.N / d.tp : d.N;
    d.C = c->d_model;
    d.hd = c->d_model / c->n_head;
    d.H = c->n_head / d.tp;
    d.KV = c->n_kv_head / d.tp;
    d.A = d.H * d.hd;
    d.QKV = (d.H + 2 * d.KV) * d.hd;
    d.F = c->d_ff / d.tp;
    d.FC = c->family == LOOM_FAMILY_GPT2 ? d.F : 2 * d.F;
    d.V = c->vocab_size / d.tp;
    d.v0 = d.rank * d.V;
    return d;
}

static int seq_parallel(const loom_model *m) {
    return m->tp && m->tp->size > 1 && m->tp->sequence_parallel;
}

/* Carves the arena twice: first without one to size it, then from the backend arena.
 * Pieces are rounded to the backend's alignment (64 bytes on the CPU), so the sizing
 * pass and the arena's bump allocation agree piece by piece. */
typedef struct {
    const loom_backend *be;
    loom_backend_arena *arena; /* NULL: sizing */
    size_t used;               /* bytes */
} carver;

static float *carve(carver *cv, size_t floats) {
    const size_t bytes = loom_backend_piece_bytes(cv->be, floats * sizeof(float));
    /* the arena was sized by the same pieces: the allocation cannot fail */
    float *p = cv->arena ? loom_backend_arena_alloc(cv->arena, bytes, "activations", NULL) : NULL;
    cv->used += bytes;
    return p;
}

/* A block's forward activations except its output (res2); mlp: rows of the dense MLP's
 * (0 for an MoE layer). */
static void carve_block(const loom_model *m, const dims *d, carver *cv, loom_block_acts *a,
                        size_t mlp) {
    const size_t N = (size_t)d->N, Ns = (size_t)d->Ns, C = d->C;
    a->norm1 = carve(cv, Ns * C);
    a->norm1_mean = carve(cv, Ns);
    a->norm1_rstd = carve(cv, Ns);
    a->qkv = carve(cv, N * d->QKV);
    a->att = carve(cv, N * d->A);
    a->lse = carve(cv, (size_t)m->B * d->H * m->T);
    a->res1 = carve(cv, Ns * C);
    a->norm2 = carve(cv, Ns * C);
    a->norm2_mean = carve(cv, Ns);
    a->norm2_rstd = carve(cv, Ns);
    a->fc = carve(cv, mlp * d->FC);
    a->act = carve(cv, mlp * d->F);
}

static void plan(loom_model *m, carver *cv, int sequence_parallel) {
    const dims d = dims_of(m, sequence_parallel);
    const size_t N = (size_t)d.N, Ns = (size_t)d.Ns, C = d.C, F = d.F;
    const size_t QKV = d.QKV, FC = d.FC, A = d.A;
    m->embed = carve(cv, Ns * C);
    /* recomputation: one block's activations for all layers (refilled before backward) */
    loom_block_acts shared;
    memset(&shared, 0, sizeof shared);
    if (m->recompute && m->table.n_layer > 0) carve_block(m, &d, cv, &shared, N);
    for (int l = 0; l < m->table.n_layer; l++) {
        loom_block_acts *a = &m->blocks[l];
        /* MoE: the experts' activations live in model/moe.c */
        const size_t mlp = loom_model_layer_is_moe(&m->cfg, m->table.layer_ids[l]) ? 0 : N;
        if (m->recompute)
            *a = shared;
        else
            carve_block(m, &d, cv, a, mlp);
        a->res2 = carve(cv, Ns * C);
        /* split backward (zero-bubble W): the linears' output gradients, kept for W */
        const int split = m->split_backward;
        a->d_res2 = split && mlp ? carve(cv, N * C) : NULL;
        a->d_fc = split && mlp ? carve(cv, N * FC) : NULL;
        a->d_res1 = split ? carve(cv, N * C) : NULL;
        a->d_qkv = split ? carve(cv, N * QKV) : NULL;
    }
    m->normf = carve(cv, Ns * C);
    m->normf_mean = carve(cv, Ns);
    m->normf_rstd = carve(cv, Ns);
    m->logits = carve(cv, N * (size_t)d.V);
    m->losses = carve(cv, N);
    m->dres = carve(cv, Ns * C);
    m->dnorm = carve(cv, N * C);
    m->dqkv = carve(cv, N * QKV);
    m->datt = carve(cv, N * A);
    m->dfc = carve(cv, N * FC);
    m->dact = carve(cv, N * F);
    m->full = sequence_parallel && d.tp > 1 ? carve(cv, N * C) : NULL;
    m->moe_full = sequence_parallel && d.tp > 1 && m->cfg.n_experts > 0 ? carve(cv, N * C) : NULL;
    m->att_scratch = carve(cv, loom_backend_attention_scratch_floats(m->be, m->B, m->T, d.H));
}

size_t loom_model_plan_bytes(const loom_model *m, int sequence_parallel) {
    loom_model copy = *m; /* plan() writes pointers: let it write into a copy */
    copy.blocks = calloc((size_t)m->cfg.n_layer, sizeof *copy.blocks);
    if (!copy.blocks) return 0;
    carver sizing = {m->be, NULL, 0};
    plan(&copy, &sizing, sequence_parallel);
    free(copy.blocks);
    return sizing.used;
}

/* Sizes the arena for the current plan, allocates it on the backend and carves it. */
static loom_status allocate_arena(loom_model *m, loom_error *err) {
    carver sizing = {m->be, NULL, 0};
    plan(m, &sizing, seq_parallel(m));
    m->arena_floats = sizing.used / sizeof(float);
    if (loom_backend_arena_create(&m->arena, m->be, sizing.used, "activations", NULL))
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "activations: cannot allocate %.1f MiB for micro-batch %d x %d",
                              (double)sizing.used / (1 << 20), m->B, m->T);
    carver real = {m->be, &m->arena, 0};
    plan(m, &real, seq_parallel(m));
    return LOOM_OK;
}

loom_status loom_model_create(loom_model *m, const loom_model_options *o, loom_error *err) {
    memset(m, 0, sizeof *m);
    m->be = o->backend ? o->backend : loom_backend_cpu();
    m->arena.be = m->be;
    if (!o->cfg) return loom_error_set(err, LOOM_ERR_INPUT, "model: no configuration");
    const loom_model_config *cfg = o->cfg;
    const int B = o->B, T = o->T;
    loom_tp *tp = o->tp;
    loom_comm *ep = o->ep;
    m->split_backward = (o->flags & LOOM_MODEL_SPLIT_BACKWARD) != 0;
    m->recompute = (o->flags & LOOM_MODEL_RECOMPUTE) != 0;
    m->cfg = *cfg;
    m->tp = tp;
    m->B = B;
    m->T = T;
    loom_status st = loom_model_config_validate(cfg, err);
    if (st) return st;
    if (T > cfg->seq_len)
        return loom_error_set(err, LOOM_ERR_INPUT, "sequence length %d exceeds --seq-len %d", T,
                              cfg->seq_len);
    if (tp && tp->size > 1 && (tp->rows != B * T || tp->width != cfg->d_model))
        return loom_error_set(err, LOOM_ERR_STATE, "tensor parallelism planned for %d x %d rows",
                              tp->rows, tp->width);
    /* MoE with --tp: the block is replicated, every tp rank runs it on the whole
     * micro-batch (with sequence parallelism on the gathered input, keeping its slice). */
    const loom_params_options po = {.tp_rank = tp ? tp->rank : 0,
                                    .tp_size = tp ? tp->size : 1,
                                    .ep_rank = ep ? ep->rank : 0,
                                    .ep_size = ep ? ep->size : 1,
                                    .layers = o->layers};
    st = loom_params_build(&m->table, cfg, &po, err);
    if (st || (st = loom_moe_create(&m->moe, cfg, &m->table, B * T, ep, m->be, err)) ||
        (m->split_backward && (st = loom_moe_set_split(m->moe, err)))) {
        loom_model_destroy(m);
        return st;
    }
    m->Ns = dims_of(m, seq_parallel(m)).Ns;
    /* host metadata: the per-layer activation pointers and the host copy of the losses */
    m->blocks = calloc((size_t)cfg->n_layer, sizeof *m->blocks);
    m->losses_host = malloc((size_t)B * T * sizeof *m->losses_host);
    /* tokens the embedding and the loss read: backend memory */
    m->inputs = loom_backend_alloc(m->be, (size_t)B * T * sizeof *m->inputs);
    m->targets = loom_backend_alloc(m->be, (size_t)B * T * sizeof *m->targets);
    if (!m->blocks || !m->losses_host || !m->inputs || !m->targets) {
        loom_model_destroy(m);
        return loom_error_set(err, LOOM_ERR_NOMEM, "model: out of memory");
    }
    if ((st = allocate_arena(m, err))) loom_model_destroy(m);
    return st;
}

loom_status loom_model_set_recompute(loom_model *m, int on, loom_error *err) {
    if (m->recompute == (on != 0)) return LOOM_OK;
    m->recompute = on != 0;
    loom_backend_arena_destroy(&m->arena);
    return allocate_arena(m, err);
}

void loom_model_destroy(loom_model *m) {
    loom_moe_destroy(m->moe);
    if (m->be) {
        loom_backend_arena_destroy(&m->arena);
        loom_backend_free(m->be, m->inputs);
        loom_backend_free(m->be, m->targets);
    }
    free(m->blocks);
    free(m->losses_host);
    loom_params_free(&m->table);
    memset(m, 0, sizeof *m);
}

size_t loom_model_activation_bytes(const loom_model *m) {
    return m->arena_floats * sizeof(float);
}

/* Norm of the block's family: LayerNorm with bias (GPT-2) or RMSNorm (Llama). */
static void norm_forward(const loom_model *m, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N) {
    if (is_gpt2(m))
        loom_backend_layernorm_forward(m->be, out, mean, rstd, inp, w, b, N, m->cfg.d_model,
                                       m->cfg.norm_eps);
    else
        loom_backend_rmsnorm_forward(m->be, out, rstd, inp, w, N, m->cfg.d_model, m->cfg.norm_eps);
}

static void norm_backward(const loom_model *m, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N) {
    if (is_gpt2(m))
        loom_backend_layernorm_backward(m->be, dinp, dw, db, dout, inp, w, mean, rstd, N,
                                        m->cfg.d_model);
    else
        loom_backend_rmsnorm_backward(m->be, dinp, dw, dout, inp, w, rstd, N, m->cfg.d_model);
}

/* Pointer to a tensor in a flat buffer, NULL when the family has none. */
static float *at(float *flat, size_t offset) {
    return offset == LOOM_NO_PARAM ? NULL : flat + offset;
}
static const float *cat(const float *flat, size_t offset) {
    return offset == LOOM_NO_PARAM ? NULL : flat + offset;
}

/* Runs a hook if set. */
static loom_status hook(const loom_model *m, int after, int layer, int backward) {
    const loom_block_hooks *h = &m->hooks;
    loom_status (*fn)(void *, int, int) = after ? h->after_block : h->before_block;
    return fn ? fn(h->ctx, layer, backward) : LOOM_OK;
}

/* Tensor-parallel plumbing (no-ops on one rank). */
static loom_status tp_gather(const loom_model *m, const float *local, const float **inp) {
    if (!seq_parallel(m)) {
        *inp = local;
        return LOOM_OK;
    }
    return loom_tp_gather(m->tp, local, m->full, inp);
}

static loom_status tp_reduce(const loom_model *m, float *partial, float *out) {
    return m->tp && m->tp->size > 1 ? loom_tp_reduce(m->tp, partial, out) : LOOM_OK;
}

/* Row-parallel linear: out[Ns, C] = sum over ranks of inp[N, IC] @ w^T, + bias once. */
static loom_status row_forward(loom_model *m, const dims *d, float *out, const float *inp,
                               const float *w, const float *b, int IC) {
    float *part = seq_parallel(m) ? m->dnorm : out;
    loom_backend_linear_forward(m->be, part, inp, w, d->rank == 0 ? b : NULL, d->N, IC, d->C);
    return tp_reduce(m, part, out);
}

/* Column-parallel linear backward: dw, db from dout [N, OC] and the (gathered) input;
 * *dinp = this rank's rows of d(input), summed over the ranks. */
static loom_status column_backward(loom_model *m, const dims *d, const float *dout, const float *w,
                                   float *dw, float *db, const float *inp_local, int OC,
                                   const float **dinp) {
    loom_backend_memset(m->be, m->dnorm, 0, (size_t)d->N * d->C * sizeof(float));
    loom_backend_linear_backward_input(m->be, m->dnorm, dout, w, d->N, d->C, OC);
    const float *inp;
    loom_status st = tp_gather(m, inp_local, &inp);
    if (st) return st;
    loom_backend_linear_backward_weight(m->be, dw, db, dout, inp, d->N, d->C, OC);
    float *out = seq_parallel(m) ? m->full : m->dnorm;
    *dinp = out;
    return tp_reduce(m, m->dnorm, out);
}

void loom_model_load_tokens(loom_model *m, const int32_t *batch, int first) {
    const int T = m->T;
    const size_t row = (size_t)T * sizeof(int32_t);
    for (int b = 0; b < m->B; b++) {
        const int32_t *seq = batch + (size_t)(first + b) * (T + 1);
        loom_backend_copy_to_device(m->be, m->inputs + (size_t)b * T, seq, row);
        loom_backend_copy_to_device(m->be, m->targets + (size_t)b * T, seq + 1, row);
    }
}

/* Embedding of m->inputs into m->embed (first pipeline stage). */
static loom_status embed_forward(loom_model *m, const dims *d, const float *p) {
    const loom_param_table *t = &m->table;
    if (d->tp == 1) {
        loom_backend_embedding_forward(m->be, m->embed, m->inputs, p + t->wte, cat(p, t->wpe), m->B,
                                       m->T, d->C);
        return LOOM_OK;
    }
    /* vocabulary-parallel: each rank looks up its rows; positions once */
    float *part = seq_parallel(m) ? m->dnorm : m->embed;
    loom_backend_embedding_forward_shard(m->be, part, m->inputs, p + t->wte,
                                         d->rank == 0 ? cat(p, t->wpe) : NULL, d->v0, d->V, m->B,
                                         m->T, d->C);
    return tp_reduce(m, part, m->embed);
}

/* Block l (local index) from input x; its output is m->blocks[l].res2. No hooks: the
 * caller has the block's parameters (recomputation runs it again inside backward).
 * Recomputing an MoE block stops at the MoE block's input (norm2): the MoE block keeps
 * its own forward state per layer (routing, dispatched rows, expert activations), so
 * neither the router nor the all-to-all runs again (the kept res2 stays as it is, and
 * statistics and aux terms are not counted twice). */
static loom_status block_forward_body(loom_model *m, const dims *dd, const float *p, int l,
                                      const float *x, int recomputing) {
    const loom_model_config *c = &m->cfg;
    const dims d = *dd;
    const int B = m->B, T = m->T, N = d.N, Ns = d.Ns, C = d.C, hd = d.hd;
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    const float *in;
    loom_status st = LOOM_OK;
    loom_trace_begin(m->trace, "block", recomputing ? "recompute" : "forward");
    norm_forward(m, a->norm1, a->norm1_mean, a->norm1_rstd, x, p + k->norm1_w, cat(p, k->norm1_b),
                 Ns);
    if (!(st = tp_gather(m, a->norm1, &in))) {
        loom_backend_linear_forward(m->be, a->qkv, in, p + k->qkv_w, cat(p, k->qkv_b), N, C, d.QKV);
        if (!is_gpt2(m))
            loom_backend_rope_forward(m->be, a->qkv, B, T, d.H, d.KV, hd, c->rope_theta);
        loom_backend_attention_forward(m->be, a->att, a->lse, a->qkv, m->att_scratch, B, T, d.H,
                                       d.KV, hd);
        st = row_forward(m, &d, a->res1, a->att, p + k->attn_out_w, cat(p, k->attn_out_b), d.A);
    }
    if (!st) {
        loom_backend_add(m->be, a->res1, a->res1, x, (size_t)Ns * C);
        norm_forward(m, a->norm2, a->norm2_mean, a->norm2_rstd, a->res1, p + k->norm2_w,
                     cat(p, k->norm2_b), Ns);
        if (recomputing && k->moe) { /* backward gathers norm2 itself */
            loom_trace_end(m->trace);
            return st;
        }
        st = tp_gather(m, a->norm2, &in);
    }
    if (!st && k->moe && m->moe_full) {
        st = loom_moe_forward(m->moe, l, p, in, m->moe_full);
        loom_backend_copy(m->be, a->res2, m->moe_full + (size_t)d.rank * Ns * C,
                          (size_t)Ns * C * sizeof(float));
    } else if (!st && k->moe) {
        st = loom_moe_forward(m->moe, l, p, in, a->res2);
    } else if (!st) {
        loom_backend_linear_forward(m->be, a->fc, in, p + k->fc_w, cat(p, k->fc_b), N, C, d.FC);
        if (is_gpt2(m))
            loom_backend_gelu_forward(m->be, a->act, a->fc, (size_t)N * d.F);
        else
            loom_backend_swiglu_forward(m->be, a->act, a->fc, N, d.F);
        st = row_forward(m, &d, a->res2, a->act, p + k->proj_w, cat(p, k->proj_b), d.F);
    }
    if (!st) loom_backend_add(m->be, a->res2, a->res2, a->res1, (size_t)Ns * C);
    loom_trace_end(m->trace);
    return st;
}

static loom_status block_forward(loom_model *m, const dims *d, const float *p, int l,
                                 const float *x) {
    loom_status st = hook(m, 0, l, 0);
    if (!st) st = block_forward_body(m, d, p, l, x, 0);
    return st ? st : hook(m, 1, l, 0);
}

/* Final norm and logits from the last block's output x. */
static loom_status head_forward(loom_model *m, const dims *d, const float *p, const float *x) {
    const loom_param_table *t = &m->table;
    const float *in;
    norm_forward(m, m->normf, m->normf_mean, m->normf_rstd, x, p + t->normf_w, cat(p, t->normf_b),
                 d->Ns);
    loom_status st = tp_gather(m, m->normf, &in);
    if (!st)
        loom_backend_linear_forward(m->be, m->logits, in, p + t->lm_head, NULL, d->N, d->C, d->V);
    return st;
}

loom_status loom_model_forward(loom_model *m, const float *p) {
    const dims d = dims_of(m, seq_parallel(m));
    loom_trace_begin(m->trace, "forward", "compute");
    loom_status st = embed_forward(m, &d, p);
    const float *x = m->embed;
    for (int l = 0; l < m->table.n_layer && !st; l++) {
        st = block_forward(m, &d, p, l, x);
        x = m->blocks[l].res2;
    }
    if (!st) st = head_forward(m, &d, p, x);
    loom_trace_end(m->trace);
    return st;
}

loom_status loom_model_embed_forward(loom_model *m, const float *p) {
    const dims d = dims_of(m, seq_parallel(m));
    return embed_forward(m, &d, p);
}

loom_status loom_model_blocks_forward(loom_model *m, const float *p, int lo, int hi, const float *x,
                                      const float **out) {
    const dims d = dims_of(m, seq_parallel(m));
    loom_status st = LOOM_OK;
    for (int l = lo; l < hi && !st; l++) {
        st = block_forward(m, &d, p, l, x);
        x = m->blocks[l].res2;
    }
    *out = x;
    return st;
}

loom_status loom_model_head_forward(loom_model *m, const float *p, const float *x) {
    const dims d = dims_of(m, seq_parallel(m));
    return head_forward(m, &d, p, x);
}

loom_status loom_model_loss_sum(loom_model *m, float dloss, int backward, double *sum) {
    const dims d = dims_of(m, 0);
    const int N = d.N;
    loom_status st = LOOM_OK;
    if (d.tp > 1)
        st = loom_tp_crossentropy(m->tp, m->losses, m->logits, m->targets, d.V, d.v0, dloss,
                                  backward);
    else if (backward)
        loom_backend_crossentropy_forward_backward(m->be, m->losses, m->logits, m->targets, N, d.V,
                                                   dloss);
    else
        loom_backend_crossentropy_forward(m->be, m->losses, m->logits, m->targets, N, d.V);
    double s = loom_moe_loss_sum(m->moe, dloss, backward); /* 0 without MoE */
    if (!backward) s = 0.0;                                /* evaluation: cross-entropy only */
    /* the sum runs on the host, in token order */
    loom_backend_copy_to_host(m->be, m->losses_host, m->losses, (size_t)N * sizeof(float));
    for (int i = 0; i < N; i++) s += m->losses_host[i];
    *sum = s;
    return st;
}

double loom_model_loss(loom_model *m) {
    double sum = 0.0;
    loom_model_loss_sum(m, 0.0f, 0, &sum); /* cannot fail on one rank */
    return sum;
}

double loom_model_loss_and_dlogits(loom_model *m, float dloss) {
    double sum = 0.0;
    loom_model_loss_sum(m, dloss, 1, &sum);
    return sum;
}

/* Column-parallel weight gradient (the W half of column_backward). */
static loom_status column_weight(loom_model *m, const dims *d, const float *dout, float *dw,
                                 float *db, const float *inp_local, int OC) {
    const float *inp;
    loom_status st = tp_gather(m, inp_local, &inp);
    if (!st) loom_backend_linear_backward_weight(m->be, dw, db, dout, inp, d->N, d->C, OC);
    return st;
}

/* Column-parallel input gradient (the B half): *dinp = d(input), summed over the ranks. */
static loom_status column_input(loom_model *m, const dims *d, const float *dout, const float *w,
                                int OC, const float **dinp) {
    loom_backend_memset(m->be, m->dnorm, 0, (size_t)d->N * d->C * sizeof(float));
    loom_backend_linear_backward_input(m->be, m->dnorm, dout, w, d->N, d->C, OC);
    float *out = seq_parallel(m) ? m->full : m->dnorm;
    *dinp = out;
    return tp_reduce(m, m->dnorm, out);
}

/* Head backward from dlogits: m->dres = d(x), the last block's output. With split backward
 * the head's weight gradient waits for head_backward_weight. */
static loom_status head_backward(loom_model *m, const dims *d, const float *p, float *g,
                                 const float *x_last) {
    const loom_param_table *t = &m->table;
    const float *dn;
    loom_status st = m->split_backward ? column_input(m, d, m->logits, p + t->lm_head, d->V, &dn)
                                       : column_backward(m, d, m->logits, p + t->lm_head,
                                                         g + t->lm_head, NULL, m->normf, d->V, &dn);
    loom_backend_memset(m->be, m->dres, 0, (size_t)d->Ns * d->C * sizeof(float));
    if (!st)
        norm_backward(m, m->dres, g + t->normf_w, at(g, t->normf_b), dn, x_last, p + t->normf_w,
                      m->normf_mean, m->normf_rstd, d->Ns);
    return st;
}

/* Block l backward from m->dres = d(output) to m->dres = d(input x). With split backward
 * only the input gradients (B): the output gradients each linear's weight gradient needs
 * are kept in the block's activations for block_backward_weight (W). Norm parameter
 * gradients come with B (they are a by-product of the norm's input gradient). */
static loom_status block_backward(loom_model *m, const dims *dd, const float *p, float *g, int l,
                                  const float *x) {
    const loom_model_config *c = &m->cfg;
    const dims d = *dd;
    const int B = m->B, T = m->T, N = d.N, Ns = d.Ns, C = d.C, hd = d.hd;
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    const int split = m->split_backward;
    float *dfc = split ? a->d_fc : m->dfc, *dqkv = split ? a->d_qkv : m->dqkv;
    const float *dn, *dy;
    loom_status st = hook(m, 0, l, 1);
    /* recomputation: the block's activations again, from its kept input */
    if (!st && m->recompute) st = block_forward_body(m, &d, p, l, x, 1);
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward");
    /* res2 = res1 + act @ proj^T (row-parallel: d(out) is needed in full). MoE: under
     * split backward its weight gradients wait for W too (model/moe.h). */
    if (k->moe && m->moe_full) { /* sequence parallel: the whole dy and x, this slice of dx */
        const float *xn = NULL;
        if (!(st = tp_gather(m, m->dres, &dy))) {
            loom_backend_copy(m->be, m->moe_full, dy, (size_t)N * C * sizeof(float));
            st = tp_gather(m, a->norm2, &xn);
        }
        if (!st && !(st = loom_moe_backward(m->moe, l, p, g, xn, m->moe_full, m->dnorm)))
            dn = m->dnorm + (size_t)d.rank * Ns * C;
    } else if (k->moe) {
        if (!(st = loom_moe_backward(m->moe, l, p, g, a->norm2, m->dres, m->dnorm))) dn = m->dnorm;
    } else if (!(st = tp_gather(m, m->dres, &dy))) {
        loom_backend_memset(m->be, m->dact, 0, (size_t)N * d.F * sizeof(float));
        loom_backend_linear_backward_input(m->be, m->dact, dy, p + k->proj_w, N, d.F, C);
        if (split)
            loom_backend_copy(m->be, a->d_res2, dy, (size_t)N * C * sizeof(float));
        else
            loom_backend_linear_backward_weight(m->be, g + k->proj_w, at(g, k->proj_b), dy, a->act,
                                                N, d.F, C);
        loom_backend_memset(m->be, dfc, 0, (size_t)N * d.FC * sizeof(float));
        if (is_gpt2(m))
            loom_backend_gelu_backward(m->be, dfc, a->fc, m->dact, (size_t)N * d.F);
        else
            loom_backend_swiglu_backward(m->be, dfc, m->dact, a->fc, N, d.F);
        st = split ? column_input(m, &d, dfc, p + k->fc_w, d.FC, &dn)
                   : column_backward(m, &d, dfc, p + k->fc_w, g + k->fc_w, at(g, k->fc_b), a->norm2,
                                     d.FC, &dn);
    }
    if (!st) {
        norm_backward(m, m->dres, g + k->norm2_w, at(g, k->norm2_b), dn, a->res1, p + k->norm2_w,
                      a->norm2_mean, a->norm2_rstd, Ns);
        /* m->dres is now d(res1); res1 = x + att @ attn_out^T */
        st = tp_gather(m, m->dres, &dy);
    }
    if (!st) {
        loom_backend_memset(m->be, m->datt, 0, (size_t)N * d.A * sizeof(float));
        loom_backend_linear_backward_input(m->be, m->datt, dy, p + k->attn_out_w, N, d.A, C);
        if (split)
            loom_backend_copy(m->be, a->d_res1, dy, (size_t)N * C * sizeof(float));
        else
            loom_backend_linear_backward_weight(m->be, g + k->attn_out_w, at(g, k->attn_out_b), dy,
                                                a->att, N, d.A, C);
        loom_backend_memset(m->be, dqkv, 0, (size_t)N * d.QKV * sizeof(float));
        loom_backend_attention_backward(m->be, dqkv, m->att_scratch, m->datt, a->qkv, a->att,
                                        a->lse, B, T, d.H, d.KV, hd);
        if (!is_gpt2(m))
            loom_backend_rope_backward(m->be, dqkv, B, T, d.H, d.KV, hd, c->rope_theta);
        st = split ? column_input(m, &d, dqkv, p + k->qkv_w, d.QKV, &dn)
                   : column_backward(m, &d, dqkv, p + k->qkv_w, g + k->qkv_w, at(g, k->qkv_b),
                                     a->norm1, d.QKV, &dn);
    }
    if (!st)
        norm_backward(m, m->dres, g + k->norm1_w, at(g, k->norm1_b), dn, x, p + k->norm1_w,
                      a->norm1_mean, a->norm1_rstd, Ns);
    loom_trace_end(m->trace);
    return st ? st : hook(m, 1, l, 1);
}

/* W of block l: the weight gradients of its four linears from what B kept (with
 * recomputation, the linears' inputs are recomputed from the block's input x first). */
static loom_status block_backward_weight(loom_model *m, const dims *d, const float *p, float *g,
                                         int l, const float *x) {
    const loom_block_params *k = &m->table.blocks[l];
    const loom_block_acts *a = &m->blocks[l];
    const int N = d->N, C = d->C;
    loom_status st = m->recompute ? block_forward_body(m, d, p, l, x, 1) : LOOM_OK;
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward-weight");
    if (k->moe) { /* the experts', router's and shared expert's, from what B kept */
        const float *xn;
        if (!(st = tp_gather(m, a->norm2, &xn))) loom_moe_backward_weight(m->moe, l, g, xn);
    } else {
        loom_backend_linear_backward_weight(m->be, g + k->proj_w, at(g, k->proj_b), a->d_res2,
                                            a->act, N, d->F, C);
        st = column_weight(m, d, a->d_fc, g + k->fc_w, at(g, k->fc_b), a->norm2, d->FC);
    }
    if (!st)
        loom_backend_linear_backward_weight(m->be, g + k->attn_out_w, at(g, k->attn_out_b),
                                            a->d_res1, a->att, N, d->A, C);
    if (!st) st = column_weight(m, d, a->d_qkv, g + k->qkv_w, at(g, k->qkv_b), a->norm1, d->QKV);
    loom_trace_end(m->trace);
    return st;
}

/* Embedding gradient from m->dres = d(embed). */
static loom_status embed_backward(loom_model *m, const dims *d, float *g) {
    const loom_param_table *t = &m->table;
    const float *dy;
    loom_status st = LOOM_OK;
    if (d->tp == 1)
        loom_backend_embedding_backward(m->be, g + t->wte, at(g, t->wpe), m->dres, m->inputs, m->B,
                                        m->T, d->C);
    else if (!(st = tp_gather(m, m->dres, &dy)))
        loom_backend_embedding_backward_shard(m->be, g + t->wte, at(g, t->wpe), dy, m->inputs,
                                              d->v0, d->V, m->B, m->T, d->C);
    return st;
}

loom_status loom_model_backward(loom_model *m, const float *p, float *g, loom_grads_ready_fn ready,
                                void *ctx) {
    const dims d = dims_of(m, seq_parallel(m));
    const loom_param_table *t = &m->table;
    const int L = t->n_layer;
    const float *x_last = L > 0 ? m->blocks[L - 1].res2 : m->embed;
    loom_trace_begin(m->trace, "backward", "compute");
    loom_status st = head_backward(m, &d, p, g, x_last);
    /* Everything after the last block (final norm, an untied head) is final now. */
    if (!st && ready) st = ready(ctx, t->head_begin, t->total);
    /* m->dres holds d(block output); each block turns it into d(block input). */
    for (int l = L - 1; l >= 0 && !st; l--) {
        st = block_backward(m, &d, p, g, l, l > 0 ? m->blocks[l - 1].res2 : m->embed);
        if (ready && !st) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    /* With data parallelism's embedding split (parallel/embed_grad.h) the caller turns
     * d(embedding output), left in m->dres, into the embeddings' gradients. */
    if (!st && !(ready && m->defer_embedding_grad)) st = embed_backward(m, &d, g);
    if (ready && !st) st = ready(ctx, 0, t->n_layer > 0 ? t->blocks[0].begin : t->head_begin);
    loom_trace_end(m->trace);
    return st;
}

loom_status loom_model_head_backward(loom_model *m, const float *p, float *g, const float *x) {
    const dims d = dims_of(m, seq_parallel(m));
    return head_backward(m, &d, p, g, x);
}

size_t loom_model_block_range_end(const loom_param_table *t, int l) {
    return l + 1 < t->n_layer ? t->blocks[l + 1].begin : t->head_begin;
}

loom_status loom_model_blocks_backward(loom_model *m, const float *p, float *g, int lo, int hi,
                                       const float *x, loom_grads_ready_fn ready, void *ctx) {
    const dims d = dims_of(m, seq_parallel(m));
    const loom_param_table *t = &m->table;
    loom_status st = LOOM_OK;
    for (int l = hi - 1; l >= lo && !st; l--) {
        st = block_backward(m, &d, p, g, l, l > lo ? m->blocks[l - 1].res2 : x);
        if (!st && ready) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    return st;
}

loom_status loom_model_blocks_backward_weight(loom_model *m, const float *p, float *g, int lo,
                                              int hi, const float *x, loom_grads_ready_fn ready,
                                              void *ctx) {
    const dims d = dims_of(m, seq_parallel(m));
    const loom_param_table *t = &m->table;
    loom_status st = LOOM_OK;
    for (int l = hi - 1; l >= lo && !st; l--) {
        st = block_backward_weight(m, &d, p, g, l, l > lo ? m->blocks[l - 1].res2 : x);
        if (!st && ready) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    return st;
}

loom_status loom_model_head_backward_weight(loom_model *m, float *g) {
    const dims d = dims_of(m, seq_parallel(m));
    return column_weight(m, &d, m->logits, g + m->table.lm_head, NULL, m->normf, d.V);
}

loom_status loom_model_embed_backward(loom_model *m, float *g) {
    const dims d = dims_of(m, seq_parallel(m));
    return embed_backward(m, &d, g);
}
