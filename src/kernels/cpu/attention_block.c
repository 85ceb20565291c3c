/* Blockwise attention for ring context parallelism (kernels.h "Blockwise attention"):
 * the queries of a rank against one key/value block, with the causal mask taken from
 * the GLOBAL positions of the chunks, a log-sum-exp merge of partial results, and the
 * block's share of the gradient from the final lse. The same scheme as attention.c:
 * OpenBLAS GEMMs on strided views, per-thread scratch for one query chunk's scores,
 * softmax rows in LOOM_SIMD helpers. Per (query chunk, key chunk) pair only the visible
 * key prefix of each 64-row block is computed (a pair with no visible key costs nothing,
 * a fully visible one has no mask). */
#include "kernels/kernels.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "vecmath.h"

#define LOOM_ATTN_BLOCK_ROWS 64

size_t loom_attention_block_scratch_floats(int chunk, int nk) {
    return 2 * (size_t)chunk * (size_t)chunk * (size_t)nk * (size_t)omp_get_max_threads();
}

/* Keys of the chunk starting at kp visible to the query at position qp. */
static inline int visible(const loom_attention_blocks *g, int qp, int kp) {
    if (!g->causal) return g->chunk;
    int n = qp - kp + 1;
    return n < 0 ? 0 : n > g->chunk ? g->chunk : n;
}

/* Rows per block for query chunk jq: 64 when some key chunk is partially visible (so the
 * masked part is skipped), else the whole chunk (fewer, larger GEMMs). */
static int rows_per_block(const loom_attention_blocks *g, int jq) {
    int q0 = g->qpos[jq], q1 = q0 + g->chunk - 1;
    for (int c = 0; c < g->nk; c++) {
        int lo = visible(g, q0, g->kpos[c]), hi = visible(g, q1, g->kpos[c]);
        if (hi > 0 && lo < g->chunk) return LOOM_ATTN_BLOCK_ROWS;
    }
    return g->chunk;
}

/* Strided views of one (query chunk, sample, query head) against the block. */
typedef struct {
    const float *q;           /* query rows, stride R */
    const float *k[2], *v[2]; /* per key chunk, stride KR */
    size_t R, KR, OC;         /* qkv, kv and out row strides */
    size_t seg;               /* segment jq*B + b */
} blk_view;

static blk_view blk_view_make(const float *qkv, const float *kv, const loom_attention_blocks *g,
                              int jq, int b, int h) {
    blk_view a;
    a.R = (size_t)(g->H + 2 * g->KV) * g->hd;
    a.KR = (size_t)2 * g->KV * g->hd;
    a.OC = (size_t)g->H * g->hd;
    a.seg = (size_t)jq * g->B + b;
    int kvh = h / (g->H / g->KV);
    a.q = qkv + a.seg * g->chunk * a.R + (size_t)h * g->hd;
    for (int c = 0; c < g->nk; c++) {
        const float *base = kv + ((size_t)c * g->B + b) * g->chunk * a.KR;
        a.k[c] = base + (size_t)kvh * g->hd;
        a.v[c] = base + (size_t)(g->KV + kvh) * g->hd;
    }
    return a;
}

/* Visible width of key chunk c for rows [r0, r1): the last row sees the most. */
static void block_widths(int *w, const loom_attention_blocks *g, int jq, int r1) {
    for (int c = 0; c < g->nk; c++) w[c] = visible(g, g->qpos[jq] + r1 - 1, g->kpos[c]);
}

/* S[r0:r1, c*chunk : c*chunk + w_c] = scale * Q[r0:r1] K_c[0:w_c]^T (row stride W). */
static void block_scores(float *S, size_t W, const blk_view *a, const loom_attention_blocks *g,
                         int r0, int r1, const int *w, float scale) {
    for (int c = 0; c < g->nk; c++)
        if (w[c] > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, w[c], g->hd, scale,
                        a->q + r0 * a->R, (int)a->R, a->k[c], (int)a->KR, 0.0f,
                        S + (size_t)r0 * W + (size_t)c * g->chunk, (int)W);
}

/* Softmax of rows [r0, r1) over their visible keys of every chunk; lse saved (-inf for a
 * row that sees nothing). Entries up to the block width w_c that the row may not see are
 * zeroed, so the P @ V GEMMs can read them. */
LOOM_SIMD static void block_softmax_rows(float *S, size_t W, float *lse,
                                         const loom_attention_blocks *g, int jq, int r0, int r1,
                                         const int *w) {
    const int chunk = g->chunk, nk = g->nk;
    for (int i = r0; i < r1; i++) {
        float *row = S + (size_t)i * W;
        int n[2] = {0, 0};
        float m = -INFINITY;
        for (int c = 0; c < nk; c++) {
            n[c] = visible(g, g->qpos[jq] + i, g->kpos[c]);
            if (n[c] > 0) {
                float mc = loom_max_f32(row + (size_t)c * chunk, n[c]);
                m = mc > m ? mc : m;
            }
        }
        double sum = 0.0;
        for (int c = 0; c < nk; c++) {
            float *restrict p = row + (size_t)c * chunk;
            for (int j = 0; j < n[c]; j++) p[j] = loom_expf(p[j] - m);
            sum += loom_sum_f64(p, n[c]);
        }
        if (sum > 0.0) {
            float inv = (float)(1.0 / sum);
            for (int c = 0; c < nk; c++) {
                float *restrict p = row + (size_t)c * chunk;
                for (int j = 0; j < n[c]; j++) p[j] *= inv;
            }
            lse[i] = (float)((double)m + log(sum));
        } else {
            lse[i] = -INFINITY;
        }
        for (int c = 0; c < nk; c++)
            for (int j = n[c]; j < w[c]; j++) row[(size_t)c * chunk + j] = 0.0f;
    }
}

void loom_attention_block_forward(float *out, float *lse, const float *qkv, const float *kv,
                                  float *scratch, const loom_attention_blocks *g) {
    const float scale = (float)(1.0 / sqrt((double)g->hd));
    const int chunk = g->chunk, tasks = g->nq * g->B * g->H;
    const size_t W = (size_t)g->nk * chunk;
#pragma omp parallel for schedule(dynamic)
    for (int task = 0; task < tasks; task++) {
        int h = task % g->H, seg = task / g->H, jq = seg / g->B, b = seg % g->B;
        float *S = scratch + 2 * (size_t)chunk * W * omp_get_thread_num();
        blk_view a = blk_view_make(qkv, kv, g, jq, b, h);
        float *o = out + a.seg * chunk * a.OC + (size_t)h * g->hd;
        float *l = lse + (a.seg * g->H + h) * chunk;
        const int rb = rows_per_block(g, jq);
        for (int r0 = 0; r0 < chunk; r0 += rb) {
            int r1 = r0 + rb < chunk ? r0 + rb : chunk, w[2] = {0, 0}, first = 1;
            block_widths(w, g, jq, r1);
            block_scores(S, W, &a, g, r0, r1, w, scale);
            block_softmax_rows(S, W, l, g, jq, r0, r1, w);
            for (int c = 0; c < g->nk; c++) {
                if (w[c] == 0) continue;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, g->hd, w[c], 1.0f,
                            S + (size_t)r0 * W + (size_t)c * chunk, (int)W, a.v[c], (int)a.KR,
                            first ? 0.0f : 1.0f, o + r0 * a.OC, (int)a.OC);
                first = 0;
            }
            if (first) /* no key of the block is visible to these rows */
                for (int i = r0; i < r1; i++) memset(o + i * a.OC, 0, sizeof(float) * g->hd);
        }
    }
}

/* One (segment, head) slice of the merge: rows of hd floats at stride OC. */
LOOM_SIMD static void merge_rows(float *o, float *l, const float *ob, const float *lb, size_t OC,
                                 int rows, int hd) {
    for (int i = 0; i < rows; i++) {
        float *restrict y = o + i * OC;
        const float *restrict yb = ob + i * OC;
        double a = l[i], b = lb[i];
        if (b == -INFINITY) continue; /* the block gave this row nothing */
        if (a == -INFINITY) {
            memcpy(y, yb, sizeof(float) * hd);
            l[i] = lb[i];
            continue;
        }
        double mx = a > b ? a : b, lse = mx + log(exp(a - mx) + exp(b - mx));
        float wa = (float)exp(a - lse), wb = (float)exp(b - lse);
        for (int c = 0; c < hd; c++) y[c] = y[c] * wa + yb[c] * wb;
        l[i] = (float)lse;
    }
}

void loom_attention_block_merge(float *out, float *lse, const float *out_b, const float *lse_b,
                                const loom_attention_blocks *g) {
    const int tasks = g->nq * g->B * g->H, chunk = g->chunk;
    const size_t OC = (size_t)g->H * g->hd;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; task++) {
        size_t h = (size_t)(task % g->H), seg = (size_t)(task / g->H);
        size_t o = seg * chunk * OC + h * g->hd, l = (seg * g->H + h) * chunk;
        merge_rows(out + o, lse + l, out_b + o, lse_b + l, OC, chunk, g->hd);
    }
}

void loom_attention_block_delta(float *D, const float *dout, const float *out,
                                const loom_attention_blocks *g) {
    const int tasks = g->nq * g->B * g->H, chunk = g->chunk, hd = g->hd;
    const size_t OC = (size_t)g->H * hd;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; task++) {
        size_t h = (size_t)(task % g->H), seg = (size_t)(task / g->H);
        const float *dy = dout + seg * chunk * OC + h * hd, *y = out + seg * chunk * OC + h * hd;
        float *d = D + (seg * g->H + h) * chunk;
        for (int i = 0; i < chunk; i++) {
            double acc = 0.0;
            for (int c = 0; c < hd; c++) acc += (double)dy[i * OC + c] * y[i * OC + c];
            d[i] = (float)acc;
        }
    }
}

/* P = exp(S - lse) and dS = scale * P * (dP - D) over the visible keys of rows [r0, r1);
 * invisible entries up to the block widths zeroed. */
LOOM_SIMD static void block_softmax_backward_rows(float *P, float *dP, size_t W, const float *lse,
                                                  const float *D, const loom_attention_blocks *g,
                                                  int jq, int r0, int r1, const int *w,
                                                  float scale) {
    const int chunk = g->chunk;
    for (int i = r0; i < r1; i++) {
        float l = lse[i], Di = D[i];
        for (int c = 0; c < g->nk; c++) {
            float *restrict p = P + (size_t)i * W + (size_t)c * chunk;
            float *restrict dp = dP + (size_t)i * W + (size_t)c * chunk;
            int n = l == -INFINITY ? 0 : visible(g, g->qpos[jq] + i, g->kpos[c]);
            for (int j = 0; j < n; j++) {
                p[j] = loom_expf(p[j] - l);
                dp[j] = scale * p[j] * (dp[j] - Di);
            }
            for (int j = n; j < w[c]; j++) p[j] = dp[j] = 0.0f;
        }
    }
}

/* One query chunk x one query head of the task's (sample, key/value head). */
static void block_backward_head(float *dqkv, float *dkv, float *P, float *dS, const float *dout,
                                const float *qkv, const float *kv, const float *lse, const float *D,
                                const loom_attention_blocks *g, int jq, int b, int h, float scale) {
    const int chunk = g->chunk;
    const size_t W = (size_t)g->nk * chunk;
    blk_view a = blk_view_make(qkv, kv, g, jq, b, h);
    float *dq = dqkv + (a.q - qkv), *dk[2], *dv[2];
    for (int c = 0; c < g->nk; c++) dk[c] = dkv + (a.k[c] - kv), dv[c] = dkv + (a.v[c] - kv);
    const float *dy = dout + a.seg * chunk * a.OC + (size_t)h * g->hd;
    const float *l = lse + (a.seg * g->H + h) * chunk, *d = D + (a.seg * g->H + h) * chunk;
    const int R = (int)a.R, KR = (int)a.KR, OC = (int)a.OC, hd = g->hd;
    const int rb = rows_per_block(g, jq);
    for (int r0 = 0; r0 < chunk; r0 += rb) {
        int r1 = r0 + rb < chunk ? r0 + rb : chunk, n = r1 - r0, w[2] = {0, 0};
        block_widths(w, g, jq, r1);
        block_scores(P, W, &a, g, r0, r1, w, scale);
        for (int c = 0; c < g->nk; c++) /* dP = dO V^T */
            if (w[c] > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, w[c], hd, 1.0f,
                            dy + r0 * a.OC, OC, a.v[c], KR, 0.0f,
                            dS + (size_t)r0 * W + (size_t)c * chunk, (int)W);
        block_softmax_backward_rows(P, dS, W, l, d, g, jq, r0, r1, w, scale);
        for (int c = 0; c < g->nk; c++) {
            if (w[c] == 0) continue;
            const float *Pb = P + (size_t)r0 * W + (size_t)c * chunk;
            const float *dSb = dS + (size_t)r0 * W + (size_t)c * chunk;
            /* dV_c[0:w] += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w[c], hd, n, 1.0f, Pb, (int)W,
                        dy + r0 * a.OC, OC, 1.0f, dv[c], KR);
            /* dQ[r0:r1] += dS K_c[0:w] (scale already in dS) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, w[c], 1.0f, dSb, (int)W,
                        a.k[c], KR, 1.0f, dq + r0 * a.R, R);
            /* dK_c[0:w] += dS^T Q[r0:r1] */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w[c], hd, n, 1.0f, dSb, (int)W,
                        a.q + r0 * a.R, R, 1.0f, dk[c], KR);
        }
    }
}

void loom_attention_block_backward(float *dqkv, float *dkv, float *scratch, const float *dout,
                                   const float *qkv, const float *kv, const float *lse,
                                   const float *D, const loom_attention_blocks *g) {
    const float scale = (float)(1.0 / sqrt((double)g->hd));
    const int group = g->H / g->KV, tasks = g->B * g->KV;
    const size_t W = (size_t)g->nk * g->chunk;
#pragma omp parallel for schedule(dynamic)
    for (int task = 0; task < tasks; task++) {
        int b = task / g->KV, kvh = task % g->KV;
        float *P = scratch + 2 * (size_t)g->chunk * W * omp_get_thread_num();
        float *dS = P + (size_t)g->chunk * W;
        for (int jq = 0; jq < g->nq; jq++)
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                block_backward_head(dqkv, dkv, P, dS, dout, qkv, kv, lse, D, g, jq, b, h, scale);
    }
}
