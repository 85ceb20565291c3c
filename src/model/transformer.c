#include "model/transformer.h"

#include "model/model_impl.h"

#include <stdlib.h>
#include <string.h>

static const loom_model_ops lm_ops; /* the language models' table (the end of this file) */

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

/* A block's forward activations except its output (res2); mlp: rows of the dense MLP's
 * (0 for an MoE layer). */
static void carve_block(const loom_model *m, const dims *d, loom_carver *cv, loom_block_acts *a,
                        size_t mlp, const loom_block_acts *sel) {
    const size_t N = (size_t)d->N, Ns = (size_t)d->Ns, C = d->C;
    a->norm1 = loom_carve(cv, Ns * C);
    a->norm1_mean = loom_carve(cv, Ns);
    a->norm1_rstd = loom_carve(cv, Ns);
    a->qkv = loom_carve(cv, N * d->QKV);
    /* selective recomputation: attention's output and the activation are sel's */
    a->att = sel ? sel->att : loom_carve(cv, N * d->A);
    a->lse = sel ? sel->lse : loom_carve(cv, (size_t)m->B * d->H * m->T);
    a->res1 = loom_carve(cv, Ns * C);
    a->norm2 = loom_carve(cv, Ns * C);
    a->norm2_mean = loom_carve(cv, Ns);
    a->norm2_rstd = loom_carve(cv, Ns);
    a->fc = loom_carve(cv, mlp * d->FC);
    a->act = sel ? sel->act : loom_carve(cv, mlp * d->F);
}

static void plan(loom_model *m, loom_carver *cv, int sequence_parallel) {
    const dims d = dims_of(m, sequence_parallel);
    const size_t N = (size_t)d.N, Ns = (size_t)d.Ns, C = d.C, F = d.F;
    const size_t QKV = d.QKV, FC = d.FC, A = d.A;
    m->embed = loom_carve(cv, Ns * C);
    /* recomputation: one block's activations for all layers (refilled before backward) */
    loom_block_acts shared;
    memset(&shared, 0, sizeof shared);
    if (m->recompute && m->table.n_layer > 0) carve_block(m, &d, cv, &shared, N, NULL);
    /* selective recomputation: one block's attention output, log-sum-exp and activation */
    const int sel = m->recompute_selective && !m->recompute && m->table.n_layer > 0;
    if (sel) {
        shared.att = loom_carve(cv, N * A);
        shared.lse = loom_carve(cv, (size_t)m->B * d.H * m->T);
        shared.act = loom_carve(cv, N * F);
    }
    for (int l = 0; l < m->table.n_layer; l++) {
        loom_block_acts *a = &m->blocks[l];
        /* MoE: the experts' activations live in model/moe.c */
        const size_t mlp = loom_model_layer_is_moe(&m->cfg, m->table.layer_ids[l]) ? 0 : N;
        if (m->recompute)
            *a = shared;
        else
            carve_block(m, &d, cv, a, mlp, sel ? &shared : NULL);
        a->res2 = loom_carve(cv, Ns * C);
        /* split backward (zero-bubble W): the linears' output gradients, kept for W */
        const int split = m->split_backward;
        a->d_res2 = split && mlp ? loom_carve(cv, N * C) : NULL;
        a->d_fc = split && mlp ? loom_carve(cv, N * FC) : NULL;
        a->d_res1 = split ? loom_carve(cv, N * C) : NULL;
        a->d_qkv = split ? loom_carve(cv, N * QKV) : NULL;
    }
    m->normf = loom_carve(cv, Ns * C);
    m->normf_mean = loom_carve(cv, Ns);
    m->normf_rstd = loom_carve(cv, Ns);
    m->logits = loom_carve(cv, N * (size_t)d.V);
    m->losses = loom_carve(cv, N);
    m->dres = loom_carve(cv, Ns * C);
    m->dnorm = loom_carve(cv, N * C);
    m->dqkv = loom_carve(cv, N * QKV);
    m->datt = loom_carve(cv, N * A);
    m->dfc = loom_carve(cv, N * FC);
    m->dact = loom_carve(cv, N * F);
    m->full = sequence_parallel && d.tp > 1 ? loom_carve(cv, N * C) : NULL;
    m->moe_full =
        sequence_parallel && d.tp > 1 && m->cfg.n_experts > 0 ? loom_carve(cv, N * C) : NULL;
    m->att_scratch = loom_carve(cv, loom_model_attention_scratch_floats(m, d.H));
}

size_t loom_model_plan_bytes(const loom_model *m, int sequence_parallel) {
    return m->ops->plan_bytes(m, sequence_parallel);
}

size_t loom_model_plan_bytes_whole(const loom_model *m, int sequence_parallel) {
    loom_model whole = *m; /* plan_bytes reads the shape and writes nothing */
    whole.cp = NULL;
    whole.T = m->T_seq;
    return m->ops->plan_bytes(&whole, sequence_parallel);
}

static size_t lm_plan_bytes(const loom_model *m, int sequence_parallel) {
    return loom_model_arena_plan_bytes(m, plan, sequence_parallel);
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
    m->recompute_selective = (o->flags & LOOM_MODEL_RECOMPUTE_SELECTIVE) != 0;
    m->size_only = (o->flags & LOOM_MODEL_SIZE_ONLY) != 0;
    m->cfg = *cfg;
    m->tp = tp;
    m->cp = o->cp;
    m->B = B;
    m->T_seq = T;
    loom_status st = loom_model_config_validate(cfg, err);
    if (st) return st;
    if (T > cfg->seq_len)
        return loom_error_set(err, LOOM_ERR_INPUT, "sequence length %d exceeds --seq-len %d", T,
                              cfg->seq_len);
    if (loom_model_cp_on(m) && (m->cp->o.B != B || m->cp->o.T != T))
        return loom_error_set(err, LOOM_ERR_STATE,
                              "context parallelism planned for %d x %d tokens, not %d x %d",
                              m->cp->o.B, m->cp->o.T, B, T);
    m->T = loom_model_cp_on(m) ? m->cp->Tl : T; /* this rank's tokens of every sample */
    if (tp && tp->size > 1 && (tp->rows != B * m->T || tp->width != cfg->d_model))
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
    if (st || (st = loom_moe_create(&m->moe, cfg, &m->table, B * m->T, ep, m->be, err)) ||
        (loom_model_cp_on(m) && (st = loom_moe_set_cp(m->moe, m->cp->comm, err))) ||
        (m->split_backward && (st = loom_moe_set_split(m->moe, err)))) {
        loom_model_destroy(m);
        return st;
    }
    m->ops = &lm_ops;
    m->Ns = dims_of(m, loom_model_seq_parallel(m)).Ns;
    /* host metadata: the per-layer activation pointers and the host copy of the losses */
    m->blocks = calloc((size_t)cfg->n_layer, sizeof *m->blocks);
    const size_t N = (size_t)B * m->T;
    m->losses_host = malloc(N * sizeof *m->losses_host);
    /* tokens the embedding and the loss read: backend memory */
    m->inputs = loom_backend_alloc(m->be, N * sizeof *m->inputs);
    m->targets = loom_backend_alloc(m->be, N * sizeof *m->targets);
    if (!m->blocks || !m->losses_host || !m->inputs || !m->targets) {
        loom_model_destroy(m);
        return loom_error_set(err, LOOM_ERR_NOMEM, "model: out of memory");
    }
    /* a dit brings its own table, conditioning and arena plan (model/dit.c) */
    st = cfg->family == LOOM_FAMILY_DIT   ? loom_dit_attach(m, err)
         : cfg->family == LOOM_FAMILY_VLM ? loom_vlm_attach(m, err)
                                          : loom_model_arena_allocate(m, m->ops->plan, err);
    if (st) loom_model_destroy(m);
    return st;
}

const char *loom_recompute_name(int mode) {
    return mode == LOOM_RECOMPUTE_FULL        ? "full"
           : mode == LOOM_RECOMPUTE_SELECTIVE ? "selective"
                                              : "none";
}

loom_status loom_model_set_recompute(loom_model *m, int mode, loom_error *err) {
    const int full = mode == LOOM_RECOMPUTE_FULL, selective = mode == LOOM_RECOMPUTE_SELECTIVE;
    if (m->recompute == full && m->recompute_selective == selective) return LOOM_OK;
    m->recompute = full;
    m->recompute_selective = selective;
    loom_backend_arena_destroy(&m->arena);
    return loom_model_arena_allocate(m, m->ops->plan, err);
}

void loom_model_destroy(loom_model *m) {
    loom_moe_destroy(m->moe);
    loom_dit_detach(m);
    loom_vlm_detach(m);
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

static void lm_load_batch(loom_model *m, const int32_t *batch, int first) {
    loom_model_load_tokens(m, batch, first);
}

/* Embedding of m->inputs into m->embed (first pipeline stage). */
static loom_status embed_forward(loom_model *m, const dims *d, const float *p) {
    const loom_param_table *t = &m->table;
    /* vocabulary-parallel: each rank looks up its rows (positions once), then the sum */
    const int vp = d->tp > 1;
    float *out = vp && loom_model_seq_parallel(m) ? m->dnorm : m->embed;
    const float *wpe = loom_cat(p, t->wpe);
    if (vp && d->rank != 0) wpe = NULL;
    int pos[2];
    const int n = loom_model_chunks(m, pos), L = m->T / n;
    const size_t rows = (size_t)m->B * L; /* of one chunk (model/context.c) */
    for (int j = 0; j < n; j++) {
        float *o = out + j * rows * d->C;
        const int32_t *in = m->inputs + j * rows;
        const float *w = wpe ? wpe + (size_t)pos[j] * d->C : NULL;
        if (vp)
            loom_backend_embedding_forward_shard(m->be, o, in, p + t->wte, w, d->v0, d->V, m->B, L,
                                                 d->C);
        else
            loom_backend_embedding_forward(m->be, o, in, p + t->wte, w, m->B, L, d->C);
    }
    return vp ? loom_model_tp_reduce(m, out, m->embed) : LOOM_OK;
}

/* Block l (local index) from input x; its output is m->blocks[l].res2. No hooks: the
 * caller has the block's parameters (recomputation runs it again inside backward).
 * Recomputing an MoE block stops at the MoE block's input (norm2): the MoE block keeps
 * its own forward state per layer (routing, dispatched rows, expert activations), so
 * neither the router nor the all-to-all runs again (the kept res2 stays as it is, and
 * statistics and aux terms are not counted twice). */
static loom_status block_forward_body(loom_model *m, const dims *dd, const float *p, int l,
                                      const float *x, int recomputing) {
    const dims d = *dd;
    const int N = d.N, Ns = d.Ns, C = d.C, hd = d.hd;
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    const float *in;
    loom_status st = LOOM_OK;
    loom_trace_begin(m->trace, "block", recomputing ? "recompute" : "forward");
    norm_forward(m, a->norm1, a->norm1_mean, a->norm1_rstd, x, p + k->norm1_w,
                 loom_cat(p, k->norm1_b), Ns);
    if (!(st = loom_model_tp_gather(m, a->norm1, &in))) {
        loom_backend_linear_forward(m->be, a->qkv, in, p + k->qkv_w, loom_cat(p, k->qkv_b), N, C,
                                    d.QKV);
        if (!is_gpt2(m)) loom_model_rope(m, a->qkv, d.H, d.KV, hd, 0);
        st = loom_model_attention_forward(m, a->att, a->lse, a->qkv, d.H, d.KV, hd, 1);
    }
    if (!st) {
        st = loom_model_row_forward(m, a->res1, a->att, p + k->attn_out_w,
                                    loom_cat(p, k->attn_out_b), d.A);
    }
    if (!st) {
        loom_backend_add(m->be, a->res1, a->res1, x, (size_t)Ns * C);
        norm_forward(m, a->norm2, a->norm2_mean, a->norm2_rstd, a->res1, p + k->norm2_w,
                     loom_cat(p, k->norm2_b), Ns);
        if (recomputing && k->moe) { /* backward gathers norm2 itself */
            loom_trace_end(m->trace);
            return st;
        }
        st = loom_model_tp_gather(m, a->norm2, &in);
    }
    if (!st && k->moe && m->moe_full) {
        st = loom_moe_forward(m->moe, l, p, in, m->moe_full);
        loom_backend_copy(m->be, a->res2, m->moe_full + (size_t)d.rank * Ns * C,
                          (size_t)Ns * C * sizeof(float));
    } else if (!st && k->moe) {
        st = loom_moe_forward(m->moe, l, p, in, a->res2);
    } else if (!st) {
        loom_backend_linear_forward(m->be, a->fc, in, p + k->fc_w, loom_cat(p, k->fc_b), N, C,
                                    d.FC);
        if (is_gpt2(m))
            loom_backend_gelu_forward(m->be, a->act, a->fc, (size_t)N * d.F);
        else
            loom_backend_swiglu_forward(m->be, a->act, a->fc, N, d.F);
        st = loom_model_row_forward(m, a->res2, a->act, p + k->proj_w, loom_cat(p, k->proj_b), d.F);
    }
    if (!st) loom_backend_add(m->be, a->res2, a->res2, a->res1, (size_t)Ns * C);
    loom_trace_end(m->trace);
    return st;
}

static loom_status block_forward(loom_model *m, const dims *d, const float *p, int l,
                                 const float *x) {
    loom_status st = loom_model_hook(m, 0, l, 0);
    if (!st) st = block_forward_body(m, d, p, l, x, 0);
    return st ? st : loom_model_hook(m, 1, l, 0);
}

/* Selective recomputation: block l's attention output and log-sum-exp from its kept qkv
 * and its MLP activation from its kept fc, into the buffers all layers share (the same
 * kernels on the same inputs as its forward: the same bits). */
static loom_status block_recompute_selective(loom_model *m, const dims *d, int l) {
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    loom_trace_begin(m->trace, "block", "recompute");
    loom_status st = loom_model_attention_forward(m, a->att, a->lse, a->qkv, d->H, d->KV, d->hd, 1);
    if (!st && !k->moe) {
        if (is_gpt2(m))
            loom_backend_gelu_forward(m->be, a->act, a->fc, (size_t)d->N * d->F);
        else
            loom_backend_swiglu_forward(m->be, a->act, a->fc, d->N, d->F);
    }
    loom_trace_end(m->trace);
    return st;
}

/* Final norm and logits from the last block's output x. */
static loom_status head_forward(loom_model *m, const dims *d, const float *p, const float *x) {
    const loom_param_table *t = &m->table;
    const float *in;
    norm_forward(m, m->normf, m->normf_mean, m->normf_rstd, x, p + t->normf_w,
                 loom_cat(p, t->normf_b), d->Ns);
    loom_status st = loom_model_tp_gather(m, m->normf, &in);
    if (!st)
        loom_backend_linear_forward(m->be, m->logits, in, p + t->lm_head, NULL, d->N, d->C, d->V);
    return st;
}

static loom_status lm_embed_forward(loom_model *m, const float *p) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return embed_forward(m, &d, p);
}

static loom_status lm_block_forward(loom_model *m, const float *p, int l, const float *x) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return block_forward(m, &d, p, l, x);
}

static loom_status lm_head_forward(loom_model *m, const float *p, const float *x) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return head_forward(m, &d, p, x);
}

static loom_status lm_loss_sum(loom_model *m, float dloss, int backward, double *sum) {
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

/* Head backward from dlogits: m->dres = d(x), the last block's output. With split backward
 * the head's weight gradient waits for head_backward_weight. */
static loom_status head_backward(loom_model *m, const dims *d, const float *p, float *g,
                                 const float *x_last) {
    const loom_param_table *t = &m->table;
    const float *dn;
    loom_status st = m->split_backward
                         ? loom_model_column_input(m, m->logits, p + t->lm_head, d->V, &dn)
                         : loom_model_column_backward(m, m->logits, p + t->lm_head, g + t->lm_head,
                                                      NULL, m->normf, d->V, &dn);
    loom_backend_memset(m->be, m->dres, 0, (size_t)d->Ns * d->C * sizeof(float));
    if (!st)
        norm_backward(m, m->dres, g + t->normf_w, loom_at(g, t->normf_b), dn, x_last,
                      p + t->normf_w, m->normf_mean, m->normf_rstd, d->Ns);
    return st;
}

/* Block l backward from m->dres = d(output) to m->dres = d(input x). With split backward
 * only the input gradients (B): the output gradients each linear's weight gradient needs
 * are kept in the block's activations for block_backward_weight (W). Norm parameter
 * gradients come with B (they are a by-product of the norm's input gradient). */
static loom_status block_backward(loom_model *m, const dims *dd, const float *p, float *g, int l,
                                  const float *x) {
    const dims d = *dd;
    const int N = d.N, Ns = d.Ns, C = d.C, hd = d.hd;
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    const int split = m->split_backward;
    float *dfc = split ? a->d_fc : m->dfc, *dqkv = split ? a->d_qkv : m->dqkv;
    const float *dn, *dy;
    loom_status st = loom_model_hook(m, 0, l, 1);
    /* recomputation: the block's activations again, from its kept input */
    if (!st && m->recompute) st = block_forward_body(m, &d, p, l, x, 1);
    if (!st && m->recompute_selective) st = block_recompute_selective(m, &d, l);
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward");
    /* res2 = res1 + act @ proj^T (row-parallel: d(out) is needed in full). MoE: under
     * split backward its weight gradients wait for W too (model/moe.h). */
    if (k->moe && m->moe_full) { /* sequence parallel: the whole dy and x, this slice of dx */
        const float *xn = NULL;
        if (!(st = loom_model_tp_gather(m, m->dres, &dy))) {
            loom_backend_copy(m->be, m->moe_full, dy, (size_t)N * C * sizeof(float));
            st = loom_model_tp_gather(m, a->norm2, &xn);
        }
        if (!st && !(st = loom_moe_backward(m->moe, l, p, g, xn, m->moe_full, m->dnorm)))
            dn = m->dnorm + (size_t)d.rank * Ns * C;
    } else if (k->moe) {
        if (!(st = loom_moe_backward(m->moe, l, p, g, a->norm2, m->dres, m->dnorm))) dn = m->dnorm;
    } else if (!(st = loom_model_tp_gather(m, m->dres, &dy))) {
        loom_backend_memset(m->be, m->dact, 0, (size_t)N * d.F * sizeof(float));
        loom_backend_linear_backward_input(m->be, m->dact, dy, p + k->proj_w, N, d.F, C);
        if (split)
            loom_backend_copy(m->be, a->d_res2, dy, (size_t)N * C * sizeof(float));
        else
            loom_backend_linear_backward_weight(m->be, g + k->proj_w, loom_at(g, k->proj_b), dy,
                                                a->act, N, d.F, C);
        loom_backend_memset(m->be, dfc, 0, (size_t)N * d.FC * sizeof(float));
        if (is_gpt2(m))
            loom_backend_gelu_backward(m->be, dfc, a->fc, m->dact, (size_t)N * d.F);
        else
            loom_backend_swiglu_backward(m->be, dfc, m->dact, a->fc, N, d.F);
        st = split ? loom_model_column_input(m, dfc, p + k->fc_w, d.FC, &dn)
                   : loom_model_column_backward(m, dfc, p + k->fc_w, g + k->fc_w,
                                                loom_at(g, k->fc_b), a->norm2, d.FC, &dn);
    }
    if (!st) {
        norm_backward(m, m->dres, g + k->norm2_w, loom_at(g, k->norm2_b), dn, a->res1,
                      p + k->norm2_w, a->norm2_mean, a->norm2_rstd, Ns);
        /* m->dres is now d(res1); res1 = x + att @ attn_out^T */
        st = loom_model_tp_gather(m, m->dres, &dy);
    }
    if (!st) {
        loom_backend_memset(m->be, m->datt, 0, (size_t)N * d.A * sizeof(float));
        loom_backend_linear_backward_input(m->be, m->datt, dy, p + k->attn_out_w, N, d.A, C);
        if (split)
            loom_backend_copy(m->be, a->d_res1, dy, (size_t)N * C * sizeof(float));
        else
            loom_backend_linear_backward_weight(m->be, g + k->attn_out_w, loom_at(g, k->attn_out_b),
                                                dy, a->att, N, d.A, C);
        loom_backend_memset(m->be, dqkv, 0, (size_t)N * d.QKV * sizeof(float));
        st = loom_model_attention_backward(m, dqkv, m->datt, a->qkv, a->att, a->lse, d.H, d.KV, hd,
                                           1);
    }
    if (!st) {
        if (!is_gpt2(m)) loom_model_rope(m, dqkv, d.H, d.KV, hd, 1);
        st = split ? loom_model_column_input(m, dqkv, p + k->qkv_w, d.QKV, &dn)
                   : loom_model_column_backward(m, dqkv, p + k->qkv_w, g + k->qkv_w,
                                                loom_at(g, k->qkv_b), a->norm1, d.QKV, &dn);
    }
    if (!st)
        norm_backward(m, m->dres, g + k->norm1_w, loom_at(g, k->norm1_b), dn, x, p + k->norm1_w,
                      a->norm1_mean, a->norm1_rstd, Ns);
    loom_trace_end(m->trace);
    return st ? st : loom_model_hook(m, 1, l, 1);
}

/* W of block l: the weight gradients of its four linears from what B kept (with
 * recomputation, the linears' inputs are recomputed from the block's input x first). */
static loom_status block_backward_weight(loom_model *m, const dims *d, const float *p, float *g,
                                         int l, const float *x) {
    const loom_block_params *k = &m->table.blocks[l];
    const loom_block_acts *a = &m->blocks[l];
    const int N = d->N, C = d->C;
    loom_status st = m->recompute ? block_forward_body(m, d, p, l, x, 1) : LOOM_OK;
    if (!st && m->recompute_selective) st = block_recompute_selective(m, d, l);
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward-weight");
    if (k->moe) { /* the experts', router's and shared expert's, from what B kept */
        const float *xn;
        if (!(st = loom_model_tp_gather(m, a->norm2, &xn)))
            loom_moe_backward_weight(m->moe, l, g, xn);
    } else {
        loom_backend_linear_backward_weight(m->be, g + k->proj_w, loom_at(g, k->proj_b), a->d_res2,
                                            a->act, N, d->F, C);
        st =
            loom_model_column_weight(m, a->d_fc, g + k->fc_w, loom_at(g, k->fc_b), a->norm2, d->FC);
    }
    if (!st)
        loom_backend_linear_backward_weight(m->be, g + k->attn_out_w, loom_at(g, k->attn_out_b),
                                            a->d_res1, a->att, N, d->A, C);
    if (!st)
        st = loom_model_column_weight(m, a->d_qkv, g + k->qkv_w, loom_at(g, k->qkv_b), a->norm1,
                                      d->QKV);
    loom_trace_end(m->trace);
    return st;
}

/* Embedding gradient from m->dres = d(embed). */
static loom_status embed_backward(loom_model *m, const dims *d, float *g) {
    const loom_param_table *t = &m->table;
    const float *dy = m->dres;
    loom_status st = d->tp == 1 ? LOOM_OK : loom_model_tp_gather(m, m->dres, &dy);
    int pos[2];
    const int n = loom_model_chunks(m, pos), L = m->T / n;
    const size_t rows = (size_t)m->B * L; /* of one chunk (model/context.c) */
    float *dwpe = loom_at(g, t->wpe);
    for (int j = 0; j < n && !st; j++) {
        const float *dyj = dy + j * rows * d->C;
        const int32_t *in = m->inputs + j * rows;
        float *dw = dwpe ? dwpe + (size_t)pos[j] * d->C : NULL;
        if (d->tp == 1)
            loom_backend_embedding_backward(m->be, g + t->wte, dw, dyj, in, m->B, L, d->C);
        else
            loom_backend_embedding_backward_shard(m->be, g + t->wte, dw, dyj, in, d->v0, d->V, m->B,
                                                  L, d->C);
    }
    return st;
}

static loom_status lm_head_backward(loom_model *m, const float *p, float *g, const float *x) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return head_backward(m, &d, p, g, x);
}

size_t loom_model_block_range_end(const loom_param_table *t, int l) {
    return l + 1 < t->n_layer ? t->blocks[l + 1].begin : t->head_begin;
}

static loom_status lm_block_backward(loom_model *m, const float *p, float *g, int l,
                                     const float *x) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return block_backward(m, &d, p, g, l, x);
}

static loom_status lm_block_backward_weight(loom_model *m, const float *p, float *g, int l,
                                            const float *x) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return block_backward_weight(m, &d, p, g, l, x);
}

static loom_status lm_head_backward_weight(loom_model *m, float *g) {
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return loom_model_column_weight(m, m->logits, g + m->table.lm_head, NULL, m->normf, d.V);
}

static loom_status lm_embed_backward(loom_model *m, const float *p, float *g) {
    (void)p; /* the embeddings' gradients need no parameters */
    const dims d = dims_of(m, loom_model_seq_parallel(m));
    return embed_backward(m, &d, g);
}

static const loom_model_ops lm_ops = {
    .plan = plan,
    .plan_bytes = lm_plan_bytes,
    .load_batch = lm_load_batch,
    .embed_forward = lm_embed_forward,
    .block_forward = lm_block_forward,
    .head_forward = lm_head_forward,
    .loss_sum = lm_loss_sum,
    .head_backward = lm_head_backward,
    .block_backward = lm_block_backward,
    .block_backward_weight = lm_block_backward_weight,
    .head_backward_weight = lm_head_backward_weight,
    .embed_backward = lm_embed_backward,
};

/* ---- the family-independent model: forward, backward and the pipeline's pieces
 * through the family's table ---- */

void loom_model_load_batch(loom_model *m, const int32_t *batch, int first) {
    m->ops->load_batch(m, batch, first);
}

loom_status loom_model_embed_forward(loom_model *m, const float *p) {
    return m->ops->embed_forward(m, p);
}

loom_status loom_model_blocks_forward(loom_model *m, const float *p, int lo, int hi, const float *x,
                                      const float **out) {
    loom_status st = LOOM_OK;
    for (int l = lo; l < hi && !st; l++) {
        st = m->ops->block_forward(m, p, l, x);
        x = m->blocks[l].res2;
    }
    *out = x;
    return st;
}

loom_status loom_model_head_forward(loom_model *m, const float *p, const float *x) {
    return m->ops->head_forward(m, p, x);
}

loom_status loom_model_loss_sum(loom_model *m, float dloss, int backward, double *sum) {
    return m->ops->loss_sum(m, dloss, backward, sum);
}

loom_status loom_model_head_backward(loom_model *m, const float *p, float *g, const float *x) {
    return m->ops->head_backward(m, p, g, x);
}

loom_status loom_model_blocks_backward(loom_model *m, const float *p, float *g, int lo, int hi,
                                       const float *x, loom_grads_ready_fn ready, void *ctx) {
    const loom_param_table *t = &m->table;
    loom_status st = LOOM_OK;
    for (int l = hi - 1; l >= lo && !st; l--) {
        st = m->ops->block_backward(m, p, g, l, l > lo ? m->blocks[l - 1].res2 : x);
        if (!st && ready) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    return st;
}

loom_status loom_model_blocks_backward_weight(loom_model *m, const float *p, float *g, int lo,
                                              int hi, const float *x, loom_grads_ready_fn ready,
                                              void *ctx) {
    const loom_param_table *t = &m->table;
    loom_status st = LOOM_OK;
    for (int l = hi - 1; l >= lo && !st; l--) {
        st = m->ops->block_backward_weight(m, p, g, l, l > lo ? m->blocks[l - 1].res2 : x);
        if (!st && ready) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    return st;
}

loom_status loom_model_head_backward_weight(loom_model *m, float *g) {
    return m->ops->head_backward_weight(m, g);
}

loom_status loom_model_embed_backward(loom_model *m, const float *p, float *g) {
    return m->ops->embed_backward(m, p, g);
}

loom_status loom_model_forward(loom_model *m, const float *p) {
    loom_trace_begin(m->trace, "forward", "compute");
    const float *x = m->embed;
    loom_status st = loom_model_embed_forward(m, p);
    if (!st) st = loom_model_blocks_forward(m, p, 0, m->table.n_layer, m->embed, &x);
    if (!st) st = loom_model_head_forward(m, p, x);
    loom_trace_end(m->trace);
    return st;
}

loom_status loom_model_backward(loom_model *m, const float *p, float *g, loom_grads_ready_fn ready,
                                void *ctx) {
    const loom_param_table *t = &m->table;
    const int L = t->n_layer;
    const float *x_last = L > 0 ? m->blocks[L - 1].res2 : m->embed;
    loom_trace_begin(m->trace, "backward", "compute");
    loom_status st = loom_model_head_backward(m, p, g, x_last);
    /* Everything after the last block (the final norm, an untied head) is final now. */
    if (!st && ready) st = ready(ctx, t->head_begin, t->total);
    /* m->dres holds d(block output); each block turns it into d(block input). */
    if (!st) st = loom_model_blocks_backward(m, p, g, 0, L, m->embed, ready, ctx);
    /* With data parallelism's embedding split (parallel/embed_grad.h) the caller turns
     * d(embedding output), left in m->dres, into the embeddings' gradients. */
    if (!st && !(ready && m->defer_embedding_grad)) st = loom_model_embed_backward(m, p, g);
    if (ready && !st) st = ready(ctx, 0, L > 0 ? t->blocks[0].begin : t->head_begin);
    loom_trace_end(m->trace);
    return st;
}

size_t loom_model_stream_floats(const loom_model *m) {
    return (size_t)m->Ns * m->cfg.d_model + m->cond_floats;
}

void loom_model_stream_send(loom_model *m, const float *x, float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    loom_backend_copy(m->be, buf, x, n * sizeof(float));
    if (m->cond_floats) loom_backend_copy(m->be, buf + n, m->cond, m->cond_floats * sizeof(float));
}

void loom_model_stream_receive(loom_model *m, const float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    if (m->cond_floats) loom_backend_copy(m->be, m->cond, buf + n, m->cond_floats * sizeof(float));
}

void loom_model_grad_stream_send(loom_model *m, float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    loom_backend_copy(m->be, buf, m->dres, n * sizeof(float));
    if (m->cond_floats) loom_backend_copy(m->be, buf + n, m->dcond, m->cond_floats * sizeof(float));
}

void loom_model_grad_stream_receive(loom_model *m, const float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    loom_backend_copy(m->be, m->dres, buf, n * sizeof(float));
    if (m->cond_floats) loom_backend_copy(m->be, m->dcond, buf + n, m->cond_floats * sizeof(float));
}

int loom_model_record_words(const loom_model_config *c) {
    if (c->family == LOOM_FAMILY_VLM) return loom_vlm_record_words(c);
    return c->family == LOOM_FAMILY_DIT ? 2 + 2 * loom_model_dit_sample_floats(c) : c->seq_len + 1;
}
