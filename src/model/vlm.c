/* The multimodal LLM's forward and backward (model/vlm.h): the language models' family
 * table (transformer.c) with the batch, the embedding (encoder, projector and the image
 * rows) and the masked loss replaced. */
#include "model/vlm.h"

#include <stdlib.h>
#include <string.h>

#include "data/vlm_shard.h"
#include "kernels/backend_bf16.h"
#include "model/dit.h"
#include "model/model_impl.h"
#include "model/vlm_pieces.h"

/* One encoder block's activations. --precision bf16 (docs/precision.md): the norms' outputs
 * and the activation (only GEMMs read them) and qkv, attention's output and the MLP's
 * pre-activation (rounded, as the language models' blocks round them) are kept in bf16:
 * the *16 pointer set, the fp32 one NULL. */
typedef struct {
    float *ln1, *mean1, *rstd1, *qkv, *att, *lse, *x1, *ln2, *mean2, *rstd2, *fc, *act, *x2;
    loom_bf16 *ln1_16, *qkv16, *att16, *ln2_16, *fc16, *act16;
} vit_acts;

struct loom_vlm {
    loom_model_ops ops;       /* the language models' table with the vlm's pieces */
    const loom_model_ops *lm; /* transformer.c's */
    int NI, P, Pin, S, Dv, Hv, Fv, C;
    int n_img;                  /* images of the loaded micro-batch with rows on this rank */
    int *img_b, *img_g0;        /* [NI] image j's sample and its first slot's position */
    float *host_patches;        /* [NI * P, Pin] */
    float *host_w;              /* [N] loss weights of the loaded micro-batch */
    float *sample_w;            /* [B] the answer weight of each sample (0: none) */
    int32_t *host_in, *host_tg; /* [N] */
    float *pos;                 /* [P, Dv] backend memory, outside the arena */
    int encoder;                /* 1 on the first stage (the encoder and projector are here) */
    int frozen;                 /* loom_vlm_part bits: no gradients computed for those parts */
    const float *remote_emb;    /* --vision-schedule bubbles: this micro-batch's image rows */
    float *remote_demb;         /* ... and where their gradient goes (NULL: encoder here) */
    /* arena */
    float *patches, *x0; /* [R, Pin], [R, Dv] */
    vit_acts *blk;       /* vit_layers */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *h1, *a1, *out;     /* projector [R, C] */
    loom_bf16 *lnf16, *a1_16; /* bf16: lnf and a1 (only GEMMs read them) kept so */
    float *dx, *dln, *dqkv, *datt, *dfc, *dact, *dh, *da, *scratch;
};

int loom_vlm_image_tokens(const loom_model_config *c) {
    return c->patch > 0 ? (c->height / c->patch) * (c->width / c->patch) : 0;
}

int loom_vlm_image_floats(const loom_model_config *c) {
    return c->channels * c->height * c->width;
}

int loom_vlm_record_words(const loom_model_config *c) {
    const loom_vlm_record_shape r = {
        c->seq_len, loom_vlm_image_tokens(c), c->max_images, c->channels, c->height, c->width};
    return loom_vlm_record_size(&r);
}

double loom_vlm_image_flops(const loom_model_config *c) {
    const double P = loom_vlm_image_tokens(c), Dv = c->vit_d_model, Fv = c->vit_d_ff;
    const double C = c->d_model, Pin = (double)c->channels * c->patch * c->patch;
    const double block = 2.0 * (4.0 * Dv * Dv + 2.0 * Dv * Fv) + 4.0 * P * Dv;
    const double per_token = 2.0 * Pin * Dv + c->vit_layers * block + 2.0 * (Dv * C + C * C);
    return 3.0 * P * per_token;
}

double loom_vlm_record_flops(const loom_model_config *c) {
    const double T = c->seq_len, C = c->d_model, F = c->d_ff, V = c->vocab_size;
    const double hd = (double)c->d_model / c->n_head, H = c->n_head, KV = c->n_kv_head;
    const double block = 2.0 * (C * (H + 2.0 * KV) * hd + H * hd * C + 3.0 * C * F) + 2.0 * T * C;
    return 3.0 * T * (c->n_layer * block + 2.0 * C * V);
}

/* ---- the arena: the decoder's, then the encoder's for B * max_images images ---- */

static void plan(loom_model *m, loom_carver *cv, int sequence_parallel) {
    loom_vlm *v = m->vlm;
    v->lm->plan(m, cv, sequence_parallel);
    if (!v->encoder) return;
    const size_t R = (size_t)v->NI * v->P, Dv = v->Dv, Fv = v->Fv, C = v->C;
    /* bf16 (vit_acts): the encoder is whole on every rank, never split by sp */
    const int h = loom_model_bf16_activations(m, 0), hp = loom_model_keep_bf16_pre(m);
    v->patches = loom_carve(cv, R * v->Pin);
    v->x0 = loom_carve(cv, R * Dv);
    for (int l = 0; l < m->cfg.vit_layers; l++) {
        vit_acts *a = &v->blk[l];
        loom_carve_kept(cv, h, R * Dv, &a->ln1, &a->ln1_16);
        a->mean1 = loom_carve(cv, R);
        a->rstd1 = loom_carve(cv, R);
        loom_carve_kept(cv, hp, R * 3 * Dv, &a->qkv, &a->qkv16);
        loom_carve_kept(cv, hp, R * Dv, &a->att, &a->att16);
        a->lse = loom_carve(cv, (size_t)v->NI * v->Hv * v->P);
        a->x1 = loom_carve(cv, R * Dv);
        loom_carve_kept(cv, h, R * Dv, &a->ln2, &a->ln2_16);
        a->mean2 = loom_carve(cv, R);
        a->rstd2 = loom_carve(cv, R);
        loom_carve_kept(cv, hp, R * Fv, &a->fc, &a->fc16);
        loom_carve_kept(cv, h, R * Fv, &a->act, &a->act16);
        a->x2 = loom_carve(cv, R * Dv);
    }
    loom_carve_kept(cv, h, R * Dv, &v->lnf, &v->lnf16);
    v->lnf_mean = loom_carve(cv, R);
    v->lnf_rstd = loom_carve(cv, R);
    v->h1 = loom_carve(cv, R * C);
    loom_carve_kept(cv, h, R * C, &v->a1, &v->a1_16);
    v->out = loom_carve(cv, R * C);
    v->dx = loom_carve(cv, R * Dv);
    v->dln = loom_carve(cv, R * Dv);
    v->dqkv = loom_carve(cv, R * 3 * Dv);
    v->datt = loom_carve(cv, R * Dv);
    /* forward: the fp32 values of what is kept in bf16 pass through the backward's scratch
     * (free then); backward: attention reads qkv and att widened into dfc and dact (the
     * MLP's backward is done with both) */
    v->dfc = loom_carve(cv, R * (hp && 3 * Dv > Fv ? 3 * Dv : Fv));
    v->dact = loom_carve(cv, R * (hp && Dv > Fv ? Dv : Fv));
    v->dh = loom_carve(cv, R * C);
    v->da = loom_carve(cv, R * C);
    v->scratch = loom_carve(cv, loom_backend_attention_scratch_floats(m->be, v->NI, v->P, v->Hv));
}

static size_t vlm_plan_bytes(const loom_model *m, int sequence_parallel) {
    /* plan() writes pointers into the model and its state: let it write into copies */
    loom_model copy = *m;
    loom_vlm state = *m->vlm;
    state.blk = calloc((size_t)m->cfg.vit_layers + 1, sizeof *state.blk);
    copy.vlm = &state;
    loom_block_acts *blocks = calloc((size_t)m->cfg.n_layer + 1, sizeof *blocks);
    copy.blocks = blocks;
    size_t bytes =
        state.blk && blocks ? loom_model_arena_plan_bytes(&copy, plan, sequence_parallel) : 0;
    free(state.blk);
    free(blocks);
    return bytes;
}

/* ---- the batch ---- */

/* Image j's rows on this rank (context parallelism: a rank holds chunks of every sample,
 * rows [chunk][sample][token], model/context.c): up to two runs of local rows, each
 * (first local row, first row of the image, rows). Returns the number of runs. */
static int image_runs(const loom_model *m, int j, int runs[2][3]) {
    const loom_vlm *v = m->vlm;
    int pos[2];
    const int n = loom_model_chunks(m, pos), L = m->T / n;
    const int g0 = v->img_g0[j], b = v->img_b[j];
    int k = 0;
    for (int c = 0; c < n; c++) {
        const int a = g0 > pos[c] ? g0 : pos[c];
        const int e = g0 + v->P < pos[c] + L ? g0 + v->P : pos[c] + L;
        if (a >= e) continue;
        runs[k][0] = (c * m->B + b) * L + (a - pos[c]);
        runs[k][1] = a - g0;
        runs[k][2] = e - a;
        k++;
    }
    return k;
}

static void vlm_load_batch(loom_model *m, const int32_t *batch, int first) {
    loom_vlm *v = m->vlm;
    const loom_model_config *c = &m->cfg;
    const int T = m->T_seq, words = loom_vlm_record_words(c);
    int pos[2];
    const int n_chunks = loom_model_chunks(m, pos), L = m->T / n_chunks;
    v->n_img = 0;
    for (int b = 0; b < m->B; b++) {
        const int32_t *rec = batch + (size_t)(first + b) * words;
        const float *w = (const float *)(rec + T + 1); /* float bits, 4 bytes each */
        float sw = 0.0f;
        for (int ch = 0; ch < n_chunks; ch++)
            for (int t = 0; t < L; t++) {
                const int g = pos[ch] + t;
                const size_t i = ((size_t)ch * m->B + b) * L + t;
                v->host_in[i] = rec[g] < 0 ? 0 : rec[g];
                v->host_tg[i] = rec[g + 1] < 0 ? 0 : rec[g + 1];
                memcpy(&v->host_w[i], &w[g], sizeof(float));
            }
        for (int t = 0; t < T && sw == 0.0f; t++) memcpy(&sw, &w[t], sizeof(float));
        v->sample_w[b] = sw;
        const int n = rec[2 * T + 1];
        const float *px = (const float *)(rec + 2 * T + 2);
        /* image k of the sample: its k-th group of P slots (groups may touch); the
         * encoder runs on the images with rows here */
        int k = 0;
        for (int t = 0; t < T && k < n; t++) {
            if (rec[t] != LOOM_VLM_SLOT) continue;
            v->img_b[v->n_img] = b;
            v->img_g0[v->n_img] = t;
            int runs[2][3];
            if (image_runs(m, v->n_img, runs) > 0) {
                if (v->encoder)
                    loom_dit_patchify(c, px + (size_t)k * v->S,
                                      v->host_patches + (size_t)v->n_img * v->P * v->Pin);
                v->n_img++;
            }
            k++;
            t += v->P - 1;
        }
    }
    const size_t N = (size_t)m->B * m->T;
    loom_backend_copy_to_device(m->be, m->inputs, v->host_in, N * sizeof(int32_t));
    loom_backend_copy_to_device(m->be, m->targets, v->host_tg, N * sizeof(int32_t));
    if (v->encoder && v->n_img > 0)
        loom_backend_copy_to_device(m->be, v->patches, v->host_patches,
                                    (size_t)v->n_img * v->P * v->Pin * sizeof(float));
}

/* ---- the encoder and projector ---- */

/* This rank's residual rows [row0, row0 + Ns) (sequence parallelism: its slice). */
static int stream_row0(const loom_model *m) {
    return loom_model_seq_parallel(m) ? m->tp->rank * m->Ns : 0;
}

static void encoder_forward(loom_model *m, const float *p) {
    loom_vlm *v = m->vlm;
    const loom_vlm_params *q = &m->table.vlm;
    const loom_backend *be = m->be;
    const int R = v->n_img * v->P, Dv = v->Dv, Fv = v->Fv, C = v->C, hd = Dv / v->Hv;
    const float eps = m->cfg.norm_eps;
    loom_trace_begin(m->trace, "vision", "forward");
    loom_backend_linear_forward(be, v->x0, v->patches, p + q->patch_w, p + q->patch_b, R, v->Pin,
                                Dv);
    loom_backend_add_position(be, v->x0, v->pos, R, Dv, v->P, 0);
    const float *x = v->x0;
    for (int l = 0; l < q->n_layer; l++) {
        const loom_block_params *k = &q->blocks[l];
        vit_acts *a = &v->blk[l];
        /* what is kept in bf16 passes through the backward's scratch (free in forward) */
        float *ln1 = a->ln1 ? a->ln1 : v->dln, *qkv = a->qkv ? a->qkv : v->dqkv;
        float *att = a->att ? a->att : v->datt, *ln2 = a->ln2 ? a->ln2 : v->dln;
        float *fc = a->fc ? a->fc : v->dfc, *act = a->act ? a->act : v->dact;
        loom_backend_layernorm_forward(be, ln1, a->mean1, a->rstd1, x, p + k->norm1_w,
                                       p + k->norm1_b, R, Dv, eps);
        loom_model_keep_bf16(m, a->ln1_16, ln1, (size_t)R * Dv);
        loom_model_linear_forward(m, qkv, loom_act_of(a->ln1, a->ln1_16), p + k->qkv_w,
                                  p + k->qkv_b, R, Dv, 3 * Dv);
        loom_model_round_pre(m, a->qkv16, qkv, (size_t)R * 3 * Dv, 1);
        loom_backend_attention_bidir_forward(be, att, a->lse, qkv, v->scratch, v->n_img, v->P,
                                             v->Hv, v->Hv, hd);
        loom_model_round_pre(m, a->att16, att, (size_t)R * Dv, 0);
        loom_model_linear_forward(m, a->x1, loom_act_of(a->att, a->att16), p + k->attn_out_w,
                                  p + k->attn_out_b, R, Dv, Dv);
        loom_backend_add(be, a->x1, a->x1, x, (size_t)R * Dv);
        loom_backend_layernorm_forward(be, ln2, a->mean2, a->rstd2, a->x1, p + k->norm2_w,
                                       p + k->norm2_b, R, Dv, eps);
        loom_model_keep_bf16(m, a->ln2_16, ln2, (size_t)R * Dv);
        loom_model_linear_forward(m, fc, loom_act_of(a->ln2, a->ln2_16), p + k->fc_w, p + k->fc_b,
                                  R, Dv, Fv);
        loom_model_round_pre(m, a->fc16, fc, (size_t)R * Fv, 0);
        loom_model_gelu_forward_kept(be, act, a->fc, a->fc16, (size_t)R * Fv);
        loom_model_keep_bf16(m, a->act16, act, (size_t)R * Fv);
        loom_model_linear_forward(m, a->x2, loom_act_of(a->act, a->act16), p + k->proj_w,
                                  p + k->proj_b, R, Fv, Dv);
        loom_backend_add(be, a->x2, a->x2, a->x1, (size_t)R * Dv);
        x = a->x2;
    }
    float *lnf = v->lnf ? v->lnf : v->dln, *a1 = v->a1 ? v->a1 : v->da;
    loom_backend_layernorm_forward(be, lnf, v->lnf_mean, v->lnf_rstd, x, p + q->norm_w,
                                   p + q->norm_b, R, Dv, eps);
    loom_model_keep_bf16(m, v->lnf16, lnf, (size_t)R * Dv);
    loom_model_linear_forward(m, v->h1, loom_act_of(v->lnf, v->lnf16), p + q->fc1_w, p + q->fc1_b,
                              R, Dv, C);
    loom_backend_gelu_forward(be, a1, v->h1, (size_t)R * C);
    loom_model_keep_bf16(m, v->a1_16, a1, (size_t)R * C);
    loom_model_linear_forward(m, v->out, loom_act_of(v->a1, v->a1_16), p + q->fc2_w, p + q->fc2_b,
                              R, C, C);
    loom_trace_end(m->trace);
}

/* Copies between image j's rows of the projector output `img` and the residual stream's
 * rows here (to_stream 1: img -> stream, else stream -> img); 0 rows: none here. */
static void image_rows(loom_model *m, int j, float *stream, float *img, int to_stream) {
    loom_vlm *v = m->vlm;
    const int row0 = stream_row0(m);
    int runs[2][3];
    const int n = image_runs(m, j, runs);
    for (int r = 0; r < n; r++) {
        const int lo = runs[r][0], hi = lo + runs[r][2];
        const int a = lo > row0 ? lo : row0, b = hi < row0 + m->Ns ? hi : row0 + m->Ns;
        if (a >= b) continue;
        float *s = stream + (size_t)(a - row0) * v->C;
        float *i = img + ((size_t)j * v->P + runs[r][1] + (a - lo)) * v->C;
        const size_t bytes = (size_t)(b - a) * v->C * sizeof(float);
        if (to_stream)
            loom_backend_copy(m->be, s, i, bytes);
        else
            loom_backend_copy(m->be, i, s, bytes);
    }
}

static loom_status vlm_embed_forward(loom_model *m, const float *p) {
    loom_vlm *v = m->vlm;
    loom_status st = v->lm->embed_forward(m, p);
    if (st || v->n_img == 0) return st;
    if (v->remote_emb) /* encoded on another stage (model/vlm_pieces.h) */
        loom_backend_copy_to_device(m->be, v->out, v->remote_emb,
                                    (size_t)v->n_img * v->P * v->C * sizeof(float));
    else
        encoder_forward(m, p);
    for (int j = 0; j < v->n_img; j++) image_rows(m, j, m->embed, v->out, 1);
    return LOOM_OK;
}

/* d(projector output) in v->dh -> the projector's and encoder's gradients. */
static void encoder_backward(loom_model *m, const float *p, float *g) {
    loom_vlm *v = m->vlm;
    const loom_vlm_params *q = &m->table.vlm;
    const loom_backend *be = m->be;
    const int R = v->n_img * v->P, Dv = v->Dv, Fv = v->Fv, C = v->C, hd = Dv / v->Hv;
    const int vision = !(v->frozen & LOOM_VLM_PART_VISION);
    const int projector = !(v->frozen & LOOM_VLM_PART_PROJECTOR);
    const size_t RD = (size_t)R * Dv * sizeof(float);
    if (!vision && !projector) return;
    loom_trace_begin(m->trace, "vision", "backward");
    /* projector: out = fc2(gelu(h1)), h1 = fc1(lnf) */
    loom_linear_backward_act(be, v->da, LOOM_DX_SET, v->dh, p + q->fc2_w,
                             projector ? g + q->fc2_w : NULL, g + q->fc2_b,
                             loom_act_of(v->a1, v->a1_16), R, C, C);
    loom_backend_memset(be, v->dh, 0, (size_t)R * C * sizeof(float));
    loom_backend_gelu_backward(be, v->dh, v->h1, v->da, (size_t)R * C);
    loom_linear_backward_act(be, vision ? v->dln : NULL, LOOM_DX_SET, v->dh, p + q->fc1_w,
                             projector ? g + q->fc1_w : NULL, g + q->fc1_b,
                             loom_act_of(v->lnf, v->lnf16), R, Dv, C);
    if (!vision) {
        loom_trace_end(m->trace);
        return;
    }
    const int L = q->n_layer;
    const float *x_last = L > 0 ? v->blk[L - 1].x2 : v->x0;
    loom_backend_memset(be, v->dx, 0, RD);
    loom_backend_layernorm_backward(be, v->dx, g + q->norm_w, g + q->norm_b, v->dln, x_last,
                                    p + q->norm_w, v->lnf_mean, v->lnf_rstd, R, Dv);
    for (int l = L - 1; l >= 0; l--) {
        const loom_block_params *k = &q->blocks[l];
        const vit_acts *a = &v->blk[l];
        const float *x = l > 0 ? v->blk[l - 1].x2 : v->x0;
        /* x2 = x1 + fc2(gelu(fc1(LN2(x1)))); v->dx = d(x2) */
        loom_linear_backward_act(be, v->dact, LOOM_DX_SET, v->dx, p + k->proj_w, g + k->proj_w,
                                 g + k->proj_b, loom_act_of(a->act, a->act16), R, Fv, Dv);
        loom_backend_memset(be, v->dfc, 0, (size_t)R * Fv * sizeof(float));
        loom_model_gelu_backward_kept(be, v->dfc, a->fc, a->fc16, v->dact, (size_t)R * Fv);
        loom_linear_backward_act(be, v->dln, LOOM_DX_SET, v->dfc, p + k->fc_w, g + k->fc_w,
                                 g + k->fc_b, loom_act_of(a->ln2, a->ln2_16), R, Dv, Fv);
        loom_backend_layernorm_backward(be, v->dx, g + k->norm2_w, g + k->norm2_b, v->dln, a->x1,
                                        p + k->norm2_w, a->mean2, a->rstd2, R, Dv);
        /* x1 = x + proj(attention(qkv(LN1(x)))); v->dx = d(x1) */
        loom_linear_backward_act(be, v->datt, LOOM_DX_SET, v->dx, p + k->attn_out_w,
                                 g + k->attn_out_w, g + k->attn_out_b,
                                 loom_act_of(a->att, a->att16), R, Dv, Dv);
        /* kept in bf16: qkv widened into dfc, att into dact (both free now) */
        const float *qkv = loom_model_widen_kept(m, a->qkv, a->qkv16, v->dfc, (size_t)R * 3 * Dv);
        const float *att = loom_model_widen_kept(m, a->att, a->att16, v->dact, (size_t)R * Dv);
        loom_backend_memset(be, v->dqkv, 0, (size_t)R * 3 * Dv * sizeof(float));
        loom_backend_attention_bidir_backward(be, v->dqkv, v->scratch, v->datt, qkv, att, a->lse,
                                              v->n_img, v->P, v->Hv, v->Hv, hd);
        loom_linear_backward_act(be, v->dln, LOOM_DX_SET, v->dqkv, p + k->qkv_w, g + k->qkv_w,
                                 g + k->qkv_b, loom_act_of(a->ln1, a->ln1_16), R, Dv, 3 * Dv);
        loom_backend_layernorm_backward(be, v->dx, g + k->norm1_w, g + k->norm1_b, v->dln, x,
                                        p + k->norm1_w, a->mean1, a->rstd1, R, Dv);
    }
    loom_linear_backward(be, NULL, LOOM_DX_SET, v->dx, NULL, g + q->patch_w, g + q->patch_b,
                         v->patches, R, v->Pin, Dv);
    loom_trace_end(m->trace);
}

/* m->dres = d(embedding output): the image rows go to the projector, the others to the
 * token embedding. */
static loom_status vlm_embed_backward(loom_model *m, const float *p, float *g) {
    loom_vlm *v = m->vlm;
    loom_status st = LOOM_OK;
    if (v->n_img > 0) {
        const float *whole = m->dres;
        if (loom_model_seq_parallel(m)) st = loom_model_tp_gather(m, m->dres, &whole);
        if (st) return st;
        /* this rank's rows of the images (gathered with sequence parallelism); with
         * context parallelism an image's other rows are another rank's, zero here: the
         * encoder's gradients are then partial sums, added up by the dp x cp reduction */
        if (loom_model_cp_on(m))
            loom_backend_memset(m->be, v->dh, 0, (size_t)v->n_img * v->P * v->C * sizeof(float));
        for (int j = 0; j < v->n_img; j++) {
            int runs[2][3];
            const int n = image_runs(m, j, runs);
            for (int r = 0; r < n; r++)
                loom_backend_copy(m->be, v->dh + ((size_t)j * v->P + runs[r][1]) * v->C,
                                  whole + (size_t)runs[r][0] * v->C,
                                  (size_t)runs[r][2] * v->C * sizeof(float));
        }
        /* no token-embedding gradient from the slots' rows */
        for (int j = 0; j < v->n_img; j++) {
            const int row0 = stream_row0(m);
            int runs[2][3];
            const int n = image_runs(m, j, runs);
            for (int r = 0; r < n; r++) {
                const int lo = runs[r][0], hi = lo + runs[r][2];
                const int a = lo > row0 ? lo : row0, b = hi < row0 + m->Ns ? hi : row0 + m->Ns;
                if (a < b)
                    loom_backend_memset(m->be, m->dres + (size_t)(a - row0) * v->C, 0,
                                        (size_t)(b - a) * v->C * sizeof(float));
            }
        }
    }
    if (!(v->frozen & LOOM_VLM_PART_LLM)) st = v->lm->embed_backward(m, p, g);
    if (!st && v->n_img > 0 && v->remote_demb) /* the encoding stage runs the backward */
        loom_backend_copy_to_host(m->be, v->remote_demb, v->dh,
                                  (size_t)v->n_img * v->P * v->C * sizeof(float));
    else if (!st && v->n_img > 0)
        encoder_backward(m, p, g);
    return st;
}

/* ---- --freeze llm: the decoder's backward without its weight gradients ----
 * The model runs split backward (B only, W never: train/setup.c); B still brings the
 * norms' weight gradients, cleared here before the caller reports the range ready. */

static void clear_grad(const loom_model *m, float *g, size_t offset) {
    if (offset != LOOM_NO_PARAM)
        loom_backend_memset(m->be, g + offset, 0, (size_t)m->cfg.d_model * sizeof(float));
}

static loom_status vlm_head_backward(loom_model *m, const float *p, float *g, const float *x) {
    loom_status st = m->vlm->lm->head_backward(m, p, g, x);
    if (m->vlm->frozen & LOOM_VLM_PART_LLM) clear_grad(m, g, m->table.normf_w);
    return st;
}

static loom_status vlm_block_backward(loom_model *m, const float *p, float *g, int l,
                                      const float *x) {
    loom_status st = m->vlm->lm->block_backward(m, p, g, l, x);
    if (m->vlm->frozen & LOOM_VLM_PART_LLM) {
        clear_grad(m, g, m->table.blocks[l].norm1_w);
        clear_grad(m, g, m->table.blocks[l].norm2_w);
    }
    return st;
}

/* ---- the loss: cross-entropy weighted per target (model/vlm.h) ---- */

static loom_status vlm_loss_sum(loom_model *m, float dloss, int backward, double *sum) {
    loom_vlm *v = m->vlm;
    const int T = m->T, tp = m->tp ? m->tp->size : 1;
    const int V = m->cfg.vocab_size / tp, v0 = m->tp ? m->tp->rank * V : 0;
    const loom_backend *be = m->be;
    const size_t N = (size_t)m->B * T;
    loom_status st = LOOM_OK;
    /* every row's cross-entropy (vocabulary-parallel over tp), dlogits with weight dloss */
    if (tp > 1)
        st = loom_tp_crossentropy(m->tp, m->losses, m->logits, m->targets, V, v0, dloss, backward);
    else if (backward)
        loom_backend_crossentropy_forward_backward(be, m->losses, m->logits, m->targets, (int)N, V,
                                                   dloss);
    else
        loom_backend_crossentropy_forward(be, m->losses, m->logits, m->targets, (int)N, V);
    if (st) return st;
    /* then each sample's answer rows times its weight, every other row's gradient zero */
    int pos[2];
    const int n_chunks = loom_model_chunks(m, pos), L = T / n_chunks;
    for (int cb = 0; cb < n_chunks * m->B && backward; cb++) {
        const int b = cb % m->B; /* rows [chunk][sample][token] (model/context.c) */
        const size_t r0 = (size_t)cb * L;
        float *logits = m->logits + r0 * V;
        if (v->sample_w[b] != 0.0f) loom_backend_scale(be, logits, v->sample_w[b], (size_t)L * V);
        for (int t = 0; t < L;) {
            if (v->host_w[r0 + t] != 0.0f) {
                t++;
                continue;
            }
            int e = t;
            while (e < L && v->host_w[r0 + e] == 0.0f) e++;
            loom_backend_memset(be, logits + (size_t)t * V, 0, (size_t)(e - t) * V * sizeof(float));
            t = e;
        }
    }
    loom_backend_copy_to_host(be, m->losses_host, m->losses, N * sizeof(float));
    double s = 0.0;
    for (size_t i = 0; i < N; i++)
        if (v->host_w[i] != 0.0f) s += (double)v->host_w[i] * m->losses_host[i];
    *sum = s;
    return LOOM_OK;
}

/* ---- --vision-schedule bubbles: the encoder's pieces (model/vlm_pieces.h) ---- */

size_t loom_vlm_image_rows_floats(const loom_model *m) {
    const loom_vlm *v = m->vlm;
    return (size_t)v->NI * v->P * v->C;
}

void loom_vlm_set_remote(loom_model *m, const float *emb, float *demb) {
    m->vlm->remote_emb = emb;
    m->vlm->remote_demb = demb;
}

void loom_vlm_encode(loom_model *m, const float *p, float *emb) {
    loom_vlm *v = m->vlm;
    if (v->n_img == 0) return;
    encoder_forward(m, p);
    loom_backend_copy_to_host(m->be, emb, v->out, (size_t)v->n_img * v->P * v->C * sizeof(float));
}

void loom_vlm_encode_backward(loom_model *m, const float *p, float *g, const float *demb) {
    loom_vlm *v = m->vlm;
    if (v->n_img == 0) return;
    loom_backend_copy_to_device(m->be, v->dh, demb, (size_t)v->n_img * v->P * v->C * sizeof(float));
    encoder_backward(m, p, g);
}

/* ---- set-up ---- */

loom_status loom_vlm_attach(loom_model *m, loom_error *err) {
    const loom_model_config *c = &m->cfg;
    loom_vlm *v = calloc(1, sizeof *v);
    if (!v) return loom_error_set(err, LOOM_ERR_NOMEM, "vlm: out of memory");
    m->vlm = v;
    v->lm = m->ops;
    v->ops = *m->ops;
    v->ops.plan = plan;
    v->ops.plan_bytes = vlm_plan_bytes;
    v->ops.load_batch = vlm_load_batch;
    v->ops.embed_forward = vlm_embed_forward;
    v->ops.embed_backward = vlm_embed_backward;
    v->ops.loss_sum = vlm_loss_sum;
    v->ops.head_backward = vlm_head_backward;
    v->ops.block_backward = vlm_block_backward;
    m->ops = &v->ops;
    v->encoder = m->table.has_embed;
    v->frozen = c->freeze;
    v->NI = m->B * c->max_images;
    v->P = loom_vlm_image_tokens(c);
    v->Pin = loom_model_dit_patch_floats(c);
    v->S = loom_vlm_image_floats(c);
    v->Dv = c->vit_d_model;
    v->Hv = c->vit_n_head;
    v->Fv = c->vit_d_ff;
    v->C = c->d_model;
    const size_t N = (size_t)m->B * m->T;
    v->img_b = calloc((size_t)v->NI, sizeof *v->img_b);
    v->img_g0 = calloc((size_t)v->NI, sizeof *v->img_g0);
    v->host_patches = malloc((size_t)v->NI * v->P * v->Pin * sizeof(float));
    v->host_w = calloc(N, sizeof *v->host_w);
    v->sample_w = calloc((size_t)m->B, sizeof *v->sample_w);
    v->host_in = calloc(N, sizeof *v->host_in);
    v->host_tg = calloc(N, sizeof *v->host_tg);
    v->blk = calloc((size_t)c->vit_layers, sizeof *v->blk);
    const size_t PD = (size_t)v->P * v->Dv;
    float *pos = malloc(PD * sizeof(float));
    v->pos = v->encoder ? loom_backend_alloc(m->be, PD * sizeof(float)) : NULL;
    if (!v->img_b || !v->img_g0 || !v->host_patches || !v->host_w || !v->sample_w || !v->host_in ||
        !v->host_tg || !v->blk || !pos || (v->encoder && !v->pos)) {
        free(pos);
        return loom_error_set(err, LOOM_ERR_NOMEM, "vlm: out of memory");
    }
    /* the DiT's 2-D sin-cos table at the encoder's width */
    loom_model_config enc = *c;
    enc.d_model = v->Dv;
    loom_dit_positions(&enc, pos);
    if (v->encoder) loom_backend_copy_to_device(m->be, v->pos, pos, PD * sizeof(float));
    free(pos);
    return loom_model_arena_allocate(m, plan, err);
}

void loom_vlm_detach(loom_model *m) {
    loom_vlm *v = m->vlm;
    if (!v) return;
    if (m->be) loom_backend_free(m->be, v->pos);
    free(v->img_b);
    free(v->img_g0);
    free(v->host_patches);
    free(v->host_w);
    free(v->sample_w);
    free(v->host_in);
    free(v->host_tg);
    free(v->blk);
    free(v);
    m->vlm = NULL;
}
