/* MoE dispatch: the dispatch rows of each assignment, the all-to-all-v counts, the
 * chunked exchange of rows to the experts' owners and back (non-blocking, so a chunk's
 * experts run while the next chunk travels), and the source/expert-major reorder. */
#include <string.h>

#include "kernels/backend_bf16.h"
#include "model/moe_impl.h"

/* Source-major [s][j][rows] <-> expert-major [j][s][rows] of one chunk (rows[s * EL + j]);
 * rows of C elements of es bytes (fp32 or bf16). */
static void reorder(const loom_moe *m, const int32_t *rows, void *dst_rows, const void *src_rows,
                    int to_expert_major, size_t es) {
    const size_t C = (size_t)m->C * es; /* bytes of a row */
    char *dst = dst_rows;
    const char *src = src_rows;
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
                loom_backend_copy(m->be, dst + em * C, src + src_row * C, n);
            else
                loom_backend_copy(m->be, dst + src_row * C, src + em * C, n);
            src_row += (size_t)rows[s * m->EL + j];
        }
}

/* Dispatch rows: chunk by chunk, within a chunk expert by expert (so the rows for one
 * rank are contiguous), within an expert in the capacity's slot-major order; with one
 * chunk, row = the expert's first row + its position (pos). Also the per-chunk counts. */
void loom_moe_set_rows(loom_moe *m, moe_layer *L) {
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
void loom_moe_set_counts(loom_moe *m, const moe_layer *L) {
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
loom_status loom_moe_exchange_counts(loom_moe *m, moe_layer *L) {
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

/* What this rank sends to the other ep ranks of chunk c, in elements (count: sc or rc). */
static double sent_elements(const loom_moe *m, const int *counts) {
    double n = 0;
    for (int r = 0; r < m->ep; r++)
        if (r != m->comm->rank) n += counts[r];
    return n;
}

/* Starts chunk c's rows in dispatch order (send) towards their experts' owners (into
 * recv, source-major); rows of es-byte elements (4: fp32, 2: bf16). */
static loom_status start_rows(loom_moe *m, int c, const void *send, void *recv, size_t es) {
    const size_t C = (size_t)m->C * es;
    const char *from = (const char *)send + m->sb[c] * C;
    char *to = (char *)recv + m->rb[c] * C;
    if (!m->comm) {
        loom_backend_copy(m->be, to, from, (size_t)(m->sb[c + 1] - m->sb[c]) * C);
        return LOOM_OK;
    }
    const int o = c * m->ep;
    if (es == sizeof(float)) {
        m->sent_dispatch32 += 4.0 * sent_elements(m, m->sc + o);
        return loom_comm_ialltoallv(m->comm, (const float *)from, m->sc + o, m->sd + o, (float *)to,
                                    m->rc + o, m->rd + o, &m->hd[c], m->err);
    }
    m->sent_dispatch16 += 2.0 * sent_elements(m, m->sc + o);
    return loom_comm_ialltoallv_bf16(m->comm, (const loom_bf16 *)from, m->sc + o, m->sd + o,
                                     (loom_bf16 *)to, m->rc + o, m->rd + o, &m->hd[c], m->err);
}

loom_status loom_moe_dispatch_start(loom_moe *m, int c, const float *send) {
    return start_rows(m, c, send, m->recv, sizeof(float));
}

loom_status loom_moe_dispatch_start16(loom_moe *m, int c) {
    return start_rows(m, c, m->send16, m->recv16, sizeof(loom_bf16));
}

/* Completes chunk c's dispatch and places its rows (recv) expert-major into dst. */
static loom_status finish_rows(loom_moe *m, const moe_layer *L, int c, void *dst, const void *recv,
                               size_t es) {
    loom_status st = m->comm ? loom_comm_wait(&m->hd[c], m->err) : LOOM_OK;
    const size_t off = (size_t)m->rb[c] * m->C * es;
    if (!st)
        reorder(m, L->rows + c * m->ep * m->EL, (char *)dst + off, (const char *)recv + off, 1, es);
    return st;
}

loom_status loom_moe_dispatch_finish(loom_moe *m, const moe_layer *L, int c, float *dst) {
    return finish_rows(m, L, c, dst, m->recv, sizeof(float));
}

loom_status loom_moe_dispatch_finish16(loom_moe *m, const moe_layer *L, int c, loom_bf16 *dst) {
    return finish_rows(m, L, c, dst, m->recv16, sizeof(loom_bf16));
}

/* Backward's bf16 dispatch: send16 and recv16 are free in backward (forward's rows live in
 * xin16, its combine was widened into ret). */
loom_status loom_moe_dispatch_start_rounded(loom_moe *m, int c, const float *send) {
    const size_t C = (size_t)m->C;
    loom_backend_round_bf16(m->be, m->send16 + m->sb[c] * C, send + m->sb[c] * C,
                            (size_t)(m->sb[c + 1] - m->sb[c]) * C);
    return start_rows(m, c, m->send16, m->recv16, sizeof(loom_bf16));
}

loom_status loom_moe_dispatch_finish_widened(loom_moe *m, const moe_layer *L, int c, float *dst) {
    loom_status st = loom_comm_wait(&m->hd[c], m->err);
    const size_t C = (size_t)m->C, off = (size_t)m->rb[c] * C;
    if (st) return st;
    loom_backend_widen_bf16(m->be, m->recv + off, m->recv16 + off,
                            (size_t)(m->rb[c + 1] - m->rb[c]) * C);
    reorder(m, L->rows + c * m->ep * m->EL, dst + off, m->recv + off, 1, sizeof(float));
    return LOOM_OK;
}

/* Starts chunk c's expert-major rows (src) back to the tokens' ranks, dispatch order
 * (out); m->recv's chunk c region (consumed by finish_dispatch) is the send buffer. */
loom_status loom_moe_combine_start(loom_moe *m, const moe_layer *L, int c, const float *src,
                                   float *out) {
    const size_t C = (size_t)m->C, off = (size_t)m->rb[c] * C;
    reorder(m, L->rows + c * m->ep * m->EL, m->recv + off, src + off, 0, sizeof(float));
    if (!m->comm) {
        loom_backend_copy(m->be, out + m->sb[c] * C, m->recv + off,
                          (size_t)(m->sb[c + 1] - m->sb[c]) * C * sizeof(float));
        return LOOM_OK;
    }
    const int o = c * m->ep;
    m->sent_combine32 += 4.0 * sent_elements(m, m->rc + o);
    return loom_comm_ialltoallv(m->comm, m->recv + off, m->rc + o, m->rd + o, out + m->sb[c] * C,
                                m->sc + o, m->sd + o, &m->hc[c], m->err);
}

/* m->recv's chunk c region is free in a bf16 forward (its dispatch used recv16), as are
 * recv16's (reordered into xin16) and send16's (sent, and the send completed); in
 * backward the same (its dispatch's rows, fp32 or widened, were reordered out of recv). */
loom_status loom_moe_combine_start16(loom_moe *m, const moe_layer *L, int c, const float *src) {
    const size_t C = (size_t)m->C, off = (size_t)m->rb[c] * C;
    reorder(m, L->rows + c * m->ep * m->EL, m->recv + off, src + off, 0, sizeof(float));
    /* bf16 values already: this rounding is exact */
    loom_backend_round_bf16(m->be, m->recv16 + off, m->recv + off,
                            (size_t)(m->rb[c + 1] - m->rb[c]) * C);
    const int o = c * m->ep;
    m->sent_combine16 += 2.0 * sent_elements(m, m->rc + o);
    return loom_comm_ialltoallv_bf16(m->comm, m->recv16 + off, m->rc + o, m->rd + o,
                                     m->send16 + m->sb[c] * C, m->sc + o, m->sd + o, &m->hc[c],
                                     m->err);
}

loom_status loom_moe_combines_finish16(loom_moe *m, float *out) {
    loom_status st = loom_moe_combines_finish(m);
    if (!st)
        loom_backend_widen_bf16(m->be, out, m->send16, (size_t)m->sb[m->chunks] * (size_t)m->C);
    return st;
}

/* Lets MPI progress the exchanges in flight (between expert GEMMs). */
loom_status loom_moe_poke(loom_moe *m, int c) {
    int done;
    loom_status st = LOOM_OK;
    if (m->comm && c + 1 < m->chunks) st = loom_comm_test(&m->hd[c + 1], &done, m->err);
    if (!st && m->comm && c > 0) st = loom_comm_test(&m->hc[c - 1], &done, m->err);
    return st;
}

loom_status loom_moe_combines_finish(loom_moe *m) {
    loom_status st = LOOM_OK;
    for (int c = 0; c < m->chunks && m->comm; c++) {
        loom_status s2 = loom_comm_wait(&m->hc[c], m->err);
        st = st ? st : s2;
    }
    return st;
}

/* Local expert j's rows [r0, r0 + n) within chunk c's expert-major rows. */
int loom_moe_expert_rows(const loom_moe *m, const moe_layer *L, int c, int j, int *r0) {
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
