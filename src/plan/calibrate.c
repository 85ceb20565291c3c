/* loom calibrate's measurements (plan/calibrate.h): loom's own kernels, AdamW, MPI
 * collectives, the communication engine and page refaults on this machine, as the
 * profile's JSON parts (docs/PROFILE.md). */
#include "plan/calibrate.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "comm/engine.h"
#include "comm/world.h"
#include "core/clock.h"
#include "core/cpu_boot.h"
#include "core/median.h"
#include "core/version.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "parallel/zero.h"
#include "plan/profile.h"

/* ---- timing and fitting ---- */

typedef void (*bench_fn)(const void *arg);

/* Microseconds per call: one warm-up, then the median of five batches of about
 * target_ms / 3 each (the faster of two single calls when one already takes target_ms).
 * The median, not the best: a step's kernels meet the machine's usual interference, and
 * bench_plan compares with a run's median step. With the best batch (the luckiest) the
 * 1-rank GPT-2 and Llama steps of bench_plan were predicted 7% and 11% under the
 * measured, with the median 3% and 6% (docs/PLAN.md, "Measured"). One batch that lost
 * its core moves the median little. */
static double bench_us(bench_fn f, const void *arg, double target_ms) {
    f(arg);
    double t0 = loom_now_ms();
    f(arg);
    const double one = loom_now_ms() - t0;
    if (one >= target_ms) {
        t0 = loom_now_ms();
        f(arg);
        return fmin(one, loom_now_ms() - t0) * 1e3;
    }
    const int reps = (int)fmin(1e5, fmax(1.0, target_ms / 3 / fmax(one, 1e-4)));
    double t[5];
    for (int b = 0; b < 5; b++) {
        t0 = loom_now_ms();
        for (int r = 0; r < reps; r++) f(arg);
        t[b] = (loom_now_ms() - t0) / reps;
    }
    return loom_median(t, 5) * 1e3;
}

/* t ~ a + b x with a >= 0, b > 0, minimising the relative errors (weights 1/t^2, so the
 * small sizes count as much as the large). Returns the largest relative error. */
static double fit_line(const double *x, const double *t, int n, double *a, double *b) {
    double s0 = 0, s1 = 0, s2 = 0, st = 0, sxt = 0;
    for (int i = 0; i < n; i++) {
        double w = 1.0 / (t[i] * t[i]);
        s0 += w, s1 += w * x[i], s2 += w * x[i] * x[i], st += w * t[i], sxt += w * x[i] * t[i];
    }
    double det = s0 * s2 - s1 * s1;
    *a = det > 0 ? (st * s2 - s1 * sxt) / det : 0;
    *b = det > 0 ? (s0 * sxt - s1 * st) / det : 0;
    if (*a < 0 || det <= 0) *a = 0, *b = sxt / s2;
    if (*b <= 0) { /* times falling with size: the line through the largest point */
        int big = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[big]) big = i;
        *a = 0, *b = t[big] / x[big];
    }
    double worst = 0;
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(*a + *b * x[i] - t[i]) / t[i]);
    return worst;
}

static void fill(float *p, size_t n, float scale) {
    uint32_t s = 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
    }
}

static json_t *points_json(const double *x, const double *t, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_pack("[f, f]", x[i], t[i]));
    return a;
}

/* ---- GEMM: the three linear-layer GEMMs over a grid of M, N, K ---- */

/* Each GEMM operand lives in a pool of GEMM_POOL_FLOATS (64 MiB per operand, more than a
 * CPU's last-level cache): every call takes the next slot, so its operands come from
 * memory as in a step, where each layer's weights and activations are other memory than
 * the previous GEMM's. Repeating one GEMM on the same hot operands overrated the step's
 * GEMMs (docs/PLAN.md, "Measured"): the fitted 1-thread peaks went from 108/106/114
 * (nt/nn/tn) to 100/90/117 GFLOP/s with cold operands, and a 1-thread GPT-2 step's
 * predicted compute from 18% under the measured to 1.5%. */
#define GEMM_POOL_FLOATS ((size_t)16 << 20)

typedef struct {
    const loom_backend *be;
    loom_gemm_op op;
    int M, N, K;
    float *a, *b, *c; /* pools of GEMM_POOL_FLOATS */
    size_t *slot;     /* the next call's offset (advanced by every call) */
} gemm_arg;

static void gemm_run(const void *p) {
    const gemm_arg *g = p;
    const size_t M = (size_t)g->M, N = (size_t)g->N, K = (size_t)g->K;
    size_t span = M * K > N * K ? M * K : N * K;
    if (M * N > span) span = M * N;
    span = (span + 15) & ~(size_t)15; /* 64-byte aligned slots */
    if (*g->slot + span > GEMM_POOL_FLOATS) *g->slot = 0;
    const size_t at = *g->slot;
    *g->slot += span;
    float *a = g->a + at, *b = g->b + at, *c = g->c + at;
    switch (g->op) {
    case LOOM_GEMM_NT: /* out[M,N] = inp[M,K] W[N,K]^T */
        loom_backend_linear_forward(g->be, c, a, b, NULL, g->M, g->K, g->N);
        break;
    case LOOM_GEMM_NN: /* dinp[M,N] += dout[M,K] W[K,N] */
        loom_backend_linear_backward_input(g->be, c, a, b, g->M, g->N, g->K);
        break;
    default: /* dW[M,N] += dout[K,M]^T inp[K,N] */
        loom_backend_linear_backward_weight(g->be, c, NULL, a, b, g->K, g->N, g->M);
        break;
    }
}

static json_t *measure_gemm(const loom_backend *be, loom_gemm_op op, const int *dims, int nd,
                            float *bufs[3], double target_ms) {
    int n = nd * nd * nd;
    double *flops = malloc(n * sizeof *flops), *dmin = malloc(n * sizeof *dmin);
    double *t = malloc(n * sizeof *t), *x = malloc(n * sizeof *x);
    json_t *rates = json_array(), *axis = json_array();
    for (int i = 0; i < nd; i++) json_array_append_new(axis, json_integer(dims[i]));
    int at = 0;
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < nd; j++)
            for (int k = 0; k < nd; k++, at++) {
                size_t slot = 0;
                gemm_arg g = {be, op, dims[i], dims[j], dims[k], bufs[0], bufs[1], bufs[2], &slot};
                /* the linear op's (tokens, IC, OC); the bf16 backend's primitives for it
                 * are made here, as a run makes them at setup (the fp32 one has none) */
                const int tok = op == LOOM_GEMM_TN ? g.K : g.M;
                const int ic = op == LOOM_GEMM_NT ? g.K : g.N;
                const int oc = op == LOOM_GEMM_NT ? g.N : op == LOOM_GEMM_NN ? g.K : g.M;
                loom_error perr;
                (void)loom_backend_linear_prepare(be, tok, ic, oc, &perr); /* else: general */
                flops[at] = 2.0 * dims[i] * dims[j] * dims[k];
                dmin[at] = fmin(dims[i], fmin(dims[j], dims[k]));
                t[at] = bench_us(gemm_run, &g, target_ms);
                json_array_append_new(rates, json_real(flops[at] / (t[at] * 1e3)));
            }
    /* t = latency + F (1 + half_dim / min(M, N, K)) / peak: the half_dim with the
     * smallest worst relative error over the grid, then the line in x = F (1 + h/d).
     * half_dim stays at most a quarter of the largest dimension measured, so the curve
     * (used beyond the grid) never promises more than 1.25x the rate at the largest
     * shape: only noise fits more (a sanitizer run fitted 4096, a 4129 GFLOP/s peak on
     * 2 cores measured at most 209; quiet runs fit 16-64). */
    double best_err = INFINITY, best_a = 0, best_b = 1, best_h = 0;
    for (int e = -1; e <= 12 && (e < 0 || 4 * (1 << e) <= dims[nd - 1]); e++) {
        double h = e < 0 ? 0 : (double)(1 << e);
        for (int i = 0; i < n; i++) x[i] = flops[i] * (1 + h / dmin[i]);
        double a, b, err = fit_line(x, t, n, &a, &b);
        if (err < best_err) best_err = err, best_a = a, best_b = b, best_h = h;
    }
    json_t *o =
        json_pack("{s:f, s:f, s:f, s:f, s:f, s:{s:O, s:O, s:O, s:o}}", "peak_gflops", 1e-3 / best_b,
                  "efficiency", 1.0, "latency_us", best_a, "half_dim", best_h, "fit_max_rel_err",
                  best_err, "grid", "M", axis, "N", axis, "K", axis, "gflops", rates);
    json_decref(axis);
    free(flops), free(dmin), free(t), free(x);
    return o;
}

/* ---- attention: per (T, head width), microseconds per (sample, head) ---- */

typedef struct {
    const loom_backend *be;
    loom_attention_kind kind;
    int T, H, hd;
    float *qkv, *out, *lse, *dout, *dqkv, *scratch, *kv, *dkv, *D;
    loom_attention_blocks g;
} att_arg;

static void att_run(const void *p) {
    const att_arg *a = p;
    switch (a->kind) {
    case LOOM_ATT_CAUSAL_FWD:
        loom_backend_attention_forward(a->be, a->out, a->lse, a->qkv, a->scratch, 1, a->T, a->H,
                                       a->H, a->hd);
        break;
    case LOOM_ATT_CAUSAL_BWD:
        loom_backend_attention_backward(a->be, a->dqkv, a->scratch, a->dout, a->qkv, a->out, a->lse,
                                        1, a->T, a->H, a->H, a->hd);
        break;
    case LOOM_ATT_BIDIR_FWD:
        loom_backend_attention_bidir_forward(a->be, a->out, a->lse, a->qkv, a->scratch, 1, a->T,
                                             a->H, a->H, a->hd);
        break;
    case LOOM_ATT_BIDIR_BWD:
        loom_backend_attention_bidir_backward(a->be, a->dqkv, a->scratch, a->dout, a->qkv, a->out,
                                              a->lse, 1, a->T, a->H, a->H, a->hd);
        break;
    case LOOM_ATT_BLOCK_FWD:
        loom_backend_attention_block_forward(a->be, a->out, a->lse, a->qkv, a->kv, a->scratch,
                                             &a->g);
        break;
    default:
        loom_backend_attention_block_backward(a->be, a->dqkv, a->dkv, a->scratch, a->dout, a->qkv,
                                              a->kv, a->lse, a->D, &a->g);
        break;
    }
}

static json_t *measure_attention(const loom_backend *be, loom_attention_kind kind, const int *Ts,
                                 int nT, const int *hds, int nh, int H, float *bufs[9],
                                 double target_ms) {
    json_t *ta = json_array(), *ha = json_array(), *us = json_array();
    for (int i = 0; i < nT; i++) json_array_append_new(ta, json_integer(Ts[i]));
    for (int j = 0; j < nh; j++) json_array_append_new(ha, json_integer(hds[j]));
    for (int i = 0; i < nT; i++)
        for (int j = 0; j < nh; j++) {
            att_arg a = {be,      kind,    Ts[i],   H,       hds[j],  bufs[0], bufs[1], bufs[2],
                         bufs[3], bufs[4], bufs[5], bufs[6], bufs[7], bufs[8], {0}};
            a.g = (loom_attention_blocks){.B = 1,
                                          .chunk = Ts[i],
                                          .H = H,
                                          .KV = H,
                                          .hd = hds[j],
                                          .causal = 0,
                                          .nq = 1,
                                          .nk = 1};
            /* the backward kernels read a forward's out and lse (and the block's D) */
            att_arg f = a;
            if (kind == LOOM_ATT_CAUSAL_BWD) f.kind = LOOM_ATT_CAUSAL_FWD, att_run(&f);
            if (kind == LOOM_ATT_BIDIR_BWD) f.kind = LOOM_ATT_BIDIR_FWD, att_run(&f);
            if (kind == LOOM_ATT_BLOCK_BWD) {
                f.kind = LOOM_ATT_BLOCK_FWD, att_run(&f);
                loom_backend_attention_block_delta(be, a.D, a.dout, a.out, &a.g);
            }
            json_array_append_new(us, json_real(bench_us(att_run, &a, target_ms) / H));
        }
    return json_pack("{s:{s:o, s:o, s:o}, s:i}", "grid", "T", ta, "hd", ha, "us_per_head", us,
                     "heads_measured", H);
}

/* ---- elementwise kernels and AdamW: time against bytes (parameters) ---- */

/* The elementwise kernels' four row buffers are pools of EW_POOL_FLOATS (64 MiB each),
 * walked like the GEMMs': every call reads and writes memory the previous calls did not
 * touch, as a step's norms and activations do (each layer's rows are other memory).
 * Repeating a kernel on the same 256 KiB rows measured the cache, not the step: a traced
 * llama step (docs/PLAN.md, "Measured") ran rmsnorm backward at 83 us a call where the
 * hot-row profile predicted 46, swiglu forward at 58 against 31; cold rows predict 71 and
 * 64. The per-row statistics and the weights stay put (they are small). */
#define EW_POOL_FLOATS ((size_t)16 << 20)

typedef struct {
    const loom_backend *be;
    loom_elementwise_kind kind;
    int rows, width;
    float *b[4], *s[3], *w[4];
    int32_t *targets;
    loom_attention_blocks g;
    size_t pool;  /* floats in each of b[0..3] */
    size_t *slot; /* where the next call's rows start in the pools */
} ew_arg;

static void ew_run(const void *p) {
    const ew_arg *a = p;
    int N = a->rows, C = a->width;
    size_t n = (size_t)N * C;
    /* 2n: swiglu's input and input gradient are two rows wide */
    const size_t span = (2 * n + 15) & ~(size_t)15;
    ew_arg at = *a;
    if (span <= a->pool) {
        if (*a->slot + span > a->pool) *a->slot = 0;
        for (int i = 0; i < 4; i++) at.b[i] = a->b[i] + *a->slot;
        *a->slot += span;
    }
    const ew_arg *e = &at;
    const loom_backend *be = e->be;
    switch (e->kind) {
    case LOOM_EW_LAYERNORM_FWD:
        loom_backend_layernorm_forward(be, e->b[1], e->s[0], e->s[1], e->b[0], e->w[0], e->w[1], N,
                                       C, 1e-5f);
        break;
    case LOOM_EW_LAYERNORM_BWD:
        loom_backend_layernorm_backward(be, e->b[2], e->w[2], e->w[3], e->b[3], e->b[0], e->w[0],
                                        e->s[0], e->s[1], N, C);
        break;
    case LOOM_EW_RMSNORM_FWD:
        loom_backend_rmsnorm_forward(be, e->b[1], e->s[1], e->b[0], e->w[0], N, C, 1e-5f);
        break;
    case LOOM_EW_RMSNORM_BWD:
        loom_backend_rmsnorm_backward(be, e->b[2], e->w[2], e->b[3], e->b[0], e->w[0], e->s[1], N,
                                      C);
        break;
    case LOOM_EW_GELU_FWD:
        loom_backend_gelu_forward(be, e->b[1], e->b[0], n);
        break;
    case LOOM_EW_GELU_BWD:
        loom_backend_gelu_backward(be, e->b[2], e->b[0], e->b[3], n);
        break;
    case LOOM_EW_SWIGLU_FWD:
        loom_backend_swiglu_forward(be, e->b[1], e->b[0], N, C);
        break;
    case LOOM_EW_SWIGLU_BWD:
        loom_backend_swiglu_backward(be, e->b[2], e->b[3], e->b[0], N, C);
        break;
    case LOOM_EW_ADD:
        loom_backend_add(be, e->b[2], e->b[0], e->b[1], n);
        break;
    case LOOM_EW_CROSSENTROPY:
        loom_backend_crossentropy_forward_backward(be, e->s[0], e->b[0], e->targets, N, C,
                                                   1.0f / N);
        break;
    default:
        loom_backend_attention_block_merge(be, e->b[1], e->s[0], e->b[0], e->s[1], &e->g);
        break;
    }
}

typedef struct {
    const loom_backend *be;
    size_t n;
    float *p, *g, *m, *v;
} adamw_arg;

static void adamw_run(const void *p) {
    const adamw_arg *a = p;
    loom_backend_adamw_update(a->be, a->p, a->g, a->m, a->v, a->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                              10);
}

static json_t *line_json(const double *x, const double *t, int n, int bytes_unit) {
    double a, b, err = fit_line(x, t, n, &a, &b);
    return json_pack("{s:f, s:f, s:f, s:o}", "alpha_us", a, bytes_unit ? "gbps" : "ns_per_param",
                     bytes_unit ? 1e-3 / b : b * 1e3, "fit_max_rel_err", err, "points",
                     points_json(x, t, n));
}

/* ---- the compute part, for one thread count ---- */

typedef struct {
    int gemm_dims[5], n_gemm;
    int att_T[6], n_T, att_hd[3], n_hd;
    double ew_bytes[6];
    int n_ew;
    double adamw_n[5];
    int n_adamw;
    double target_ms;
} grid_plan;

static grid_plan plan_for(int quick) {
    if (quick)
        return (grid_plan){{64, 256, 1024},
                           3,
                           {128, 256, 512},
                           3,
                           {32, 64},
                           2,
                           {1 << 18, 1 << 21, 1 << 24},
                           3,
                           {1 << 16, 1 << 20, 1 << 22},
                           3,
                           5.0};
    return (grid_plan){{32, 128, 512, 2048},
                       4,
                       {128, 256, 512, 1024, 2048},
                       5,
                       {32, 64, 128},
                       3,
                       {1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26},
                       5,
                       {1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24},
                       5,
                       30.0};
}

typedef struct {
    const loom_backend *be;
    const loom_backend *bf16; /* the bf16 backend (CPUs with AVX512-BF16/AMX), or NULL */
    float *gemm[3];
    float *att[9];
    float *ew[4], *ew_small[3], *ew_w[4];
    int32_t *targets;
    float *opt[4];
    int att_heads, ew_width, ce_width;
    size_t ew_pool; /* floats in each b->ew[i] */
} buffers;

static void free_buffers(buffers *b) {
    float **all[] = {b->gemm, b->att, b->ew, b->ew_small, b->ew_w, b->opt};
    int counts[] = {3, 9, 4, 3, 4, 4};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < counts[i]; j++) loom_backend_free(b->be, all[i][j]);
    loom_backend_free(b->be, b->targets);
}

static float *alloc_filled(const loom_backend *be, size_t n, float scale, int *ok) {
    float *p = loom_backend_alloc(be, n * sizeof(float) + 64);
    if (!p) {
        *ok = 0;
        return NULL;
    }
    fill(p, n, scale);
    return p;
}

/* Buffers for the largest of every kind, allocated with all threads set (the attention
 * scratch is per thread). */
static int alloc_buffers(buffers *b, const grid_plan *g) {
    const loom_backend *be = b->be;
    int ok = 1;
    size_t D = (size_t)g->gemm_dims[g->n_gemm - 1];
    const size_t pool = D * D > GEMM_POOL_FLOATS ? D * D : GEMM_POOL_FLOATS;
    for (int i = 0; i < 3; i++) b->gemm[i] = alloc_filled(be, pool, 0.01f, &ok);
    size_t T = (size_t)g->att_T[g->n_T - 1], hd = (size_t)g->att_hd[g->n_hd - 1];
    size_t H = (size_t)b->att_heads;
    size_t row = 3 * H * hd, sc = loom_backend_attention_scratch_floats(be, 1, (int)T, (int)H);
    size_t bsc = loom_backend_attention_block_scratch_floats(be, (int)T, 1);
    size_t sizes[9] = {T * row,        T * H * hd,     H * T,
                       T * H * hd,     T * row,        sc > bsc ? sc : bsc,
                       T * 2 * H * hd, T * 2 * H * hd, H * T};
    for (int i = 0; i < 9; i++) b->att[i] = alloc_filled(be, sizes[i], i == 2 ? 0.0f : 0.5f, &ok);
    size_t maxb = (size_t)g->ew_bytes[g->n_ew - 1];
    size_t rows = maxb / (8 * (size_t)b->ew_width) + 1;
    b->ew_pool = maxb / 4 + 16 > EW_POOL_FLOATS ? maxb / 4 + 16 : EW_POOL_FLOATS;
    for (int i = 0; i < 4; i++) b->ew[i] = alloc_filled(be, b->ew_pool, 0.5f, &ok);
    for (int i = 0; i < 3; i++) b->ew_small[i] = alloc_filled(be, 16 * rows + 16, 0.0f, &ok);
    for (int i = 0; i < 4; i++) b->ew_w[i] = alloc_filled(be, (size_t)b->ce_width, 0.5f, &ok);
    b->targets = loom_backend_alloc(be, (maxb / 8 + 16) * sizeof(int32_t));
    if (b->targets)
        for (size_t i = 0; i < maxb / 8 + 16; i++) b->targets[i] = (int32_t)(i % b->ce_width);
    else
        ok = 0;
    size_t nmax = (size_t)g->adamw_n[g->n_adamw - 1];
    for (int i = 0; i < 4; i++) b->opt[i] = alloc_filled(be, nmax, i < 2 ? 0.1f : 0.0f, &ok);
    /* the norms' statistics start sane (rstd 1), and so do the ring merge's lse */
    for (size_t i = 0; b->ew_small[1] && i < 16 * rows + 16; i++) b->ew_small[1][i] = 1.0f;
    if (b->opt[3])
        for (size_t i = 0; i < nmax; i++) b->opt[3][i] = 1e-4f;
    return ok;
}

static json_t *measure_compute(buffers *b, const grid_plan *g, int threads) {
    const loom_backend *be = b->be;
    loom_cpu_set_threads(threads);
    json_t *gemm = json_object(), *att = json_object(), *ew = json_object();
    for (int op = 0; op < LOOM_GEMM_OPS; op++) {
        fprintf(stderr, "calibrate: threads %d: gemm %s\n", threads,
                loom_gemm_op_name((loom_gemm_op)op));
        json_object_set_new(
            gemm, loom_gemm_op_name((loom_gemm_op)op),
            measure_gemm(be, (loom_gemm_op)op, g->gemm_dims, g->n_gemm, b->gemm, g->target_ms));
    }
    json_t *gemm16 = b->bf16 ? json_object() : NULL;
    for (int op = 0; gemm16 && op < LOOM_GEMM_OPS; op++) {
        fprintf(stderr, "calibrate: threads %d: gemm_bf16 %s\n", threads,
                loom_gemm_op_name((loom_gemm_op)op));
        json_object_set_new(gemm16, loom_gemm_op_name((loom_gemm_op)op),
                            measure_gemm(b->bf16, (loom_gemm_op)op, g->gemm_dims, g->n_gemm,
                                         b->gemm, g->target_ms));
    }
    fprintf(stderr, "calibrate: threads %d: attention\n", threads);
    for (int k = 0; k < LOOM_ATT_KINDS; k++)
        json_object_set_new(att, loom_attention_kind_name((loom_attention_kind)k),
                            measure_attention(be, (loom_attention_kind)k, g->att_T, g->n_T,
                                              g->att_hd, g->n_hd, b->att_heads, b->att,
                                              g->target_ms));
    fprintf(stderr, "calibrate: threads %d: elementwise, adamw\n", threads);
    for (int k = 0; k < LOOM_EW_KINDS; k++) {
        double x[6], t[6];
        int width = k == LOOM_EW_CROSSENTROPY ? b->ce_width : b->ew_width;
        for (int i = 0; i < g->n_ew; i++) {
            size_t slot = 0;
            double per_row = loom_profile_elementwise_bytes((loom_elementwise_kind)k, 1, width);
            int rows = (int)fmax(1, floor(g->ew_bytes[i] / per_row));
            ew_arg e = {
                be,
                (loom_elementwise_kind)k,
                rows,
                width,
                {b->ew[0], b->ew[1], b->ew[2], b->ew[3]},
                {b->ew_small[0], b->ew_small[1], b->ew_small[2]},
                {b->ew_w[0], b->ew_w[1], b->ew_w[2], b->ew_w[3]},
                b->targets,
                {.B = 1, .chunk = rows, .H = 16, .KV = 16, .hd = width / 16, .nq = 1, .nk = 1},
                b->ew_pool,
                &slot};
            /* the backward norms read a forward's statistics */
            ew_arg f = e;
            if (k == LOOM_EW_LAYERNORM_BWD) f.kind = LOOM_EW_LAYERNORM_FWD, ew_run(&f);
            if (k == LOOM_EW_RMSNORM_BWD) f.kind = LOOM_EW_RMSNORM_FWD, ew_run(&f);
            if (k == LOOM_EW_CROSSENTROPY && i == 0) fill(b->ew[0], b->ew_pool, 2.0f);
            x[i] = loom_profile_elementwise_bytes((loom_elementwise_kind)k, rows, width);
            t[i] = bench_us(ew_run, &e, g->target_ms);
        }
        json_t *o = line_json(x, t, g->n_ew, 1);
        json_object_set_new(o, "width", json_integer(width));
        json_object_set_new(ew, loom_elementwise_kind_name((loom_elementwise_kind)k), o);
    }
    double x[5] = {0}, t[5] = {0};
    for (int i = 0; i < g->n_adamw; i++) {
        adamw_arg a = {be, (size_t)g->adamw_n[i], b->opt[0], b->opt[1], b->opt[2], b->opt[3]};
        x[i] = g->adamw_n[i];
        t[i] = bench_us(adamw_run, &a, g->target_ms);
    }
    json_t *entry =
        json_pack("{s:i, s:o, s:o, s:o, s:o}", "threads", threads, "gemm", gemm, "attention", att,
                  "elementwise", ew, "adamw", line_json(x, t, g->n_adamw, 0));
    if (gemm16) json_object_set_new(entry, "gemm_bf16", gemm16);
    return entry;
}

json_t *loom_calibrate_compute(int quick, int threads) {
    grid_plan g = plan_for(quick);
    buffers b = {.be = loom_backend_cpu(),
                 .att_heads = 2 * threads < 4 ? 4 : 2 * threads,
                 .ew_width = 1024,
                 .ce_width = 8192};
    loom_cpu_set_threads(threads);
    if (!alloc_buffers(&b, &g)) {
        free_buffers(&b);
        return NULL;
    }
    /* --precision bf16's GEMMs as a run on this CPU does them (oneDNN, or widened to fp32
     * without bf16 instructions): the bf16 backend's linear ops, the weights read from a
     * bf16 copy of their pool as a run reads them (compute_weights.h) */
    loom_error berr;
    if (loom_backend_cpu_bf16_open(&b.bf16, &berr) == LOOM_OK) {
        size_t D = (size_t)g.gemm_dims[g.n_gemm - 1];
        const size_t pool = D * D > GEMM_POOL_FLOATS ? D * D : GEMM_POOL_FLOATS;
        loom_bf16 *copy = loom_backend_cpu_bf16_weight_copy(b.bf16, b.gemm[1], pool);
        if (copy) {
            loom_bf16_from_f32_n(copy, b.gemm[1], pool);
            loom_backend_cpu_bf16_weight_copy_valid(b.bf16, 1);
        }
    } else {
        b.bf16 = NULL;
        fprintf(stderr, "calibrate: %s (no gemm_bf16 in the profile)\n", berr.msg);
    }
    json_t *compute = json_array();
    json_array_append_new(compute, measure_compute(&b, &g, 1));
    if (threads > 1) json_array_append_new(compute, measure_compute(&b, &g, threads));
    loom_backend_close(b.bf16);
    free_buffers(&b);
    return compute;
}

/* ---- the MPI part: one process per rank under mpirun ---- */

typedef struct {
    loom_comm *c;
    float *a, *b;
    int *counts, *displs;
} comm_bufs;

static loom_status coll_run(comm_bufs *w, loom_collective_kind k, size_t bytes, loom_error *err) {
    loom_comm *c = w->c;
    int G = c->size;
    size_t total = bytes / sizeof(float), per = total / G;
    for (int r = 0; r < G; r++) w->counts[r] = (int)per, w->displs[r] = (int)(per * r);
    loom_comm_handle h[2];
    loom_status st;
    switch (k) {
    case LOOM_COLL_ALLREDUCE:
        return loom_comm_allreduce_sum(c, w->a, total, err);
    case LOOM_COLL_REDUCE_SCATTER:
        st = loom_comm_ireduce_scatter_sum(c, w->a, w->b, w->counts, &h[0], err);
        return st ? st : loom_comm_wait(&h[0], err);
    case LOOM_COLL_ALLGATHER:
        return loom_comm_allgatherv(c, w->a, w->counts, w->displs, err);
    case LOOM_COLL_ALLTOALL:
        return loom_comm_alltoallv(c, w->a, w->counts, w->displs, w->b, w->counts, w->displs, err);
    default: /* every rank sends to the next and receives from the previous */
        st = loom_comm_irecv(c, w->b, total, (c->rank + G - 1) % G, 7, &h[0], err);
        if (!st) st = loom_comm_isend(c, w->a, total, (c->rank + 1) % G, 7, &h[1], err);
        if (!st) st = loom_comm_wait(&h[0], err);
        if (!st) st = loom_comm_wait(&h[1], err);
        return st;
    }
}

/* Microseconds per operation: the slowest rank's, best of four batches. */
static loom_status coll_us(comm_bufs *w, loom_collective_kind k, size_t bytes, double target_ms,
                           double *us, loom_error *err) {
    loom_status st = coll_run(w, k, bytes, err);
    if (!st) st = loom_comm_barrier(w->c, err);
    double t0 = loom_now_ms();
    if (!st) st = coll_run(w, k, bytes, err);
    double one = loom_now_ms() - t0, best;
    if (st) return st;
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, w->c->mpi);
    best = one;
    int reps = (int)fmin(2000, fmax(1, target_ms / 2 / fmax(one, 1e-4)));
    for (int b = 0; b < 4 && !st; b++) {
        st = loom_comm_barrier(w->c, err);
        t0 = loom_now_ms();
        for (int r = 0; r < reps && !st; r++) st = coll_run(w, k, bytes, err);
        double dt = (loom_now_ms() - t0) / reps;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, w->c->mpi);
        best = fmin(best, dt);
    }
    *us = best * 1e3;
    return st;
}

/* The engine's cost: n operations of `count` floats posted and waited one at a time. */
static loom_status engine_cost(loom_comm *c, float *buf, size_t count, int n, double *cpu_us,
                               double *post_us, int *threaded, loom_error *err) {
    loom_comm_engine e;
    loom_status st = loom_comm_engine_start(&e, c, 4, err);
    if (st) return st;
    *threaded = e.threaded;
    double cpu0 = loom_comm_engine_cpu_ms(&e), post = 0;
    for (int i = 0; i < n && !st; i++) {
        loom_comm_op op = {.kind = LOOM_OP_ALLREDUCE, .buf = buf, .count = count};
        double t0 = loom_now_ms();
        st = loom_comm_engine_post(&e, &op, err);
        post += loom_now_ms() - t0;
        if (!st) st = loom_comm_engine_wait(&e, &op, err);
    }
    double cpu = loom_comm_engine_cpu_ms(&e) - cpu0;
    loom_comm_engine_stop(&e);
    MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_MAX, c->mpi);
    MPI_Allreduce(MPI_IN_PLACE, &post, 1, MPI_DOUBLE, MPI_MAX, c->mpi);
    *cpu_us = cpu * 1e3 / n;
    *post_us = post * 1e3 / n;
    return st;
}

loom_status loom_calibrate_comm(loom_comm *c, int quick, json_t **out, loom_error *err) {
    *out = NULL;
    loom_status st = LOOM_OK;
    int G = c->size;
    size_t maxb = quick ? (size_t)16 << 20 : (size_t)64 << 20;
    double target = quick ? 8.0 : 40.0;
    comm_bufs b = {c, malloc(maxb), malloc(maxb), calloc((size_t)G, sizeof(int)),
                   calloc((size_t)G, sizeof(int))};
    if (!b.a || !b.b || !b.counts || !b.displs) st = loom_error_set(err, LOOM_ERR_NOMEM, "buffers");
    if (!st) fill(b.a, maxb / 4, 0.01f), fill(b.b, maxb / 4, 0.01f);
    json_t *colls = json_array();
    for (int k = 0; k < LOOM_COLL_KINDS && !st; k++) {
        double x[12], t[12];
        int n = 0;
        for (size_t bytes = 4096; bytes <= maxb && !st; bytes *= quick ? 8 : 4, n++) {
            x[n] = (double)bytes;
            st = coll_us(&b, (loom_collective_kind)k, bytes, target, &t[n], err);
        }
        if (st) break;
        double a, beta, fit_err = fit_line(x, t, n, &a, &beta);
        double factor = loom_collective_bus_factor((loom_collective_kind)k, G);
        json_array_append_new(colls, json_pack("{s:s, s:i, s:s, s:f, s:f, s:f, s:o}", "kind",
                                               loom_collective_kind_name((loom_collective_kind)k),
                                               "group", G, "placement", "intra_node", "alpha_us", a,
                                               "busbw_gbs", 1e-3 / beta * factor, "fit_max_rel_err",
                                               fit_err, "points", points_json(x, t, n)));
        if (c->rank == 0)
            fprintf(stderr, "calibrate: group %d: %s alpha %.1f us, busbw %.2f GB/s\n", G,
                    loom_collective_kind_name((loom_collective_kind)k), a, 1e-3 / beta * factor);
    }
    double cpu_small = 0, cpu_big = 0, post = 0, post_big = 0;
    int threaded = 0, n_ops = quick ? 100 : 400;
    if (!st) st = engine_cost(c, b.a, 1024, n_ops, &cpu_small, &post, &threaded, err);
    if (!st) st = engine_cost(c, b.a, 262144, n_ops / 4, &cpu_big, &post_big, &threaded, err);
    if (!st && c->rank == 0) {
        double per_mib = fmax(0, (cpu_big - cpu_small) * 1048576.0 / (1048576.0 - 4096.0));
        *out = json_pack("{s:i, s:s, s:o, s:{s:f, s:f, s:f, s:b, s:s}}", "group", G, "thread_level",
                         loom_world_thread_level_name(loom_world_thread_level()), "collectives",
                         colls, "engine", "cpu_us_per_op", cpu_small, "cpu_us_per_mib", per_mib,
                         "post_us", post, "threaded", threaded, "measured_with",
                         "allreduce of 4 KiB and 1 MiB, post + wait");
        colls = NULL;
    }
    json_decref(colls);
    free(b.a), free(b.b), free(b.counts), free(b.displs);
    return st;
}

/* ---- cores busy at once: one one-thread process a core ---- */

/* The co-run workload: GEMMs as the compute grid times them (nt, 256 x 256 x 256, cold
 * operands from the pools), or memory-bound kernels (an add over 4 M floats, AdamW over
 * 2 M parameters). */
typedef struct {
    gemm_arg g;
    float *x, *y, *z, *p, *gr, *m, *v;
    size_t n, np;
} corun_arg;

static void corun_gemm(const void *p) {
    gemm_run(&((const corun_arg *)p)->g);
}

static void corun_memory(const void *p) {
    const corun_arg *a = p;
    loom_backend_add(a->g.be, a->z, a->x, a->y, a->n);
    loom_backend_adamw_update(a->g.be, a->p, a->gr, a->m, a->v, a->np, 1e-4f, 0.9f, 0.95f, 1e-8f,
                              0.1f, 10);
}

static double run_ms(bench_fn f, const void *arg, int reps) {
    const double t0 = loom_now_ms();
    for (int r = 0; r < reps; r++) f(arg);
    return loom_now_ms() - t0;
}

/* A barrier that waits without keeping a core busy (an MPI_Ibarrier tested every 2 ms):
 * the other processes' cores stay idle while one measures alone. */
static void quiet_barrier(MPI_Comm comm) {
    MPI_Request rq;
    int done = 0;
    MPI_Ibarrier(comm, &rq);
    while (!done) {
        MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        if (!done) nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

/* Per call of f, ms: rank 0 alone (the others wait quietly), then every rank at once (the
 * mean over the ranks); the median of three rounds each. */
static void corun_times(loom_comm *c, bench_fn f, const void *arg, double target_ms, double *alone,
                        double *together) {
    int reps = 1;
    double t[3];
    f(arg);
    quiet_barrier(c->mpi); /* every warm-up done before rank 0 times alone */
    if (c->rank == 0) {
        reps = (int)fmax(2, fmin(1000, target_ms / fmax(run_ms(f, arg, 1), 1e-3)));
        for (int r = 0; r < 3; r++) t[r] = run_ms(f, arg, reps) / reps;
        *alone = loom_median(t, 3);
    }
    quiet_barrier(c->mpi);
    MPI_Bcast(&reps, 1, MPI_INT, 0, c->mpi);
    for (int r = 0; r < 3; r++) {
        MPI_Barrier(c->mpi);
        t[r] = run_ms(f, arg, reps) / reps;
        MPI_Allreduce(MPI_IN_PLACE, &t[r], 1, MPI_DOUBLE, MPI_SUM, c->mpi);
        t[r] /= c->size;
    }
    *together = loom_median(t, 3);
}

loom_status loom_calibrate_corun(loom_comm *c, int quick, json_t **out, loom_error *err) {
    *out = NULL;
    if (c->size < 2 || c->size > sysconf(_SC_NPROCESSORS_ONLN)) return LOOM_OK;
    const loom_backend *be = loom_backend_cpu();
    size_t slot = 0;
    corun_arg a = {.g = {be, LOOM_GEMM_NT, 256, 256, 256, NULL, NULL, NULL, &slot},
                   .n = (size_t)4 << 20,
                   .np = (size_t)2 << 20};
    float **bufs[] = {&a.g.a, &a.g.b, &a.g.c, &a.x, &a.y, &a.z, &a.p, &a.gr, &a.m, &a.v};
    int ok = 1;
    for (int i = 0; i < 10; i++) {
        const size_t n = i < 3 ? GEMM_POOL_FLOATS : i < 6 ? a.n : a.np;
        *bufs[i] = malloc(n * sizeof(float));
        if (*bufs[i]) fill(*bufs[i], n, i == 9 ? 0.01f : 1.0f);
        ok = ok && *bufs[i];
    }
    if (!ok) {
        for (int i = 0; i < 10; i++) free(*bufs[i]);
        return loom_error_set(err, LOOM_ERR_NOMEM, "calibrate: co-run buffers");
    }
    for (size_t i = 0; i < a.np; i++) a.v[i] = fabsf(a.v[i]); /* a second moment: >= 0 */
    const double target = quick ? 100.0 : 400.0;
    double alone[2] = {0}, together[2] = {0};
    corun_times(c, corun_gemm, &a, target, &alone[0], &together[0]);
    corun_times(c, corun_memory, &a, target, &alone[1], &together[1]);
    for (int i = 0; i < 10; i++) free(*bufs[i]);
    if (c->rank == 0) {
        const double g = together[0] / alone[0], m = together[1] / alone[1];
        fprintf(stderr,
                "calibrate: %d one-thread processes at once: GEMMs %.2fx, memory-bound "
                "kernels %.2fx their time alone\n",
                c->size, g, m);
        *out = json_pack("{s:i, s:f, s:f}", "processes", c->size, "gemm", g, "memory", m);
    }
    return LOOM_OK;
}

/* GB/s of touching pages handed back to the kernel: ZeRO-3 hands back the whole huge
 * pages of each gathered block after its use (loom_fsdp_release_span) and the next gather
 * faults them in again, zero-filled (plan/step_time.c prices that). Handed back one huge
 * page at a time as ZeRO-3 does, then one float written per 4 KiB page (where the kernel
 * gives no huge pages, these are 4 KiB faults); the median of 7 rounds (faults vary with
 * the host's memory). */
static double measure_refault_gbps(void) {
    const size_t bytes = (size_t)32 << 20, piece = LOOM_HUGE_PAGE_BYTES;
    float *buf = loom_zero_map_huge(bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    double t[7];
    for (int r = 0; r < 7; r++) {
        const double t0 = loom_now_ms();
        for (size_t at = 0; at < bytes; at += piece)
            loom_zero_release_pages(buf, at / sizeof(float), (at + piece) / sizeof(float));
        for (size_t i = 0; i < bytes / sizeof(float); i += 4096 / sizeof(float)) buf[i] = 1.0f;
        t[r] = loom_now_ms() - t0;
    }
    munmap(buf, bytes);
    const double ms = loom_median(t, 7);
    return ms > 0 ? (double)bytes / (ms * 1e6) : 0;
}

json_t *loom_calibrate_machine(int quick) {
    char model[256] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v += v[1] == ' ' ? 2 : 1;
                v[strcspn(v, "\n")] = 0;
                snprintf(model, sizeof model, "%s", v);
            }
            break;
        }
    if (f) fclose(f);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 1073741824.0;
    double load = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la && fscanf(la, "%lf", &load) != 1) load = -1;
    if (la) fclose(la);
    if (load > 0.5 * (double)cores)
        fprintf(stderr,
                "calibrate: warning: load average %.1f on %ld cores: other processes share this "
                "machine, so the measurements are slower and noisier than the machine\n",
                load, cores);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    char desc[400];
    snprintf(desc, sizeof desc, "%s, %ld cores (OpenBLAS %s)", model, cores,
             loom_cpu_blas_corename());
    const double refault = measure_refault_gbps();
    fprintf(stderr, "calibrate: pages handed back and touched again: %.2f GB/s\n", refault);
    return json_pack("{s:s, s:s, s:i, s:f, s:b, s:i, s:f, s:s, s:s, s:s, s:b, s:f}", "description",
                     desc, "cpu", model, "cores", (int)cores, "memory_gib", gib, "memory_shared", 1,
                     "devices_per_node", (int)(cores < 1 ? 1 : cores), "refault_gbps", refault,
                     "blas_kernel", loom_cpu_blas_corename(), "loom_version", LOOM_VERSION, "date",
                     date, "quick", quick, "load_average", load);
}
