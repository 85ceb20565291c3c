/* Kernel tests for the diffusion transformer's pieces (bidirectional attention, LayerNorm
 * without affine, adaLN modulation, the gated residual, positions, SiLU, the timestep
 * embedding, the MSE loss) against naive float64 references on random inputs. Every
 * backward is checked twice: against the float64 analytic gradient of the reference
 * forward (with random starting gradients, so the += is checked too) and by central
 * finite differences of the float64 forward at random entries. Odd shapes throughout:
 * C = 37, T = 5, row0 not a multiple of T, N not a multiple of T (samples split at the
 * first and last local rows). Then: results independent of the thread count, and every
 * op through loom_backend_cpu() bitwise the direct kernel. */
#include "test_kernels_util.h"

#include <omp.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/kernels.h"

/* Bitwise equality of two float buffers; names the seed on failure. */
static void same(const char *what, const float *a, const float *b, size_t n) {
    if (memcmp(a, b, n * sizeof(float)) == 0) return;
    size_t i = 0;
    while (i < n && memcmp(a + i, b + i, sizeof(float)) == 0) i++;
    fprintf(stderr, "%s: differ at [%zu]: %.9g vs %.9g; LOOM_TEST_SEED=%llu\n", what, i,
            (double)a[i], (double)b[i], (unsigned long long)tk_seed);
    fail();
}

/* got[i] - start[i] as float64: what a backward added to a random starting gradient. */
static double *added(const float *got, const float *start, size_t n) {
    double *d = tk_dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = (double)got[i] - start[i];
    return d;
}

/* Central finite differences of a float64 loss at `probes` random entries of x (the
 * loss reads x through ctx), against grad = what the kernel added to its gradient. */
typedef double (*loss_fn)(void *ctx);
static void fd_check(const char *what, double *x, size_t n, loss_fn loss, void *ctx,
                     const double *grad, int probes) {
    for (int p = 0; p < probes; p++) {
        size_t k = (size_t)tk_randint((int)n);
        double save = x[k], h = 1e-5 * fmax(1.0, fabs(save));
        x[k] = save + h;
        double lp = loss(ctx);
        x[k] = save - h;
        double lm = loss(ctx);
        x[k] = save;
        double fd = (lp - lm) / (2 * h);
        if (!(fabs(grad[k] - fd) <= 3e-5 + 3e-4 * fabs(fd))) {
            fprintf(stderr,
                    "%s: finite difference at [%zu]: kernel %.9g, fd %.9g; LOOM_TEST_SEED=%llu\n",
                    what, k, grad[k], fd, (unsigned long long)tk_seed);
            fail();
        }
    }
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ==== bidirectional attention ==== */
typedef struct {
    int B, T, H, KV, hd;
} attn_shape;

/* Naive float64 softmax attention over all keys; dqkv (may be NULL) += the analytic
 * gradient of sum(out * dout). */
static void ref_attention(double *out, double *lse, double *dqkv, const double *qkv,
                          const double *dout, attn_shape s) {
    int R = (s.H + 2 * s.KV) * s.hd, OC = s.H * s.hd, T = s.T, hd = s.hd;
    double scale = 1.0 / sqrt(hd);
    double *P = tk_dalloc((size_t)T * T), *dP = tk_dalloc((size_t)T);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.H; h++) {
            int kvh = h / (s.H / s.KV);
            size_t base = (size_t)b * T * R;
            size_t qo = base + (size_t)h * hd, ko = base + (size_t)(s.H + kvh) * hd;
            size_t vo = base + (size_t)(s.H + s.KV + kvh) * hd;
            const double *q = qkv + qo, *k = qkv + ko, *v = qkv + vo;
            const double *dy = dout + (size_t)b * T * OC + (size_t)h * hd;
            double *o = out + (size_t)b * T * OC + (size_t)h * hd;
            for (int i = 0; i < T; i++) {
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += q[i * R + c] * k[j * R + c];
                    P[i * T + j] = d * scale;
                    m = fmax(m, d * scale);
                }
                for (int j = 0; j < T; j++) sum += exp(P[i * T + j] - m);
                for (int j = 0; j < T; j++) P[i * T + j] = exp(P[i * T + j] - m) / sum;
                if (lse) lse[((size_t)b * s.H + h) * T + i] = m + log(sum);
                for (int c = 0; c < hd; c++) {
                    double acc = 0;
                    for (int j = 0; j < T; j++) acc += P[i * T + j] * v[j * R + c];
                    o[i * OC + c] = acc;
                }
            }
            if (!dqkv) continue;
            for (int i = 0; i < T; i++) {
                double pdp = 0; /* sum_k P_ik dP_ik, the softmax Jacobian's rank-1 term */
                for (int j = 0; j < T; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += dy[i * OC + c] * v[j * R + c];
                    dP[j] = d;
                    pdp += P[i * T + j] * d;
                }
                for (int j = 0; j < T; j++) {
                    double ds = P[i * T + j] * (dP[j] - pdp) * scale;
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

typedef struct {
    attn_shape s;
    double *qkv, *dout, *out;
} attn_ctx;
static double attn_loss(void *p) {
    attn_ctx *c = p;
    size_t nout = (size_t)c->s.B * c->s.T * c->s.H * c->s.hd;
    ref_attention(c->out, NULL, NULL, c->qkv, c->dout, c->s);
    return dot(c->out, c->dout, nout);
}

static void check_attention_bidir(attn_shape s) {
    size_t nqkv = (size_t)s.B * s.T * (s.H + 2 * s.KV) * s.hd;
    size_t nout = (size_t)s.B * s.T * s.H * s.hd, nlse = (size_t)s.B * s.H * s.T;
    size_t nscratch = loom_attention_scratch_floats(s.T);
    float *qkv = tk_rand(nqkv, 1.5f), *dout = tk_rand(nout, 1), *dqkv = tk_rand(nqkv, 1);
    float *dqkv0 = tk_copy(dqkv, nqkv);
    float *out = tk_alloc(nout), *lse = tk_alloc(nlse), *scratch = tk_alloc(nscratch);
    for (size_t i = 0; i < nscratch; i++) scratch[i] = NAN; /* stale scratch must not leak */
    double *qd = tk_widen(qkv, nqkv), *dyd = tk_widen(dout, nout);
    double *rout = tk_dalloc(nout), *rlse = tk_dalloc(nlse), *rdqkv = tk_widen(dqkv, nqkv);
    ref_attention(rout, rlse, rdqkv, qd, dyd, s);
    loom_attention_bidir_forward(out, lse, qkv, scratch, s.B, s.T, s.H, s.KV, s.hd);
    tk_check("attention_bidir out", out, rout, nout, 1e-4, 1e-5);
    tk_check("attention_bidir lse", lse, rlse, nlse, 1e-5, 1e-5);
    for (size_t i = 0; i < nscratch; i++) scratch[i] = NAN;
    loom_attention_bidir_backward(dqkv, scratch, dout, qkv, out, lse, s.B, s.T, s.H, s.KV, s.hd);
    tk_check("attention_bidir dqkv", dqkv, rdqkv, nqkv, 1e-4, 2e-5);
    double *g = added(dqkv, dqkv0, nqkv);
    attn_ctx c = {s, qd, dyd, tk_dalloc(nout)};
    fd_check("attention_bidir dqkv", qd, nqkv, attn_loss, &c, g, 12);
    /* not the causal kernel: the first row sees every key (T > 1) */
    if (s.T > 1) {
        float *cout = tk_alloc(nout), *clse = tk_alloc(nlse);
        loom_attention_forward(cout, clse, qkv, scratch, s.B, s.T, s.H, s.KV, s.hd);
        assert_true(fabsf(clse[0] - lse[0]) > 1e-6f);
        free(cout), free(clse);
    }
    free(qkv), free(dout), free(dqkv), free(dqkv0), free(out), free(lse), free(scratch);
    free(qd), free(dyd), free(rout), free(rlse), free(rdqkv), free(g), free(c.out);
}

static void test_attention_bidir(void **state) {
    (void)state;
    tk_reseed(101);
    const attn_shape shapes[] = {
        {1, 1, 4, 2, 6},   {2, 5, 4, 2, 6},  {1, 17, 4, 2, 10}, {2, 33, 6, 3, 10},
        {1, 130, 4, 2, 8}, {2, 65, 4, 1, 8}, {1, 64, 2, 2, 64}, {3, 37, 4, 4, 16},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        check_attention_bidir(shapes[i]);
}

/* ==== LayerNorm without affine ==== */
static void ref_layernorm(double *out, double *mean, double *rstd, const double *x, int N, int C,
                          double eps) {
    for (int n = 0; n < N; n++) {
        const double *r = x + (size_t)n * C;
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++) mu += r[c];
        mu /= C;
        for (int c = 0; c < C; c++) var += (r[c] - mu) * (r[c] - mu);
        double rs = 1.0 / sqrt(var / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (r[c] - mu) * rs;
        if (mean) mean[n] = mu, rstd[n] = rs;
    }
}
/* dx += rstd * (dy - mean(dy) - xhat * mean(dy * xhat)), the exact float64 gradient */
static void ref_layernorm_backward(double *dx, const double *dy, const double *x, int N, int C,
                                   double eps) {
    double *xh = tk_dalloc((size_t)N * C), *mean = tk_dalloc(N), *rstd = tk_dalloc(N);
    ref_layernorm(xh, mean, rstd, x, N, C, eps);
    for (int n = 0; n < N; n++) {
        double sg = 0, sgx = 0;
        for (int c = 0; c < C; c++) {
            sg += dy[(size_t)n * C + c];
            sgx += dy[(size_t)n * C + c] * xh[(size_t)n * C + c];
        }
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            dx[i] += rstd[n] * (dy[i] - sg / C - xh[i] * sgx / C);
        }
    }
    free(xh), free(mean), free(rstd);
}

typedef struct {
    int N, C;
    double eps, *x, *dy, *out;
} ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    ref_layernorm(c->out, NULL, NULL, c->x, c->N, c->C, c->eps);
    return dot(c->out, c->dy, (size_t)c->N * c->C);
}

static void check_layernorm_plain(int N, int C, float shift) {
    const float eps = 1e-6f;
    size_t n = (size_t)N * C;
    float *x = tk_rand(n, 2), *dy = tk_rand(n, 1), *dx = tk_rand(n, 1), *dx0 = tk_copy(dx, n);
    for (size_t i = 0; i < n; i++) x[i] += shift; /* a large mean: the two-pass variance */
    float *out = tk_alloc(n), *mean = tk_alloc(N), *rstd = tk_alloc(N);
    double *xd = tk_widen(x, n), *dyd = tk_widen(dy, n), *rout = tk_dalloc(n);
    double *rmean = tk_dalloc(N), *rrstd = tk_dalloc(N), *rdx = tk_widen(dx, n);
    ref_layernorm(rout, rmean, rrstd, xd, N, C, eps);
    ref_layernorm_backward(rdx, dyd, xd, N, C, eps);
    loom_layernorm_plain_forward(out, mean, rstd, x, N, C, eps);
    tk_check("layernorm_plain out", out, rout, n, 1e-4, 1e-5);
    tk_check("layernorm_plain mean", mean, rmean, N, 1e-6, 1e-6);
    tk_check("layernorm_plain rstd", rstd, rrstd, N, 1e-5, 0);
    loom_layernorm_plain_backward(dx, dy, x, mean, rstd, N, C);
    tk_check("layernorm_plain dinp", dx, rdx, n, 1e-4, 2e-5);
    double *g = added(dx, dx0, n);
    ln_ctx c = {N, C, eps, xd, dyd, tk_dalloc(n)};
    fd_check("layernorm_plain dinp", xd, n, ln_loss, &c, g, 12);
    /* the same numerics as the affine kernel with weight 1, bias 0 (== treats -0 == 0) */
    float *w = tk_alloc(C), *b = tk_alloc(C), *dw = tk_alloc(C), *db = tk_alloc(C);
    float *aout = tk_alloc(n), *amean = tk_alloc(N), *arstd = tk_alloc(N), *adx = tk_copy(dx0, n);
    float *pdx = tk_copy(dx0, n);
    for (int i = 0; i < C; i++) w[i] = 1, b[i] = 0, dw[i] = 0, db[i] = 0;
    loom_layernorm_forward(aout, amean, arstd, x, w, b, N, C, eps);
    for (size_t i = 0; i < n; i++) assert_true(aout[i] == out[i]);
    same("layernorm_plain mean vs affine", mean, amean, N);
    same("layernorm_plain rstd vs affine", rstd, arstd, N);
    loom_layernorm_backward(adx, dw, db, dy, x, w, mean, rstd, N, C);
    loom_layernorm_plain_backward(pdx, dy, x, mean, rstd, N, C);
    for (size_t i = 0; i < n; i++) assert_true(adx[i] == pdx[i]);
    free(x), free(dy), free(dx), free(dx0), free(out), free(mean), free(rstd), free(xd);
    free(dyd), free(rout), free(rmean), free(rrstd), free(rdx), free(g), free(c.out), free(w);
    free(b), free(dw), free(db), free(aout), free(amean), free(arstd), free(adx), free(pdx);
}

static void test_layernorm_plain(void **state) {
    (void)state;
    tk_reseed(102);
    check_layernorm_plain(1, 1, 0);
    check_layernorm_plain(7, 37, 0);
    check_layernorm_plain(13, 130, 0);
    check_layernorm_plain(5, 64, 100);
    check_layernorm_plain(3, 384, 0);
}

/* ==== per-sample ops: modulate, gate add, positions ==== */
typedef struct {
    int N, C, T, row0;
} rows_shape;
static const rows_shape row_shapes[] = {
    {21, 37, 5, 7},    /* split first and last samples */
    {3, 37, 5, 6},     /* one partial sample */
    {20, 37, 5, 0},    /* whole samples */
    {1, 3, 5, 4},      /* one row, the last of its sample */
    {130, 70, 64, 33}, /* two column blocks, samples of 64 */
    {200, 130, 7, 3},
};
#define N_ROW_SHAPES (sizeof(row_shapes) / sizeof(row_shapes[0]))

/* Samples the per-sample buffers hold: every global sample up to the last local one. */
static int n_samples(rows_shape s) {
    return (s.row0 + s.N - 1) / s.T + 1;
}
/* ld and the offsets of the vectors inside a row: gaps between them stay untouched */
static int mod_ld(int C) {
    return 3 * C + 3;
}
#define OFF_SHIFT 1
#define OFF_SCALE(C) ((C) + 2)

static void ref_modulate(double *out, const double *x, const double *mod, rows_shape s) {
    int ld = mod_ld(s.C);
    for (int i = 0; i < s.N; i++) {
        int b = (s.row0 + i) / s.T;
        for (int c = 0; c < s.C; c++) {
            size_t k = (size_t)i * s.C + c;
            out[k] = x[k] * (1 + mod[(size_t)b * ld + OFF_SCALE(s.C) + c]) +
                     mod[(size_t)b * ld + OFF_SHIFT + c];
        }
    }
}

typedef struct {
    rows_shape s;
    double *x, *mod, *dy, *out;
} mod_ctx;
static double mod_loss(void *p) {
    mod_ctx *c = p;
    ref_modulate(c->out, c->x, c->mod, c->s);
    return dot(c->out, c->dy, (size_t)c->s.N * c->s.C);
}

static void check_modulate(rows_shape s) {
    int ld = mod_ld(s.C), nb = n_samples(s);
    size_t n = (size_t)s.N * s.C, nm = (size_t)nb * ld;
    float *x = tk_rand(n, 2), *mod = tk_rand(nm, 1), *dy = tk_rand(n, 1);
    float *dx = tk_rand(n, 1), *dmod = tk_rand(nm, 1), *dx0 = tk_copy(dx, n);
    float *dmod0 = tk_copy(dmod, nm), *out = tk_alloc(n);
    double *xd = tk_widen(x, n), *md = tk_widen(mod, nm), *dyd = tk_widen(dy, n);
    double *rout = tk_dalloc(n), *rdx = tk_widen(dx, n), *rdmod = tk_widen(dmod, nm);
    ref_modulate(rout, xd, md, s);
    for (int i = 0; i < s.N; i++) {
        int b = (s.row0 + i) / s.T;
        for (int c = 0; c < s.C; c++) {
            size_t k = (size_t)i * s.C + c, m = (size_t)b * ld + c;
            rdx[k] += dyd[k] * (1 + md[m + OFF_SCALE(s.C)]);
            rdmod[m + OFF_SHIFT] += dyd[k];
            rdmod[m + OFF_SCALE(s.C)] += dyd[k] * xd[k];
        }
    }
    const float *shift = mod + OFF_SHIFT, *scale = mod + OFF_SCALE(s.C);
    loom_modulate_forward(out, x, shift, scale, ld, s.N, s.C, s.T, s.row0);
    tk_check("modulate out", out, rout, n, 1e-6, 2e-6);
    loom_modulate_backward(dx, dmod + OFF_SHIFT, dmod + OFF_SCALE(s.C), dy, x, scale, ld, s.N, s.C,
                           s.T, s.row0);
    tk_check("modulate dx", dx, rdx, n, 1e-6, 2e-6);
    /* the whole buffer: the gaps and the samples before row0's stay as they were */
    tk_check("modulate dshift/dscale", dmod, rdmod, nm, 1e-5, 1e-5);
    double *gx = added(dx, dx0, n), *gm = added(dmod, dmod0, nm);
    mod_ctx c = {s, xd, md, dyd, tk_dalloc(n)};
    fd_check("modulate dx", xd, n, mod_loss, &c, gx, 8);
    fd_check("modulate dshift/dscale", md, nm, mod_loss, &c, gm, 16);
    free(x), free(mod), free(dy), free(dx), free(dmod), free(dx0), free(dmod0), free(out);
    free(xd), free(md), free(dyd), free(rout), free(rdx), free(rdmod), free(gx), free(gm);
    free(c.out);
}

static void test_modulate(void **state) {
    (void)state;
    tk_reseed(103);
    for (size_t i = 0; i < N_ROW_SHAPES; i++) check_modulate(row_shapes[i]);
}

#define OFF_GATE 2
static void ref_gate_add(double *out, const double *res, const double *y, const double *mod,
                         rows_shape s) {
    int ld = mod_ld(s.C);
    for (int i = 0; i < s.N; i++) {
        int b = (s.row0 + i) / s.T;
        for (int c = 0; c < s.C; c++) {
            size_t k = (size_t)i * s.C + c;
            out[k] = res[k] + mod[(size_t)b * ld + OFF_GATE + c] * y[k];
        }
    }
}

typedef struct {
    rows_shape s;
    double *res, *y, *mod, *dy, *out;
} gate_ctx;
static double gate_loss(void *p) {
    gate_ctx *c = p;
    ref_gate_add(c->out, c->res, c->y, c->mod, c->s);
    return dot(c->out, c->dy, (size_t)c->s.N * c->s.C);
}

static void check_gate_add(rows_shape s) {
    int ld = mod_ld(s.C), nb = n_samples(s);
    size_t n = (size_t)s.N * s.C, nm = (size_t)nb * ld;
    float *res = tk_rand(n, 2), *y = tk_rand(n, 2), *mod = tk_rand(nm, 1), *dout = tk_rand(n, 1);
    float *dy = tk_rand(n, 1), *dmod = tk_rand(nm, 1), *dy0 = tk_copy(dy, n);
    float *dmod0 = tk_copy(dmod, nm), *out = tk_alloc(n);
    double *rd = tk_widen(res, n), *yd = tk_widen(y, n), *md = tk_widen(mod, nm);
    double *doutd = tk_widen(dout, n), *rout = tk_dalloc(n), *rdy = tk_widen(dy, n);
    double *rdmod = tk_widen(dmod, nm);
    ref_gate_add(rout, rd, yd, md, s);
    for (int i = 0; i < s.N; i++) {
        int b = (s.row0 + i) / s.T;
        for (int c = 0; c < s.C; c++) {
            size_t k = (size_t)i * s.C + c, m = (size_t)b * ld + OFF_GATE + c;
            rdy[k] += doutd[k] * md[m];
            rdmod[m] += doutd[k] * yd[k];
        }
    }
    const float *gate = mod + OFF_GATE;
    loom_gate_add_forward(out, res, y, gate, ld, s.N, s.C, s.T, s.row0);
    tk_check("gate_add out", out, rout, n, 1e-6, 2e-6);
    float *inplace = tk_copy(res, n); /* out aliasing res: the same values */
    loom_gate_add_forward(inplace, inplace, y, gate, ld, s.N, s.C, s.T, s.row0);
    same("gate_add in place", inplace, out, n);
    loom_gate_add_backward(dy, dmod + OFF_GATE, dout, y, gate, ld, s.N, s.C, s.T, s.row0);
    tk_check("gate_add dy", dy, rdy, n, 1e-6, 2e-6);
    tk_check("gate_add dgate", dmod, rdmod, nm, 1e-5, 1e-5);
    double *gy = added(dy, dy0, n), *gm = added(dmod, dmod0, nm);
    gate_ctx c = {s, rd, yd, md, doutd, tk_dalloc(n)};
    fd_check("gate_add dy", yd, n, gate_loss, &c, gy, 8);
    fd_check("gate_add dgate", md, nm, gate_loss, &c, gm, 16);
    free(res), free(y), free(mod), free(dout), free(dy), free(dmod), free(dy0), free(dmod0);
    free(out), free(rd), free(yd), free(md), free(doutd), free(rout), free(rdy), free(rdmod);
    free(inplace), free(gy), free(gm), free(c.out);
}

static void test_gate_add(void **state) {
    (void)state;
    tk_reseed(104);
    for (size_t i = 0; i < N_ROW_SHAPES; i++) check_gate_add(row_shapes[i]);
}

static void test_add_position(void **state) {
    (void)state;
    tk_reseed(105);
    for (size_t k = 0; k < N_ROW_SHAPES; k++) {
        rows_shape s = row_shapes[k];
        size_t n = (size_t)s.N * s.C;
        float *x = tk_rand(n, 2), *pos = tk_rand((size_t)s.T * s.C, 1);
        double *ref = tk_widen(x, n);
        for (int i = 0; i < s.N; i++)
            for (int c = 0; c < s.C; c++)
                ref[(size_t)i * s.C + c] += pos[(size_t)((s.row0 + i) % s.T) * s.C + c];
        loom_add_position(x, pos, s.N, s.C, s.T, s.row0);
        tk_check("add_position", x, ref, n, 1e-6, 1e-6);
        free(x), free(pos), free(ref);
    }
}

/* ==== SiLU ==== */
static double silu_d(double x) {
    return x / (1 + exp(-x));
}
typedef struct {
    size_t n;
    double *x, *dy;
} silu_ctx;
static double silu_loss(void *p) {
    silu_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += silu_d(c->x[i]) * c->dy[i];
    return s;
}

static void test_silu(void **state) {
    (void)state;
    tk_reseed(106);
    const size_t sizes[] = {1, 37, 1000, 4099};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        float *x = tk_rand(n, 8), *dy = tk_rand(n, 1), *dx = tk_rand(n, 1), *dx0 = tk_copy(dx, n);
        float *out = tk_alloc(n);
        if (n > 4) x[0] = 0, x[1] = -90, x[2] = 90, x[3] = -20; /* tails and zero */
        double *xd = tk_widen(x, n), *dyd = tk_widen(dy, n), *ro = tk_dalloc(n);
        double *rdx = tk_widen(dx, n);
        for (size_t i = 0; i < n; i++) {
            double sg = 1 / (1 + exp(-xd[i]));
            ro[i] = silu_d(xd[i]);
            rdx[i] += dyd[i] * sg * (1 + xd[i] * (1 - sg));
        }
        loom_silu_forward(out, x, n);
        tk_check("silu out", out, ro, n, 1e-6, 1e-6);
        loom_silu_backward(dx, x, dy, n);
        tk_check("silu dinp", dx, rdx, n, 1e-6, 1e-6);
        double *g = added(dx, dx0, n);
        silu_ctx c = {n, xd, dyd};
        fd_check("silu dinp", xd, n, silu_loss, &c, g, 12);
        free(x), free(dy), free(dx), free(dx0), free(out), free(xd), free(dyd), free(ro);
        free(rdx), free(g);
    }
}

/* ==== timestep embedding ==== */
static void test_timestep_embedding(void **state) {
    (void)state;
    tk_reseed(107);
    const int dims[] = {256, 10, 2, 7};
    for (size_t k = 0; k < sizeof(dims) / sizeof(dims[0]); k++) {
        int B = 5, dim = dims[k], half = dim / 2;
        float *t = tk_rand(B, 1), *out = tk_alloc((size_t)B * dim);
        t[0] = 0, t[1] = 1;
        for (int b = 2; b < B; b++) t[b] = fabsf(t[b]);
        double *ref = tk_dalloc((size_t)B * dim);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < half; j++) {
                double freq = exp(-log(10000.0) * j / half), a = (double)t[b] * 1000 * freq;
                ref[(size_t)b * dim + j] = cos(a);
                ref[(size_t)b * dim + half + j] = sin(a); /* odd dim: last column stays 0 */
            }
        loom_timestep_embedding(out, t, B, dim);
        tk_check("timestep_embedding", out, ref, (size_t)B * dim, 1e-6, 1e-6);
        if (dim == 256) { /* spot values: t = 0 gives cos 1, sin 0; t = 1, j = 0: 1000 rad */
            assert_true(out[0] == 1.0f && out[half] == 0.0f);
            assert_true(fabs(out[dim] - cos(1000.0)) < 1e-7);
        }
        free(t), free(out), free(ref);
    }
}

/* ==== MSE ==== */
typedef struct {
    int N, P;
    double dloss, *pred, *target;
} mse_ctx;
static double mse_loss(void *p) {
    mse_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < (size_t)c->N * c->P; i++)
        s += (c->pred[i] - c->target[i]) * (c->pred[i] - c->target[i]);
    return s / c->P * c->dloss;
}

static void check_mse(int N, int P) {
    size_t n = (size_t)N * P;
    const float dloss = 1.0f / (float)(N + 3);
    float *pred = tk_rand(n, 2), *target = tk_rand(n, 2), *l1 = tk_alloc(N), *l2 = tk_alloc(N);
    double *pd = tk_widen(pred, n), *td = tk_widen(target, n), *rl = tk_dalloc(N);
    double *rg = tk_dalloc(n);
    for (int r = 0; r < N; r++) {
        for (int j = 0; j < P; j++) {
            size_t i = (size_t)r * P + j;
            rl[r] += (pd[i] - td[i]) * (pd[i] - td[i]);
            rg[i] = 2 * (pd[i] - td[i]) / P * dloss;
        }
        rl[r] /= P;
    }
    loom_mse_forward(l1, pred, target, N, P);
    tk_check("mse losses", l1, rl, N, 1e-6, 1e-7);
    float *g = tk_copy(pred, n);
    loom_mse_forward_backward(l2, g, target, N, P, dloss);
    same("mse forward_backward losses", l2, l1, N);
    tk_check("mse dpred", g, rg, n, 1e-6, 1e-9);
    double *gd = tk_widen(g, n);
    mse_ctx c = {N, P, dloss, pd, td};
    fd_check("mse dpred", pd, n, mse_loss, &c, gd, 12);
    free(pred), free(target), free(l1), free(l2), free(pd), free(td), free(rl), free(rg), free(g);
    free(gd);
}

static void test_mse(void **state) {
    (void)state;
    tk_reseed(108);
    check_mse(1, 1);
    check_mse(7, 37);
    check_mse(13, 16);
    check_mse(33, 48);
    check_mse(5, 1000);
}

/* ==== thread count: the backward reductions do not depend on it ==== */
static void test_thread_independent(void **state) {
    (void)state;
    tk_reseed(109);
    const int saved = omp_get_max_threads();
    const rows_shape s = {200, 130, 7, 3};
    int ld = mod_ld(s.C), nb = n_samples(s);
    size_t n = (size_t)s.N * s.C, nm = (size_t)nb * ld;
    float *x = tk_rand(n, 2), *mod = tk_rand(nm, 1), *dy = tk_rand(n, 1);
    float *dx[2], *dmod[2], *dg[2], *ddy[2], *lnx[2], *l[2], *p[2];
    float *mean = tk_alloc(s.N), *rstd = tk_alloc(s.N), *o = tk_alloc(n);
    loom_layernorm_plain_forward(o, mean, rstd, x, s.N, s.C, 1e-6f);
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k ? 3 : 1);
        dx[k] = tk_alloc(n), dmod[k] = tk_alloc(nm), dg[k] = tk_alloc(nm);
        ddy[k] = tk_alloc(n), lnx[k] = tk_alloc(n), l[k] = tk_alloc(s.N), p[k] = tk_copy(x, n);
        memset(dx[k], 0, n * sizeof(float)), memset(dmod[k], 0, nm * sizeof(float));
        memset(dg[k], 0, nm * sizeof(float)), memset(ddy[k], 0, n * sizeof(float));
        memset(lnx[k], 0, n * sizeof(float));
        loom_modulate_backward(dx[k], dmod[k] + OFF_SHIFT, dmod[k] + OFF_SCALE(s.C), dy, x,
                               mod + OFF_SCALE(s.C), ld, s.N, s.C, s.T, s.row0);
        loom_gate_add_backward(ddy[k], dg[k] + OFF_GATE, dy, x, mod + OFF_GATE, ld, s.N, s.C, s.T,
                               s.row0);
        loom_layernorm_plain_backward(lnx[k], dy, x, mean, rstd, s.N, s.C);
        loom_mse_forward_backward(l[k], p[k], dy, s.N, s.C, 0.01f);
    }
    omp_set_num_threads(saved);
    same("modulate_backward dx threads", dx[0], dx[1], n);
    same("modulate_backward dshift/dscale threads", dmod[0], dmod[1], nm);
    same("gate_add_backward dy threads", ddy[0], ddy[1], n);
    same("gate_add_backward dgate threads", dg[0], dg[1], nm);
    same("layernorm_plain_backward threads", lnx[0], lnx[1], n);
    same("mse losses threads", l[0], l[1], s.N);
    same("mse dpred threads", p[0], p[1], n);
    for (int k = 0; k < 2; k++) {
        free(dx[k]), free(dmod[k]), free(dg[k]), free(ddy[k]), free(lnx[k]), free(l[k]);
        free(p[k]);
    }
    free(x), free(mod), free(dy), free(mean), free(rstd), free(o);
}

/* ==== every new op through the CPU backend table: bitwise the direct kernel ==== */
static void test_backend_ops(void **state) {
    (void)state;
    tk_reseed(110);
    const loom_backend *be = loom_backend_cpu();
    const rows_shape s = {21, 37, 5, 7};
    int ld = mod_ld(s.C), nb = n_samples(s);
    size_t n = (size_t)s.N * s.C, nm = (size_t)nb * ld;
    float *x = tk_rand(n, 2), *y = tk_rand(n, 2), *mod = tk_rand(nm, 1), *dy = tk_rand(n, 1);
    float *a = tk_alloc(n), *b = tk_alloc(n), *ma = tk_rand(nm, 1), *mb = tk_copy(ma, nm);
    float *ga = tk_rand(n, 1), *gb = tk_copy(ga, n);
    float *mean[2] = {tk_alloc(s.N), tk_alloc(s.N)}, *rstd[2] = {tk_alloc(s.N), tk_alloc(s.N)};
    const float *shift = mod + OFF_SHIFT, *scale = mod + OFF_SCALE(s.C), *gate = mod + OFF_GATE;
    /* LayerNorm without affine */
    loom_backend_layernorm_plain_forward(be, a, mean[0], rstd[0], x, s.N, s.C, 1e-6f);
    loom_layernorm_plain_forward(b, mean[1], rstd[1], x, s.N, s.C, 1e-6f);
    same("layernorm_plain_forward", a, b, n);
    same("layernorm_plain_forward mean", mean[0], mean[1], s.N);
    same("layernorm_plain_forward rstd", rstd[0], rstd[1], s.N);
    loom_backend_layernorm_plain_backward(be, ga, dy, x, mean[0], rstd[0], s.N, s.C);
    loom_layernorm_plain_backward(gb, dy, x, mean[1], rstd[1], s.N, s.C);
    same("layernorm_plain_backward", ga, gb, n);
    /* SiLU */
    loom_backend_silu_forward(be, a, x, n);
    loom_silu_forward(b, x, n);
    same("silu_forward", a, b, n);
    loom_backend_silu_backward(be, ga, x, dy, n);
    loom_silu_backward(gb, x, dy, n);
    same("silu_backward", ga, gb, n);
    /* modulate, gate add, positions */
    loom_backend_modulate_forward(be, a, x, shift, scale, ld, s.N, s.C, s.T, s.row0);
    loom_modulate_forward(b, x, shift, scale, ld, s.N, s.C, s.T, s.row0);
    same("modulate_forward", a, b, n);
    loom_backend_modulate_backward(be, ga, ma + OFF_SHIFT, ma + OFF_SCALE(s.C), dy, x, scale, ld,
                                   s.N, s.C, s.T, s.row0);
    loom_modulate_backward(gb, mb + OFF_SHIFT, mb + OFF_SCALE(s.C), dy, x, scale, ld, s.N, s.C, s.T,
                           s.row0);
    same("modulate_backward dx", ga, gb, n);
    same("modulate_backward dshift/dscale", ma, mb, nm);
    loom_backend_gate_add_forward(be, a, x, y, gate, ld, s.N, s.C, s.T, s.row0);
    loom_gate_add_forward(b, x, y, gate, ld, s.N, s.C, s.T, s.row0);
    same("gate_add_forward", a, b, n);
    loom_backend_gate_add_backward(be, ga, ma + OFF_GATE, dy, y, gate, ld, s.N, s.C, s.T, s.row0);
    loom_gate_add_backward(gb, mb + OFF_GATE, dy, y, gate, ld, s.N, s.C, s.T, s.row0);
    same("gate_add_backward dy", ga, gb, n);
    same("gate_add_backward dgate", ma, mb, nm);
    loom_backend_add_position(be, a, y, s.N, s.C, s.T, s.row0);
    loom_add_position(b, y, s.N, s.C, s.T, s.row0);
    same("add_position", a, b, n);
    /* timestep embedding */
    float t[3] = {0.25f, 0.0f, 0.97f};
    loom_backend_timestep_embedding(be, a, t, 3, 6);
    loom_timestep_embedding(b, t, 3, 6);
    same("timestep_embedding", a, b, 18);
    /* MSE, both variants */
    float *la = tk_alloc(s.N), *lb = tk_alloc(s.N), *pa = tk_copy(x, n), *pb = tk_copy(x, n);
    loom_backend_mse_forward(be, la, x, y, s.N, s.C);
    loom_mse_forward(lb, x, y, s.N, s.C);
    same("mse_forward", la, lb, s.N);
    loom_backend_mse_forward_backward(be, la, pa, y, s.N, s.C, 0.1f);
    loom_mse_forward_backward(lb, pb, y, s.N, s.C, 0.1f);
    same("mse_forward_backward losses", la, lb, s.N);
    same("mse_forward_backward dpred", pa, pb, n);
    /* bidirectional attention */
    const attn_shape as = {2, 9, 4, 2, 8};
    size_t nqkv = (size_t)as.B * as.T * (as.H + 2 * as.KV) * as.hd;
    size_t nout = (size_t)as.B * as.T * as.H * as.hd, nlse = (size_t)as.B * as.H * as.T;
    size_t nsc = loom_backend_attention_scratch_floats(be, as.B, as.T, as.H);
    assert_true(nsc >= loom_attention_scratch_floats(as.T));
    float *qkv = tk_rand(nqkv, 1.5f), *dout = tk_rand(nout, 1), *scr = tk_alloc(nsc);
    float *oa = tk_alloc(nout), *ob = tk_alloc(nout), *lsa = tk_alloc(nlse), *lsb = tk_alloc(nlse);
    float *dqa = tk_rand(nqkv, 1), *dqb = tk_copy(dqa, nqkv);
    loom_backend_attention_bidir_forward(be, oa, lsa, qkv, scr, as.B, as.T, as.H, as.KV, as.hd);
    loom_attention_bidir_forward(ob, lsb, qkv, scr, as.B, as.T, as.H, as.KV, as.hd);
    same("attention_bidir_forward", oa, ob, nout);
    same("attention_bidir_forward lse", lsa, lsb, nlse);
    loom_backend_attention_bidir_backward(be, dqa, scr, dout, qkv, oa, lsa, as.B, as.T, as.H, as.KV,
                                          as.hd);
    loom_attention_bidir_backward(dqb, scr, dout, qkv, ob, lsb, as.B, as.T, as.H, as.KV, as.hd);
    same("attention_bidir_backward", dqa, dqb, nqkv);
    assert_int_equal(loom_backend_status(be, NULL), LOOM_OK);
    free(x), free(y), free(mod), free(dy), free(a), free(b), free(ma), free(mb), free(ga);
    free(gb), free(mean[0]), free(mean[1]), free(rstd[0]), free(rstd[1]), free(la), free(lb);
    free(pa), free(pb), free(qkv), free(dout), free(scr), free(oa), free(ob), free(lsa);
    free(lsb), free(dqa), free(dqb);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_bidir),    cmocka_unit_test(test_layernorm_plain),
        cmocka_unit_test(test_modulate),           cmocka_unit_test(test_gate_add),
        cmocka_unit_test(test_add_position),       cmocka_unit_test(test_silu),
        cmocka_unit_test(test_timestep_embedding), cmocka_unit_test(test_mse),
        cmocka_unit_test(test_thread_independent), cmocka_unit_test(test_backend_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
