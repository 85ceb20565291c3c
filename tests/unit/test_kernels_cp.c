/* Kernel tests for blockwise (ring) attention: the block forward, the log-sum-exp merge,
 * D and the block backward against float64 references.
 *  - ring simulation: N ranks in one process, each rank's queries against every rank's
 *    key/value block in ring order, merged; the result (out, lse, dqkv) against a float64
 *    whole-sequence attention, for the zigzag split, the contiguous split and the
 *    bidirectional case, N = 1..4, GQA. Fully masked blocks (contiguous causal split)
 *    must come out as lse = -inf, out = 0 and leave the merge and the gradients untouched.
 *  - blocks at arbitrary (unaligned) positions, so partially visible chunks and rows
 *    that see nothing are exercised, against a float64 reference of the block alone.
 * Inputs are random every run; a failure prints LOOM_TEST_SEED to repeat it. */
#include "test_kernels_util.h"

#include <string.h>

#include "kernels/kernels.h"

typedef struct {
    int B, T, H, KV, hd;
} shape;

/* Float64 whole-sequence attention (causal or not) forward + backward; dqkv accumulates. */
static void ref_attention(double *out, double *lse, double *dqkv, const float *qkv,
                          const float *dout, shape s, int causal) {
    int R = (s.H + 2 * s.KV) * s.hd, OC = s.H * s.hd, T = s.T, hd = s.hd;
    double scale = 1.0 / sqrt(hd);
    double *P = tk_dalloc((size_t)T * T), *dP = tk_dalloc((size_t)T * T);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.H; h++) {
            int kvh = h / (s.H / s.KV);
            size_t base = (size_t)b * T * R;
            size_t qo = base + (size_t)h * hd, ko = base + (size_t)(s.H + kvh) * hd;
            size_t vo = base + (size_t)(s.H + s.KV + kvh) * hd;
            const float *q = qkv + qo, *k = qkv + ko, *v = qkv + vo;
            const float *dy = dout + (size_t)b * T * OC + (size_t)h * hd;
            double *o = out + (size_t)b * T * OC + (size_t)h * hd;
            for (int i = 0; i < T; i++) {
                int n = causal ? i + 1 : T;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)q[i * R + c] * k[j * R + c];
                    P[i * T + j] = d * scale;
                    m = fmax(m, d * scale);
                }
                for (int j = 0; j < n; j++) sum += exp(P[i * T + j] - m);
                for (int j = 0; j < n; j++) P[i * T + j] = exp(P[i * T + j] - m) / sum;
                lse[((size_t)b * s.H + h) * T + i] = m + log(sum);
                for (int c = 0; c < hd; c++) {
                    double acc = 0;
                    for (int j = 0; j < n; j++) acc += P[i * T + j] * v[j * R + c];
                    o[i * OC + c] = acc;
                }
            }
            for (int i = 0; i < T; i++) {
                int n = causal ? i + 1 : T;
                double pdp = 0;
                for (int j = 0; j < n; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)dy[i * OC + c] * v[j * R + c];
                    dP[i * T + j] = d;
                    pdp += P[i * T + j] * d;
                }
                for (int j = 0; j < n; j++) {
                    double ds = P[i * T + j] * (dP[i * T + j] - pdp) * scale;
                    for (int c = 0; c < hd; c++) {
                        dqkv[vo + j * R + c] += P[i * T + j] * dy[i * OC + c];
                        dqkv[qo + i * R + c] += ds * k[j * R + c];
                        dqkv[ko + j * R + c] += ds * q[i * R + c];
                    }
                }
            }
        }
    free(P), free(dP);
}

/* Global position of chunk j of rank r (the cp layout: zigzag = chunks r and 2N-1-r). */
static int chunk_pos(int r, int j, int N, int nq, int chunk) {
    return nq == 2 ? (j == 0 ? r * chunk : (2 * N - 1 - r) * chunk) : r * chunk;
}

static void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

static int all_masked(const loom_attention_blocks *g) {
    if (!g->causal) return 0;
    for (int a = 0; a < g->nq; a++)
        for (int c = 0; c < g->nk; c++)
            if (g->kpos[c] <= g->qpos[a] + g->chunk - 1) return 0;
    return 1;
}

static void check_ring(shape s, int N, int causal, int zigzag) {
    const int nq = causal && zigzag ? 2 : 1, Tl = s.T / N, chunk = Tl / nq;
    const int R = (s.H + 2 * s.KV) * s.hd, KR = 2 * s.KV * s.hd, OC = s.H * s.hd;
    const size_t Nl = (size_t)s.B * Tl, nqkv = (size_t)s.B * s.T * R;
    const size_t nout = (size_t)s.B * s.T * OC, nlse = (size_t)s.B * s.H * s.T;
    const size_t nlse_l = (size_t)s.B * s.H * Tl;
    float *qkv = tk_rand(nqkv, 1.5f), *dout = tk_rand(nout, 1.0f);
    double *rout = tk_dalloc(nout), *rlse = tk_dalloc(nlse), *rdqkv = tk_dalloc(nqkv);
    ref_attention(rout, rlse, rdqkv, qkv, dout, s, causal);

    float **lq = malloc(sizeof(float *) * N), **lkv = malloc(sizeof(float *) * N);
    float **ldo = malloc(sizeof(float *) * N), **dkv = malloc(sizeof(float *) * N);
    assert_non_null(lq), assert_non_null(lkv), assert_non_null(ldo), assert_non_null(dkv);
    for (int r = 0; r < N; r++) { /* each rank's local rows, and its packed key/value block */
        lq[r] = tk_alloc(Nl * R), ldo[r] = tk_alloc(Nl * OC), lkv[r] = tk_alloc(Nl * KR);
        dkv[r] = tk_alloc(Nl * KR);
        memset(dkv[r], 0, sizeof(float) * Nl * KR);
        for (int j = 0; j < nq; j++)
            for (int b = 0; b < s.B; b++)
                for (int t = 0; t < chunk; t++) {
                    size_t row = ((size_t)j * s.B + b) * chunk + t;
                    size_t grow = (size_t)b * s.T + chunk_pos(r, j, N, nq, chunk) + t;
                    memcpy(lq[r] + row * R, qkv + grow * R, sizeof(float) * R);
                    memcpy(ldo[r] + row * OC, dout + grow * OC, sizeof(float) * OC);
                }
        loom_copy_2d(lkv[r], KR, lq[r] + (size_t)s.H * s.hd, R, Nl, KR);
    }
    size_t nscratch = loom_attention_block_scratch_floats(chunk, nq);
    float *scratch = tk_alloc(nscratch), *out = tk_alloc(Nl * OC), *lse = tk_alloc(nlse_l);
    float *pout = tk_alloc(Nl * OC), *plse = tk_alloc(nlse_l), *D = tk_alloc(nlse_l);
    float *dq = tk_alloc(Nl * R), *snap = tk_alloc(Nl * (R > OC ? R : OC));
    float *gout = tk_alloc(nout), *glse = tk_alloc(nlse), *gdqkv = tk_alloc(nqkv);
    float **lout = malloc(sizeof(float *) * N), **llse = malloc(sizeof(float *) * N);
    assert_non_null(lout), assert_non_null(llse);
    int masked_seen = 0;
    for (int r = 0; r < N; r++) {
        loom_attention_blocks g = {s.B, chunk, s.H, s.KV, s.hd, causal, nq, nq, {0, 0}, {0, 0}};
        for (int j = 0; j < nq; j++) g.qpos[j] = chunk_pos(r, j, N, nq, chunk);
        fill_nan(out, Nl * OC), fill_nan(lse, nlse_l);
        for (int i = 0; i < N; i++) { /* forward: blocks in ring order */
            int src = (r - i + N) % N;
            for (int j = 0; j < nq; j++) g.kpos[j] = chunk_pos(src, j, N, nq, chunk);
            fill_nan(scratch, nscratch);
            if (i == 0) {
                loom_attention_block_forward(out, lse, lq[r], lkv[src], scratch, &g);
                continue;
            }
            fill_nan(pout, Nl * OC), fill_nan(plse, nlse_l);
            loom_attention_block_forward(pout, plse, lq[r], lkv[src], scratch, &g);
            if (all_masked(&g)) { /* nothing visible: -inf, zeros, and a merge that is a no-op */
                masked_seen++;
                for (size_t k = 0; k < nlse_l; k++) assert_true(plse[k] == -INFINITY);
                for (size_t k = 0; k < Nl * OC; k++) assert_true(pout[k] == 0.0f);
                memcpy(snap, out, sizeof(float) * Nl * OC);
                loom_attention_block_merge(out, lse, pout, plse, &g);
                assert_memory_equal(snap, out, sizeof(float) * Nl * OC);
                continue;
            }
            loom_attention_block_merge(out, lse, pout, plse, &g);
        }
        lout[r] = tk_copy(out, Nl * OC), llse[r] = tk_copy(lse, nlse_l);
        for (int j = 0; j < nq; j++) /* back to global order for the comparison */
            for (int b = 0; b < s.B; b++)
                for (int t = 0; t < chunk; t++) {
                    size_t seg = (size_t)j * s.B + b, row = seg * chunk + t;
                    int p = g.qpos[j] + t;
                    memcpy(gout + ((size_t)b * s.T + p) * OC, out + row * OC, sizeof(float) * OC);
                    for (int h = 0; h < s.H; h++)
                        glse[((size_t)b * s.H + h) * s.T + p] = lse[(seg * s.H + h) * chunk + t];
                }
    }
    if (causal && !zigzag && N > 1) assert_true(masked_seen == N * (N - 1) / 2);
    tk_check("ring out", gout, rout, nout, 1e-5, 1e-6);
    tk_check("ring lse", glse, rlse, nlse, 1e-5, 1e-6);

    for (int r = 0; r < N; r++) { /* backward: queries of r against every block */
        loom_attention_blocks g = {s.B, chunk, s.H, s.KV, s.hd, causal, nq, nq, {0, 0}, {0, 0}};
        for (int j = 0; j < nq; j++) g.qpos[j] = chunk_pos(r, j, N, nq, chunk);
        fill_nan(D, nlse_l);
        loom_attention_block_delta(D, ldo[r], lout[r], &g);
        memset(dq, 0, sizeof(float) * Nl * R);
        for (int i = 0; i < N; i++) {
            int src = (r - i + N) % N;
            for (int j = 0; j < nq; j++) g.kpos[j] = chunk_pos(src, j, N, nq, chunk);
            fill_nan(scratch, nscratch);
            if (all_masked(&g)) { /* must add exactly nothing */
                memcpy(snap, dq, sizeof(float) * Nl * R);
                float *dk0 = tk_copy(dkv[src], Nl * KR);
                loom_attention_block_backward(dq, dkv[src], scratch, ldo[r], lq[r], lkv[src],
                                              llse[r], D, &g);
                assert_memory_equal(snap, dq, sizeof(float) * Nl * R);
                assert_memory_equal(dk0, dkv[src], sizeof(float) * Nl * KR);
                free(dk0);
                continue;
            }
            loom_attention_block_backward(dq, dkv[src], scratch, ldo[r], lq[r], lkv[src], llse[r],
                                          D, &g);
        }
        memcpy(lq[r], dq, sizeof(float) * Nl * R); /* lq[r] now holds the query gradient */
    }
    for (int r = 0; r < N; r++) {
        float *g_r = lq[r];
        for (size_t row = 0; row < Nl; row++) /* the block backward writes query columns only */
            for (int c = s.H * s.hd; c < R; c++) assert_true(g_r[row * R + c] == 0.0f);
        loom_add_2d(g_r + (size_t)s.H * s.hd, R, dkv[r], KR, Nl, KR);
        for (int j = 0; j < nq; j++)
            for (int b = 0; b < s.B; b++)
                for (int t = 0; t < chunk; t++) {
                    size_t row = ((size_t)j * s.B + b) * chunk + t;
                    size_t grow = (size_t)b * s.T + chunk_pos(r, j, N, nq, chunk) + t;
                    memcpy(gdqkv + grow * R, g_r + row * R, sizeof(float) * R);
                }
    }
    tk_check("ring dqkv", gdqkv, rdqkv, nqkv, 1e-5, 1e-6);

    for (int r = 0; r < N; r++) {
        free(lq[r]), free(lkv[r]), free(ldo[r]), free(dkv[r]), free(lout[r]), free(llse[r]);
    }
    free(lq), free(lkv), free(ldo), free(dkv), free(lout), free(llse);
    free(qkv), free(dout), free(rout), free(rlse), free(rdqkv), free(scratch), free(out);
    free(lse), free(pout), free(plse), free(D), free(dq), free(snap), free(gout), free(glse);
    free(gdqkv);
}

static void test_ring_zigzag(void **state) {
    (void)state;
    tk_reseed(31);
    for (int N = 1; N <= 4; N++) {
        check_ring((shape){2, 2 * N * 5, 4, 2, 8}, N, 1, 1);
        check_ring((shape){1, 2 * N * 33, 2, 1, 16}, N, 1, 1);
    }
    check_ring((shape){1, 2 * 2 * 70, 2, 2, 8}, 2, 1, 1); /* chunks over one 64-row block */
    check_ring((shape){2, 2 * 3 * 7, 6, 3, 4}, 3, 1, 1);
}

static void test_ring_contiguous(void **state) {
    (void)state;
    tk_reseed(32);
    for (int N = 1; N <= 4; N++) check_ring((shape){2, N * 12, 4, 2, 8}, N, 1, 0);
    check_ring((shape){1, 3 * 70, 4, 1, 8}, 3, 1, 0);
}

static void test_ring_bidir(void **state) {
    (void)state;
    tk_reseed(33);
    for (int N = 1; N <= 4; N++) check_ring((shape){2, N * 9, 4, 2, 8}, N, 0, 1);
    check_ring((shape){1, 2 * 70, 4, 4, 16}, 2, 0, 0);
}

/* ---- one block at arbitrary positions against a float64 reference of that block ---- */
static void ref_block(double *out, double *lse, double *dq, double *dkv, const float *qkv,
                      const float *kv, const float *dout, const float *flse, const float *D,
                      const loom_attention_blocks *g) {
    const int R = (g->H + 2 * g->KV) * g->hd, KR = 2 * g->KV * g->hd, OC = g->H * g->hd;
    const int hd = g->hd, ch = g->chunk, nkeys = g->nk * ch;
    const double scale = 1.0 / sqrt(hd);
    double *s = tk_dalloc((size_t)nkeys);
    int *kp = malloc(sizeof(int) * nkeys), *krow = malloc(sizeof(int) * nkeys);
    assert_non_null(kp), assert_non_null(krow);
    for (int jq = 0; jq < g->nq; jq++)
        for (int b = 0; b < g->B; b++)
            for (int h = 0; h < g->H; h++) {
                int kvh = h / (g->H / g->KV), seg = jq * g->B + b;
                int n = 0;
                for (int c = 0; c < g->nk; c++)
                    for (int t = 0; t < ch; t++) {
                        kp[n] = g->kpos[c] + t;
                        krow[n++] = (c * g->B + b) * ch + t;
                    }
                for (int i = 0; i < ch; i++) {
                    int qp = g->qpos[jq] + i;
                    size_t qrow = (size_t)seg * ch + i, li = ((size_t)seg * g->H + h) * ch + i;
                    const float *q = qkv + qrow * R + (size_t)h * hd;
                    double m = -INFINITY, sum = 0;
                    for (int j = 0; j < nkeys; j++) {
                        s[j] = -INFINITY;
                        if (g->causal && kp[j] > qp) continue;
                        double d = 0;
                        const float *k = kv + (size_t)krow[j] * KR + (size_t)kvh * hd;
                        for (int c = 0; c < hd; c++) d += (double)q[c] * k[c];
                        s[j] = d * scale;
                        m = fmax(m, s[j]);
                    }
                    for (int j = 0; j < nkeys; j++)
                        if (s[j] > -INFINITY) sum += exp(s[j] - m);
                    lse[li] = sum > 0 ? m + log(sum) : -INFINITY;
                    double *o = out + qrow * OC + (size_t)h * hd;
                    for (int c = 0; c < hd; c++) o[c] = 0;
                    const float *dy = dout + qrow * OC + (size_t)h * hd;
                    for (int j = 0; j < nkeys; j++) {
                        if (s[j] == -INFINITY) continue;
                        const float *k = kv + (size_t)krow[j] * KR + (size_t)kvh * hd;
                        const float *v = k + (size_t)g->KV * hd;
                        double p = exp(s[j] - m) / sum, dp = 0;
                        for (int c = 0; c < hd; c++) o[c] += p * v[c];
                        /* the backward uses the given (final) lse and D */
                        double P = exp(s[j] - flse[li]);
                        for (int c = 0; c < hd; c++) dp += (double)dy[c] * v[c];
                        double ds = P * (dp - D[li]) * scale;
                        double *dk = dkv + (size_t)krow[j] * KR + (size_t)kvh * hd;
                        double *dv = dk + (size_t)g->KV * hd;
                        for (int c = 0; c < hd; c++) {
                            dv[c] += P * dy[c];
                            dq[qrow * R + (size_t)h * hd + c] += ds * k[c];
                            dk[c] += ds * q[c];
                        }
                    }
                }
            }
    free(s), free(kp), free(krow);
}

static void check_block(loom_attention_blocks g) {
    const int R = (g.H + 2 * g.KV) * g.hd, KR = 2 * g.KV * g.hd, OC = g.H * g.hd;
    const size_t nqr = (size_t)g.nq * g.B * g.chunk, nkr = (size_t)g.nk * g.B * g.chunk;
    const size_t nl = (size_t)g.nq * g.B * g.H * g.chunk;
    float *qkv = tk_rand(nqr * R, 1.5f), *kv = tk_rand(nkr * KR, 1.5f);
    float *dout = tk_rand(nqr * OC, 1.0f), *flse = tk_rand(nl, 1.0f), *D = tk_rand(nl, 0.5f);
    for (size_t i = 0; i < nl; i++) flse[i] += 2.0f; /* some final lse: P = exp(S - lse) */
    float *out = tk_alloc(nqr * OC), *lse = tk_alloc(nl), *dq = tk_rand(nqr * R, 1.0f);
    float *dkv = tk_rand(nkr * KR, 1.0f);
    double *rout = tk_dalloc(nqr * OC), *rlse = tk_dalloc(nl);
    double *rdq = tk_widen(dq, nqr * R), *rdkv = tk_widen(dkv, nkr * KR);
    size_t nscratch = loom_attention_block_scratch_floats(g.chunk, g.nk);
    float *scratch = tk_alloc(nscratch);
    fill_nan(scratch, nscratch), fill_nan(out, nqr * OC), fill_nan(lse, nl);
    ref_block(rout, rlse, rdq, rdkv, qkv, kv, dout, flse, D, &g);
    loom_attention_block_forward(out, lse, qkv, kv, scratch, &g);
    tk_check("block out", out, rout, nqr * OC, 1e-5, 1e-6);
    for (size_t i = 0; i < nl; i++) { /* -inf must be exactly -inf */
        if (rlse[i] == -INFINITY) {
            assert_true(lse[i] == -INFINITY);
            lse[i] = 0.0f, rlse[i] = 0.0;
        }
    }
    tk_check("block lse", lse, rlse, nl, 1e-5, 1e-6);
    fill_nan(scratch, nscratch);
    loom_attention_block_backward(dq, dkv, scratch, dout, qkv, kv, flse, D, &g);
    tk_check("block dq", dq, rdq, nqr * R, 1e-5, 1e-5);
    tk_check("block dkv", dkv, rdkv, nkr * KR, 1e-5, 1e-5);
    free(qkv), free(kv), free(dout), free(flse), free(D), free(out), free(lse), free(dq);
    free(dkv), free(rout), free(rlse), free(rdq), free(rdkv), free(scratch);
}

static void test_block_positions(void **state) {
    (void)state;
    tk_reseed(34);
    for (int trial = 0; trial < 24; trial++) {
        int chunk = 1 + tk_randint(trial < 20 ? 40 : 150), span = 4 * chunk;
        loom_attention_blocks g = {
            1 + tk_randint(2), chunk,  4,     1 << tk_randint(3), 8, 1, 1 + tk_randint(2),
            1 + tk_randint(2), {0, 0}, {0, 0}};
        g.causal = trial % 4 != 3;
        for (int j = 0; j < 2; j++) g.qpos[j] = tk_randint(span), g.kpos[j] = tk_randint(span);
        check_block(g);
    }
    /* a block entirely in the future of the queries: nothing visible */
    check_block((loom_attention_blocks){2, 9, 4, 2, 8, 1, 2, 2, {0, 9}, {18, 30}});
}

/* A merge of an empty partial (-inf) in either order, and of two halves of the keys. */
static void test_merge(void **state) {
    (void)state;
    tk_reseed(35);
    loom_attention_blocks g = {2, 7, 2, 1, 4, 0, 1, 1, {0, 0}, {0, 0}};
    const size_t no = (size_t)2 * 7 * 8, nl = (size_t)2 * 2 * 7;
    float *o = tk_rand(no, 1), *l = tk_rand(nl, 3), *ob = tk_rand(no, 1), *lb = tk_rand(nl, 3);
    for (size_t i = 0; i < nl; i += 3) lb[i] = -INFINITY;
    for (size_t i = 1; i < nl; i += 5) l[i] = -INFINITY, lb[i] = 0.5f;
    double *ro = tk_dalloc(no), *rl = tk_dalloc(nl);
    for (int seg = 0; seg < 2; seg++)
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < 7; t++) {
                size_t li = ((size_t)seg * 2 + h) * 7 + t, oi = ((size_t)seg * 7 + t) * 8 + h * 4;
                double a = l[li], b = lb[li];
                double m = fmax(a, b), L = m + log(exp(a - m) + exp(b - m));
                rl[li] = L;
                for (int c = 0; c < 4; c++)
                    ro[oi + c] = (a == -INFINITY ? 0 : o[oi + c] * exp(a - L)) +
                                 (b == -INFINITY ? 0 : ob[oi + c] * exp(b - L));
            }
    loom_attention_block_merge(o, l, ob, lb, &g);
    tk_check("merge out", o, ro, no, 1e-6, 1e-7);
    tk_check("merge lse", l, rl, nl, 1e-6, 1e-7);
    free(o), free(l), free(ob), free(lb), free(ro), free(rl);
}

static void test_copy_add_2d(void **state) {
    (void)state;
    tk_reseed(36);
    const size_t rows = 13, w = 5, sld = 9, dld = 7;
    float *src = tk_rand(rows * sld, 1), *dst = tk_rand(rows * dld, 1),
          *d0 = tk_copy(dst, rows * dld);
    loom_add_2d(dst, dld, src + 2, sld, rows, w);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < dld; c++)
            assert_true(dst[r * dld + c] ==
                        (c < w ? d0[r * dld + c] + src[r * sld + 2 + c] : d0[r * dld + c]));
    loom_copy_2d(dst, dld, src + 2, sld, rows, w);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < dld; c++)
            assert_true(dst[r * dld + c] == (c < w ? src[r * sld + 2 + c] : d0[r * dld + c]));
    free(src), free(dst), free(d0);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_zigzag), cmocka_unit_test(test_ring_contiguous),
        cmocka_unit_test(test_ring_bidir),  cmocka_unit_test(test_block_positions),
        cmocka_unit_test(test_merge),       cmocka_unit_test(test_copy_add_2d),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
