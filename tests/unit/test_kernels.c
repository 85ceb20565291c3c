/* Kernel tests (linear, embedding, norms, activations, elementwise): every kernel is
 * compared with a naive float64 reference on random odd-sized inputs; backward
 * kernels start from random gradients to check that they accumulate (+=). */
#include "test_kernels_util.h"

#include <omp.h>

#include "kernels/kernels.h"

/* ---- linear ---- */
static void check_linear(int N, int IC, int OC, int use_bias) {
    float *x = tk_rand((size_t)N * IC, 1), *w = tk_rand((size_t)OC * IC, 1);
    float *bias = use_bias ? tk_rand(OC, 1) : NULL;
    float *out = tk_rand((size_t)N * OC, 1), *dy = tk_rand((size_t)N * OC, 1);
    float *dx = tk_rand((size_t)N * IC, 1), *dw = tk_rand((size_t)OC * IC, 1);
    float *db = tk_rand(OC, 1);
    double *rout = tk_dalloc((size_t)N * OC), *rdx = tk_widen(dx, (size_t)N * IC);
    double *rdw = tk_widen(dw, (size_t)OC * IC), *rdb = tk_widen(db, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++) {
                s += (double)x[n * IC + i] * w[o * IC + i];
                rdx[n * IC + i] += (double)dy[n * OC + o] * w[o * IC + i];
                rdw[o * IC + i] += (double)dy[n * OC + o] * x[n * IC + i];
            }
            rout[n * OC + o] = s;
            rdb[o] += dy[n * OC + o];
        }
    loom_linear_forward(out, x, w, bias, N, IC, OC);
    loom_linear_backward_input(dx, dy, w, N, IC, OC);
    loom_linear_backward_weight(dw, use_bias ? db : NULL, dy, x, N, IC, OC);
    tk_check("linear out", out, rout, (size_t)N * OC, 1e-4, 1e-5);
    tk_check("linear dinp", dx, rdx, (size_t)N * IC, 1e-4, 1e-5);
    tk_check("linear dweight", dw, rdw, (size_t)OC * IC, 1e-4, 1e-5);
    if (!use_bias) /* dbias NULL: the buffer must be untouched */
        for (int o = 0; o < OC; o++) rdb[o] = db[o];
    tk_check("linear dbias", db, rdb, OC, 1e-4, 1e-5);
    free(x), free(w), free(bias), free(out), free(dy), free(dx), free(dw), free(db);
    free(rout), free(rdx), free(rdw), free(rdb);
}

static void test_linear(void **state) {
    (void)state;
    tk_reseed(1);
    check_linear(7, 13, 5, 1);
    check_linear(33, 17, 37, 1);
    check_linear(5, 11, 3, 0);
    check_linear(1, 1, 1, 1);
    check_linear(67, 129, 71, 1);
}

/* ---- embedding ---- */
static void check_embedding(int B, int T, int C, int Vocab, int use_wpe) {
    int N = B * T;
    int32_t *tok = malloc(sizeof(int32_t) * N);
    assert_non_null(tok);
    for (int i = 0; i < N; i++) tok[i] = tk_randint(Vocab); /* small vocab: repeats */
    float *wte = tk_rand((size_t)Vocab * C, 1), *wpe = use_wpe ? tk_rand((size_t)T * C, 1) : NULL;
    float *out = tk_rand((size_t)N * C, 1), *dy = tk_rand((size_t)N * C, 1);
    float *dwte = tk_rand((size_t)Vocab * C, 1), *dwpe = tk_rand((size_t)T * C, 1);
    double *rout = tk_dalloc((size_t)N * C), *rdwte = tk_widen(dwte, (size_t)Vocab * C);
    double *rdwpe = tk_widen(dwpe, (size_t)T * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            int t = n % T;
            rout[n * C + c] = (double)wte[tok[n] * C + c] + (wpe ? wpe[t * C + c] : 0.0);
            rdwte[tok[n] * C + c] += dy[n * C + c];
            if (wpe) rdwpe[t * C + c] += dy[n * C + c];
        }
    loom_embedding_forward(out, tok, wte, wpe, B, T, C);
    loom_embedding_backward(dwte, use_wpe ? dwpe : NULL, dy, tok, B, T, C);
    tk_check("embedding out", out, rout, (size_t)N * C, 1e-6, 1e-7);
    tk_check("embedding dwte", dwte, rdwte, (size_t)Vocab * C, 1e-5, 1e-6);
    tk_check("embedding dwpe", dwpe, rdwpe, (size_t)T * C, 1e-5, 1e-6);
    free(tok), free(wte), free(wpe), free(out), free(dy), free(dwte), free(dwpe);
    free(rout), free(rdwte), free(rdwpe);
}

static void test_embedding(void **state) {
    (void)state;
    tk_reseed(2);
    check_embedding(1, 5, 13, 37, 1);
    check_embedding(3, 17, 13, 5, 1);
    check_embedding(2, 7, 77, 11, 0);
}

/* ---- LayerNorm / RMSNorm; backward references use the explicit Jacobian ---- */
static void check_layernorm(int N, int C, float offset) {
    const float eps = 1e-5f;
    float *x = tk_rand((size_t)N * C, 2), *w = tk_rand(C, 1.5f), *b = tk_rand(C, 1);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] += offset;
    float *out = tk_alloc((size_t)N * C), *mean = tk_alloc(N), *rstd = tk_alloc(N);
    float *dy = tk_rand((size_t)N * C, 1), *dx = tk_rand((size_t)N * C, 1);
    float *dw = tk_rand(C, 1), *db = tk_rand(C, 1);
    double *rout = tk_dalloc((size_t)N * C), *rmean = tk_dalloc(N), *rrstd = tk_dalloc(N);
    double *rdx = tk_widen(dx, (size_t)N * C), *rdw = tk_widen(dw, C), *rdb = tk_widen(db, C);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++) mu += xr[c];
        mu /= C;
        for (int c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu);
        double rs = 1.0 / sqrt(var / C + eps);
        rmean[n] = mu, rrstd[n] = rs;
        for (int c = 0; c < C; c++) {
            double xh = (xr[c] - mu) * rs;
            rout[n * C + c] = xh * w[c] + b[c];
            rdw[c] += dy[n * C + c] * xh;
            rdb[c] += dy[n * C + c];
        }
        /* d xhat_j / d x_k = rs (delta_jk - 1/C) - xhat_j xhat_k rs / C */
        for (int k = 0; k < C; k++) {
            double xk = (xr[k] - mu) * rs, g = 0;
            for (int j = 0; j < C; j++) {
                double xj = (xr[j] - mu) * rs;
                double jac = rs * ((j == k) - 1.0 / C) - xj * xk * rs / C;
                g += (double)dy[n * C + j] * w[j] * jac;
            }
            rdx[n * C + k] += g;
        }
    }
    loom_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
    loom_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
    tk_check("layernorm out", out, rout, (size_t)N * C, 1e-4, 1e-5);
    tk_check("layernorm mean", mean, rmean, N, 1e-5, 1e-6);
    tk_check("layernorm rstd", rstd, rrstd, N, 1e-5, 1e-6);
    tk_check("layernorm dinp", dx, rdx, (size_t)N * C, 1e-4, 1e-4);
    tk_check("layernorm dweight", dw, rdw, C, 1e-4, 1e-5);
    tk_check("layernorm dbias", db, rdb, C, 1e-4, 1e-5);
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dy), free(dx), free(dw);
    free(db), free(rout), free(rmean), free(rrstd), free(rdx), free(rdw), free(rdb);
}

static void test_layernorm(void **state) {
    (void)state;
    tk_reseed(3);
    check_layernorm(7, 13, 0.0f);
    check_layernorm(33, 130, 3.0f);
    check_layernorm(2, 1, 0.5f);
}

static void check_rmsnorm(int N, int C) {
    const float eps = 1e-6f;
    float *x = tk_rand((size_t)N * C, 2), *w = tk_rand(C, 1.5f);
    float *out = tk_alloc((size_t)N * C), *rstd = tk_alloc(N);
    float *dy = tk_rand((size_t)N * C, 1), *dx = tk_rand((size_t)N * C, 1), *dw = tk_rand(C, 1);
    double *rout = tk_dalloc((size_t)N * C), *rrstd = tk_dalloc(N);
    double *rdx = tk_widen(dx, (size_t)N * C), *rdw = tk_widen(dw, C);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        double rs = 1.0 / sqrt(ss / C + eps);
        rrstd[n] = rs;
        for (int c = 0; c < C; c++) {
            rout[n * C + c] = xr[c] * rs * w[c];
            rdw[c] += dy[n * C + c] * xr[c] * rs;
        }
        /* d (x_j rs) / d x_k = rs delta_jk - x_j x_k rs^3 / C */
        for (int k = 0; k < C; k++) {
            double g = 0;
            for (int j = 0; j < C; j++)
                g += (double)dy[n * C + j] * w[j] *
                     (rs * (j == k) - (double)xr[j] * xr[k] * rs * rs * rs / C);
            rdx[n * C + k] += g;
        }
    }
    loom_rmsnorm_forward(out, rstd, x, w, N, C, eps);
    loom_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
    tk_check("rmsnorm out", out, rout, (size_t)N * C, 1e-4, 1e-5);
    tk_check("rmsnorm rstd", rstd, rrstd, N, 1e-5, 1e-6);
    tk_check("rmsnorm dinp", dx, rdx, (size_t)N * C, 1e-4, 1e-4);
    tk_check("rmsnorm dweight", dw, rdw, C, 1e-4, 1e-5);
    free(x), free(w), free(out), free(rstd), free(dy), free(dx), free(dw);
    free(rout), free(rrstd), free(rdx), free(rdw);
}

static void test_rmsnorm(void **state) {
    (void)state;
    tk_reseed(4);
    check_rmsnorm(7, 13);
    check_rmsnorm(33, 130);
    check_rmsnorm(3, 1);
}

/* ---- GELU (tanh) and SwiGLU ---- */
static void test_gelu(void **state) {
    (void)state;
    tk_reseed(5);
    const size_t n = 1001;
    float *x = tk_rand(n, 6), *out = tk_alloc(n), *dy = tk_rand(n, 1), *dx = tk_rand(n, 1);
    double *rout = tk_dalloc(n), *rdx = tk_widen(dx, n);
    const double s = sqrt(2.0 / M_PI), k = 0.044715;
    for (size_t i = 0; i < n; i++) {
        double v = x[i], th = tanh(s * (v + k * v * v * v));
        rout[i] = 0.5 * v * (1 + th);
        rdx[i] += dy[i] * (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * s * (1 + 3 * k * v * v));
    }
    loom_gelu_forward(out, x, n);
    loom_gelu_backward(dx, x, dy, n);
    tk_check("gelu out", out, rout, n, 1e-5, 1e-6);
    tk_check("gelu dinp", dx, rdx, n, 1e-5, 1e-6);
    free(x), free(out), free(dy), free(dx), free(rout), free(rdx);
}

static void test_swiglu(void **state) {
    (void)state;
    tk_reseed(6);
    const int N = 7, F = 13;
    float *x = tk_rand((size_t)N * 2 * F, 5), *out = tk_alloc((size_t)N * F);
    float *dy = tk_rand((size_t)N * F, 1), *dx = tk_rand((size_t)N * 2 * F, 1);
    double *rout = tk_dalloc((size_t)N * F), *rdx = tk_widen(dx, (size_t)N * 2 * F);
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            double g = x[n * 2 * F + f], u = x[n * 2 * F + F + f], sig = 1 / (1 + exp(-g));
            rout[n * F + f] = g * sig * u;
            rdx[n * 2 * F + f] += dy[n * F + f] * u * (sig + g * sig * (1 - sig));
            rdx[n * 2 * F + F + f] += dy[n * F + f] * g * sig;
        }
    loom_swiglu_forward(out, x, N, F);
    loom_swiglu_backward(dx, dy, x, N, F);
    tk_check("swiglu out", out, rout, (size_t)N * F, 1e-5, 1e-6);
    tk_check("swiglu dinp", dx, rdx, (size_t)N * 2 * F, 1e-5, 1e-6);
    free(x), free(out), free(dy), free(dx), free(rout), free(rdx);
}

/* ---- add, sum of squares, scale ---- */
static void test_elementwise(void **state) {
    (void)state;
    tk_reseed(7);
    const size_t n = 10007;
    float *a = tk_rand(n, 3), *b = tk_rand(n, 3), *out = tk_alloc(n);
    double *ref = tk_dalloc(n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
    loom_add(out, a, b, n);
    tk_check("add", out, ref, n, 1e-7, 0);
    loom_add(a, a, b, n); /* out aliasing an input */
    tk_check("add aliased", a, ref, n, 1e-7, 0);

    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)b[i] * b[i];
    double got = loom_sum_squares(b, n);
    if (!(fabs(got - ss) <= 1e-12 * ss)) {
        fprintf(stderr, "sum_squares %.17g vs %.17g; LOOM_TEST_SEED=%llu\n", got, ss,
                (unsigned long long)tk_seed);
        fail();
    }
    const float sc = 0.37f;
    for (size_t i = 0; i < n; i++) ref[i] = (double)b[i] * sc;
    loom_scale(b, sc, n);
    tk_check("scale", b, ref, n, 1e-7, 0);
    free(a), free(b), free(out), free(ref);
}

/* The sum of squares (gradient clipping's norm): within float64 rounding of the naive
 * sum, and the same bits at any thread count (its parts depend on n only), on sizes
 * below and above its parallel cut and around the lanes' remainder. */
static void test_sum_squares_threads(void **state) {
    (void)state;
    tk_reseed(8);
    const size_t sizes[] = {1, 7, 8, 9, 1000, 64 * 16384 - 1, 64 * 16384 + 13, 3000017};
    const int max_threads = omp_get_max_threads();
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const size_t n = sizes[k];
        float *x = tk_rand(n, (float)tk_uniform(0.5, 100));
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double first = 0;
        for (int t = 1; t <= 5; t++) {
            omp_set_num_threads(t);
            const double got = loom_sum_squares(x, n);
            if (!(fabs(got - ss) <= 1e-12 * ss) || (t > 1 && got != first)) {
                fprintf(stderr,
                        "sum_squares n %zu threads %d: %.17g, naive %.17g, 1 thread %.17g; "
                        "LOOM_TEST_SEED=%llu\n",
                        n, t, got, ss, first, (unsigned long long)tk_seed);
                fail();
            }
            if (t == 1) first = got;
        }
        free(x);
    }
    omp_set_num_threads(max_threads);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),      cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_layernorm),   cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_gelu),        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_sum_squares_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
