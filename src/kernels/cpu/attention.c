/* Scaled-dot-product attention (GQA) on OpenBLAS, causal (GPT-style) or bidirectional
 * (DiT), one implementation with a causal flag. Per (batch, head) the T x T scores are
 * materialised in scratch, one row block at a time: causally a block of rows [r0, r1)
 * only needs key columns [0, r1), so the fully masked upper triangle beyond the block
 * is never computed; bidirectionally every row needs all T columns, so the whole
 * T x T is one block (fewer, larger GEMMs). Q, K, V are read in place from the strided
 * qkv rows.
 * Only out and the row log-sum-exp are saved; backward recomputes P from lse.
 * Threading: OpenMP over (batch, head) tasks, each with its own scratch; loom links the
 * OpenMP build of OpenBLAS, which runs an sgemm called inside a parallel region on the
 * calling thread, so the many small GEMMs never pay for thread hand-offs. Backward
 * tasks own one key/value head (all its query heads), so no two tasks write the same
 * dK/dV rows and the result does not depend on the thread count. */
#include "kernels/kernels.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "vecmath.h"

#define LOOM_ATTN_BLOCK 64

size_t loom_attention_scratch_floats(int T) {
    return 2 * (size_t)T * T * (size_t)omp_get_max_threads();
}

/* Strided views of one (batch, query head) slice. */
typedef struct {
    const float *q, *k, *v; /* rows of stride R */
    size_t R, OC;           /* qkv row stride, out row stride */
} attn_view;

static attn_view attn_view_make(const float *qkv, int b, int h, int T, int H, int KV, int hd) {
    attn_view a;
    a.R = (size_t)(H + 2 * KV) * hd;
    a.OC = (size_t)H * hd;
    int kvh = h / (H / KV);
    const float *base = qkv + (size_t)b * T * a.R;
    a.q = base + (size_t)h * hd;
    a.k = base + (size_t)(H + kvh) * hd;
    a.v = base + (size_t)(H + KV + kvh) * hd;
    return a;
}

/* Rows per block: LOOM_ATTN_BLOCK causally, all T rows bidirectionally. */
static int row_block(int T, int causal) {
    return causal ? LOOM_ATTN_BLOCK : T;
}
/* First row past the block that starts at row r0. */
static int block_rows_end(int r0, int T, int causal) {
    int e = r0 + row_block(T, causal);
    return e < T ? e : T;
}
/* First column past the computed part of row i: the end of i's row block causally
 * (columns past it are masked for the whole block), T bidirectionally. */
static int block_end(int i, int T, int causal) {
    if (!causal) return T;
    int e = (i / LOOM_ATTN_BLOCK + 1) * LOOM_ATTN_BLOCK;
    return e < T ? e : T;
}

/* S[r0:r1, 0:c1] = scale * Q[r0:r1] K[0:c1]^T for every row block (c1 = r1 causally,
 * T bidirectionally). */
static void scores(float *S, const attn_view *a, int T, int hd, float scale, int causal) {
    for (int r0 = 0; r0 < T; r0 += row_block(T, causal)) {
        int r1 = block_rows_end(r0, T, causal), c1 = block_end(r0, T, causal);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, c1, hd, scale,
                    a->q + r0 * a->R, (int)a->R, a->k, (int)a->R, 0.0f, S + (size_t)r0 * T, T);
    }
}

/* Softmax of each row in place over its visible keys ([0, i] causally, all T
 * otherwise); lse[i] saved. Masked entries inside the computed block are zeroed so the
 * P @ V block GEMMs can read them. */
LOOM_SIMD static void softmax_rows(float *S, float *lse, int T, int causal) {
    for (int i = 0; i < T; i++) {
        float *restrict row = S + (size_t)i * T;
        int n = causal ? i + 1 : T; /* visible keys */
        float m = loom_max_f32(row, n);
        for (int j = 0; j < n; j++) row[j] = loom_expf(row[j] - m);
        double sum = loom_sum_f64(row, n);
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < n; j++) row[j] *= inv;
        for (int j = n, e = block_end(i, T, causal); j < e; j++) row[j] = 0.0f;
        lse[i] = (float)((double)m + log(sum));
    }
}

static void attention_forward(float *out, float *lse, const float *qkv, float *scratch, int B,
                              int T, int H, int KV, int hd, int causal) {
    float scale = (float)(1.0 / sqrt((double)hd));
#pragma omp parallel for schedule(dynamic)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        float *S = scratch + 2 * (size_t)T * T * omp_get_thread_num();
        attn_view a = attn_view_make(qkv, b, h, T, H, KV, hd);
        float *o = out + (size_t)b * T * a.OC + (size_t)h * hd;
        scores(S, &a, T, hd, scale, causal);
        softmax_rows(S, lse + ((size_t)b * H + h) * T, T, causal);
        for (int r0 = 0; r0 < T; r0 += row_block(T, causal)) {
            int r1 = block_rows_end(r0, T, causal), c1 = block_end(r0, T, causal);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hd, c1, 1.0f,
                        S + (size_t)r0 * T, T, a.v, (int)a.R, 0.0f, o + r0 * a.OC, (int)a.OC);
        }
    }
}

void loom_attention_forward(float *out, float *lse, const float *qkv, float *scratch, int B, int T,
                            int H, int KV, int hd) {
    attention_forward(out, lse, qkv, scratch, B, T, H, KV, hd, 1);
}

void loom_attention_bidir_forward(float *out, float *lse, const float *qkv, float *scratch, int B,
                                  int T, int H, int KV, int hd) {
    attention_forward(out, lse, qkv, scratch, B, T, H, KV, hd, 0);
}

/* Given S (scaled scores) in P and dP = dO V^T: P = exp(S - lse) and
 * dS = scale * P * (dP - D) with D_i = dot(dO_i, O_i) (the softmax Jacobian); dO's rows
 * have stride dOC, O's stride OC. */
LOOM_SIMD static void softmax_backward_rows(float *P, float *dP, const float *lse,
                                            const float *dout, size_t dOC, const float *out,
                                            size_t OC, int T, int hd, float scale, int causal) {
    for (int i = 0; i < T; i++) {
        float *restrict p = P + (size_t)i * T;
        float *restrict dp = dP + (size_t)i * T;
        const float *restrict dy = dout + i * dOC;
        const float *restrict y = out + i * OC;
        double D = 0.0;
        for (int c = 0; c < hd; c++) D += (double)dy[c] * y[c];
        float Df = (float)D, l = lse[i];
        int n = causal ? i + 1 : T; /* visible keys */
        for (int j = 0; j < n; j++) {
            p[j] = loom_expf(p[j] - l);
            dp[j] = scale * p[j] * (dp[j] - Df);
        }
        for (int j = n, e = block_end(i, T, causal); j < e; j++) p[j] = dp[j] = 0.0f;
    }
}

/* What backward of one (batch, query head) writes and reads besides Q, K, V: its dQ and its
 * group's dK, dV (rows of stride dR), dO (stride dOC) and O (stride OC). */
typedef struct {
    float *dq, *dk, *dv;
    size_t dR;
    const float *dy, *y;
    size_t dOC, OC;
} grad_view;

/* Backward of one (batch, query head) on views; accumulates into dQ, dK, dV. */
static void backward_head_view(const attn_view *a, const grad_view *g, float *P, float *dS,
                               const float *lse, int T, int hd, float scale, int causal) {
    const int R = (int)a->R, dR = (int)g->dR, dOC = (int)g->dOC;
    scores(P, a, T, hd, scale, causal);
    for (int r0 = 0; r0 < T; r0 += row_block(T, causal)) { /* dP = dO V^T */
        int r1 = block_rows_end(r0, T, causal), c1 = block_end(r0, T, causal);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, c1, hd, 1.0f,
                    g->dy + r0 * g->dOC, dOC, a->v, R, 0.0f, dS + (size_t)r0 * T, T);
    }
    softmax_backward_rows(P, dS, lse, g->dy, g->dOC, g->y, g->OC, T, hd, scale, causal);
    for (int r0 = 0; r0 < T; r0 += row_block(T, causal)) {
        int r1 = block_rows_end(r0, T, causal), c1 = block_end(r0, T, causal), rb = r1 - r0;
        const float *Pb = P + (size_t)r0 * T, *dSb = dS + (size_t)r0 * T;
        /* dV[0:c1] += P_blk^T dO_blk */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1, hd, rb, 1.0f, Pb, T,
                    g->dy + r0 * g->dOC, dOC, 1.0f, g->dv, dR);
        /* dQ_blk += dS_blk K[0:c1] (scale already folded into dS) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hd, c1, 1.0f, dSb, T, a->k, R,
                    1.0f, g->dq + r0 * g->dR, dR);
        /* dK[0:c1] += dS_blk^T Q_blk */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1, hd, rb, 1.0f, dSb, T,
                    a->q + r0 * a->R, R, 1.0f, g->dk, dR);
    }
}

/* Backward of one (batch, query head); accumulates into its dQ and its group's dK, dV. */
static void backward_head(float *dqkv, float *P, float *dS, const float *dout, const float *qkv,
                          const float *out, const float *lse, int b, int h, int T, int H, int KV,
                          int hd, float scale, int causal) {
    attn_view a = attn_view_make(qkv, b, h, T, H, KV, hd);
    /* The same offsets applied to dqkv give the gradient slices. */
    size_t ooff = (size_t)b * T * a.OC + (size_t)h * hd;
    grad_view g = {.dq = dqkv + (a.q - qkv),
                   .dk = dqkv + (a.k - qkv),
                   .dv = dqkv + (a.v - qkv),
                   .dR = a.R,
                   .dy = dout + ooff,
                   .y = out + ooff,
                   .dOC = a.OC,
                   .OC = a.OC};
    backward_head_view(&a, &g, P, dS, lse + ((size_t)b * H + h) * T, T, hd, scale, causal);
}

static void attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int H, int KV,
                               int hd, int causal) {
    float scale = (float)(1.0 / sqrt((double)hd));
    const int group = H / KV; /* query heads per key/value head */
#pragma omp parallel for schedule(dynamic)
    for (int bg = 0; bg < B * KV; bg++) {
        int b = bg / KV, g = bg % KV;
        float *P = scratch + 2 * (size_t)T * T * omp_get_thread_num(), *dS = P + (size_t)T * T;
        for (int h = g * group; h < (g + 1) * group; h++)
            backward_head(dqkv, P, dS, dout, qkv, out, lse, b, h, T, H, KV, hd, scale, causal);
    }
}

void loom_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *out, const float *lse, int B, int T, int H, int KV,
                             int hd) {
    attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd, 1);
}

void loom_attention_bidir_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                   const float *out, const float *lse, int B, int T, int H, int KV,
                                   int hd) {
    attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd, 0);
}

/* ---- bf16 qkv and output (--precision bf16 keeps them in bf16: docs/precision.md) ---- */

size_t loom_attention_scratch_floats_bf16(int T, int hd) {
    return ((size_t)2 * T * T + (size_t)4 * T * hd) * (size_t)omp_get_max_threads();
}

/* cols [c0, c0 + hd) of T rows of stride R (bf16) into dst[T, ld] at column d0, widened. */
static void widen_cols(float *dst, size_t ld, int d0, const loom_bf16 *src, size_t R, int c0, int T,
                       int hd) {
    for (int t = 0; t < T; t++) loom_bf16_to_f32_n(dst + t * ld + d0, src + t * R + c0, (size_t)hd);
}

void loom_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                  const loom_bf16 *qkv, const loom_bf16 *out, const float *lse,
                                  int B, int T, int H, int KV, int hd) {
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int group = H / KV;
    const size_t R = (size_t)(H + 2 * KV) * hd, OC = (size_t)H * hd, W = (size_t)4 * hd;
    const size_t per_thread = (size_t)2 * T * T + (size_t)4 * T * hd;
#pragma omp parallel for schedule(dynamic)
    for (int bg = 0; bg < B * KV; bg++) {
        const int b = bg / KV, kv = bg % KV;
        float *P = scratch + per_thread * omp_get_thread_num(), *dS = P + (size_t)T * T;
        float *w = dS + (size_t)T * T; /* [T, 4 hd]: q | k | v | o of one query head */
        const loom_bf16 *base = qkv + (size_t)b * T * R;
        float *dbase = dqkv + (size_t)b * T * R;
        widen_cols(w, W, hd, base, R, (H + kv) * hd, T, hd);
        widen_cols(w, W, 2 * hd, base, R, (H + KV + kv) * hd, T, hd);
        const attn_view a = {.q = w, .k = w + hd, .v = w + 2 * hd, .R = W, .OC = W};
        for (int h = kv * group; h < (kv + 1) * group; h++) {
            widen_cols(w, W, 0, base, R, h * hd, T, hd);
            widen_cols(w, W, 3 * hd, out + (size_t)b * T * OC, OC, h * hd, T, hd);
            const grad_view g = {.dq = dbase + (size_t)h * hd,
                                 .dk = dbase + (size_t)(H + kv) * hd,
                                 .dv = dbase + (size_t)(H + KV + kv) * hd,
                                 .dR = R,
                                 .dy = dout + (size_t)b * T * OC + (size_t)h * hd,
                                 .y = w + 3 * hd,
                                 .dOC = OC,
                                 .OC = W};
            backward_head_view(&a, &g, P, dS, lse + ((size_t)b * H + h) * T, T, hd, scale, 1);
        }
    }
}
