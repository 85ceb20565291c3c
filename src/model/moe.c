/* The MoE block's life cycle and its forward / backward orchestration (router, then
 * chunked dispatch and experts, then combine; model/moe_router.c, moe_dispatch.c,
 * moe_experts.c), and the step statistics. */
#include "model/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_bf16.h"
#include "model/moe_impl.h"

/* A layer's expert activation from row offset off (fp32 or bf16, moe_impl.h). */
static float *act_f32(const moe_layer *L, size_t off) {
    return L->act ? L->act + off : NULL;
}
static loom_bf16 *act_bf16(const moe_layer *L, size_t off) {
    return L->act16 ? L->act16 + off : NULL;
}
static loom_act act_at(const moe_layer *L, size_t off) {
    return loom_act_of(act_f32(L, off), act_bf16(L, off));
}
/* A layer's dispatched rows from row offset off (fp32 or bf16, moe_impl.h). */
static loom_act xin_at(const moe_layer *L, size_t off) {
    return loom_act_of(L->xin ? L->xin + off : NULL, L->xin16 ? L->xin16 + off : NULL);
}
/* Forward's dispatch of chunk c: its rows as bf16 when the layer keeps them so (xin16),
 * else fp32 (m->send); finish places them expert-major into the layer's rows. */
static loom_status forward_dispatch_start(loom_moe *m, const moe_layer *L, int c) {
    return L->xin16 ? loom_moe_dispatch_start16(m, c) : loom_moe_dispatch_start(m, c, m->send);
}
static loom_status forward_dispatch_finish(loom_moe *m, const moe_layer *L, int c) {
    return L->xin16 ? loom_moe_dispatch_finish16(m, L, c, L->xin16)
                    : loom_moe_dispatch_finish(m, L, c, L->xin);
}
/* The combines carry bf16 (forward's outputs and backward's input gradients are bf16
 * values, the bf16 buffers exist, and there are other ranks: one rank copies its own
 * rows). */
static int combine16(const loom_moe *m, const moe_layer *L) {
    return m->round_out && L->xin16 && m->comm;
}
/* Chunk c's rows of buf ([rows[c], rows[c + 1]) of C floats) rounded to bf16 values in
 * place. */
static void round_chunk_rows(loom_moe *m, float *buf, const int *rows, int c) {
    const size_t C = (size_t)m->C;
    loom_backend_round_bf16_values(m->be, buf + (size_t)rows[c] * C,
                                   (size_t)(rows[c + 1] - rows[c]) * C);
}
/* Chunk c's expert-major rows (src: forward's outputs, backward's input gradients) back to
 * the tokens' ranks, into dst: under bf16 first rounded to bf16 values in every layout (as
 * autocast's down-projection and fc GEMMs give them), so that they travel as bf16. */
static loom_status combine_chunk_start(loom_moe *m, const moe_layer *L, int c, float *src,
                                       float *dst) {
    if (m->round_out) round_chunk_rows(m, src, m->rb, c);
    return combine16(m, L) ? loom_moe_combine_start16(m, L, c, src)
                           : loom_moe_combine_start(m, L, c, src, dst);
}
static loom_status combines_finish(loom_moe *m, const moe_layer *L, float *dst) {
    return combine16(m, L) ? loom_moe_combines_finish16(m, dst) : loom_moe_combines_finish(m);
}
/* Backward's dispatch carries bf16. The output gradients' readers on the experts' side are
 * the proj GEMMs, which round them anyway, and a proj bias (gpt2's experts), whose
 * gradient sums them: for those they are first rounded to bf16 values, in every layout
 * (autocast's down-projection output gradient is bf16), so that they may travel as bf16. */
static int backward_round(const loom_moe *m, const loom_block_params *k) {
    return m->round_out && k->expert0.proj_b != LOOM_NO_PARAM;
}
static int backward_dispatch16(const loom_moe *m, const moe_layer *L, const loom_block_params *k) {
    return L->xin16 && m->comm && (k->expert0.proj_b == LOOM_NO_PARAM || m->round_out);
}
static loom_status backward_dispatch_start(loom_moe *m, const moe_layer *L,
                                           const loom_block_params *k, int c) {
    if (backward_round(m, k)) round_chunk_rows(m, m->send, m->sb, c);
    return backward_dispatch16(m, L, k) ? loom_moe_dispatch_start_rounded(m, c, m->send)
                                        : loom_moe_dispatch_start(m, c, m->send);
}
static loom_status backward_dispatch_finish(loom_moe *m, const moe_layer *L,
                                            const loom_block_params *k, int c) {
    return backward_dispatch16(m, L, k) ? loom_moe_dispatch_finish_widened(m, L, c, m->ex)
                                        : loom_moe_dispatch_finish(m, L, c, m->ex);
}
static loom_act sh_act(const moe_layer *L) {
    return loom_act_of(L->sh_act, L->sh_act16);
}

void *loom_moe_grab(loom_moe *m, size_t bytes) {
    m->bytes += bytes;
    void *p = loom_backend_alloc(m->be, bytes ? bytes : 1);
    if (p) loom_backend_memset(m->be, p, 0, bytes ? bytes : 1);
    return p;
}

void *loom_moe_grab_host(loom_moe *m, size_t bytes) {
    m->bytes += bytes;
    return calloc(1, bytes ? bytes : 1);
}

static void drop(const loom_moe *m, void *p) {
    loom_backend_free(m->be, p);
}

void loom_moe_destroy(loom_moe *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->table->n_layer; l++) {
            moe_layer *L = &m->layers[l];
            drop(m, L->idx), drop(m, L->pos), drop(m, L->w), drop(m, L->probs), drop(m, L->lse);
            drop(m, L->row), drop(m, L->load), drop(m, L->kept), drop(m, L->ret);
            free(L->ccnt), free(L->rows);
            drop(m, L->xin), drop(m, L->h), drop(m, L->act), drop(m, L->sh_fc), drop(m, L->sh_act);
            drop(m, L->act16), drop(m, L->sh_act16), drop(m, L->xin16);
            drop(m, L->w_dy), drop(m, L->w_dh), drop(m, L->w_dlogits), drop(m, L->w_sh_dy);
            drop(m, L->w_sh_dh);
        }
    free(m->layers);
    drop(m, m->logits), drop(m, m->dw), drop(m, m->send), drop(m, m->recv), drop(m, m->ex);
    drop(m, m->exd), drop(m, m->dact), drop(m, m->dh), drop(m, m->zoffs);
    drop(m, m->send16), drop(m, m->recv16);
    free(m->cnt_send), free(m->cnt_recv);
    free(m->sc), free(m->sd), free(m->rc), free(m->rd), free(m->step_load);
    free(m->chunk_of), free(m->sb), free(m->rb), free(m->hd), free(m->hc);
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
        L->ccnt = loom_moe_grab_host(m, CH * E * 4), L->rows = loom_moe_grab_host(m, CH * E * 4);
        ok = ok && L->ccnt && L->rows;
    }
    free(m->cnt_send), free(m->cnt_recv), free(m->sc), free(m->sd), free(m->rc), free(m->rd);
    free(m->sb), free(m->rb), free(m->hd), free(m->hc);
    m->cnt_send = loom_moe_grab_host(m, CH * E * 4);
    m->cnt_recv = loom_moe_grab_host(m, CH * E * 4);
    m->sc = loom_moe_grab_host(m, CH * ep * 4), m->sd = loom_moe_grab_host(m, CH * ep * 4);
    m->rc = loom_moe_grab_host(m, CH * ep * 4), m->rd = loom_moe_grab_host(m, CH * ep * 4);
    m->sb = loom_moe_grab_host(m, (CH + 1) * sizeof(int));
    m->rb = loom_moe_grab_host(m, (CH + 1) * sizeof(int));
    m->hd = loom_moe_grab_host(m, CH * sizeof(loom_comm_handle));
    m->hc = loom_moe_grab_host(m, CH * sizeof(loom_comm_handle));
    m->chunk_bytes = m->bytes - before;
    m->chunks = chunks;
    for (int c = 0; c < chunks; c++) /* tokens [c * N / chunks, (c + 1) * N / chunks) */
        for (long t = (long)c * m->N / chunks; t < (long)(c + 1) * m->N / chunks; t++)
            m->chunk_of[t] = c;
    return ok && m->cnt_send && m->cnt_recv && m->sc && m->sd && m->rc && m->rd && m->sb && m->rb &&
           m->hd && m->hc;
}

loom_status loom_moe_create(loom_moe **out, const loom_model_config *cfg,
                            const loom_param_table *table, int N, loom_comm *ep,
                            const loom_backend *be, loom_error *err) {
    *out = NULL;
    if (cfg->n_experts == 0) return LOOM_OK;
    loom_moe *m = calloc(1, sizeof *m);
    if (!m) return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: out of memory");
    m->cfg = *cfg;
    m->be = be ? be : loom_backend_cpu();
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
    const int a16 = loom_backend_bf16_activations(m->be); /* the experts' act in bf16 */
    m->round_out = loom_backend_precision(m->be) == LOOM_PRECISION_BF16 &&
                   m->be->ops->round_bf16_values != NULL;
    /* Indexed by the table's blocks (a pipeline stage holds some layers). */
    m->layers = calloc((size_t)table->n_layer, sizeof *m->layers);
    int ok = m->layers != NULL;
    for (int l = 0; ok && l < table->n_layer; l++) {
        if (!table->blocks[l].moe) continue;
        moe_layer *L = &m->layers[l];
        L->idx = loom_moe_grab(m, NK * 4), L->pos = loom_moe_grab(m, NK * 4);
        L->w = loom_moe_grab(m, NK * 4);
        L->probs = loom_moe_grab(m, (size_t)N * E * 4), L->lse = loom_moe_grab(m, (size_t)N * 4);
        L->row = loom_moe_grab(m, NK * 4), L->load = loom_moe_grab(m, E * 4);
        L->kept = loom_moe_grab(m, E * 4);
        L->ret = loom_moe_grab(m, NK * C * 4);
        L->h = loom_moe_grab(m, Rs * FC * 4);
        if (a16)
            L->act16 = loom_moe_grab(m, Rs * F * 2), L->xin16 = loom_moe_grab(m, Rs * C * 2);
        else
            L->act = loom_moe_grab(m, Rs * F * 4), L->xin = loom_moe_grab(m, Rs * C * 4);
        ok = L->idx && L->pos && L->w && L->probs && L->lse && L->row && L->load && L->kept &&
             L->ret && (L->xin || L->xin16) && L->h && (L->act || L->act16);
        if (ok && cfg->shared_expert) {
            L->sh_fc = loom_moe_grab(m, (size_t)N * FC * 4);
            if (a16)
                L->sh_act16 = loom_moe_grab(m, (size_t)N * F * 2);
            else
                L->sh_act = loom_moe_grab(m, (size_t)N * F * 4);
            ok = L->sh_fc && (L->sh_act || L->sh_act16);
        }
    }
    if (ok) {
        m->logits = loom_moe_grab(m, (size_t)N * E * 4), m->dw = loom_moe_grab(m, NK * 4);
        m->send = loom_moe_grab(m, NK * C * 4), m->recv = loom_moe_grab(m, Rs * C * 4);
        m->ex = loom_moe_grab(m, Rs * C * 4), m->exd = loom_moe_grab(m, Rs * C * 4);
        m->dact = loom_moe_grab(m, Rs * F * 4), m->dh = loom_moe_grab(m, Rs * FC * 4);
        if (a16) m->send16 = loom_moe_grab(m, NK * C * 2), m->recv16 = loom_moe_grab(m, Rs * C * 2);
        m->step_load = loom_moe_grab_host(m, (E + 4) * 8);
        m->chunk_of = loom_moe_grab_host(m, (size_t)N * 4), m->zoffs = loom_moe_grab(m, E * 4);
        ok = m->logits && m->dw && m->send && m->recv && m->ex && m->exd && m->dact && m->dh &&
             m->step_load && m->chunk_of && m->zoffs && (!a16 || (m->send16 && m->recv16)) &&
             alloc_chunks(m, 1);
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

loom_status loom_moe_set_cp(loom_moe *m, loom_comm *cp, loom_error *err) {
    if (!m || !cp || cp->size == 1) return LOOM_OK;
    for (int l = 0; l < m->table->n_layer; l++) {
        moe_layer *L = &m->layers[l];
        if (!L->idx || L->gload) continue;
        if (!(L->gload = loom_moe_grab_host(m, 2 * (size_t)m->E * sizeof(double))))
            return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: out of memory (--cp statistics)");
    }
    m->cp = cp;
    return LOOM_OK;
}

loom_status loom_moe_set_split(loom_moe *m, loom_error *err) {
    if (!m || m->split) return LOOM_OK;
    const size_t R = (size_t)m->R, N = (size_t)m->N, C = (size_t)m->C, FC = (size_t)m->FC;
    int ok = 1;
    for (int l = 0; l < m->table->n_layer && ok; l++) {
        moe_layer *L = &m->layers[l];
        if (!L->idx) continue;
        L->w_dy = loom_moe_grab(m, R * C * 4), L->w_dh = loom_moe_grab(m, R * FC * 4);
        L->w_dlogits = loom_moe_grab(m, N * (size_t)m->E * 4);
        ok = L->w_dy && L->w_dh && L->w_dlogits;
        if (ok && m->cfg.shared_expert) {
            L->w_sh_dy = loom_moe_grab(m, N * C * 4), L->w_sh_dh = loom_moe_grab(m, N * FC * 4);
            ok = L->w_sh_dy && L->w_sh_dh;
        }
    }
    if (!ok) return loom_error_set(err, LOOM_ERR_NOMEM, "MoE: out of memory for split backward");
    m->split = 1;
    return LOOM_OK;
}

void loom_moe_sent_bytes(const loom_moe *m, double sent[4]) {
    sent[0] = m ? m->sent_dispatch16 : 0.0;
    sent[1] = m ? m->sent_dispatch32 : 0.0;
    sent[2] = m ? m->sent_combine16 : 0.0;
    sent[3] = m ? m->sent_combine32 : 0.0;
}

size_t loom_moe_bytes(const loom_moe *m) {
    return m ? m->bytes : 0;
}

void loom_moe_set_error(loom_moe *m, loom_error *err) {
    if (m) m->err = err;
}

loom_status loom_moe_forward(loom_moe *m, int layer, const float *p, const float *x, float *out) {
    moe_layer *L = &m->layers[layer];
    const loom_block_params *k = &m->table->blocks[layer];
    const int N = m->N, C = m->C, K = m->K;
    loom_moe_route(m, L, k, p, x);
    loom_backend_moe_permute(m->be, m->send, x, L->idx, L->row, m->zoffs, N, K, C);
    loom_status st = loom_moe_exchange_counts(m, L);
    if (st) return st;
    loom_moe_set_counts(m, L);
    /* bf16: the rows rounded once (what the fc GEMM reads) and sent as bf16 */
    if (L->xin16) loom_backend_round_bf16(m->be, m->send16, m->send, (size_t)m->sb[m->chunks] * C);
    /* Chunk c + 1's dispatch and chunk c - 1's combine are in flight while chunk c's
     * experts run: one GEMM per local expert and projection (grouped computation). The
     * collectives start in the same order on every rank. */
    if ((st = forward_dispatch_start(m, L, 0))) return st;
    for (int c = 0; c < m->chunks && !st; c++) {
        if ((st = forward_dispatch_finish(m, L, c))) break;
        if (c + 1 < m->chunks && (st = forward_dispatch_start(m, L, c + 1))) break;
        for (int j = 0; j < m->EL && !st; j++) {
            int r0;
            const int rows = loom_moe_expert_rows(m, L, c, j, &r0);
            const loom_expert_params e = loom_moe_local_expert(k, j);
            loom_moe_ffn_forward(m, &e, p, xin_at(L, (size_t)r0 * C), L->h + (size_t)r0 * m->FC,
                                 act_f32(L, (size_t)r0 * m->F), act_bf16(L, (size_t)r0 * m->F),
                                 m->ex + (size_t)r0 * C, rows);
            st = loom_moe_poke(m, c);
        }
        if (!st) st = combine_chunk_start(m, L, c, m->ex, L->ret);
    }
    loom_status fin = combines_finish(m, L, L->ret);
    if (st || (st = fin)) return st;
    loom_backend_moe_combine(m->be, out, L->ret, L->w, L->idx, L->row, m->zoffs, N, K, C);
    if (m->cfg.shared_expert) {
        loom_moe_ffn_forward(m, &k->shared, p, loom_act_f32(x), L->sh_fc, L->sh_act, L->sh_act16,
                             m->send, N);
        loom_backend_add(m->be, out, out, m->send, (size_t)N * C);
    }
    return loom_moe_router_losses(m, L);
}

loom_status loom_moe_backward(loom_moe *m, int layer, const float *p, float *g, const float *x,
                              const float *dy, float *dx) {
    moe_layer *L = &m->layers[layer];
    const loom_block_params *k = &m->table->blocks[layer];
    const int N = m->N, C = m->C, K = m->K;
    loom_moe_set_counts(m, L);
    loom_backend_moe_combine_backward(m->be, m->send, m->dw, dy, L->ret, L->w, L->idx, L->row,
                                      m->zoffs, N, K, C);
    loom_backend_memset(m->be, m->exd, 0, (size_t)m->R * C * sizeof(float));
    /* The same pipeline as forward: the output gradients go to the experts, the input
     * gradients come back (into m->send, whose chunk c was sent before). */
    loom_status st = backward_dispatch_start(m, L, k, 0);
    if (st) return st;
    for (int c = 0; c < m->chunks && !st; c++) {
        if ((st = backward_dispatch_finish(m, L, k, c))) break;
        if (c + 1 < m->chunks && (st = backward_dispatch_start(m, L, k, c + 1))) break;
        for (int j = 0; j < m->EL && !st; j++) {
            int r0;
            const int rows = loom_moe_expert_rows(m, L, c, j, &r0);
            const loom_expert_params e = loom_moe_local_expert(k, j);
            loom_moe_ffn_backward(m, &e, p, g, xin_at(L, (size_t)r0 * C), L->h + (size_t)r0 * m->FC,
                                  act_at(L, (size_t)r0 * m->F), m->ex + (size_t)r0 * C,
                                  m->exd + (size_t)r0 * C, rows,
                                  m->split ? L->w_dy + (size_t)r0 * C : NULL,
                                  m->split ? L->w_dh + (size_t)r0 * m->FC : NULL);
            st = loom_moe_poke(m, c);
        }
        if (!st) st = combine_chunk_start(m, L, c, m->exd, m->send);
    }
    loom_status fin = combines_finish(m, L, m->send);
    if (st || (st = fin)) return st;
    loom_backend_memset(m->be, dx, 0, (size_t)N * C * sizeof(float));
    loom_backend_moe_unpermute_add(m->be, dx, m->send, L->idx, L->row, m->zoffs, N, K, C);
    loom_moe_router_backward_into(m, L, k, p, g, x, dx);
    if (m->cfg.shared_expert)
        loom_moe_ffn_backward(m, &k->shared, p, g, loom_act_f32(x), L->sh_fc, sh_act(L), dy, dx, N,
                              L->w_sh_dy, L->w_sh_dh);
    return LOOM_OK;
}

void loom_moe_backward_weight(loom_moe *m, int layer, float *g, const float *x) {
    const moe_layer *L = &m->layers[layer];
    const loom_block_params *k = &m->table->blocks[layer];
    const size_t C = (size_t)m->C, FC = (size_t)m->FC, F = (size_t)m->F;
    loom_moe_set_counts(m, L); /* the row offsets of this layer (shared scratch) */
    /* B's order of the sums (chunk, then local expert): the same gradients bitwise. */
    for (int c = 0; c < m->chunks; c++)
        for (int j = 0; j < m->EL; j++) {
            int r0;
            const int rows = loom_moe_expert_rows(m, L, c, j, &r0);
            const loom_expert_params e = loom_moe_local_expert(k, j);
            loom_moe_ffn_weight(m, &e, g, xin_at(L, (size_t)r0 * C), act_at(L, (size_t)r0 * F),
                                L->w_dy + (size_t)r0 * C, L->w_dh + (size_t)r0 * FC, rows);
        }
    loom_linear_backward(m->be, NULL, LOOM_DX_SET, L->w_dlogits, NULL, g + k->gate_w, NULL, x, m->N,
                         m->C, m->E);
    if (m->cfg.shared_expert)
        loom_moe_ffn_weight(m, &k->shared, g, loom_act_f32(x), sh_act(L), L->w_sh_dy, L->w_sh_dh,
                            m->N);
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
