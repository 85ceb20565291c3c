#include "model/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_generator_create(loom_generator *g, const loom_model_config *c,
                                  const loom_param_table *t, const float *params, loom_error *err) {
    return loom_generator_create_on(g, c, t, params, NULL, err);
}

loom_status loom_generator_create_on(loom_generator *g, const loom_model_config *c,
                                     const loom_param_table *t, const float *params,
                                     const loom_backend *be, loom_error *err) {
    memset(g, 0, sizeof *g);
    g->cfg = *c;
    g->table = t;
    g->params = params;
    g->max_len = c->seq_len;
    /* The decoder runs on the host (attend() below loops over the KV cache, and
     * loom_sample reads the logits): the CPU backend, whose memory is host memory. */
    g->be = be && be->device == LOOM_DEVICE_CPU ? be : loom_backend_cpu();
    const int hd = c->d_model / c->n_head, C = c->d_model;
    const size_t kv = (size_t)c->n_kv_head * hd, QKV = (size_t)(c->n_head + 2 * c->n_kv_head) * hd;
    const size_t FC = c->family == LOOM_FAMILY_GPT2 ? (size_t)c->d_ff : 2 * (size_t)c->d_ff;
    const size_t cache = (size_t)c->n_layer * g->max_len * kv;
    g->k_cache = loom_backend_alloc(g->be, cache * sizeof(float));
    g->v_cache = loom_backend_alloc(g->be, cache * sizeof(float));
    g->x = loom_backend_alloc(g->be, C * sizeof(float));
    g->norm = loom_backend_alloc(g->be, C * sizeof(float));
    g->qkv = loom_backend_alloc(g->be, QKV * sizeof(float));
    g->att = loom_backend_alloc(g->be, (size_t)c->n_head * hd * sizeof(float));
    g->res = loom_backend_alloc(g->be, C * sizeof(float));
    g->fc = loom_backend_alloc(g->be, FC * sizeof(float));
    g->act = loom_backend_alloc(g->be, (size_t)c->d_ff * sizeof(float));
    g->logits = loom_backend_alloc(g->be, (size_t)c->vocab_size * sizeof(float));
    g->scores = loom_backend_alloc(g->be, (size_t)g->max_len * sizeof(float));
    if (!g->k_cache || !g->v_cache || !g->x || !g->norm || !g->qkv || !g->att || !g->res ||
        !g->fc || !g->act || !g->logits || !g->scores) {
        loom_generator_free(g);
        return loom_error_set(err, LOOM_ERR_NOMEM, "generate: out of memory for the KV cache");
    }
    loom_status st = loom_moe_create(&g->moe, c, t, 1, NULL, g->be, err);
    if (st) loom_generator_free(g);
    return st;
}

void loom_generator_free(loom_generator *g) {
    if (!g->be) g->be = loom_backend_cpu(); /* freed twice, or never created */
    loom_backend_free(g->be, g->k_cache);
    loom_backend_free(g->be, g->v_cache);
    loom_backend_free(g->be, g->x);
    loom_backend_free(g->be, g->norm);
    loom_backend_free(g->be, g->qkv);
    loom_backend_free(g->be, g->att);
    loom_backend_free(g->be, g->res);
    loom_backend_free(g->be, g->fc);
    loom_backend_free(g->be, g->act);
    loom_backend_free(g->be, g->logits);
    loom_backend_free(g->be, g->scores);
    loom_moe_destroy(g->moe);
    memset(g, 0, sizeof *g);
}

static const float *opt(const float *p, size_t offset) {
    return offset == LOOM_NO_PARAM ? NULL : p + offset;
}

static void norm(loom_generator *g, float *out, const float *in, size_t w, size_t b) {
    const loom_model_config *c = &g->cfg;
    if (c->family == LOOM_FAMILY_GPT2)
        loom_backend_layernorm_forward(g->be, out, &g->mean, &g->rstd, in, g->params + w,
                                       opt(g->params, b), 1, c->d_model, c->norm_eps);
    else
        loom_backend_rmsnorm_forward(g->be, out, &g->rstd, in, g->params + w, 1, c->d_model,
                                     c->norm_eps);
}

/* One query head against the cached keys/values 0..pos of its key/value head. */
static void attend(loom_generator *g, int layer, int h, int pos) {
    const loom_model_config *c = &g->cfg;
    const int hd = c->d_model / c->n_head, kv = c->n_kv_head * hd;
    const int g_kv = h / (c->n_head / c->n_kv_head);
    const float *q = g->qkv + (size_t)h * hd;
    const float *K = g->k_cache + (size_t)layer * g->max_len * kv + (size_t)g_kv * hd;
    const float *Vc = g->v_cache + (size_t)layer * g->max_len * kv + (size_t)g_kv * hd;
    const double scale = 1.0 / sqrt((double)hd);
    double m = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        double s = 0.0;
        for (int d = 0; d < hd; d++) s += (double)q[d] * K[(size_t)j * kv + d];
        g->scores[j] = (float)(s * scale);
        if (g->scores[j] > m) m = g->scores[j];
    }
    double sum = 0.0;
    for (int j = 0; j <= pos; j++) sum += (g->scores[j] = (float)exp(g->scores[j] - m));
    float *o = g->att + (size_t)h * hd;
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int j = 0; j <= pos; j++) {
        float p = (float)(g->scores[j] / sum);
        for (int d = 0; d < hd; d++) o[d] += p * Vc[(size_t)j * kv + d];
    }
}

static void decode(loom_generator *g, int pos);

void loom_generator_step(loom_generator *g, int32_t token, int pos) {
    const loom_param_table *t = g->table;
    const float *p = g->params;
    const int C = g->cfg.d_model, gpt2 = g->cfg.family == LOOM_FAMILY_GPT2;
    /* one token at position pos: the lookup with wpe shifted to row pos */
    loom_backend_embedding_forward(g->be, g->x, &token, p + t->wte,
                                   gpt2 ? p + t->wpe + (size_t)pos * C : NULL, 1, 1, C);
    decode(g, pos);
}

void loom_generator_step_row(loom_generator *g, const float *row, int pos) {
    loom_backend_copy(g->be, g->x, row, (size_t)g->cfg.d_model * sizeof(float));
    decode(g, pos);
}

/* The decoder's blocks, final norm and head on g->x at position pos. */
static void decode(loom_generator *g, int pos) {
    const loom_model_config *c = &g->cfg;
    const loom_param_table *t = g->table;
    const float *p = g->params;
    const int C = c->d_model, F = c->d_ff, hd = C / c->n_head, H = c->n_head, KV = c->n_kv_head;
    const int A = H * hd, QKV = (H + 2 * KV) * hd, kv = KV * hd;
    const int gpt2 = c->family == LOOM_FAMILY_GPT2, FC = gpt2 ? F : 2 * F;
    for (int l = 0; l < c->n_layer; l++) {
        const loom_block_params *k = &t->blocks[l];
        norm(g, g->norm, g->x, k->norm1_w, k->norm1_b);
        loom_backend_linear_forward(g->be, g->qkv, g->norm, p + k->qkv_w, opt(p, k->qkv_b), 1, C,
                                    QKV);
        if (!gpt2) loom_backend_rope_forward_at(g->be, g->qkv, 1, 1, H, KV, hd, c->rope_theta, pos);
        size_t at = ((size_t)l * g->max_len + pos) * kv;
        loom_backend_copy(g->be, g->k_cache + at, g->qkv + A, kv * sizeof(float));
        loom_backend_copy(g->be, g->v_cache + at, g->qkv + A + kv, kv * sizeof(float));
        for (int h = 0; h < H; h++) attend(g, l, h, pos);
        loom_backend_linear_forward(g->be, g->res, g->att, p + k->attn_out_w, opt(p, k->attn_out_b),
                                    1, A, C);
        loom_backend_add(g->be, g->x, g->x, g->res, C);
        norm(g, g->norm, g->x, k->norm2_w, k->norm2_b);
        if (k->moe) {
            /* One rank, no collective: cannot fail. */
            (void)loom_moe_forward(g->moe, l, p, g->norm, g->res);
            loom_backend_add(g->be, g->x, g->x, g->res, C);
            continue;
        }
        loom_backend_linear_forward(g->be, g->fc, g->norm, p + k->fc_w, opt(p, k->fc_b), 1, C, FC);
        if (gpt2)
            loom_backend_gelu_forward(g->be, g->act, g->fc, F);
        else
            loom_backend_swiglu_forward(g->be, g->act, g->fc, 1, F);
        loom_backend_linear_forward(g->be, g->res, g->act, p + k->proj_w, opt(p, k->proj_b), 1, F,
                                    C);
        loom_backend_add(g->be, g->x, g->x, g->res, C);
    }
    norm(g, g->norm, g->x, t->normf_w, t->normf_b);
    loom_backend_linear_forward(g->be, g->logits, g->norm, p + t->lm_head, NULL, 1, C,
                                c->vocab_size);
}

/* Descending order of logits, for top-k / top-p. */
static int by_logit_desc(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    float x = l[*(const int *)a], y = l[*(const int *)b];
    return (x < y) - (x > y);
}

/* Relative gap of two probabilities (or logits), 0 for a tie. */
static double rel_gap(double a, double b) {
    const double big = fmax(fabs(a), fabs(b));
    return big > 0.0 ? fabs(a - b) / big : 0.0;
}

int32_t loom_sample(float *logits, int V, const loom_sampling *s, double u, int *order,
                    double *margin) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    double gap = INFINITY; /* the draw's margin (generate.h) */
    if (s->temperature <= 0.0f) {
        for (int i = 0; margin && i < V; i++)
            if (i != best)
                gap = fmin(gap, (logits[best] - logits[i]) / fmax(1.0, fabs(logits[best])));
        if (margin) *margin = gap;
        return best;
    }
    /* Softmax at the temperature, then keep the top-k and the smallest set whose mass
     * reaches top-p (both over the sorted order), renormalise and draw. */
    double m = logits[best], sum = 0.0;
    for (int i = 0; i < V; i++) {
        logits[i] = (float)exp((logits[i] - m) / s->temperature);
        sum += logits[i];
        order[i] = i;
    }
    qsort_r(order, (size_t)V, sizeof *order, by_logit_desc, logits);
    int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    if (keep < V) /* the k-th and the next: a tie moves the top-k cut */
        gap = rel_gap(logits[order[keep - 1]], logits[order[keep]]);
    double mass = 0.0;
    for (int i = 0; i < keep; i++) {
        mass += logits[order[i]] / sum;
        if (s->top_p < 1.0f && mass >= s->top_p) {
            /* the mass crosses top-p at this token: how far from it on either side */
            gap = fmin(gap, fmin(mass - s->top_p, s->top_p - (mass - logits[order[i]] / sum)) /
                                s->top_p);
            keep = i + 1;
            break;
        }
    }
    double kept = 0.0;
    for (int i = 0; i < keep; i++) kept += logits[order[i]];
    double target = u * kept, acc = 0.0, lo = 0.0; /* lo: the mass before the token */
    int at = keep - 1;
    for (int i = 0; i < keep; i++) {
        lo = acc;
        acc += logits[order[i]];
        if (acc > target) {
            at = i;
            break;
        }
    }
    if (margin) {
        /* u's distance to the chosen token's interval ends, and the token's gap to its
         * neighbours in the order (two near-equal tokens swap places under rounding) */
        const double hi = lo + logits[order[at]];
        gap = fmin(gap, fmin(target - lo, hi - target) / kept);
        if (at > 0) gap = fmin(gap, rel_gap(logits[order[at - 1]], logits[order[at]]));
        if (at + 1 < V) gap = fmin(gap, rel_gap(logits[order[at]], logits[order[at + 1]]));
        *margin = fmax(gap, 0.0);
    }
    return order[at];
}
