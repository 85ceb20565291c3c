/* The diffusion transformer's forward and backward (model/dit.h), as the family table
 * the model's public functions call (model/model.h). */
#include "model/dit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_bf16.h"
#include "model/model_impl.h"

/* A DiT block's activations beyond the LM block's (those live in m->blocks[l]: norm1/2
 * hold the normalised inputs, qkv, att, lse, res1, fc, act, res2). */
typedef struct {
    float *mod;   /* [B, 6C]: shift/scale/gate of attention, then of the MLP */
    float *xm1;   /* [Ns, C] modulated norm1: attention's input */
    float *y1;    /* [Ns, C] attention output (before the gate) */
    float *xm2;   /* [Ns, C] modulated norm2: the MLP's input */
    float *y2;    /* [Ns, C] MLP output (before the gate) */
    float *d_mod; /* split backward: d(mod), kept for W */
    float *d_y1;  /* split backward: d(y1) gathered [N, C], kept for W */
    float *d_y2;  /* split backward: d(y2) gathered [N, C] */
    /* --precision bf16: xm1, xm2 kept as the bf16 bits their GEMMs read (then NULL) */
    loom_bf16 *xm1_bf16, *xm2_bf16;
} dit_block;

struct loom_dit {
    dit_block *blk;            /* n_layer */
    float *pos;                /* [T, C] fixed positions (backend memory, outside the arena) */
    float *host_in, *host_out; /* [N, P] host staging for the batch's patches and targets */
    float *host_sample;        /* [2, S] x_t and v of one sample */
    float *host_t;             /* [B] */
    int32_t *host_labels;      /* [B] */
    /* arena: inputs */
    float *patches, *target, *t; /* [N, P], [N, P], [B] */
    int32_t *labels;             /* [B] */
    /* arena: conditioning */
    float *tfreq, *th, *tha, *c; /* [B, 256], [B, C] x 3 */
    float *dc, *dtha, *dth;      /* backward scratch [B, C] */
    /* arena: final layer */
    float *fmod, *dfmod;              /* [B, 2C] */
    float *fxn, *fmean, *frstd, *fxm; /* [Ns, C], [Ns], [Ns], [Ns, C] */
    loom_bf16 *fxm_bf16;              /* fxm kept in bf16 (fxm then NULL) */
    float *pred;                      /* [Ns, P]: the prediction, then its gradient */
    /* arena: block backward scratch */
    float *dmod;      /* [B, 6C] */
    float *dyl, *dxn; /* [Ns, C] */
};

typedef struct {
    int N, Ns, C, H, hd, A, QKV, F, P, row0, B, T;
} dims;

static dims dims_of(const loom_model *m, int sequence_parallel) {
    const loom_model_config *c = &m->cfg;
    dims d;
    const int tp = m->tp ? m->tp->size : 1, rank = m->tp ? m->tp->rank : 0;
    d.B = m->B;
    d.T = m->T;
    d.N = m->B * m->T;
    d.Ns = sequence_parallel && tp > 1 ? d.N / tp : d.N;
    d.row0 = sequence_parallel && tp > 1 ? rank * d.Ns : 0;
    d.C = c->d_model;
    d.hd = c->d_model / c->n_head;
    d.H = c->n_head / tp;
    d.A = d.H * d.hd;
    d.QKV = 3 * d.A;
    d.F = c->d_ff / tp;
    d.P = loom_model_dit_patch_floats(c);
    return d;
}

static dims dims_here(const loom_model *m) {
    return dims_of(m, loom_model_seq_parallel(m));
}

/* ---- patches and positions ---- */

/* Walks every pixel of a sample x [F, C, H, W] with its place in the patch tokens: token
 * (f', h', w') row-major; inside a token the input order (c, dt, dy, dx) or the output
 * order (dt, dy, dx, c). to_patches 1: x -> patches, else patches -> x. */
static void patch_walk(const loom_model_config *c, float *x, float *patches, int output_order,
                       int to_patches) {
    const int p = c->patch, pt = c->patch_t, Cn = c->channels, H = c->height, W = c->width;
    const int gh = H / p, gw = W / p, gf = c->frames / pt, P = loom_model_dit_patch_floats(c);
    for (int f = 0; f < gf; f++)
        for (int i = 0; i < gh; i++)
            for (int j = 0; j < gw; j++) {
                float *v = patches + (size_t)((f * gh + i) * gw + j) * P;
                for (int ch = 0; ch < Cn; ch++)
                    for (int dt = 0; dt < pt; dt++)
                        for (int dy = 0; dy < p; dy++)
                            for (int dx = 0; dx < p; dx++) {
                                float *e =
                                    &x[(((size_t)(f * pt + dt) * Cn + ch) * H + i * p + dy) * W +
                                       j * p + dx];
                                float *q = &v[output_order ? ((dt * p + dy) * p + dx) * Cn + ch
                                                           : ((ch * pt + dt) * p + dy) * p + dx];
                                if (to_patches)
                                    *q = *e;
                                else
                                    *e = *q;
                            }
            }
}

void loom_dit_patchify(const loom_model_config *c, const float *x, float *patches) {
    patch_walk(c, (float *)x, patches, 0, 1); /* reads x only */
}

void loom_dit_unpatchify(const loom_model_config *c, const float *patches, float *x) {
    patch_walk(c, x, (float *)patches, 1, 0); /* reads patches only */
}

/* DiT's get_1d_sincos_pos_embed_from_grid: E channels for position pos, [sin | cos]. */
static void sincos_1d(float *out, int E, double pos) {
    const int half = E / 2;
    for (int i = 0; i < half; i++) {
        const double omega = 1.0 / pow(10000.0, (double)i / half);
        out[i] = (float)sin(pos * omega);
        out[half + i] = (float)cos(pos * omega);
    }
}

void loom_dit_positions(const loom_model_config *c, float *pos) {
    const int D = c->d_model, gh = c->height / c->patch, gw = c->width / c->patch;
    const int gf = c->frames / c->patch_t, video = gf > 1;
    const int Ds = video ? D / 4 * 3 : D; /* spatial channels */
    for (int f = 0; f < gf; f++)
        for (int i = 0; i < gh; i++)
            for (int j = 0; j < gw; j++) {
                float *e = pos + (size_t)((f * gh + i) * gw + j) * D;
                /* CogVideoX: [temporal | spatial]; DiT's meshgrid(grid_w, grid_h): the
                 * spatial part's first half encodes the column */
                if (video) sincos_1d(e, D - Ds, f);
                float *sp = video ? e + (D - Ds) : e;
                sincos_1d(sp, Ds / 2, j);
                sincos_1d(sp + Ds / 2, Ds / 2, i);
            }
}

/* ---- the arena ---- */

static void plan(loom_model *m, loom_carver *cv, int sequence_parallel) {
    const dims d = dims_of(m, sequence_parallel);
    loom_dit *s = m->dit;
    const size_t N = d.N, Ns = d.Ns, C = d.C, B = d.B, P = d.P, F = d.F;
    const int split = m->split_backward;
    const int h = loom_model_bf16_activations(m, Ns != N); /* model_impl.h */
    /* qkv, attention's output and the MLP's pre-activation kept in bf16, as the language
     * models keep them (model_impl.h: loom_model_keep_bf16_pre); under selective
     * recomputation layer 0's attention output serves every layer: fp32, rounded in place */
    const int hp = loom_model_keep_bf16_pre(m);
    s->patches = loom_carve(cv, N * P);
    s->target = loom_carve(cv, N * P);
    s->t = loom_carve(cv, B);
    s->labels = (int32_t *)loom_carve(cv, B); /* int32 and float are both 4 bytes */
    s->tfreq = loom_carve(cv, B * LOOM_DIT_FREQ_DIM);
    s->th = loom_carve(cv, B * C);
    s->tha = loom_carve(cv, B * C);
    s->c = loom_carve(cv, B * C);
    m->cond = loom_carve(cv, B * C);
    m->dcond = loom_carve(cv, B * C);
    s->dc = loom_carve(cv, B * C);
    s->dtha = loom_carve(cv, B * C);
    s->dth = loom_carve(cv, B * C);
    m->embed = loom_carve(cv, Ns * C);
    /* one block's activations per layer, or (recomputation) one set for all layers with
     * only each block's output kept per layer */
    loom_block_acts shared_acts;
    dit_block shared_blk;
    for (int l = 0; l < m->table.n_layer; l++) {
        loom_block_acts *a = &m->blocks[l];
        dit_block *b = &s->blk[l];
        if (!m->recompute || l == 0) {
            memset(a, 0, sizeof *a);
            memset(b, 0, sizeof *b);
            b->mod = loom_carve(cv, B * 6 * C);
            a->norm1 = loom_carve(cv, Ns * C);
            a->norm1_mean = loom_carve(cv, Ns);
            a->norm1_rstd = loom_carve(cv, Ns);
            loom_carve_kept(cv, h, Ns * C, &b->xm1, &b->xm1_bf16);
            loom_carve_kept(cv, hp, N * d.QKV, &a->qkv, &a->qkv_bf16);
            /* selective recomputation: layer 0's attention output, log-sum-exp and
             * activation serve every layer (recomputed before each block's backward) */
            const int sel = m->recompute_selective && !m->recompute && l > 0;
            if (sel)
                a->att = shared_acts.att, a->att_bf16 = NULL;
            else
                loom_carve_kept(cv, hp && !m->recompute_selective, N * d.A, &a->att, &a->att_bf16);
            a->lse = sel ? shared_acts.lse : loom_carve(cv, B * d.H * d.T);
            b->y1 = loom_carve(cv, Ns * C);
            a->res1 = loom_carve(cv, Ns * C);
            a->norm2 = loom_carve(cv, Ns * C);
            a->norm2_mean = loom_carve(cv, Ns);
            a->norm2_rstd = loom_carve(cv, Ns);
            loom_carve_kept(cv, h, Ns * C, &b->xm2, &b->xm2_bf16);
            loom_carve_kept(cv, hp, N * F, &a->fc, &a->fc_bf16);
            if (sel)
                a->act = shared_acts.act, a->act_bf16 = shared_acts.act_bf16;
            else
                loom_carve_kept(cv, h, N * F, &a->act, &a->act_bf16);
            b->y2 = loom_carve(cv, Ns * C);
            shared_acts = *a;
            shared_blk = *b;
        } else {
            *a = shared_acts;
            *b = shared_blk;
        }
        a->res2 = loom_carve(cv, Ns * C);
        /* split backward: what each linear's weight gradient needs, per layer */
        b->d_mod = split ? loom_carve(cv, B * 6 * C) : NULL;
        b->d_y1 = split ? loom_carve(cv, N * C) : NULL;
        b->d_y2 = split ? loom_carve(cv, N * C) : NULL;
        a->d_qkv = split ? loom_carve(cv, N * d.QKV) : NULL;
        a->d_fc = split ? loom_carve(cv, N * F) : NULL;
        a->d_res1 = a->d_res2 = NULL;
    }
    s->fmod = loom_carve(cv, B * 2 * C);
    s->dfmod = loom_carve(cv, B * 2 * C);
    s->fxn = loom_carve(cv, Ns * C);
    s->fmean = loom_carve(cv, Ns);
    s->frstd = loom_carve(cv, Ns);
    loom_carve_kept(cv, h, Ns * C, &s->fxm, &s->fxm_bf16);
    s->pred = loom_carve(cv, Ns * P);
    m->losses = loom_carve(cv, N);
    m->dres = loom_carve(cv, Ns * C);
    m->dnorm = loom_carve(cv, N * C);
    m->dqkv = loom_carve(cv, N * d.QKV);
    m->datt = loom_carve(cv, N * d.A);
    /* qkv and att kept in bf16: attention's backward reads them widened into dfc and dact
     * (the MLP's backward is done with both by then) */
    m->dfc = loom_carve(cv, N * (hp && (size_t)d.QKV > F ? (size_t)d.QKV : F));
    m->dact = loom_carve(cv, N * (hp && (size_t)d.A > F ? (size_t)d.A : F));
    s->dmod = loom_carve(cv, B * 6 * C);
    s->dyl = loom_carve(cv, Ns * C);
    s->dxn = loom_carve(cv, Ns * C);
    m->full = sequence_parallel && m->tp && m->tp->size > 1 ? loom_carve(cv, N * C) : NULL;
    m->att_scratch = loom_carve(cv, loom_model_attention_scratch_floats(m, d.H));
}

static size_t dit_plan_bytes(const loom_model *m, int sequence_parallel) {
    /* plan() writes pointers into the model and its DiT state: let it write into copies */
    loom_model copy = *m;
    loom_dit state = *m->dit;
    state.blk = calloc((size_t)m->cfg.n_layer, sizeof *state.blk);
    copy.dit = &state;
    size_t bytes = state.blk ? loom_model_arena_plan_bytes(&copy, plan, sequence_parallel) : 0;
    free(state.blk);
    return bytes;
}

/* ---- inputs ---- */

static void dit_load_batch(loom_model *m, const int32_t *batch, int first) {
    loom_dit *s = m->dit;
    const loom_model_config *c = &m->cfg;
    const int S = loom_model_dit_sample_floats(c), P = loom_model_dit_patch_floats(c);
    const int T = m->T_seq, words = LOOM_DIT_RECORD_HEAD + 2 * S; /* loom_model_record_words */
    float *xt = s->host_sample, *v = s->host_sample + S;
    for (int b = 0; b < m->B; b++) {
        const int32_t *rec = batch + (size_t)(first + b) * words;
        float t;
        memcpy(&t, &rec[1], sizeof t);
        s->host_labels[b] = rec[0];
        s->host_t[b] = t;
        const int32_t *x0 = rec + LOOM_DIT_RECORD_HEAD, *eps = x0 + S;
        for (int j = 0; j < S; j++) {
            float a, e;
            memcpy(&a, &x0[j], sizeof a);
            memcpy(&e, &eps[j], sizeof e);
            xt[j] = (1.0f - t) * a + t * e;
            v[j] = e - a;
        }
        loom_dit_patchify(c, xt, s->host_in + (size_t)b * T * P);
        patch_walk(c, v, s->host_out + (size_t)b * T * P, 1, 1);
    }
    /* this rank's tokens of every sample (context parallelism: one contiguous chunk) */
    int pos[2];
    loom_model_chunks(m, pos);
    const size_t row = (size_t)m->T * P, whole = (size_t)m->T_seq * P, off = (size_t)pos[0] * P;
    for (int b = 0; b < m->B; b++) {
        loom_backend_copy_to_device(m->be, s->patches + b * row, s->host_in + b * whole + off,
                                    row * sizeof(float));
        loom_backend_copy_to_device(m->be, s->target + b * row, s->host_out + b * whole + off,
                                    row * sizeof(float));
    }
    loom_backend_copy_to_device(m->be, s->t, s->host_t, (size_t)m->B * sizeof(float));
    loom_backend_copy_to_device(m->be, s->labels, s->host_labels, (size_t)m->B * sizeof(int32_t));
}

/* ---- forward ---- */

static loom_status dit_embed_forward(loom_model *m, const float *p) {
    const loom_dit_params *q = &m->table.dit;
    loom_dit *s = m->dit;
    const dims d = dims_here(m);
    const loom_backend *be = m->be;
    /* patch embedding of this rank's rows, plus the fixed positions */
    loom_backend_linear_forward(be, m->embed, s->patches + (size_t)d.row0 * d.P, p + q->x_embed_w,
                                p + q->x_embed_b, d.Ns, d.P, d.C);
    int pos[2];
    loom_model_chunks(m, pos); /* the positions of this rank's tokens */
    loom_backend_add_position(be, m->embed, s->pos + (size_t)pos[0] * d.C, d.Ns, d.C, d.T, d.row0);
    /* conditioning c = t-MLP(sinusoid(t)) + class embedding; blocks read silu(c) */
    const size_t BC = (size_t)d.B * d.C;
    loom_backend_timestep_embedding(be, s->tfreq, s->t, d.B, LOOM_DIT_FREQ_DIM);
    loom_backend_linear_forward(be, s->th, s->tfreq, p + q->t_fc1_w, p + q->t_fc1_b, d.B,
                                LOOM_DIT_FREQ_DIM, d.C);
    loom_backend_silu_forward(be, s->tha, s->th, BC);
    loom_backend_embedding_forward(be, s->c, s->labels, p + q->y_table, NULL, d.B, 1, d.C);
    loom_backend_linear_forward(be, s->dc, s->tha, p + q->t_fc2_w, p + q->t_fc2_b, d.B, d.C, d.C);
    loom_backend_add(be, s->c, s->c, s->dc, BC);
    loom_backend_silu_forward(be, m->cond, s->c, BC);
    return LOOM_OK;
}

/* GELU of a->fc (or of its bf16 copy) into a->act, or kept in bf16: through dact (free
 * until backward) rounded into a->act_bf16. */
static void mlp_activation(loom_model *m, const dims *d, loom_block_acts *a) {
    float *act = a->act ? a->act : m->dact;
    loom_model_gelu_forward_kept(m->be, act, a->fc, a->fc_bf16, (size_t)d->N * d->F);
    loom_model_keep_bf16(m, a->act_bf16, act, (size_t)d->N * d->F);
}

/* Selective recomputation: block l's attention output and log-sum-exp from its kept qkv
 * and its activation from its kept fc, into the buffers all layers share. */
static loom_status block_recompute_selective(loom_model *m, const dims *d, int l) {
    loom_block_acts *a = &m->blocks[l];
    loom_trace_begin(m->trace, "block", "recompute");
    /* kept in bf16: widened into dqkv (free until the block's attention backward) */
    const float *qkv =
        loom_model_widen_kept(m, a->qkv, a->qkv_bf16, m->dqkv, (size_t)d->N * d->QKV);
    loom_status st = loom_model_attention_forward(m, a->att, a->lse, qkv, d->H, d->H, d->hd, 0);
    if (!st) loom_model_round_pre(m, NULL, a->att, (size_t)d->N * d->A, 0); /* as forward's */
    if (!st) mlp_activation(m, d, a);
    loom_trace_end(m->trace);
    return st;
}

/* Block l (local index) from input x; output m->blocks[l].res2. */
static loom_status block_forward_body(loom_model *m, const dims *d, const float *p, int l,
                                      const float *x, int recomputing) {
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    dit_block *b = &m->dit->blk[l];
    const loom_backend *be = m->be;
    const int B = d->B, T = d->T, N = d->N, Ns = d->Ns, C = d->C, ld = 6 * C, r0 = d->row0;
    const float eps = m->cfg.norm_eps;
    loom_act in;
    loom_trace_begin(m->trace, "block", recomputing ? "recompute" : "forward");
    loom_backend_linear_forward(be, b->mod, m->cond, p + k->ada_w, p + k->ada_b, B, C, ld);
    const float *mod = b->mod;
    loom_backend_layernorm_plain_forward(be, a->norm1, a->norm1_mean, a->norm1_rstd, x, Ns, C, eps);
    /* a modulated norm kept in bf16 passes through dnorm (free until backward) */
    float *xm1 = b->xm1 ? b->xm1 : m->dnorm, *xm2 = b->xm2 ? b->xm2 : m->dnorm;
    loom_backend_modulate_forward(be, xm1, a->norm1, mod, mod + C, ld, Ns, C, T, r0);
    loom_model_keep_bf16(m, b->xm1_bf16, xm1, (size_t)Ns * C);
    loom_status st = loom_model_tp_gather_act(m, loom_act_of(b->xm1, b->xm1_bf16), &in);
    if (!st) { /* qkv and att kept in bf16: through dqkv and datt (free until backward) */
        float *qkv = a->qkv ? a->qkv : m->dqkv, *att = a->att ? a->att : m->datt;
        loom_model_linear_forward(m, qkv, in, p + k->qkv_w, p + k->qkv_b, N, C, d->QKV);
        loom_model_round_pre(m, a->qkv_bf16, qkv, (size_t)N * d->QKV, 1);
        st = loom_model_attention_forward(m, att, a->lse, qkv, d->H, d->H, d->hd, 0);
        if (!st) loom_model_round_pre(m, a->att_bf16, att, (size_t)N * d->A, 0);
    }
    if (!st) {
        st = loom_model_row_forward(m, b->y1, loom_act_of(a->att, a->att_bf16), p + k->attn_out_w,
                                    p + k->attn_out_b, d->A);
    }
    if (!st) {
        loom_backend_gate_add_forward(be, a->res1, x, b->y1, mod + 2 * C, ld, Ns, C, T, r0);
        loom_backend_layernorm_plain_forward(be, a->norm2, a->norm2_mean, a->norm2_rstd, a->res1,
                                             Ns, C, eps);
        loom_backend_modulate_forward(be, xm2, a->norm2, mod + 3 * C, mod + 4 * C, ld, Ns, C, T,
                                      r0);
        loom_model_keep_bf16(m, b->xm2_bf16, xm2, (size_t)Ns * C);
        st = loom_model_tp_gather_act(m, loom_act_of(b->xm2, b->xm2_bf16), &in);
    }
    if (!st) { /* fc kept in bf16: through dfc (free until backward) */
        float *fc = a->fc ? a->fc : m->dfc;
        loom_model_linear_forward(m, fc, in, p + k->fc_w, p + k->fc_b, N, C, d->F);
        loom_model_round_pre(m, a->fc_bf16, fc, (size_t)N * d->F, 0);
        mlp_activation(m, d, a);
        st = loom_model_row_forward(m, b->y2, loom_act_of(a->act, a->act_bf16), p + k->proj_w,
                                    p + k->proj_b, d->F);
    }
    if (!st)
        loom_backend_gate_add_forward(be, a->res2, a->res1, b->y2, mod + 5 * C, ld, Ns, C, T, r0);
    loom_trace_end(m->trace);
    return st;
}

static loom_status dit_block_forward(loom_model *m, const float *p, int l, const float *x) {
    const dims d = dims_here(m);
    loom_status st = loom_model_hook(m, 0, l, 0);
    if (!st) st = block_forward_body(m, &d, p, l, x, 0);
    return st ? st : loom_model_hook(m, 1, l, 0);
}

static loom_status dit_head_forward(loom_model *m, const float *p, const float *x) {
    const loom_dit_params *q = &m->table.dit;
    loom_dit *s = m->dit;
    const dims d = dims_here(m);
    const loom_backend *be = m->be;
    const int C = d.C;
    loom_backend_linear_forward(be, s->fmod, m->cond, p + q->final_ada_w, p + q->final_ada_b, d.B,
                                C, 2 * C);
    loom_backend_layernorm_plain_forward(be, s->fxn, s->fmean, s->frstd, x, d.Ns, C,
                                         m->cfg.norm_eps);
    float *fxm = s->fxm ? s->fxm : m->dnorm; /* kept in bf16: through dnorm */
    loom_backend_modulate_forward(be, fxm, s->fxn, s->fmod, s->fmod + C, 2 * C, d.Ns, C, d.T,
                                  d.row0);
    loom_model_keep_bf16(m, s->fxm_bf16, fxm, (size_t)d.Ns * C);
    loom_model_linear_forward(m, s->pred, loom_act_of(s->fxm, s->fxm_bf16), p + q->final_w,
                              p + q->final_b, d.Ns, C, d.P);
    return LOOM_OK;
}

/* Mean squared error of this rank's rows; with sequence parallelism the sum over tp. */
static loom_status dit_loss_sum(loom_model *m, float dloss, int backward, double *sum) {
    loom_dit *s = m->dit;
    const dims d = dims_here(m);
    const float *target = s->target + (size_t)d.row0 * d.P;
    if (backward)
        loom_backend_mse_forward_backward(m->be, m->losses, s->pred, target, d.Ns, d.P, dloss);
    else
        loom_backend_mse_forward(m->be, m->losses, s->pred, target, d.Ns, d.P);
    loom_backend_copy_to_host(m->be, m->losses_host, m->losses, (size_t)d.Ns * sizeof(float));
    double total = 0.0;
    for (int i = 0; i < d.Ns; i++) total += m->losses_host[i];
    *sum = total;
    if (!loom_model_seq_parallel(m)) return LOOM_OK;
    return loom_comm_allreduce_sum_f64(m->tp->comm, sum, 1, m->tp->err);
}

/* ---- backward ---- */

static loom_status dit_head_backward(loom_model *m, const float *p, float *g, const float *x) {
    const loom_dit_params *q = &m->table.dit;
    loom_dit *s = m->dit;
    const dims d = dims_here(m);
    const loom_backend *be = m->be;
    const int C = d.C, Ns = d.Ns, B = d.B;
    const size_t rows = (size_t)Ns * C * sizeof(float);
    /* the conditioning's gradient starts here and gathers every block's on the way down */
    const int split = m->split_backward;
    loom_backend_memset(be, m->dcond, 0, (size_t)B * C * sizeof(float));
    loom_linear_backward_act(be, s->dyl, LOOM_DX_SET, s->pred, p + q->final_w,
                             split ? NULL : g + q->final_w, g + q->final_b,
                             loom_act_of(s->fxm, s->fxm_bf16), Ns, C, d.P);
    loom_backend_memset(be, s->dfmod, 0, (size_t)B * 2 * C * sizeof(float));
    loom_backend_memset(be, s->dxn, 0, rows);
    loom_backend_modulate_backward(be, s->dxn, s->dfmod, s->dfmod + C, s->dyl, s->fxn, s->fmod + C,
                                   2 * C, Ns, C, d.T, d.row0);
    loom_backend_memset(be, m->dres, 0, rows);
    loom_backend_layernorm_plain_backward(be, m->dres, s->dxn, x, s->fmean, s->frstd, Ns, C);
    loom_linear_backward(be, m->dcond, LOOM_DX_ADD, s->dfmod, p + q->final_ada_w,
                         split ? NULL : g + q->final_ada_w, g + q->final_ada_b, m->cond, B, C,
                         2 * C);
    return LOOM_OK;
}

static loom_status dit_head_backward_weight(loom_model *m, float *g) {
    const loom_dit_params *q = &m->table.dit;
    loom_dit *s = m->dit;
    const dims d = dims_here(m);
    loom_linear_backward_act(m->be, NULL, LOOM_DX_SET, s->pred, NULL, g + q->final_w,
                             g + q->final_b, loom_act_of(s->fxm, s->fxm_bf16), d.Ns, d.C, d.P);
    loom_linear_backward(m->be, NULL, LOOM_DX_SET, s->dfmod, NULL, g + q->final_ada_w,
                         g + q->final_ada_b, m->cond, d.B, d.C, 2 * d.C);
    return LOOM_OK;
}

/* One residual branch backward: m->dres = d(out) with out = res + gate * y; y came from
 * a row-parallel linear (w, bias) over `inner` [N, IC]. On return dinner = d(inner) has
 * the linear's input gradient; the weight gradient unless split, which keeps d(y)
 * gathered in keep (loom_model_row_backward). */
static loom_status gated_row_backward(loom_model *m, const dims *d, const float *p, float *g,
                                      const float *y, const float *gate, float *dgate, size_t w_off,
                                      size_t b_off, loom_act inner, int IC, float *dinner,
                                      float *keep) {
    const loom_backend *be = m->be;
    loom_dit *s = m->dit;
    const int C = d->C;
    loom_backend_memset(be, s->dyl, 0, (size_t)d->Ns * C * sizeof(float));
    loom_backend_gate_add_backward(be, s->dyl, dgate, m->dres, y, gate, 6 * C, d->Ns, C, d->T,
                                   d->row0);
    return loom_model_row_backward(m, s->dyl, p + w_off, g + w_off, g + b_off, inner, IC, dinner,
                                   keep);
}

/* d(modulated norm input) dn -> d(norm), d(shift), d(scale); then m->dres += the norm's
 * input gradient. */
static void modulated_norm_backward(loom_model *m, const dims *d, const float *dn, const float *xn,
                                    const float *x, const float *mean, const float *rstd,
                                    const float *scale, float *dshift, float *dscale) {
    loom_dit *s = m->dit;
    const size_t rows = (size_t)d->Ns * d->C * sizeof(float);
    loom_backend_memset(m->be, s->dxn, 0, rows);
    loom_backend_modulate_backward(m->be, s->dxn, dshift, dscale, dn, xn, scale, 6 * d->C, d->Ns,
                                   d->C, d->T, d->row0);
    loom_backend_layernorm_plain_backward(m->be, m->dres, s->dxn, x, mean, rstd, d->Ns, d->C);
}

/* Block l backward: m->dres = d(output) -> d(input x); m->dcond += the block's part. */
static loom_status block_backward(loom_model *m, const dims *d, const float *p, float *g, int l,
                                  const float *x) {
    const loom_block_params *k = &m->table.blocks[l];
    loom_block_acts *a = &m->blocks[l];
    dit_block *b = &m->dit->blk[l];
    const loom_backend *be = m->be;
    const int split = m->split_backward, C = d->C, B = d->B;
    float *dmod = split ? b->d_mod : m->dit->dmod;
    float *dfc = split ? a->d_fc : m->dfc, *dqkv = split ? a->d_qkv : m->dqkv;
    const float *mod = b->mod, *dn;
    loom_status st = loom_model_hook(m, 0, l, 1);
    if (!st && m->recompute) st = block_forward_body(m, d, p, l, x, 1);
    if (!st && m->recompute_selective) st = block_recompute_selective(m, d, l);
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward");
    loom_backend_memset(be, dmod, 0, (size_t)B * 6 * C * sizeof(float));
    /* MLP branch: res2 = res1 + gate_mlp * fc2(gelu(fc1(xm2))) */
    st =
        gated_row_backward(m, d, p, g, b->y2, mod + 5 * C, dmod + 5 * C, k->proj_w, k->proj_b,
                           loom_act_of(a->act, a->act_bf16), d->F, m->dact, split ? b->d_y2 : NULL);
    if (!st) {
        loom_backend_memset(be, dfc, 0, (size_t)d->N * d->F * sizeof(float));
        loom_model_gelu_backward_kept(be, dfc, a->fc, a->fc_bf16, m->dact, (size_t)d->N * d->F);
        st = loom_model_column_backward(m, dfc, p + k->fc_w, g + k->fc_w, g + k->fc_b,
                                        loom_act_of(b->xm2, b->xm2_bf16), d->F, &dn);
    }
    if (!st) {
        modulated_norm_backward(m, d, dn, a->norm2, a->res1, a->norm2_mean, a->norm2_rstd,
                                mod + 4 * C, dmod + 3 * C, dmod + 4 * C);
        /* attention branch: res1 = x + gate_msa * proj(attention(qkv(xm1))) */
        st = gated_row_backward(m, d, p, g, b->y1, mod + 2 * C, dmod + 2 * C, k->attn_out_w,
                                k->attn_out_b, loom_act_of(a->att, a->att_bf16), d->A, m->datt,
                                split ? b->d_y1 : NULL);
    }
    if (!st) { /* kept in bf16: qkv widened into m->dfc, att into m->dact (both free now) */
        const float *qkv =
            loom_model_widen_kept(m, a->qkv, a->qkv_bf16, m->dfc, (size_t)d->N * d->QKV);
        const float *att =
            loom_model_widen_kept(m, a->att, a->att_bf16, m->dact, (size_t)d->N * d->A);
        loom_backend_memset(be, dqkv, 0, (size_t)d->N * d->QKV * sizeof(float));
        st =
            loom_model_attention_backward(m, dqkv, m->datt, qkv, att, a->lse, d->H, d->H, d->hd, 0);
    }
    if (!st) {
        st = loom_model_column_backward(m, dqkv, p + k->qkv_w, g + k->qkv_w, g + k->qkv_b,
                                        loom_act_of(b->xm1, b->xm1_bf16), d->QKV, &dn);
    }
    if (!st) {
        modulated_norm_backward(m, d, dn, a->norm1, x, a->norm1_mean, a->norm1_rstd, mod + C, dmod,
                                dmod + C);
        /* the modulation: mod = adaLN(silu(c)) */
        loom_linear_backward(be, m->dcond, LOOM_DX_ADD, dmod, p + k->ada_w,
                             split ? NULL : g + k->ada_w, g + k->ada_b, m->cond, B, C, 6 * C);
    }
    loom_trace_end(m->trace);
    return st ? st : loom_model_hook(m, 1, l, 1);
}

/* W of block l under split backward: every weight gradient from what B kept. */
static loom_status block_backward_weight(loom_model *m, const dims *d, const float *p, float *g,
                                         int l, const float *x) {
    const loom_block_params *k = &m->table.blocks[l];
    const loom_block_acts *a = &m->blocks[l];
    const dit_block *b = &m->dit->blk[l];
    const int C = d->C;
    loom_status st = m->recompute ? block_forward_body(m, d, p, l, x, 1) : LOOM_OK;
    if (!st && m->recompute_selective) st = block_recompute_selective(m, d, l);
    if (st) return st;
    loom_trace_begin(m->trace, "block", "backward-weight");
    st = loom_model_branch_weight(m, g, k->proj_w, k->proj_b, b->d_y2,
                                  loom_act_of(a->act, a->act_bf16), d->F, k->fc_w, k->fc_b, a->d_fc,
                                  loom_act_of(b->xm2, b->xm2_bf16), d->F);
    if (!st)
        st = loom_model_branch_weight(m, g, k->attn_out_w, k->attn_out_b, b->d_y1,
                                      loom_act_of(a->att, a->att_bf16), d->A, k->qkv_w, k->qkv_b,
                                      a->d_qkv, loom_act_of(b->xm1, b->xm1_bf16), d->QKV);
    if (!st)
        loom_linear_backward(m->be, NULL, LOOM_DX_SET, b->d_mod, NULL, g + k->ada_w, g + k->ada_b,
                             m->cond, d->B, C, 6 * C);
    loom_trace_end(m->trace);
    return st;
}

static loom_status dit_block_backward(loom_model *m, const float *p, float *g, int l,
                                      const float *x) {
    const dims d = dims_here(m);
    return block_backward(m, &d, p, g, l, x);
}

static loom_status dit_block_backward_weight(loom_model *m, const float *p, float *g, int l,
                                             const float *x) {
    const dims d = dims_here(m);
    return block_backward_weight(m, &d, p, g, l, x);
}

/* m->dres = d(embed), m->dcond = d(silu(c)) -> the embedders' gradients. */
static loom_status dit_embed_backward(loom_model *m, const float *p, float *g) {
    const loom_dit_params *q = &m->table.dit;
    loom_dit *s = m->dit;
    const dims d = dims_here(m);
    const loom_backend *be = m->be;
    const size_t BC = (size_t)d.B * d.C;
    loom_linear_backward(be, NULL, LOOM_DX_SET, m->dres, NULL, g + q->x_embed_w, g + q->x_embed_b,
                         s->patches + (size_t)d.row0 * d.P, d.Ns, d.P, d.C);
    loom_backend_memset(be, s->dc, 0, BC * sizeof(float));
    loom_backend_silu_backward(be, s->dc, s->c, m->dcond, BC);
    loom_backend_embedding_backward(be, g + q->y_table, NULL, s->dc, s->labels, d.B, 1, d.C);
    loom_linear_backward(be, s->dtha, LOOM_DX_SET, s->dc, p + q->t_fc2_w, g + q->t_fc2_w,
                         g + q->t_fc2_b, s->tha, d.B, d.C, d.C);
    loom_backend_memset(be, s->dth, 0, BC * sizeof(float));
    loom_backend_silu_backward(be, s->dth, s->th, s->dtha, BC);
    loom_linear_backward(be, NULL, LOOM_DX_SET, s->dth, NULL, g + q->t_fc1_w, g + q->t_fc1_b,
                         s->tfreq, d.B, LOOM_DIT_FREQ_DIM, d.C);
    return LOOM_OK;
}

static const loom_model_ops dit_ops = {
    .plan = plan,
    .plan_bytes = dit_plan_bytes,
    .load_batch = dit_load_batch,
    .embed_forward = dit_embed_forward,
    .block_forward = dit_block_forward,
    .head_forward = dit_head_forward,
    .loss_sum = dit_loss_sum,
    .head_backward = dit_head_backward,
    .block_backward = dit_block_backward,
    .block_backward_weight = dit_block_backward_weight,
    .head_backward_weight = dit_head_backward_weight,
    .embed_backward = dit_embed_backward,
};

/* ---- set-up ---- */

loom_status loom_dit_attach(loom_model *m, loom_error *err) {
    const loom_model_config *c = &m->cfg;
    const size_t N = (size_t)m->B * m->T, P = (size_t)loom_model_dit_patch_floats(c);
    const size_t S = (size_t)loom_model_dit_sample_floats(c), NW = (size_t)m->B * m->T_seq;
    if (m->tp && m->tp->size > 1 && m->tp->sequence_parallel && N % (size_t)m->tp->size != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--sequence-parallel: %zu tokens per micro-batch do not split over "
                              "--tp %d",
                              N, m->tp->size);
    loom_dit *s = calloc(1, sizeof *s);
    if (!s) return loom_error_set(err, LOOM_ERR_NOMEM, "dit: out of memory");
    m->dit = s;
    m->ops = &dit_ops;
    m->cond_floats = (size_t)m->B * c->d_model;
    s->blk = calloc((size_t)c->n_layer, sizeof *s->blk);
    s->host_in = malloc(NW * P * sizeof(float)); /* whole samples (cp: this rank's part) */
    s->host_out = malloc(NW * P * sizeof(float));
    s->host_sample = malloc(2 * S * sizeof(float));
    s->host_t = malloc((size_t)m->B * sizeof(float));
    s->host_labels = malloc((size_t)m->B * sizeof(int32_t));
    const size_t TC = (size_t)m->T_seq * c->d_model;
    float *pos = malloc(TC * sizeof(float));
    s->pos = loom_backend_alloc(m->be, TC * sizeof(float));
    if (!s->blk || !s->host_in || !s->host_out || !s->host_sample || !s->host_t ||
        !s->host_labels || !pos || !s->pos) {
        free(pos);
        return loom_error_set(err, LOOM_ERR_NOMEM, "dit: out of memory");
    }
    loom_dit_positions(c, pos);
    loom_backend_copy_to_device(m->be, s->pos, pos, TC * sizeof(float));
    free(pos);
    return loom_model_arena_allocate(m, plan, err);
}

void loom_dit_detach(loom_model *m) {
    loom_dit *s = m->dit;
    if (!s) return;
    if (m->be) loom_backend_free(m->be, s->pos);
    free(s->blk);
    free(s->host_in);
    free(s->host_out);
    free(s->host_sample);
    free(s->host_t);
    free(s->host_labels);
    free(s);
    m->dit = NULL;
}

/* ---- sampling and dumps ---- */

void loom_dit_prediction(const loom_model *m, float *out) {
    loom_dit *s = m->dit;
    const loom_model_config *c = &m->cfg;
    const size_t TP = (size_t)m->T * loom_model_dit_patch_floats(c);
    const size_t S = (size_t)loom_model_dit_sample_floats(c);
    loom_backend_copy_to_host(m->be, s->host_out, s->pred, (size_t)m->B * TP * sizeof(float));
    for (int b = 0; b < m->B; b++) loom_dit_unpatchify(c, s->host_out + b * TP, out + b * S);
}

loom_status loom_dit_velocity_inputs(loom_model *m, const float *x, const float *t,
                                     const int32_t *labels, loom_error *err) {
    loom_dit *s = m->dit;
    const loom_model_config *c = &m->cfg;
    if (!s || loom_model_seq_parallel(m) || loom_model_cp_on(m))
        return loom_error_set(err, LOOM_ERR_STATE, "dit velocity: needs a whole dit model");
    const size_t TP = (size_t)m->T * loom_model_dit_patch_floats(c);
    const size_t S = (size_t)loom_model_dit_sample_floats(c);
    for (int b = 0; b < m->B; b++) {
        if (labels[b] < 0 || labels[b] > c->n_classes)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "class %d: expected 0..%d (%d: unconditional)", labels[b],
                                  c->n_classes, c->n_classes);
        loom_dit_patchify(c, x + b * S, s->host_in + b * TP);
    }
    loom_backend_copy_to_device(m->be, s->patches, s->host_in, (size_t)m->B * TP * sizeof(float));
    loom_backend_copy_to_device(m->be, s->t, t, (size_t)m->B * sizeof(float));
    loom_backend_copy_to_device(m->be, s->labels, labels, (size_t)m->B * sizeof(int32_t));
    return LOOM_OK;
}
