/* The language models' pieces of forward and backward (GPT-2 and Llama, dense or MoE), as
 * the family table model.c runs (loom_lm_ops). */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_bf16.h"
#include "model/model_impl.h"

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

/* --precision bf16: the activations only bf16 GEMMs read (the norms' outputs feeding qkv
 * and fc or the head, the MLP's activation feeding proj; their backward reads the norm's
 * input and the pre-activation fc instead) are kept as the bf16 bits those GEMMs round
 * them to: the same run, half their bytes. Not with sequence parallelism (the norms'
 * rows are gathered in fp32 there), nor an MoE layer's norm2 (the router and the
 * dispatch read it). */
static int keep_bf16(const loom_model *m, const dims *d) {
    return loom_model_bf16_activations(m, d->Ns != d->N);
}

/* A block's forward activations except its output (res2); mlp: rows of the dense MLP's
 * (0 for an MoE layer); norm2_fp32: norm2 kept in fp32 (an MoE layer reads it, or a
 * recomputation's block serving one). */
static void carve_block(const loom_model *m, const dims *d, loom_carver *cv, loom_block_acts *a,
                        size_t mlp, const loom_block_acts *sel, int norm2_fp32) {
    const size_t N = (size_t)d->N, Ns = (size_t)d->Ns, C = d->C;
    const int h = keep_bf16(m, d), hp = loom_model_keep_bf16_pre(m);
    loom_carve_kept(cv, h, Ns * C, &a->norm1, &a->norm1_bf16);
    a->norm1_mean = loom_carve(cv, Ns);
    a->norm1_rstd = loom_carve(cv, Ns);
    loom_carve_kept(cv, hp, N * d->QKV, &a->qkv, &a->qkv_bf16);
    /* selective recomputation: attention's output and the activation are sel's */
    if (sel) /* fp32 (one block's worth), holding the rounded values */
        a->att = sel->att, a->att_bf16 = NULL;
    else
        loom_carve_kept(cv, hp, N * d->A, &a->att, &a->att_bf16);
    a->lse = sel ? sel->lse : loom_carve(cv, (size_t)m->B * d->H * m->T);
    a->res1 = loom_carve(cv, Ns * C);
    loom_carve_kept(cv, h && mlp && !norm2_fp32, Ns * C, &a->norm2, &a->norm2_bf16);
    a->norm2_mean = loom_carve(cv, Ns);
    a->norm2_rstd = loom_carve(cv, Ns);
    loom_carve_kept(cv, hp && mlp, mlp * d->FC, &a->fc, &a->fc_bf16);
    if (sel)
        a->act = sel->act, a->act_bf16 = sel->act_bf16;
    else
        loom_carve_kept(cv, h && mlp, mlp * d->F, &a->act, &a->act_bf16);
}

/* --precision bf16 with qkv, attention's output and the MLP's pre-activation kept in bf16
 * (docs/precision.md): the fp32 scratch dqkv, datt, dfc and dact is one region, each
 * phase's pieces at their own offsets. Forward: qkv's and att's fp32 values before their
 * rounding (dqkv at 0, datt after it), then fc's, then the activation's (at 0: fc is read
 * from its bf16 copy). The MLP's backward: d(act) at 0, d(fc) after it, or in place for
 * GELU. Attention's backward: d(att) and d(qkv) where forward had them, reading the kept
 * bf16 qkv and att directly (no widened copies). Not with context parallelism (its
 * attention reads fp32 qkv), nor selective recomputation (att is one fp32 buffer there). */
static int shared_scratch(const loom_model *m) {
    return loom_model_keep_bf16_pre(m) && !loom_model_cp_on(m) && !m->recompute_selective &&
           loom_backend_bf16_shared_scratch(m->be);
}

static void plan(loom_model *m, loom_carver *cv, int sequence_parallel) {
    const dims d = dims_of(m, sequence_parallel);
    const size_t N = (size_t)d.N, Ns = (size_t)d.Ns, C = d.C, F = d.F;
    const size_t QKV = d.QKV, FC = d.FC, A = d.A;
    m->embed = loom_carve(cv, Ns * C);
    /* recomputation: one block's activations for all layers (refilled before backward) */
    loom_block_acts shared;
    memset(&shared, 0, sizeof shared);
    if (m->recompute && m->table.n_layer > 0)
        carve_block(m, &d, cv, &shared, N, NULL, m->cfg.n_experts > 0);
    /* selective recomputation: one block's attention output, log-sum-exp and activation */
    const int sel = m->recompute_selective && !m->recompute && m->table.n_layer > 0;
    if (sel) {
        shared.att = loom_carve(cv, N * A);
        shared.lse = loom_carve(cv, (size_t)m->B * d.H * m->T);
        loom_carve_kept(cv, keep_bf16(m, &d), N * F, &shared.act, &shared.act_bf16);
    }
    for (int l = 0; l < m->table.n_layer; l++) {
        loom_block_acts *a = &m->blocks[l];
        /* MoE: the experts' activations live in model/moe.c */
        const size_t mlp = loom_model_layer_is_moe(&m->cfg, m->table.layer_ids[l]) ? 0 : N;
        if (m->recompute)
            *a = shared;
        else
            carve_block(m, &d, cv, a, mlp, sel ? &shared : NULL, 0);
        a->res2 = loom_carve(cv, Ns * C);
        /* split backward (zero-bubble W): the linears' output gradients, kept for W */
        const int split = m->split_backward && !m->no_weight_grads;
        a->d_res2 = split && mlp ? loom_carve(cv, N * C) : NULL;
        a->d_fc = split && mlp ? loom_carve(cv, N * FC) : NULL;
        a->d_res1 = split ? loom_carve(cv, N * C) : NULL;
        a->d_qkv = split ? loom_carve(cv, N * QKV) : NULL;
    }
    loom_carve_kept(cv, keep_bf16(m, &d), Ns * C, &m->normf, &m->normf_bf16);
    m->normf_mean = loom_carve(cv, Ns);
    m->normf_rstd = loom_carve(cv, Ns);
    loom_carve_kept(cv, loom_model_keep_bf16_logits(m), N * (size_t)d.V, &m->logits,
                    &m->logits_bf16);
    m->losses = loom_carve(cv, N);
    m->dres = loom_carve(cv, Ns * C);
    m->dnorm = loom_carve(cv, N * C);
    if (shared_scratch(m)) { /* one region, phase by phase (shared_scratch) */
        const int inplace = is_gpt2(m) && FC == F && !m->split_backward;
        const size_t mlp = inplace ? F : F + FC, att = QKV + A;
        float *u = loom_carve(cv, N * (mlp > att ? mlp : att));
        m->dqkv = u, m->datt = u ? u + N * QKV : NULL;
        m->dact = u, m->dfc = u ? (inplace ? u : u + N * F) : NULL;
    } else {
        m->dqkv = loom_carve(cv, N * QKV);
        m->datt = loom_carve(cv, N * A);
        /* qkv kept in bf16: attention's backward reads it widened into dfc (free by then) */
        m->dfc = loom_carve(cv, N * (loom_model_keep_bf16_pre(m) && QKV > FC ? QKV : FC));
        /* att kept in bf16: attention's backward reads it widened into dact (free by then) */
        m->dact = loom_carve(cv, N * (loom_model_keep_bf16_pre(m) && A > F ? A : F));
    }
    m->full = sequence_parallel && d.tp > 1 ? loom_carve(cv, N * C) : NULL;
    m->moe_full =
        sequence_parallel && d.tp > 1 && m->cfg.n_experts > 0 ? loom_carve(cv, N * C) : NULL;
    m->att_scratch = loom_carve(
        cv, shared_scratch(m) ? loom_backend_attention_scratch_floats_bf16(m->be, m->T, d.hd)
                              : loom_model_attention_scratch_floats(m, d.H));
}

static size_t lm_plan_bytes(const loom_model *m, int sequence_parallel) {
    return loom_model_arena_plan_bytes(m, plan, sequence_parallel);
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

/* The dense MLP's activation (GELU or SwiGLU) of a->fc into a->act, or kept in bf16: through
 * dact (free until backward) rounded into a->act_bf16. */
static void mlp_activation(loom_model *m, const dims *d, loom_block_acts *a) {
    float *act = a->act ? a->act : m->dact;
    if (is_gpt2(m)) /* from the pre-activation's bf16 copy when it is kept in bf16 */
        loom_model_gelu_forward_kept(m->be, act, a->fc, a->fc_bf16, (size_t)d->N * d->F);
    else if (a->fc_bf16)
        loom_backend_swiglu_forward_in_bf16(m->be, act, a->fc_bf16, d->N, d->F);
    else
        loom_backend_swiglu_forward(m->be, act, a->fc, d->N, d->F);
    loom_model_keep_bf16(m, a->act_bf16, act, (size_t)d->N * d->F);
}

/* d(fc) into dfc from d(act) in m->dact: GELU or SwiGLU backward (in place for GELU in the
 * shared scratch, where dfc is m->dact: shared_scratch). */
static void mlp_activation_backward(loom_model *m, const dims *d, const loom_block_acts *a,
                                    float *dfc) {
    const size_t n = (size_t)d->N * d->F;
    if (dfc == m->dact) {
        loom_backend_gelu_backward_in_bf16_inplace(m->be, dfc, a->fc_bf16, n);
        return;
    }
    loom_backend_memset(m->be, dfc, 0, (size_t)d->N * d->FC * sizeof(float));
    if (is_gpt2(m))
        loom_model_gelu_backward_kept(m->be, dfc, a->fc, a->fc_bf16, m->dact, n);
    else if (a->fc_bf16)
        loom_backend_swiglu_backward_in_bf16(m->be, dfc, m->dact, a->fc_bf16, d->N, d->F);
    else
        loom_backend_swiglu_backward(m->be, dfc, m->dact, a->fc, d->N, d->F);
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
    /* a norm kept in bf16 passes through dnorm (free until backward) and is rounded */
    float *n1 = a->norm1 ? a->norm1 : m->dnorm, *n2 = a->norm2 ? a->norm2 : m->dnorm;
    norm_forward(m, n1, a->norm1_mean, a->norm1_rstd, x, p + k->norm1_w, loom_cat(p, k->norm1_b),
                 Ns);
    loom_model_keep_bf16(m, a->norm1_bf16, n1, (size_t)Ns * C);
    loom_act in1;
    /* qkv kept in bf16: through dqkv (free until backward), rounded after RoPE; attention
     * reads the rounded values */
    float *qkv = a->qkv ? a->qkv : m->dqkv;
    if (!(st = loom_model_tp_gather_act(m, loom_act_of(a->norm1, a->norm1_bf16), &in1))) {
        loom_model_linear_forward(m, qkv, in1, p + k->qkv_w, loom_cat(p, k->qkv_b), N, C, d.QKV);
        if (!is_gpt2(m)) loom_model_rope(m, qkv, d.H, d.KV, hd, 0);
        loom_model_round_pre(m, a->qkv_bf16, qkv, (size_t)N * d.QKV, 1);
        float *att = a->att ? a->att : m->datt; /* kept in bf16: through datt, rounded */
        st = loom_model_attention_forward(m, att, a->lse, qkv, d.H, d.KV, hd, 1);
        if (!st) loom_model_round_pre(m, a->att_bf16, att, (size_t)N * d.A, 0);
    }
    if (!st) {
        st = loom_model_row_forward(m, a->res1, loom_act_of(a->att, a->att_bf16), p + k->attn_out_w,
                                    loom_cat(p, k->attn_out_b), d.A);
    }
    if (!st) {
        loom_backend_add(m->be, a->res1, a->res1, x, (size_t)Ns * C);
        norm_forward(m, n2, a->norm2_mean, a->norm2_rstd, a->res1, p + k->norm2_w,
                     loom_cat(p, k->norm2_b), Ns);
        loom_model_keep_bf16(m, a->norm2_bf16, n2, (size_t)Ns * C);
        if (recomputing && k->moe) { /* backward gathers norm2 itself */
            loom_trace_end(m->trace);
            return st;
        }
        if (!a->norm2_bf16) /* the dense MLP's fc GEMM reads it, the MoE block more */
            st = k->moe ? loom_model_tp_gather(m, a->norm2, &in)
                        : loom_model_tp_gather_gemm(m, a->norm2, &in);
    }
    if (!st && k->moe && m->moe_full) {
        st = loom_moe_forward(m->moe, l, p, in, m->moe_full);
        loom_backend_copy(m->be, a->res2, m->moe_full + (size_t)d.rank * Ns * C,
                          (size_t)Ns * C * sizeof(float));
    } else if (!st && k->moe) {
        st = loom_moe_forward(m->moe, l, p, in, a->res2);
    } else if (!st) {
        float *fc = a->fc ? a->fc : m->dfc; /* kept in bf16: through dfc, rounded */
        loom_model_linear_forward(
            m, fc, a->norm2_bf16 ? loom_act_of(NULL, a->norm2_bf16) : loom_act_f32(in), p + k->fc_w,
            loom_cat(p, k->fc_b), N, C, d.FC);
        loom_model_round_pre(m, a->fc_bf16, fc, (size_t)N * d.FC, 0);
        mlp_activation(m, dd, a);
        st = loom_model_row_forward(m, a->res2, loom_act_of(a->act, a->act_bf16), p + k->proj_w,
                                    loom_cat(p, k->proj_b), d.F);
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
    /* kept in bf16: widened into dqkv (free until the block's attention backward) */
    const float *qkv =
        loom_model_widen_kept(m, a->qkv, a->qkv_bf16, m->dqkv, (size_t)d->N * d->QKV);
    loom_status st = loom_model_attention_forward(m, a->att, a->lse, qkv, d->H, d->KV, d->hd, 1);
    if (!st) loom_model_round_pre(m, NULL, a->att, (size_t)d->N * d->A, 0); /* as forward's */
    if (!st && !k->moe) mlp_activation(m, d, a);
    loom_trace_end(m->trace);
    return st;
}

/* Final norm and logits from the last block's output x. */
static loom_status head_forward(loom_model *m, const dims *d, const float *p, const float *x) {
    const loom_param_table *t = &m->table;
    loom_act in;
    float *nf = m->normf ? m->normf : m->dnorm; /* kept in bf16: through dnorm */
    norm_forward(m, nf, m->normf_mean, m->normf_rstd, x, p + t->normf_w, loom_cat(p, t->normf_b),
                 d->Ns);
    loom_model_keep_bf16(m, m->normf_bf16, nf, (size_t)d->Ns * d->C);
    loom_status st = loom_model_tp_gather_act(m, loom_act_of(m->normf, m->normf_bf16), &in);
    if (!st && m->logits_bf16) /* kept in bf16: the GEMM rounds its fp32 sums once */
        loom_backend_linear_forward_out_bf16(m->be, m->logits_bf16, in.f32, in.bf16, p + t->lm_head,
                                             d->N, d->C, d->V);
    else if (!st)
        loom_model_linear_forward(m, m->logits, in, p + t->lm_head, NULL, d->N, d->C, d->V);
    if (!st && !m->logits_bf16 && loom_model_bf16_logits(m)) /* vocabulary-parallel (tp > 1) */
        loom_backend_round_bf16_values(m->be, m->logits, (size_t)d->N * d->V);
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
    if (m->logits_bf16 && backward) /* one rank (loom_model_keep_bf16_logits) */
        loom_backend_crossentropy_forward_backward_bf16(m->be, m->losses, m->logits_bf16,
                                                        m->targets, N, d.V, dloss);
    else if (m->logits_bf16)
        loom_backend_crossentropy_forward_bf16(m->be, m->losses, m->logits_bf16, m->targets, N,
                                               d.V);
    else if (d.tp > 1)
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

/* The head's linear backward from bf16 dlogits (loom_model_keep_bf16_logits: one rank, no
 * sequence parallelism): d(normf) into m->dnorm, returned; dw += dlogits^T normf unless dw
 * is NULL. The same GEMMs on the same bits as the fp32-dlogits path, which rounds them to
 * bf16 inside (the head has no bias, whose gradient would read fp32 dlogits). */
static const float *head_backward_bf16(loom_model *m, const dims *d, const float *w, float *dw) {
    loom_backend_memset(m->be, m->dnorm, 0, (size_t)d->N * d->C * sizeof(float));
    loom_backend_linear_backward_input_dbf16(m->be, m->dnorm, m->logits_bf16, w, d->N, d->C, d->V);
    if (dw)
        loom_backend_linear_backward_weight_dbf16(m->be, dw, m->logits_bf16, m->normf,
                                                  m->normf_bf16, d->N, d->C, d->V);
    return m->dnorm;
}

/* Head backward from dlogits: m->dres = d(x), the last block's output. With split backward
 * the head's weight gradient waits for head_backward_weight. */
static loom_status head_backward(loom_model *m, const dims *d, const float *p, float *g,
                                 const float *x_last) {
    const loom_param_table *t = &m->table;
    const float *dn;
    float *dw = m->head_weight_deferred ? NULL : g + t->lm_head; /* head_backward_rows */
    loom_status st = LOOM_OK;
    if (m->logits_bf16) { /* one rank: the column-parallel layer is the plain one */
        dn = head_backward_bf16(m, d, p + t->lm_head, m->split_backward ? NULL : dw);
        if (m->round_tp) /* the tests' reference for tp's rounded sums (model/tp_round.c) */
            st = loom_model_round_tp_column_input(m, m->dnorm, loom_act_of(NULL, m->logits_bf16),
                                                  p + t->lm_head, d->V);
    } else
        st = loom_model_column_backward(m, m->logits, p + t->lm_head, dw, NULL,
                                        loom_act_of(m->normf, m->normf_bf16), d->V, &dn);
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
    float *dfc = a->d_fc ? a->d_fc : m->dfc, *dqkv = a->d_qkv ? a->d_qkv : m->dqkv;
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
    } else if (!(st = loom_model_row_backward(
                     m, m->dres, p + k->proj_w, g + k->proj_w, loom_at(g, k->proj_b),
                     loom_act_of(a->act, a->act_bf16), d.F, m->dact, a->d_res2))) {
        mlp_activation_backward(m, &d, a, dfc);
        st = loom_model_column_backward(m, dfc, p + k->fc_w, g + k->fc_w, loom_at(g, k->fc_b),
                                        loom_act_of(a->norm2, a->norm2_bf16), d.FC, &dn);
    }
    if (!st) {
        norm_backward(m, m->dres, g + k->norm2_w, loom_at(g, k->norm2_b), dn, a->res1,
                      p + k->norm2_w, a->norm2_mean, a->norm2_rstd, Ns);
        /* m->dres is now d(res1); res1 = x + att @ attn_out^T */
        st = loom_model_row_backward(m, m->dres, p + k->attn_out_w, g + k->attn_out_w,
                                     loom_at(g, k->attn_out_b), loom_act_of(a->att, a->att_bf16),
                                     d.A, m->datt, a->d_res1);
    }
    /* bf16: attention's output gradient, and below its input gradients (dq, dk, dv, the
     * query heads' sums made), are rounded to bf16 values in every layout, where
     * autocast's are bf16; context parallelism sends them as bf16 (cp/ulysses.c) */
    const int round_grads = loom_model_bf16_pre_activations(m);
    if (!st && round_grads) loom_backend_round_bf16_values(m->be, m->datt, (size_t)N * d.A);
    if (!st && shared_scratch(m)) { /* reading the kept bf16 qkv and att */
        loom_backend_memset(m->be, dqkv, 0, (size_t)N * d.QKV * sizeof(float));
        loom_backend_attention_backward_in_bf16(m->be, dqkv, m->att_scratch, m->datt, a->qkv_bf16,
                                                a->att_bf16, a->lse, m->B, m->T, d.H, d.KV, hd);
    } else if (!st) {
        /* kept in bf16: qkv widened into dfc and att into dact (the MLP's backward is done
         * with both) */
        const float *qkv = loom_model_widen_kept(m, a->qkv, a->qkv_bf16, m->dfc, (size_t)N * d.QKV);
        const float *att = loom_model_widen_kept(m, a->att, a->att_bf16, m->dact, (size_t)N * d.A);
        loom_backend_memset(m->be, dqkv, 0, (size_t)N * d.QKV * sizeof(float));
        st = loom_model_attention_backward(m, dqkv, m->datt, qkv, att, a->lse, d.H, d.KV, hd, 1);
    }
    if (!st && round_grads) loom_backend_round_bf16_values(m->be, dqkv, (size_t)N * d.QKV);
    if (!st) {
        if (!is_gpt2(m)) loom_model_rope(m, dqkv, d.H, d.KV, hd, 1);
        st = loom_model_column_backward(m, dqkv, p + k->qkv_w, g + k->qkv_w, loom_at(g, k->qkv_b),
                                        loom_act_of(a->norm1, a->norm1_bf16), d.QKV, &dn);
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
    loom_status st = m->recompute ? block_forward_body(m, d, p, l, x, 1) : LOOM_OK;
    if (!st && m->recompute_selective) st = block_recompute_selective(m, d, l);
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward-weight");
    if (k->moe) { /* the experts', router's and shared expert's, from what B kept */
        const float *xn;
        if (!(st = loom_model_tp_gather(m, a->norm2, &xn)))
            loom_moe_backward_weight(m->moe, l, g, xn);
    } else {
        st = loom_model_branch_weight(m, g, k->proj_w, k->proj_b, a->d_res2,
                                      loom_act_of(a->act, a->act_bf16), d->F, k->fc_w, k->fc_b,
                                      a->d_fc, loom_act_of(a->norm2, a->norm2_bf16), d->FC);
    }
    if (!st)
        st = loom_model_branch_weight(m, g, k->attn_out_w, k->attn_out_b, a->d_res1,
                                      loom_act_of(a->att, a->att_bf16), d->A, k->qkv_w, k->qkv_b,
                                      a->d_qkv, loom_act_of(a->norm1, a->norm1_bf16), d->QKV);
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
    if (m->logits_bf16) {
        loom_backend_linear_backward_weight_dbf16(m->be, g + m->table.lm_head, m->logits_bf16,
                                                  m->normf, m->normf_bf16, d.N, d.C, d.V);
        return LOOM_OK;
    }
    return loom_model_column_weight(m, m->logits, g + m->table.lm_head, NULL,
                                    loom_act_of(m->normf, m->normf_bf16), d.V);
}

/* Rows [v0, v1) of the untied head's weight gradient (loom_model_head_can_split: whole
 * sequences, so the final norm's output is this rank's own). */
static loom_status lm_head_backward_rows(loom_model *m, float *g, int v0, int v1) {
    const dims d = dims_of(m, 0);
    float *dw = g + m->table.lm_head + (size_t)v0 * d.C;
    if (m->logits_bf16) return LOOM_ERR_STATE; /* not reached: the bf16 table has no _ld op */
    if (!loom_backend_linear_backward_weight_ld(m->be, dw, m->logits + v0, d.V, m->normf, d.N, d.C,
                                                v1 - v0))
        return LOOM_ERR_STATE; /* not reached: loom_model_head_can_split checked the backend */
    return LOOM_OK;
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
    .head_backward_rows = lm_head_backward_rows,
};

const loom_model_ops *loom_lm_ops(void) {
    return &lm_ops;
}
