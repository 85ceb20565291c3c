#include "model/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* What one MoE layer keeps from forward for backward. */
typedef struct {
    int32_t *idx, *pos;    /* [N*K] chosen experts, row among the expert's kept rows or -1 */
    float *w;              /* [N*K] renormalised combine weights */
    float *probs, *lse;    /* [N*E], [N] */
    int32_t *row;          /* [N*K] dispatch row of each assignment, -1: dropped */
    int32_t *load;         /* [E] assignments before dropping */
    int32_t *kept;         /* [E] */
    int32_t *ccnt;         /* [chunks][E] kept rows per chunk and expert (sent) */
    float *ret;            /* [N*K, C] expert outputs, dispatch order */
    int32_t *rows;         /* [chunks][ep][EL] rows received from source s for local expert j */
    float *xin, *h, *act;  /* expert side, expert-major: [R, C], [R, FC], [R, F] */
    float *sh_fc, *sh_act; /* shared expert: [N, FC], [N, F] */
    double aux, zsum;
    int dropped;
    int fresh; /* forward ran since the last loom_moe_loss_sum */
    /* split backward (loom_moe_set_split): what B keeps for W */
    float *w_dy, *w_dh;       /* expert side [R, C] output and [R, FC] hidden gradients */
    float *w_dlogits;         /* [N, E] */
    float *w_sh_dy, *w_sh_dh; /* shared expert [N, C], [N, FC] */
} moe_layer;

struct loom_moe {
    loom_model_config cfg;
    const loom_param_table *table;
    int N, C, F, FC, E, K, EL, ep, cap, gpt2, R;
    int chunks;                /* token chunks whose all-to-all overlaps another's experts */
    int split;                 /* backward leaves the weight gradients to W */
    int32_t *chunk_of;         /* [N] chunk of each token */
    int32_t *zoffs;            /* [E] zeros: the kernels address rows as offs[e] + row */
    int *sb, *rb;              /* [chunks + 1] first row of each chunk: sent, received */
    loom_comm_handle *hd, *hc; /* [chunks] dispatch and combine in flight */
    loom_comm *comm;
    loom_error *err;
    moe_layer *layers; /* n_layer; only MoE layers have buffers */
    size_t bytes, chunk_bytes;
    /* scratch shared by all layers */
    float *logits, *dw, *send, *recv, *ex, *exd, *dact, *dh;
    float *cnt_send, *cnt_recv; /* [ep][chunks][EL] row counts as floats, sent and received */
    int *sc, *sd, *rc, *rd;     /* all-to-all-v counts and displacements, [chunks][ep] each */
    float dloss;
    double loss_term; /* this forward's aux and z terms times their token weights */
    /* step statistics (this rank) */
    double *step_load; /* [E + 4]: loads, dropped, aux, z, tokens */
};

static void *grab(loom_moe *m, size_t bytes) {
    m->bytes += bytes;
    return calloc(1, bytes ? bytes : 1);
}

void loom_moe_destroy(loom_moe *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->table->n_layer; l++) {
            moe_layer *L = &m->layers[l];
            free(L->idx), free(L->pos), free(L->w), free(L->probs), free(L->lse);
            free(L->row), free(L->load), free(L->kept), free(L->ccnt), free(L->ret), free(L->rows);
            free(L->xin), free(L->h), free(L->act), free(L->sh_fc), free(L->sh_act);
            free(L->w_dy), free(L->w_dh), free(L->w_dlogits), free(L->w_sh_dy), free(L->w_sh_dh);
        }
    free(m->layers);
    free(m->logits), free(m->dw), free(m->send), free(m->recv), free(m->ex), free(m->exd);
    free(m->dact), free(m->dh), free(m->cnt_send), free(m->cnt_recv);
    free(m->sc), free(m->sd), free(m->rc), free(m->rd), free(m->step_load);
    free(m->chunk_of), free(m->zoffs), free(m->sb), free(m->rb), free(m->hd), free(m->hc);
    free(m);
}

/* (Re)allocates what depends on the chunk count; 0 when out of memory. */
static int alloc_chunks(loom_moe *m, int chunks) {
    const size_t CH = (size_t)chunks, E = (size_t)m->E, ep = (size_t)m->ep;
    m->bytes -= m->chunk_bytes;
    const size_t before = m->bytes;
    int ok = 1;
    for (int l = 0; l < m->table->n_layer; l++) {
        moe_layer *L = &m->layers[l];
        if (!L->idx) continue;
        free(L->ccnt), free(L->rows);
        L->ccnt = grab(m, CH * E * 4), L->rows = grab(m, CH * E * 4);
        ok = ok && L->ccnt && L->rows;
    }
    free(m->cnt_send), free(m->cnt_recv), free(m->sc), free(m->sd), free(m->rc), free(m->rd);
    free(m->sb), free(m->rb), free(m->hd), free(m->hc);
    m->cnt_send = grab(m, CH * E * 4), m->cnt_recv = grab(m, CH * E * 4);
    m->sc = grab(m, CH * ep * 4), m->sd = grab(m, CH * ep * 4);
    m->rc = grab(m, CH * ep * 4), m->rd = grab(m, CH * ep * 4);
    m->sb = grab(m, (CH + 1) * sizeof(int)), m->rb = grab(m, (CH + 1) * sizeof(int));
    m->hd = grab(m, CH * sizeof(loom_comm_handle)), m->hc = grab(m, CH * sizeof(loom_comm_handle));
    m->chunk_bytes = m->bytes - before;
    m->chunks = chunks;
    for (int c = 0; c < chunks; c++) /* tokens [c * N / chunks, (c + 1) * N / chunks) */
        for (long t = (long)c * m->N / chunks; t < (long)(c + 1) * m->N / chunks; t++)
            m->chunk_of[t] = c;
    return ok && m->cnt_send && m->cnt_recv && m->sc && m->sd && m->rc && m->rd && m->sb && m->rb &&
           m->hd && m->hc;
}

loom_status loom_moe_create(loom_moe **out, const loom_model_config *cfg,
                            const loom_param_table *table, int N, loom_comm *ep, loom_error *err) {
    *out = NULL;
    if (cfg->n_experts == 0) return LOOM_OK;
    loom_moe *m = calloc(1, sizeof *m);
    if (!m) return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: out of memory");
    m->cfg = *cfg;
    m->table = table;
    m->comm = ep && ep->size > 1 ? ep : NULL;
    m->err = err;
    m->N = N;
    m->C = cfg->d_model;
    m->F = cfg->d_ff;
    m->gpt2 = cfg->family == LOOM_FAMILY_GPT2;
    m->FC = m->gpt2 ? m->F : 2 * m->F;
    m->E = cfg->n_experts;
    m->K = cfg->top_k;
    m->ep = m->comm ? m->comm->size : 1;
    m->EL = m->E / m->ep;
    m->chunks = 1;
    m->cap =
        cfg->capacity_factor > 0 ? (int)ceil((double)cfg->capacity_factor * N * m->K / m->E) : 0;
    /* Rows a rank can receive: each source sends at most min(K, EL) rows per token to
     * it, and with a capacity at most cap per expert. */
    const int per_token = m->K < m->EL ? m->K : m->EL;
    long R = (long)m->ep * N * per_token;
    if (m->cap > 0 && (long)m->ep * m->EL * m->cap < R) R = (long)m->ep * m->EL * m->cap;
    if (R < N) R = N;
    if (R * (long)(m->FC > m->C ? m->FC : m->C) > 0x7fffffffL) {
        loom_moe_destroy(m);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "MoE: %ld expert rows per rank: too many for one collective", R);
    }
    m->R = (int)R;
    const size_t NK = (size_t)N * m->K, C = m->C, E = m->E, F = m->F, FC = m->FC;
    const size_t Rs = (size_t)R;
    /* Indexed by the table's blocks (a pipeline stage holds some layers). */
    m->layers = calloc((size_t)table->n_layer, sizeof *m->layers);
    int ok = m->layers != NULL;
    for (int l = 0; ok && l < table->n_layer; l++) {
        if (!table->blocks[l].moe) continue;
        moe_layer *L = &m->layers[l];
        L->idx = grab(m, NK * 4), L->pos = grab(m, NK * 4), L->w = grab(m, NK * 4);
        L->probs = grab(m, (size_t)N * E * 4), L->lse = grab(m, (size_t)N * 4);
        L->row = grab(m, NK * 4), L->load = grab(m, E * 4), L->kept = grab(m, E * 4);
        L->ret = grab(m, NK * C * 4);
        L->xin = grab(m, Rs * C * 4), L->h = grab(m, Rs * FC * 4), L->act = grab(m, Rs * F * 4);
        ok = L->idx && L->pos && L->w && L->probs && L->lse && L->row && L->load && L->kept &&
             L->ret && L->xin && L->h && L->act;
        if (ok && cfg->shared_expert) {
            L->sh_fc = grab(m, (size_t)N * FC * 4), L->sh_act = grab(m, (size_t)N * F * 4);
            ok = L->sh_fc && L->sh_act;
        }
    }
    if (ok) {
        m->logits = grab(m, (size_t)N * E * 4), m->dw = grab(m, NK * 4);
        m->send = grab(m, NK * C * 4), m->recv = grab(m, Rs * C * 4);
        m->ex = grab(m, Rs * C * 4), m->exd = grab(m, Rs * C * 4);
        m->dact = grab(m, Rs * F * 4), m->dh = grab(m, Rs * FC * 4);
        m->step_load = grab(m, (E + 4) * 8);
        m->chunk_of = grab(m, (size_t)N * 4), m->zoffs = grab(m, E * 4);
        ok = m->logits && m->dw && m->send && m->recv && m->ex && m->exd && m->dact && m->dh &&
             m->step_load && m->chunk_of && m->zoffs && alloc_chunks(m, 1);
    }
    if (!ok) {
        double mib = (double)m->bytes / (1 << 20);
        loom_moe_destroy(m);
        return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: cannot allocate %.1f MiB of buffers", mib);
    }
    *out = m;
    return LOOM_OK;
}

loom_status loom_moe_set_chunks(loom_moe *m, int chunks, loom_error *err) {
    if (!m && chunks != 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--moe-chunks %d: needs a mixture-of-experts model (--n-experts E)",
                              chunks);
    if (!m || chunks == m->chunks) return LOOM_OK;
    if (chunks < 1 || chunks > m->N)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--moe-chunks %d: expected 1 <= chunks <= the %d tokens of a "
                              "micro-batch",
                              chunks, m->N);
    if (!alloc_chunks(m, chunks))
        return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: out of memory for %d chunks", chunks);
    return LOOM_OK;
}

loom_status loom_moe_set_split(loom_moe *m, loom_error *err) {
    if (!m || m->split) return LOOM_OK;
    const size_t R = (size_t)m->R, N = (size_t)m->N, C = (size_t)m->C, FC = (size_t)m->FC;
    int ok = 1;
    for (int l = 0; l < m->table->n_layer && ok; l++) {
        moe_layer *L = &m->layers[l];
        if (!L->idx) continue;
        L->w_dy = grab(m, R * C * 4), L->w_dh = grab(m, R * FC * 4);
        L->w_dlogits = grab(m, N * (size_t)m->E * 4);
        ok = L->w_dy && L->w_dh && L->w_dlogits;
        if (ok && m->cfg.shared_expert) {
            L->w_sh_dy = grab(m, N * C * 4), L->w_sh_dh = grab(m, N * FC * 4);
            ok = L->w_sh_dy && L->w_sh_dh;
        }
    }
    if (!ok) return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: out of memory for split backward");
    m->split = 1;
    return LOOM_OK;
}

size_t loom_moe_bytes(const loom_moe *m) {
    return m ? m->bytes : 0;
}

void loom_moe_set_error(loom_moe *m, loom_error *err) {
    if (m) m->err = err;
}

/* Source-major [s][j][rows] <-> expert-major [j][s][rows] of one chunk (rows[s * EL + j]). */
static void reorder(const loom_moe *m, const int32_t *rows, float *dst, const float *src,
                    int to_expert_major) {
    const size_t C = (size_t)m->C;
    size_t src_row = 0;
    for (int s = 0; s < m->ep; s++)
        for (int j = 0; j < m->EL; j++) {
            /* expert-major row of block (s, j): all earlier experts, then earlier sources */
            size_t em = 0;
            for (int jj = 0; jj < m->EL; jj++)
                for (int ss = 0; ss < m->ep; ss++)
                    if (jj < j || (jj == j && ss < s)) em += (size_t)rows[ss * m->EL + jj];
            const size_t n = (size_t)rows[s * m->EL + j] * C;
            if (to_expert_major)
                memcpy(dst + em * C, src + src_row * C, n * sizeof(float));
            else
                memcpy(dst + src_row * C, src + em * C, n * sizeof(float));
            src_row += (size_t)rows[s * m->EL + j];
        }
}

/* Dispatch rows: chunk by chunk, within a chunk expert by expert (so the rows for one
 * rank are contiguous), within an expert in the capacity's slot-major order; with one
 * chunk, row = the expert's first row + its position (pos). Also the per-chunk counts. */
static void set_rows(loom_moe *m, moe_layer *L) {
    const int N = m->N, K = m->K, E = m->E;
    memset(L->ccnt, 0, (size_t)m->chunks * E * sizeof(int32_t));
    for (int j = 0; j < K; j++)
        for (int t = 0; t < N; t++) {
            const int a = t * K + j;
            L->row[a] = L->pos[a] < 0 ? -1 : L->ccnt[m->chunk_of[t] * E + L->idx[a]]++;
        }
    int32_t *base = (int32_t *)m->cnt_recv; /* scratch [chunks][E] first rows */
    int n = 0;
    for (int c = 0; c < m->chunks * E; c++) base[c] = n, n += L->ccnt[c];
    for (int a = 0; a < N * K; a++)
        if (L->row[a] >= 0) L->row[a] += base[m->chunk_of[a / K] * E + L->idx[a]];
}

/* Chunk c's all-to-all-v counts in rows x C floats: what this rank sends to each rank (by
 * expert owner) and receives from each (by source), displacements within the chunk; and
 * the chunks' first rows sent (sb) and received (rb). */
static void set_counts(loom_moe *m, const moe_layer *L) {
    m->sb[0] = m->rb[0] = 0;
    for (int c = 0; c < m->chunks; c++) {
        int sent = 0, got = 0;
        int *sc = m->sc + c * m->ep, *sd = m->sd + c * m->ep;
        int *rc = m->rc + c * m->ep, *rd = m->rd + c * m->ep;
        for (int r = 0; r < m->ep; r++) {
            int n = 0, g = 0;
            for (int j = 0; j < m->EL; j++) {
                n += L->ccnt[c * m->E + r * m->EL + j];
                g += L->rows[(c * m->ep + r) * m->EL + j];
            }
            sc[r] = n * m->C, sd[r] = sent * m->C;
            rc[r] = g * m->C, rd[r] = got * m->C;
            sent += n, got += g;
        }
        m->sb[c + 1] = m->sb[c] + sent, m->rb[c + 1] = m->rb[c] + got;
    }
}

/* Row counts per (chunk, source, local expert): one all-to-all-v before the chunks. */
static loom_status exchange_counts(loom_moe *m, moe_layer *L) {
    const int CH = m->chunks, EL = m->EL;
    if (!m->comm) {
        memcpy(L->rows, L->ccnt, (size_t)CH * m->E * sizeof(int32_t));
        return LOOM_OK;
    }
    for (int r = 0; r < m->ep; r++)
        for (int c = 0; c < CH; c++)
            for (int j = 0; j < EL; j++)
                m->cnt_send[(r * CH + c) * EL + j] = (float)L->ccnt[c * m->E + r * EL + j];
    int *one = m->sc, *dis = m->sd; /* free until set_counts */
    for (int r = 0; r < m->ep; r++) one[r] = CH * EL, dis[r] = r * CH * EL;
    loom_status st =
        loom_comm_alltoallv(m->comm, m->cnt_send, one, dis, m->cnt_recv, one, dis, m->err);
    for (int s = 0; s < m->ep; s++)
        for (int c = 0; c < CH; c++)
            for (int j = 0; j < EL; j++)
                L->rows[(c * m->ep + s) * EL + j] = (int32_t)m->cnt_recv[(s * CH + c) * EL + j];
    return st;
}

/* Starts chunk c's rows in dispatch order (send) towards their experts' owners (into
 * m->recv, source-major). */
static loom_status start_dispatch(loom_moe *m, int c, const float *send) {
    const size_t C = (size_t)m->C;
    if (!m->comm) {
        memcpy(m->recv + m->rb[c] * C, send + m->sb[c] * C,
               (size_t)(m->sb[c + 1] - m->sb[c]) * C * sizeof(float));
        return LOOM_OK;
    }
    const int o = c * m->ep;
    return loom_comm_ialltoallv(m->comm, send + m->sb[c] * C, m->sc + o, m->sd + o,
                                m->recv + m->rb[c] * C, m->rc + o, m->rd + o, &m->hd[c], m->err);
}

/* Completes chunk c's dispatch and places its rows expert-major into dst. */
static loom_status finish_dispatch(loom_moe *m, const moe_layer *L, int c, float *dst) {
    loom_status st = m->comm ? loom_comm_wait(&m->hd[c], m->err) : LOOM_OK;
    const size_t off = (size_t)m->rb[c] * m->C;
    if (!st) reorder(m, L->rows + c * m->ep * m->EL, dst + off, m->recv + off, 1);
    return st;
}

/* Starts chunk c's expert-major rows (src) back to the tokens' ranks, dispatch order
 * (out); m->recv's chunk c region (consumed by finish_dispatch) is the send buffer. */
static loom_status start_combine(loom_moe *m, const moe_layer *L, int c, const float *src,
                                 float *out) {
    const size_t C = (size_t)m->C, off = (size_t)m->rb[c] * C;
    reorder(m, L->rows + c * m->ep * m->EL, m->recv + off, src + off, 0);
    if (!m->comm) {
        memcpy(out + m->sb[c] * C, m->recv + off,
               (size_t)(m->sb[c + 1] - m->sb[c]) * C * sizeof(float));
        return LOOM_OK;
    }
    const int o = c * m->ep;
    return loom_comm_ialltoallv(m->comm, m->recv + off, m->rc + o, m->rd + o, out + m->sb[c] * C,
                                m->sc + o, m->sd + o, &m->hc[c], m->err);
}

/* Lets MPI progress the exchanges in flight (between expert GEMMs). */
static loom_status poke(loom_moe *m, int c) {
    int done;
    loom_status st = LOOM_OK;
    if (m->comm && c + 1 < m->chunks) st = loom_comm_test(&m->hd[c + 1], &done, m->err);
    if (!st && m->comm && c > 0) st = loom_comm_test(&m->hc[c - 1], &done, m->err);
    return st;
}

static loom_status finish_combines(loom_moe *m) {
    loom_status st = LOOM_OK;
    for (int c = 0; c < m->chunks && m->comm; c++) {
        loom_status s2 = loom_comm_wait(&m->hc[c], m->err);
        st = st ? st : s2;
    }
    return st;
}

/* Local expert j's rows [r0, r0 + n) within chunk c's expert-major rows. */
static int expert_rows(const loom_moe *m, const moe_layer *L, int c, int j, int *r0) {
    const int32_t *rows = L->rows + c * m->ep * m->EL;
    int start = 0, n = 0;
    for (int jj = 0; jj <= j; jj++)
        for (int s = 0; s < m->ep; s++) {
            if (jj < j)
                start += rows[s * m->EL + jj];
            else
                n += rows[s * m->EL + jj];
        }
    *r0 = m->rb[c] + start;
    return n;
}

static const float *cp(const float *flat, size_t off) {
    return off == LOOM_NO_PARAM ? NULL : flat + off;
}
static float *gp(float *flat, size_t off) {
    return off == LOOM_NO_PARAM ? NULL : flat + off;
}

/* One feed-forward expert over n rows: h = x @ fc^T (+b), act, y = act @ proj^T (+b). */
static void ffn_forward(const loom_moe *m, const loom_expert_params *e, const float *p,
                        const float *x, float *h, float *act, float *y, int n) {
    if (n == 0) return;
    loom_linear_forward(h, x, p + e->fc_w, cp(p, e->fc_b), n, m->C, m->FC);
    if (m->gpt2)
        loom_gelu_forward(act, h, (size_t)n * m->F);
    else
        loom_swiglu_forward(act, h, n, m->F);
    loom_linear_forward(y, act, p + e->proj_w, cp(p, e->proj_b), n, m->F, m->C);
}

/* The weight gradients of ffn_forward from its output gradient dy and hidden one dh. */
static void ffn_weight(const loom_moe *m, const loom_expert_params *e, float *g, const float *x,
                       const float *act, const float *dy, const float *dh, int n) {
    if (n == 0) return;
    loom_linear_backward_weight(g + e->proj_w, gp(g, e->proj_b), dy, act, n, m->F, m->C);
    loom_linear_backward_weight(g + e->fc_w, gp(g, e->fc_b), dh, x, n, m->C, m->FC);
}

/* Backward of ffn_forward: dx += d/dx; weight gradients accumulate, or with keep_dy /
 * keep_dh (split backward) dy and the hidden gradient are kept there for W. */
static void ffn_backward(loom_moe *m, const loom_expert_params *e, const float *p, float *g,
                         const float *x, const float *h, const float *act, const float *dy,
                         float *dx, int n, float *keep_dy, float *keep_dh) {
    if (n == 0) return;
    memset(m->dact, 0, (size_t)n * m->F * sizeof(float));
    loom_linear_backward_input(m->dact, dy, p + e->proj_w, n, m->F, m->C);
    float *dh = keep_dh ? keep_dh : m->dh;
    memset(dh, 0, (size_t)n * m->FC * sizeof(float));
    if (m->gpt2)
        loom_gelu_backward(dh, h, m->dact, (size_t)n * m->F);
    else
        loom_swiglu_backward(dh, m->dact, h, n, m->F);
    if (keep_dy)
        memcpy(keep_dy, dy, (size_t)n * m->C * sizeof(float));
    else
        ffn_weight(m, e, g, x, act, dy, dh, n);
    loom_linear_backward_input(dx, dh, p + e->fc_w, n, m->C, m->FC);
}

static loom_expert_params local_expert(const loom_block_params *k, int j) {
    const size_t d = (size_t)j * k->expert_stride;
    loom_expert_params e = k->expert0;
    e.fc_w += d;
    e.proj_w += d;
    if (e.fc_b != LOOM_NO_PARAM) e.fc_b += d;
    if (e.proj_b != LOOM_NO_PARAM) e.proj_b += d;
    return e;
}

loom_status loom_moe_forward(loom_moe *m, int layer, const float *p, const float *x, float *out) {
    moe_layer *L = &m->layers[layer];
    const loom_block_params *k = &m->table->blocks[layer];
    const int N = m->N, C = m->C, E = m->E, K = m->K;
    loom_linear_forward(m->logits, x, p + k->gate_w, NULL, N, C, E);
    loom_moe_router_forward(L->probs, L->idx, L->w, L->lse, m->logits, N, E, K);
    L->dropped = loom_moe_capacity(L->pos, L->load, L->kept, L->idx, N, K, E, m->cap);
    set_rows(m, L);
    loom_moe_permute(m->send, x, L->idx, L->row, m->zoffs, N, K, C);
    loom_status st = exchange_counts(m, L);
    if (st) return st;
    set_counts(m, L);
    /* Chunk c + 1's dispatch and chunk c - 1's combine are in flight while chunk c's
     * experts run: one GEMM per local expert and projection (grouped computation). The
     * collectives start in the same order on every rank. */
    if ((st = start_dispatch(m, 0, m->send))) return st;
    for (int c = 0; c < m->chunks && !st; c++) {
        if ((st = finish_dispatch(m, L, c, L->xin))) break;
        if (c + 1 < m->chunks && (st = start_dispatch(m, c + 1, m->send))) break;
        for (int j = 0; j < m->EL && !st; j++) {
            int r0;
            const int rows = expert_rows(m, L, c, j, &r0);
            const loom_expert_params e = local_expert(k, j);
            ffn_forward(m, &e, p, L->xin + (size_t)r0 * C, L->h + (size_t)r0 * m->FC,
                        L->act + (size_t)r0 * m->F, m->ex + (size_t)r0 * C, rows);
            st = poke(m, c);
        }
        if (!st) st = start_combine(m, L, c, m->ex, L->ret);
    }
    loom_status fin = finish_combines(m);
    if (st || (st = fin)) return st;
    loom_moe_combine(out, L->ret, L->w, L->idx, L->row, m->zoffs, N, K, C);
    if (m->cfg.shared_expert) {
        ffn_forward(m, &k->shared, p, x, L->sh_fc, L->sh_act, m->send, N);
        loom_add(out, out, m->send, (size_t)N * C);
    }
    /* Auxiliary losses of this micro-batch (double: order-independent enough, and they
     * are sums over a fixed order anyway). */
    double aux = 0.0, z = 0.0;
    for (int e = 0; e < E; e++) {
        double P = 0.0;
        for (int t = 0; t < N; t++) P += L->probs[(size_t)t * E + e];
        aux += (double)L->load[e] / ((double)N * K) * (P / N);
    }
    for (int t = 0; t < N; t++) z += (double)L->lse[t] * L->lse[t];
    L->aux = aux * E;
    L->zsum = z;
    L->fresh = 1;
    m->loss_term += (double)m->cfg.aux_loss_coef * L->aux * N + (double)m->cfg.z_loss_coef * z;
    return LOOM_OK;
}

loom_status loom_moe_backward(loom_moe *m, int layer, const float *p, float *g, const float *x,
                              const float *dy, float *dx) {
    moe_layer *L = &m->layers[layer];
    const loom_block_params *k = &m->table->blocks[layer];
    const int N = m->N, C = m->C, E = m->E, K = m->K;
    set_counts(m, L);
    loom_moe_combine_backward(m->send, m->dw, dy, L->ret, L->w, L->idx, L->row, m->zoffs, N, K, C);
    memset(m->exd, 0, (size_t)m->R * C * sizeof(float));
    /* The same pipeline as forward: the output gradients go to the experts, the input
     * gradients come back (into m->send, whose chunk c was sent before). */
    loom_status st = start_dispatch(m, 0, m->send);
    if (st) return st;
    for (int c = 0; c < m->chunks && !st; c++) {
        if ((st = finish_dispatch(m, L, c, m->ex))) break;
        if (c + 1 < m->chunks && (st = start_dispatch(m, c + 1, m->send))) break;
        for (int j = 0; j < m->EL && !st; j++) {
            int r0;
            const int rows = expert_rows(m, L, c, j, &r0);
            const loom_expert_params e = local_expert(k, j);
            ffn_backward(m, &e, p, g, L->xin + (size_t)r0 * C, L->h + (size_t)r0 * m->FC,
                         L->act + (size_t)r0 * m->F, m->ex + (size_t)r0 * C,
                         m->exd + (size_t)r0 * C, rows, m->split ? L->w_dy + (size_t)r0 * C : NULL,
                         m->split ? L->w_dh + (size_t)r0 * m->FC : NULL);
            st = poke(m, c);
        }
        if (!st) st = start_combine(m, L, c, m->exd, m->send);
    }
    loom_status fin = finish_combines(m);
    if (st || (st = fin)) return st;
    memset(dx, 0, (size_t)N * C * sizeof(float));
    loom_moe_unpermute_add(dx, m->send, L->idx, L->row, m->zoffs, N, K, C);
    /* Router: d(aux term)/d probs[t,e] = aux_coef * dloss * N * E * f_e / N. */
    float dprob[1024];
    const double a = (double)m->cfg.aux_loss_coef * m->dloss * E / ((double)N * K);
    for (int e = 0; e < E; e++) dprob[e] = (float)(a * L->load[e]);
    loom_moe_router_backward(m->logits, L->probs, L->idx, L->w, m->dw, L->lse, dprob,
                             m->cfg.z_loss_coef * m->dloss, N, E, K);
    if (m->split)
        memcpy(L->w_dlogits, m->logits, (size_t)N * E * sizeof(float));
    else
        loom_linear_backward_weight(g + k->gate_w, NULL, m->logits, x, N, C, E);
    loom_linear_backward_input(dx, m->logits, p + k->gate_w, N, C, E);
    if (m->cfg.shared_expert)
        ffn_backward(m, &k->shared, p, g, x, L->sh_fc, L->sh_act, dy, dx, N, L->w_sh_dy,
                     L->w_sh_dh);
    return LOOM_OK;
}

void loom_moe_backward_weight(loom_moe *m, int layer, float *g, const float *x) {
    const moe_layer *L = &m->layers[layer];
    const loom_block_params *k = &m->table->blocks[layer];
    const size_t C = (size_t)m->C, FC = (size_t)m->FC, F = (size_t)m->F;
    set_counts(m, L); /* the row offsets of this layer (shared scratch) */
    /* B's order of the sums (chunk, then local expert): the same gradients bitwise. */
    for (int c = 0; c < m->chunks; c++)
        for (int j = 0; j < m->EL; j++) {
            int r0;
            const int rows = expert_rows(m, L, c, j, &r0);
            const loom_expert_params e = local_expert(k, j);
            ffn_weight(m, &e, g, L->xin + (size_t)r0 * C, L->act + (size_t)r0 * F,
                       L->w_dy + (size_t)r0 * C, L->w_dh + (size_t)r0 * FC, rows);
        }
    loom_linear_backward_weight(g + k->gate_w, NULL, L->w_dlogits, x, m->N, m->C, m->E);
    if (m->cfg.shared_expert)
        ffn_weight(m, &k->shared, g, x, L->sh_act, L->w_sh_dy, L->w_sh_dh, m->N);
}

double loom_moe_loss_sum(loom_moe *m, float dloss, int training) {
    if (!m) return 0.0;
    /* The layers that ran since the last call (a pipeline stage's chunk, or all). */
    if (training) m->dloss = dloss;
    for (int l = 0; l < m->table->n_layer; l++) {
        moe_layer *L = &m->layers[l];
        if (!L->fresh) continue;
        L->fresh = 0;
        if (!training) continue;
        for (int e = 0; e < m->E; e++) m->step_load[e] += L->load[e];
        m->step_load[m->E] += L->dropped;
        m->step_load[m->E + 1] += L->aux;
        m->step_load[m->E + 2] += L->zsum;
        m->step_load[m->E + 3] += m->N; /* token-layers */
    }
    const double s = m->loss_term;
    m->loss_term = 0.0;
    return s;
}

void loom_moe_stats_add(loom_moe *dst, loom_moe *src) {
    if (!dst || !src || dst == src) return;
    for (int i = 0; i < dst->E + 4; i++) dst->step_load[i] += src->step_load[i];
    memset(src->step_load, 0, (size_t)(src->E + 4) * sizeof(double));
}

void loom_moe_stats_clear(loom_moe *m) {
    if (m) memset(m->step_load, 0, (size_t)(m->E + 4) * sizeof(double));
}

int loom_moe_routes(const loom_moe *m, int32_t *idx, float *gap) {
    const int N = m->N, E = m->E, K = m->K;
    int n = 0;
    for (int l = 0; l < m->table->n_layer; l++) {
        if (!m->table->blocks[l].moe) continue;
        const moe_layer *L = &m->layers[l];
        if (idx) memcpy(idx + (size_t)n * N * K, L->idx, (size_t)N * K * sizeof(int32_t));
        for (int t = 0; gap && t < N; t++) {
            const float *p = L->probs + (size_t)t * E;
            const int32_t *ix = L->idx + (size_t)t * K;
            float next = -1.0f; /* the best expert not chosen */
            for (int e = 0; e < E; e++) {
                int chosen = 0;
                for (int j = 0; j < K; j++) chosen |= ix[j] == e;
                if (!chosen && p[e] > next) next = p[e];
            }
            double g = 1.0;
            for (int j = 0; j < K; j++) {
                const double a = p[ix[j]], b = j + 1 < K ? p[ix[j + 1]] : next;
                if (b >= 0 && a > 0 && (a - b) / a < g) g = (a - b) / a;
            }
            gap[(size_t)n * N + t] = (float)g;
        }
        n++;
    }
    return n;
}

loom_status loom_moe_step_stats(loom_moe *m, loom_comm *dp, loom_moe_stats *out, loom_error *err) {
    memset(out, 0, sizeof *out);
    if (!m) return LOOM_OK;
    const int E = m->E;
    loom_status st = loom_comm_allreduce_sum_f64(dp, m->step_load, E + 4, err);
    if (st) return st;
    int n_moe = 0; /* of the whole model: the sums may come from every pipeline stage */
    for (int l = 0; l < m->cfg.n_layer; l++) n_moe += loom_model_layer_is_moe(&m->cfg, l);
    const double per = m->step_load[E + 3], tokens = per / n_moe, groups = tokens / m->N;
    /* load: assignments per token of one layer (so the mean is K/E) */
    out->load_min = out->load_max = m->step_load[0] / per;
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
        const double f = m->step_load[e] / per;
        out->load_min = f < out->load_min ? f : out->load_min;
        out->load_max = f > out->load_max ? f : out->load_max;
        sum += f;
    }
    out->load_mean = sum / E;
    out->dropped = m->step_load[E];
    out->aux_loss = m->step_load[E + 1] / groups;
    out->z_loss = m->step_load[E + 2] / tokens;
    memset(m->step_load, 0, (size_t)(E + 4) * sizeof(double));
    return LOOM_OK;
}
