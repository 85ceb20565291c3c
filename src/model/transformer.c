#include "model/transformer.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static int is_gpt2(const loom_model *m) {
    return m->cfg.family == LOOM_FAMILY_GPT2;
}
static int head_dim(const loom_model_config *c) {
    return c->d_model / c->n_head;
}
static int qkv_width(const loom_model_config *c) {
    return (c->n_head + 2 * c->n_kv_head) * head_dim(c);
}
static int fc_width(const loom_model_config *c) {
    return c->family == LOOM_FAMILY_GPT2 ? c->d_ff : 2 * c->d_ff;
}

/* Carves the arena twice: first with base NULL to size it, then for real. */
typedef struct {
    float *base;
    size_t used;
} carver;

static float *carve(carver *cv, size_t floats) {
    float *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (floats + 15) & ~(size_t)15; /* 64-byte aligned pieces */
    return p;
}

static void plan(loom_model *m, carver *cv) {
    const loom_model_config *c = &m->cfg;
    const size_t N = (size_t)m->B * m->T, C = c->d_model, F = c->d_ff;
    const size_t QKV = qkv_width(c), FC = fc_width(c), A = (size_t)c->n_head * head_dim(c);
    m->embed = carve(cv, N * C);
    for (int l = 0; l < c->n_layer; l++) {
        loom_block_acts *a = &m->blocks[l];
        a->norm1 = carve(cv, N * C);
        a->norm1_mean = carve(cv, N);
        a->norm1_rstd = carve(cv, N);
        a->qkv = carve(cv, N * QKV);
        a->att = carve(cv, N * A);
        a->lse = carve(cv, (size_t)m->B * c->n_head * m->T);
        a->res1 = carve(cv, N * C);
        a->norm2 = carve(cv, N * C);
        a->norm2_mean = carve(cv, N);
        a->norm2_rstd = carve(cv, N);
        a->fc = carve(cv, N * FC);
        a->act = carve(cv, N * F);
        a->res2 = carve(cv, N * C);
    }
    m->normf = carve(cv, N * C);
    m->normf_mean = carve(cv, N);
    m->normf_rstd = carve(cv, N);
    m->logits = carve(cv, N * (size_t)c->vocab_size);
    m->losses = carve(cv, N);
    m->dres = carve(cv, N * C);
    m->dnorm = carve(cv, N * C);
    m->dqkv = carve(cv, N * QKV);
    m->datt = carve(cv, N * A);
    m->dfc = carve(cv, N * FC);
    m->dact = carve(cv, N * F);
    m->att_scratch = carve(cv, loom_attention_scratch_floats(m->T));
}

loom_status loom_model_create(loom_model *m, const loom_model_config *cfg, int B, int T,
                              loom_error *err) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    loom_status st = loom_model_config_validate(cfg, err);
    if (st) return st;
    if (T > cfg->seq_len)
        return loom_error_set(err, LOOM_ERR_INPUT, "sequence length %d exceeds --seq-len %d", T,
                              cfg->seq_len);
    if ((st = loom_params_build(&m->table, cfg, err))) return st;
    m->blocks = calloc((size_t)cfg->n_layer, sizeof *m->blocks);
    carver sizing = {NULL, 0};
    if (m->blocks) plan(m, &sizing);
    m->arena_floats = sizing.used;
    m->arena = m->blocks ? aligned_alloc(64, m->arena_floats * sizeof(float)) : NULL;
    m->inputs = malloc((size_t)B * T * sizeof *m->inputs);
    m->targets = malloc((size_t)B * T * sizeof *m->targets);
    if (!m->arena || !m->inputs || !m->targets) {
        loom_model_destroy(m);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "activations: cannot allocate %.1f MiB for micro-batch %d x %d",
                              (double)sizing.used * 4 / (1 << 20), B, T);
    }
    carver real = {m->arena, 0};
    plan(m, &real);
    return LOOM_OK;
}

void loom_model_destroy(loom_model *m) {
    free(m->arena);
    free(m->blocks);
    free(m->inputs);
    free(m->targets);
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
        loom_layernorm_forward(out, mean, rstd, inp, w, b, N, m->cfg.d_model, m->cfg.norm_eps);
    else
        loom_rmsnorm_forward(out, rstd, inp, w, N, m->cfg.d_model, m->cfg.norm_eps);
}

static void norm_backward(const loom_model *m, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N) {
    if (is_gpt2(m))
        loom_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, m->cfg.d_model);
    else
        loom_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, m->cfg.d_model);
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

loom_status loom_model_forward(loom_model *m, const float *p) {
    const loom_model_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->d_model, F = c->d_ff, hd = head_dim(c);
    const int H = c->n_head, KV = c->n_kv_head, A = H * hd;
    const loom_param_table *t = &m->table;
    loom_trace_begin(m->trace, "forward", "compute");
    loom_embedding_forward(m->embed, m->inputs, p + t->wte, cat(p, t->wpe), B, T, C);
    const float *x = m->embed;
    for (int l = 0; l < c->n_layer; l++) {
        const loom_block_params *k = &t->blocks[l];
        loom_block_acts *a = &m->blocks[l];
        loom_status st = hook(m, 0, l, 0);
        if (st) return st;
        loom_trace_begin(m->trace, "block", "forward");
        norm_forward(m, a->norm1, a->norm1_mean, a->norm1_rstd, x, p + k->norm1_w,
                     cat(p, k->norm1_b), N);
        loom_linear_forward(a->qkv, a->norm1, p + k->qkv_w, cat(p, k->qkv_b), N, C, qkv_width(c));
        if (!is_gpt2(m)) loom_rope_forward(a->qkv, B, T, H, KV, hd, c->rope_theta);
        loom_attention_forward(a->att, a->lse, a->qkv, m->att_scratch, B, T, H, KV, hd);
        loom_linear_forward(a->res1, a->att, p + k->attn_out_w, cat(p, k->attn_out_b), N, A, C);
        loom_add(a->res1, a->res1, x, (size_t)N * C);
        norm_forward(m, a->norm2, a->norm2_mean, a->norm2_rstd, a->res1, p + k->norm2_w,
                     cat(p, k->norm2_b), N);
        loom_linear_forward(a->fc, a->norm2, p + k->fc_w, cat(p, k->fc_b), N, C, fc_width(c));
        if (is_gpt2(m))
            loom_gelu_forward(a->act, a->fc, (size_t)N * F);
        else
            loom_swiglu_forward(a->act, a->fc, N, F);
        loom_linear_forward(a->res2, a->act, p + k->proj_w, cat(p, k->proj_b), N, F, C);
        loom_add(a->res2, a->res2, a->res1, (size_t)N * C);
        x = a->res2;
        loom_trace_end(m->trace);
        if ((st = hook(m, 1, l, 0))) return st;
    }
    norm_forward(m, m->normf, m->normf_mean, m->normf_rstd, x, p + t->normf_w, cat(p, t->normf_b),
                 N);
    loom_linear_forward(m->logits, m->normf, p + t->lm_head, NULL, N, C, c->vocab_size);
    loom_trace_end(m->trace);
    return LOOM_OK;
}

double loom_model_loss(loom_model *m) {
    const int N = m->B * m->T;
    loom_crossentropy_forward(m->losses, m->logits, m->targets, N, m->cfg.vocab_size);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->losses[i];
    return sum;
}

double loom_model_loss_and_dlogits(loom_model *m, float dloss) {
    const int N = m->B * m->T;
    loom_crossentropy_forward_backward(m->losses, m->logits, m->targets, N, m->cfg.vocab_size,
                                       dloss);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->losses[i];
    return sum;
}

loom_status loom_model_backward(loom_model *m, const float *p, float *g, loom_grads_ready_fn ready,
                                void *ctx) {
    const loom_model_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->d_model, F = c->d_ff, hd = head_dim(c);
    const int H = c->n_head, KV = c->n_kv_head, A = H * hd, QKV = qkv_width(c), FC = fc_width(c);
    const loom_param_table *t = &m->table;
    const size_t NC = (size_t)N * C;
    const float *x_last = c->n_layer > 0 ? m->blocks[c->n_layer - 1].res2 : m->embed;

    loom_trace_begin(m->trace, "backward", "compute");
    /* logits = normf @ lm_head^T */
    memset(m->dnorm, 0, NC * sizeof(float));
    loom_linear_backward_input(m->dnorm, m->logits, p + t->lm_head, N, C, c->vocab_size);
    loom_linear_backward_weight(g + t->lm_head, NULL, m->logits, m->normf, N, C, c->vocab_size);
    memset(m->dres, 0, NC * sizeof(float));
    norm_backward(m, m->dres, g + t->normf_w, at(g, t->normf_b), m->dnorm, x_last, p + t->normf_w,
                  m->normf_mean, m->normf_rstd, N);
    /* Everything after the last block (final norm, an untied head) is final now. */
    loom_status st = ready ? ready(ctx, t->normf_w, t->total) : LOOM_OK;

    /* m->dres holds d(block output); each block turns it into d(block input). */
    for (int l = c->n_layer - 1; l >= 0; l--) {
        const loom_block_params *k = &t->blocks[l];
        const loom_block_acts *a = &m->blocks[l];
        const float *x = l > 0 ? m->blocks[l - 1].res2 : m->embed;
        if (!st) st = hook(m, 0, l, 1);
        if (st) {
            loom_trace_end(m->trace);
            return st;
        }
        loom_trace_begin(m->trace, "block", "backward");
        /* res2 = res1 + act @ proj^T */
        memset(m->dact, 0, (size_t)N * F * sizeof(float));
        loom_linear_backward_input(m->dact, m->dres, p + k->proj_w, N, F, C);
        loom_linear_backward_weight(g + k->proj_w, at(g, k->proj_b), m->dres, a->act, N, F, C);
        memset(m->dfc, 0, (size_t)N * FC * sizeof(float));
        if (is_gpt2(m))
            loom_gelu_backward(m->dfc, a->fc, m->dact, (size_t)N * F);
        else
            loom_swiglu_backward(m->dfc, m->dact, a->fc, N, F);
        memset(m->dnorm, 0, NC * sizeof(float));
        loom_linear_backward_input(m->dnorm, m->dfc, p + k->fc_w, N, C, FC);
        loom_linear_backward_weight(g + k->fc_w, at(g, k->fc_b), m->dfc, a->norm2, N, C, FC);
        norm_backward(m, m->dres, g + k->norm2_w, at(g, k->norm2_b), m->dnorm, a->res1,
                      p + k->norm2_w, a->norm2_mean, a->norm2_rstd, N);
        /* m->dres is now d(res1); res1 = x + att @ attn_out^T */
        memset(m->datt, 0, (size_t)N * A * sizeof(float));
        loom_linear_backward_input(m->datt, m->dres, p + k->attn_out_w, N, A, C);
        loom_linear_backward_weight(g + k->attn_out_w, at(g, k->attn_out_b), m->dres, a->att, N, A,
                                    C);
        memset(m->dqkv, 0, (size_t)N * QKV * sizeof(float));
        loom_attention_backward(m->dqkv, m->att_scratch, m->datt, a->qkv, a->att, a->lse, B, T, H,
                                KV, hd);
        if (!is_gpt2(m)) loom_rope_backward(m->dqkv, B, T, H, KV, hd, c->rope_theta);
        memset(m->dnorm, 0, NC * sizeof(float));
        loom_linear_backward_input(m->dnorm, m->dqkv, p + k->qkv_w, N, C, QKV);
        loom_linear_backward_weight(g + k->qkv_w, at(g, k->qkv_b), m->dqkv, a->norm1, N, C, QKV);
        norm_backward(m, m->dres, g + k->norm1_w, at(g, k->norm1_b), m->dnorm, x, p + k->norm1_w,
                      a->norm1_mean, a->norm1_rstd, N);
        size_t end = l + 1 < c->n_layer ? t->blocks[l + 1].norm1_w : t->normf_w;
        loom_trace_end(m->trace);
        if (ready && !st) st = ready(ctx, k->norm1_w, end);
        if (!st) st = hook(m, 1, l, 1);
    }
    if (!(ready && m->defer_embedding_grad))
        loom_embedding_backward(g + t->wte, at(g, t->wpe), m->dres, m->inputs, B, T, C);
    if (ready && !st) st = ready(ctx, 0, t->blocks[0].norm1_w);
    loom_trace_end(m->trace);
    return st;
}
