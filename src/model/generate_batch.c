#include "model/generate_batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_batch_generator_create(loom_batch_generator *g, const loom_model_config *c,
                                        const loom_param_table *t, const float *params,
                                        int max_batch, loom_error *err) {
    memset(g, 0, sizeof *g);
    g->cfg = *c;
    g->table = t;
    g->params = params;
    g->max_batch = max_batch;
    g->max_len = c->seq_len;
    g->be = loom_backend_cpu();
    const size_t B = (size_t)max_batch, hd = (size_t)c->d_model / c->n_head, C = c->d_model;
    const size_t kv = (size_t)c->n_kv_head * hd, QKV = (size_t)(c->n_head + 2 * c->n_kv_head) * hd;
    const size_t FC = c->family == LOOM_FAMILY_GPT2 ? (size_t)c->d_ff : 2 * (size_t)c->d_ff;
    const size_t cache = B * c->n_layer * g->max_len * kv;
    g->k_cache = loom_backend_alloc(g->be, cache * sizeof(float));
    g->v_cache = loom_backend_alloc(g->be, cache * sizeof(float));
    g->x = loom_backend_alloc(g->be, B * C * sizeof(float));
    g->norm = loom_backend_alloc(g->be, B * C * sizeof(float));
    g->qkv = loom_backend_alloc(g->be, B * QKV * sizeof(float));
    g->att = loom_backend_alloc(g->be, B * c->n_head * hd * sizeof(float));
    g->res = loom_backend_alloc(g->be, B * C * sizeof(float));
    g->fc = loom_backend_alloc(g->be, B * FC * sizeof(float));
    g->act = loom_backend_alloc(g->be, B * c->d_ff * sizeof(float));
    g->mean = loom_backend_alloc(g->be, B * sizeof(float));
    g->rstd = loom_backend_alloc(g->be, B * sizeof(float));
    g->scores = loom_backend_alloc(g->be, B * c->n_head * g->max_len * sizeof(float));
    g->logits = loom_backend_alloc(g->be, B * c->vocab_size * sizeof(float));
    if (!g->k_cache || !g->v_cache || !g->x || !g->norm || !g->qkv || !g->att || !g->res ||
        !g->fc || !g->act || !g->mean || !g->rstd || !g->scores || !g->logits) {
        loom_batch_generator_free(g);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "generate: out of memory for the KV caches of %d sequences",
                              max_batch);
    }
    loom_status st = loom_moe_create(&g->moe, c, t, 1, NULL, g->be, err);
    if (st) loom_batch_generator_free(g);
    return st;
}

void loom_batch_generator_free(loom_batch_generator *g) {
    if (!g->be) g->be = loom_backend_cpu();
    float *bufs[] = {g->k_cache, g->v_cache, g->x,    g->norm, g->qkv,    g->att,    g->res,
                     g->fc,      g->act,     g->mean, g->rstd, g->scores, g->logits, g->parts};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_backend_free(g->be, bufs[i]);
    loom_moe_destroy(g->moe);
    memset(g, 0, sizeof *g);
}

loom_status loom_batch_generator_shard(loom_batch_generator *g, loom_comm *tp, loom_error *err) {
    const loom_model_config *c = &g->cfg;
    const int P = tp->size;
    if (c->n_head % P || c->n_kv_head % P || c->d_ff % P || c->vocab_size % P || g->moe)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "generate: tp %d must divide the heads, KV heads, d_ff and the "
                              "vocabulary of a dense model",
                              P);
    g->parts = loom_backend_alloc(g->be, (size_t)g->max_batch * c->vocab_size * sizeof(float));
    if (!g->parts) return loom_error_set(err, LOOM_ERR_NOMEM, "generate: out of memory");
    g->tp = tp;
    return LOOM_OK;
}

static const float *opt(const float *p, size_t offset) {
    return offset == LOOM_NO_PARAM ? NULL : p + offset;
}

static void norm(loom_batch_generator *g, int M, float *out, const float *in, size_t w, size_t b) {
    const loom_model_config *c = &g->cfg;
    if (c->family == LOOM_FAMILY_GPT2)
        loom_backend_layernorm_forward(g->be, out, g->mean, g->rstd, in, g->params + w,
                                       opt(g->params, b), M, c->d_model, c->norm_eps);
    else
        loom_backend_rmsnorm_forward(g->be, out, g->rstd, in, g->params + w, M, c->d_model,
                                     c->norm_eps);
}

/* Row r's query head h against its sequence's cached keys/values 0..pos (the arithmetic
 * of model/generate.c's attend()). */
static void attend(loom_batch_generator *g, int layer, int r, int s, int h, int pos) {
    const loom_model_config *c = &g->cfg;
    const int P = g->tp ? g->tp->size : 1; /* the rank's heads: H / P of them */
    const int hd = c->d_model / c->n_head, KV = c->n_kv_head / P, kv = KV * hd, H = c->n_head / P;
    const int g_kv = h / (c->n_head / c->n_kv_head), QKV = (H + 2 * KV) * hd;
    const size_t base = ((size_t)s * c->n_layer + layer) * g->max_len * kv + (size_t)g_kv * hd;
    const float *q = g->qkv + (size_t)r * QKV + (size_t)h * hd;
    const float *K = g->k_cache + base, *Vc = g->v_cache + base;
    float *sc = g->scores + ((size_t)r * H + h) * g->max_len;
    const double scale = 1.0 / sqrt((double)hd);
    double m = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        double d = 0.0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * K[(size_t)j * kv + i];
        sc[j] = (float)(d * scale);
        if (sc[j] > m) m = sc[j];
    }
    double sum = 0.0;
    for (int j = 0; j <= pos; j++) sum += (sc[j] = (float)exp(sc[j] - m));
    float *o = g->att + (size_t)r * H * hd + (size_t)h * hd;
    for (int i = 0; i < hd; i++) o[i] = 0.0f;
    for (int j = 0; j <= pos; j++) {
        float p = (float)(sc[j] / sum);
        for (int i = 0; i < hd; i++) o[i] += p * Vc[(size_t)j * kv + i];
    }
}

/* A row-parallel layer's partial output summed over the tp group (no group: as it is). */
static loom_status tp_sum(loom_batch_generator *g, float *buf, size_t n, loom_error *err) {
    return g->tp ? loom_comm_allreduce_sum(g->tp, buf, n, err) : LOOM_OK;
}

/* tp: the vocabulary-parallel logits [M, V / P] of every rank as whole rows [M, V]. */
static loom_status tp_logits(loom_batch_generator *g, int M, loom_error *err) {
    if (!g->tp) return LOOM_OK;
    const int P = g->tp->size, V = g->cfg.vocab_size, Vl = V / P, part = M * Vl;
    int counts[P], displs[P];
    for (int q = 0; q < P; q++) counts[q] = part, displs[q] = q * part;
    memcpy(g->parts + (size_t)g->tp->rank * part, g->logits, (size_t)part * sizeof(float));
    loom_status st = loom_comm_allgatherv(g->tp, g->parts, counts, displs, err);
    for (int q = 0; !st && q < P; q++)
        for (int r = 0; r < M; r++)
            memcpy(g->logits + (size_t)r * V + (size_t)q * Vl,
                   g->parts + (size_t)q * part + (size_t)r * Vl, (size_t)Vl * sizeof(float));
    return st;
}

loom_status loom_batch_generator_step(loom_batch_generator *g, int M, const int *seq,
                                      const int32_t *tokens, const int *pos, loom_error *err) {
    const loom_model_config *c = &g->cfg;
    const loom_param_table *t = g->table;
    const float *p = g->params;
    const int P = g->tp ? g->tp->size : 1, lead = !g->tp || g->tp->rank == 0;
    const int C = c->d_model, F = c->d_ff / P, hd = C / c->n_head, H = c->n_head / P;
    const int KV = c->n_kv_head / P, A = H * hd, QKV = (H + 2 * KV) * hd, kv = KV * hd;
    const int gpt2 = c->family == LOOM_FAMILY_GPT2, FC = gpt2 ? F : 2 * F;
    const int Vl = c->vocab_size / P, v0 = g->tp ? g->tp->rank * Vl : 0;
    const size_t n = (size_t)M * C;
    loom_status st;
    for (int r = 0; r < M; r++) {
        const float *wpe = gpt2 && lead ? p + t->wpe + (size_t)pos[r] * C : NULL;
        if (g->tp) /* this rank's vocabulary rows (the others: 0), positions on rank 0 */
            loom_backend_embedding_forward_shard(g->be, g->x + (size_t)r * C, &tokens[r],
                                                 p + t->wte, wpe, v0, Vl, 1, 1, C);
        else
            loom_backend_embedding_forward(g->be, g->x + (size_t)r * C, &tokens[r], p + t->wte,
                                           gpt2 ? p + t->wpe + (size_t)pos[r] * C : NULL, 1, 1, C);
    }
    if ((st = tp_sum(g, g->x, n, err))) return st;
    for (int l = 0; l < c->n_layer; l++) {
        const loom_block_params *k = &t->blocks[l];
        norm(g, M, g->norm, g->x, k->norm1_w, k->norm1_b);
        loom_backend_linear_forward(g->be, g->qkv, g->norm, p + k->qkv_w, opt(p, k->qkv_b), M, C,
                                    QKV);
        for (int r = 0; r < M; r++) {
            float *row = g->qkv + (size_t)r * QKV;
            if (!gpt2)
                loom_backend_rope_forward_at(g->be, row, 1, 1, H, KV, hd, c->rope_theta, pos[r]);
            size_t at = (((size_t)seq[r] * c->n_layer + l) * g->max_len + pos[r]) * kv;
            memcpy(g->k_cache + at, row + A, kv * sizeof(float));
            memcpy(g->v_cache + at, row + A + kv, kv * sizeof(float));
        }
#pragma omp parallel for collapse(2) schedule(static)
        for (int r = 0; r < M; r++)
            for (int h = 0; h < H; h++) attend(g, l, r, seq[r], h, pos[r]);
        loom_backend_linear_forward(g->be, g->res, g->att, p + k->attn_out_w,
                                    lead ? opt(p, k->attn_out_b) : NULL, M, A, C);
        if ((st = tp_sum(g, g->res, n, err))) return st;
        loom_backend_add(g->be, g->x, g->x, g->res, n);
        norm(g, M, g->norm, g->x, k->norm2_w, k->norm2_b);
        if (k->moe) {
            for (int r = 0; r < M; r++) /* one token, one rank: cannot fail */
                (void)loom_moe_forward(g->moe, l, p, g->norm + (size_t)r * C,
                                       g->res + (size_t)r * C);
            loom_backend_add(g->be, g->x, g->x, g->res, n);
            continue;
        }
        loom_backend_linear_forward(g->be, g->fc, g->norm, p + k->fc_w, opt(p, k->fc_b), M, C, FC);
        if (gpt2)
            loom_backend_gelu_forward(g->be, g->act, g->fc, (size_t)M * F);
        else
            loom_backend_swiglu_forward(g->be, g->act, g->fc, M, F);
        loom_backend_linear_forward(g->be, g->res, g->act, p + k->proj_w,
                                    lead ? opt(p, k->proj_b) : NULL, M, F, C);
        if ((st = tp_sum(g, g->res, n, err))) return st;
        loom_backend_add(g->be, g->x, g->x, g->res, n);
    }
    norm(g, M, g->norm, g->x, t->normf_w, t->normf_b);
    loom_backend_linear_forward(g->be, g->logits, g->norm, p + t->lm_head, NULL, M, C, Vl);
    return tp_logits(g, M, err);
}
