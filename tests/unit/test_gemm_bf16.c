/* bf16 GEMMs (kernels/cpu/gemm_bf16.h) against float64, every kind, prepared and run-time
 * shapes, accumulating into random C: on oneDNN where the CPU has bf16 instructions, and
 * widened to fp32 for OpenBLAS (gemm_widened.h: always tested, LOOM_BF16_PRETEND_NO_CPU
 * forces it), also with small blocks so that every shape crosses block edges.
 *
 * The bound (derived in gemm_bf16.h): inputs rounded to bf16 (8-bit significand) carry a
 * relative error of at most u = 2^-8 each, so a product a*b is off by (2u + u^2)|ab|;
 * fp32 accumulation of the K products and the C already there adds at most gamma_{K+1} =
 * (K+1) 2^-24 / (1 - (K+1) 2^-24) times (|c| + sum |ab|). So against float64 of the
 * fp32 inputs: |C - C64| <= (2u + u^2 + gamma_{K+1}) (|c| + sum |ab|); against float64
 * of the bf16-rounded inputs only gamma_{K+1} is left (the products of two 8-bit
 * significands are exact in fp32). Small integers are exact: checked for equality. */
#include "test_kernels_util.h"

#include "kernels/backend.h"
#include "kernels/backend_bf16.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_widened.h"

/* element (i, k) of A and (k, j) of B for each kind's storage */
static size_t a_at(loom_gemm_kind kind, int M, int K, int i, int k) {
    return kind == LOOM_GEMM_TN ? (size_t)k * M + i : (size_t)i * K + k;
}
static size_t b_at(loom_gemm_kind kind, int N, int K, int k, int j) {
    return kind == LOOM_GEMM_NT ? (size_t)j * K + k : (size_t)k * N + j;
}

/* One kind and shape on g, or (g NULL) on the widened path w. */
static void check(loom_gemm_bf16 *g, loom_gemm_widened *w, loom_gemm_kind kind, int M, int N, int K,
                  int prepare, int integers) {
    loom_error err = {0};
    if (g && prepare) assert_int_equal(loom_gemm_bf16_prepare(g, kind, M, N, K, &err), LOOM_OK);
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *a = tk_rand(na, 1), *b = tk_rand(nb, 1), *c = tk_rand(nc, 1);
    if (integers)
        for (size_t i = 0; i < na + nb + nc; i++) {
            float *p = i < na ? a + i : i < na + nb ? b + i - na : c + i - na - nb;
            *p = (float)(tk_randint(9) - 4);
        }
    loom_bf16 *ah = malloc(na * 2), *bh = malloc(nb * 2);
    assert_non_null(ah), assert_non_null(bh);
    loom_bf16_from_f32_n(ah, a, na);
    loom_bf16_from_f32_n(bh, b, nb);
    float *out = tk_copy(c, nc);
    if (g) {
        size_t before = loom_gemm_bf16_unprepared_calls(g);
        loom_gemm_bf16_run(g, kind, M, N, K, out, ah, bh);
        assert_int_equal(loom_gemm_bf16_status(g, &err), LOOM_OK);
        assert_int_equal(loom_gemm_bf16_unprepared_calls(g) - before, prepare ? 0 : 1);
    } else {
        loom_gemm_widened_run(w, kind, M, N, K, out, ah, bh);
    }
    const double u = 0x1p-8, gam = (K + 1) * 0x1p-24 / (1.0 - (K + 1) * 0x1p-24);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s64 = c[(size_t)i * N + j], r64 = s64, mag = fabs(s64);
            for (int k = 0; k < K; k++) {
                double x = a[a_at(kind, M, K, i, k)], y = b[b_at(kind, N, K, k, j)];
                double xr = loom_bf16_to_f32(ah[a_at(kind, M, K, i, k)]);
                double yr = loom_bf16_to_f32(bh[b_at(kind, N, K, k, j)]);
                s64 += x * y, r64 += xr * yr, mag += fabs(x * y);
            }
            double got = out[(size_t)i * N + j];
            if (integers && got != s64)
                fail_msg("kind %d %dx%dx%d (%d,%d): %.9g != exact %.9g (LOOM_TEST_SEED=%llu)", kind,
                         M, N, K, i, j, got, s64, (unsigned long long)tk_seed);
            if (fabs(got - s64) > (2 * u + u * u + gam) * mag ||
                fabs(got - r64) > gam * (mag * (1 + 2 * u + u * u)))
                fail_msg("kind %d %dx%dx%d (%d,%d): got %.9g, float64 %.9g, of bf16 inputs %.9g "
                         "(LOOM_TEST_SEED=%llu)",
                         kind, M, N, K, i, j, got, s64, r64, (unsigned long long)tk_seed);
        }
    free(a), free(b), free(c), free(ah), free(bh), free(out);
}

static const int shapes[][3] = {{7, 13, 5}, {33, 17, 37}, {1, 1, 1}, {64, 96, 128}, {67, 129, 71}};

static void check_kinds(loom_gemm_bf16 *g, loom_gemm_widened *w) {
    for (int k = 0; k < 3; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int prep = 0; prep < 2; prep++) {
                check(g, w, (loom_gemm_kind)k, shapes[s][0], shapes[s][1], shapes[s][2], prep, 0);
                check(g, w, (loom_gemm_kind)k, shapes[s][0], shapes[s][1], shapes[s][2], prep, 1);
            }
    /* K = 1000: fp32 accumulation's share of the bound grows */
    check(g, w, LOOM_GEMM_TN, 24, 40, 1000, 1, 0);
}

/* The path this CPU runs (oneDNN with AVX512-BF16 or AMX-BF16, else widened), then the
 * widened one forced (LOOM_BF16_PRETEND_NO_CPU), then widened with blocks smaller than the
 * shapes. */
static void test_kinds(void **state) {
    (void)state;
    tk_reseed(1);
    for (int pretend = 0; pretend < 2; pretend++) {
        if (pretend) setenv("LOOM_BF16_PRETEND_NO_CPU", "1", 1);
        loom_gemm_bf16 *g = NULL;
        loom_error err = {0};
        assert_int_equal(loom_gemm_bf16_create(&g, &err), LOOM_OK);
        if (pretend) assert_true(loom_gemm_bf16_is_widened(g));
        check_kinds(g, NULL);
        fprintf(stderr, "bf16 matmul: %s (%zu shapes prepared)\n", loom_gemm_bf16_impl(g),
                loom_gemm_bf16_prepared(g));
        loom_gemm_bf16_destroy(g);
        unsetenv("LOOM_BF16_PRETEND_NO_CPU");
    }
    loom_gemm_widened *w = NULL;
    loom_error err = {0};
    assert_int_equal(loom_gemm_widened_create(&w, 8, 16, 8, &err), LOOM_OK);
    check_kinds(NULL, w);
    loom_gemm_widened_destroy(w);
}

/* The widened path's NT_OUT_BF16 is NT's fp32 sums from zero rounded once to nearest
 * even, bit for bit, with blocks smaller than the shapes and with the defaults. */
static void test_widened_blocks(void **state) {
    (void)state;
    tk_reseed(5);
    const int blocks[][3] = {{8, 16, 8}, {5, 7, 3}, {LOOM_WIDEN_MB, LOOM_WIDEN_NB, LOOM_WIDEN_KB}};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        loom_gemm_widened *w = NULL;
        loom_error err = {0};
        assert_int_equal(
            loom_gemm_widened_create(&w, blocks[bi][0], blocks[bi][1], blocks[bi][2], &err),
            LOOM_OK);
        const int M = 19 + (int)tk_randint(20), N = 37 + (int)tk_randint(30);
        const int K = 20 + (int)tk_randint(40);
        float *a = tk_rand((size_t)M * K, 1), *b = tk_rand((size_t)N * K, 1);
        loom_bf16 *ah = malloc((size_t)M * K * 2), *bh = malloc((size_t)N * K * 2);
        loom_bf16 *ob = malloc((size_t)M * N * 2);
        float *full = calloc((size_t)M * N, sizeof(float));
        assert_true(ah && bh && ob && full);
        loom_bf16_from_f32_n(ah, a, (size_t)M * K);
        loom_bf16_from_f32_n(bh, b, (size_t)N * K);
        loom_gemm_widened_run(w, LOOM_GEMM_NT, M, N, K, full, ah, bh);
        loom_gemm_widened_run(w, LOOM_GEMM_NT_OUT_BF16, M, N, K, ob, ah, bh);
        for (size_t i = 0; i < (size_t)M * N; i++)
            if (ob[i] != loom_bf16_from_f32(full[i]))
                fail_msg("widened %dx%dx%d blocks %dx%dx%d [%zu]: NT %.9g, bf16 out %#x "
                         "(LOOM_TEST_SEED=%llu)",
                         M, N, K, blocks[bi][0], blocks[bi][1], blocks[bi][2], i, full[i], ob[i],
                         (unsigned long long)tk_seed);
        free(a), free(b), free(ah), free(bh), free(ob), free(full);
        loom_gemm_widened_destroy(w);
    }
}

/* The bf16 backend table's linear ops keep kernels.h's contract: forward writes out
 * (bias added), both backward ops accumulate (+=), dbias is the fp32 column sum; each GEMM
 * equals float64 of its bf16-rounded operands within gamma_{K+1}. Prepared and unprepared
 * shapes alike; the _bf16 variants give the same bits as the fp32 signatures. */
static double rb(float x) {
    return loom_bf16_to_f32(loom_bf16_from_f32(x));
}

static void check_backend(const loom_backend *be, int N, int IC, int OC, int prepare) {
    loom_error err = {0};
    if (prepare) assert_int_equal(loom_backend_linear_prepare(be, N, IC, OC, &err), LOOM_OK);
    float *x = tk_rand((size_t)N * IC, 1), *w = tk_rand((size_t)OC * IC, 1), *b = tk_rand(OC, 1);
    float *out = tk_rand((size_t)N * OC, 1), *dy = tk_rand((size_t)N * OC, 1);
    float *dx = tk_rand((size_t)N * IC, 1), *dw = tk_rand((size_t)OC * IC, 1), *db = tk_rand(OC, 1);
    double *rdx = tk_widen(dx, (size_t)N * IC), *rdw = tk_widen(dw, (size_t)OC * IC);
    double *rdb = tk_widen(db, OC), *rout = tk_dalloc((size_t)N * OC);
    double *mout = tk_dalloc((size_t)N * OC), *mdx = tk_dalloc((size_t)N * IC);
    double *mdw = tk_dalloc((size_t)OC * IC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b[o], m = fabs(b[o]);
            for (int i = 0; i < IC; i++) {
                double xi = rb(x[n * IC + i]), wi = rb(w[o * IC + i]), g = rb(dy[n * OC + o]);
                s += xi * wi, m += fabs(xi * wi);
                rdx[n * IC + i] += g * wi, mdx[n * IC + i] += fabs(g * wi);
                rdw[o * IC + i] += g * xi, mdw[o * IC + i] += fabs(g * xi);
            }
            rout[n * OC + o] = s, mout[n * OC + o] = m;
            rdb[o] += dy[n * OC + o];
        }
    for (size_t i = 0; i < (size_t)N * IC; i++) mdx[i] += fabs(dx[i]);
    for (size_t i = 0; i < (size_t)OC * IC; i++) mdw[i] += fabs(dw[i]);
    float *dx2 = tk_copy(dx, (size_t)N * IC), *dw2 = tk_copy(dw, (size_t)OC * IC);
    float *out2 = tk_rand((size_t)N * OC, 1), *db2 = tk_copy(db, OC);
    loom_backend_linear_forward(be, out, x, w, b, N, IC, OC);
    loom_backend_linear_backward_input(be, dx, dy, w, N, IC, OC);
    loom_backend_linear_backward_weight(be, dw, db, dy, x, N, IC, OC);
    assert_int_equal(loom_backend_status(be, &err), LOOM_OK);
    const size_t sizes[3] = {(size_t)N * OC, (size_t)N * IC, (size_t)OC * IC};
    const float *got[3] = {out, dx, dw};
    const double *want[3] = {rout, rdx, rdw}, *mag[3] = {mout, mdx, mdw};
    const int K[3] = {IC, OC, N};
    for (int t = 0; t < 3; t++) {
        const double gam = (K[t] + 1) * 0x1p-24 / (1.0 - (K[t] + 1) * 0x1p-24);
        for (size_t i = 0; i < sizes[t]; i++)
            if (fabs(got[t][i] - want[t][i]) > gam * mag[t][i] + 1e-30)
                fail_msg("bf16 backend op %d, %dx%dx%d element %zu: %.9g vs %.9g "
                         "(LOOM_TEST_SEED=%llu)",
                         t, N, IC, OC, i, (double)got[t][i], want[t][i],
                         (unsigned long long)tk_seed);
    }
    tk_check("bf16 backend dbias", db, rdb, OC, 1e-6, 1e-6);
    /* the _bf16 variants on pre-rounded operands: the same bits */
    loom_bf16 *xh = malloc((size_t)N * IC * 2), *wh = malloc((size_t)OC * IC * 2);
    assert_non_null(xh), assert_non_null(wh);
    loom_bf16_from_f32_n(xh, x, (size_t)N * IC);
    loom_bf16_from_f32_n(wh, w, (size_t)OC * IC);
    loom_backend_linear_forward_bf16(be, out2, xh, wh, b, N, IC, OC);
    loom_backend_linear_backward_input_bf16(be, dx2, dy, wh, N, IC, OC);
    loom_backend_linear_backward_weight_bf16(be, dw2, db2, dy, xh, N, IC, OC);
    assert_memory_equal(out, out2, sizes[0] * sizeof(float));
    assert_memory_equal(dx, dx2, sizes[1] * sizeof(float));
    assert_memory_equal(dw, dw2, sizes[2] * sizeof(float));
    assert_memory_equal(db, db2, OC * sizeof(float));
    free(x), free(w), free(b), free(out), free(dy), free(dx), free(dw), free(db), free(rdx);
    free(rdw), free(rdb), free(rout), free(mout), free(mdx), free(mdw), free(dx2), free(dw2);
    free(out2), free(db2), free(xh), free(wh);
}

static void test_backend_table(void **state) {
    (void)state;
    tk_reseed(3);
    const loom_backend *be = NULL;
    loom_error err = {0};
    assert_int_equal(loom_backend_cpu_bf16_open(&be, &err), LOOM_OK);
    assert_int_equal(loom_backend_precision(be), LOOM_PRECISION_BF16);
    assert_int_equal(loom_backend_precision(loom_backend_cpu()), LOOM_PRECISION_FP32);
    check_backend(be, 7, 13, 5, 1);
    check_backend(be, 33, 17, 37, 0);
    check_backend(be, 64, 48, 96, 1);
    char line[256];
    loom_backend_cpu_bf16_describe(be, line, sizeof line);
    /* 33 x 17 x 37 was not prepared: its 3 ops and their 3 _bf16 variants */
    assert_non_null(strstr(line, ", 6 calls unprepared"));
    loom_backend_close(be);
}

/* The LM head's logits in bf16 (docs/precision.md): the forward's bf16 output is the fp32
 * sums of the bf16 operands rounded once (within u of float64 of those operands, plus
 * fp32 accumulation's gamma); the cross-entropy over bf16 logits against float64 (loss;
 * dlogits within one bf16 rounding); and the backward ops with a bf16 dout are bitwise the
 * fp32-signature ops given that dout widened (which they round back to the same bits). */
static void check_logits(const loom_backend *be, int N, int IC, int V, int prepare) {
    loom_error err = {0};
    if (prepare) assert_int_equal(loom_backend_linear_prepare_out_bf16(be, N, IC, V, &err), 0);
    float *x = tk_rand((size_t)N * IC, 1), *w = tk_rand((size_t)V * IC, 1);
    loom_bf16 *lg = malloc((size_t)N * V * 2), *xh = malloc((size_t)N * IC * 2);
    float *wide = malloc((size_t)N * V * sizeof(float)), *losses = malloc(N * sizeof(float));
    float *losses2 = malloc(N * sizeof(float));
    int32_t *tg = malloc(N * sizeof(int32_t));
    assert_true(lg && xh && wide && losses && losses2 && tg);
    loom_bf16_from_f32_n(xh, x, (size_t)N * IC);
    loom_backend_linear_forward_out_bf16(be, lg, x, NULL, w, N, IC, V);
    const double u = 0x1p-8, gam = (IC + 1) * 0x1p-24 / (1.0 - (IC + 1) * 0x1p-24);
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++) {
            double r64 = 0.0, mag = 0.0;
            for (int k = 0; k < IC; k++) {
                double p = rb(x[(size_t)n * IC + k]) * rb(w[(size_t)v * IC + k]);
                r64 += p, mag += fabs(p);
            }
            double got = loom_bf16_to_f32(lg[(size_t)n * V + v]);
            if (fabs(got - r64) > u * fabs(r64) + gam * mag * (1 + u))
                fail_msg("bf16 logits %dx%dx%d (%d,%d): %.9g, float64 %.9g (LOOM_TEST_SEED=%llu)",
                         N, IC, V, n, v, got, r64, (unsigned long long)tk_seed);
        }
    /* the same from the bf16 input: the same bits */
    loom_bf16 *lg2 = malloc((size_t)N * V * 2);
    assert_non_null(lg2);
    loom_backend_linear_forward_out_bf16(be, lg2, NULL, xh, w, N, IC, V);
    assert_memory_equal(lg, lg2, (size_t)N * V * 2);
    for (int n = 0; n < N; n++) tg[n] = (int32_t)tk_randint(V);
    loom_bf16_to_f32_n(wide, lg, (size_t)N * V);
    const float dloss = 0.37f;
    loom_backend_crossentropy_forward_bf16(be, losses2, lg, tg, N, V);
    loom_backend_crossentropy_forward_backward_bf16(be, losses, lg, tg, N, V, dloss);
    for (int n = 0; n < N; n++) {
        const float *z = wide + (size_t)n * V;
        double m = z[0], sum = 0.0;
        for (int v = 1; v < V; v++) m = z[v] > m ? z[v] : m;
        for (int v = 0; v < V; v++) sum += exp((double)z[v] - m);
        const double loss = m + log(sum) - z[tg[n]];
        assert_true(fabs(losses[n] - loss) <= 1e-6 * (1 + fabs(loss)));
        assert_true(losses2[n] == losses[n]);
        for (int v = 0; v < V; v++) {
            double ref = (exp((double)z[v] - m) / sum - (v == tg[n])) * dloss;
            double got = loom_bf16_to_f32(lg[(size_t)n * V + v]);
            if (fabs(got - ref) > u * fabs(ref) + 1e-6 * dloss)
                fail_msg("bf16 dlogits (%d,%d): %.9g, float64 %.9g (LOOM_TEST_SEED=%llu)", n, v,
                         got, ref, (unsigned long long)tk_seed);
        }
    }
    /* backward from bf16 dlogits = the fp32 signatures from them widened, bit for bit */
    loom_bf16_to_f32_n(wide, lg, (size_t)N * V);
    float *dx = tk_rand((size_t)N * IC, 1), *dw = tk_rand((size_t)V * IC, 1);
    float *dx2 = tk_copy(dx, (size_t)N * IC), *dw2 = tk_copy(dw, (size_t)V * IC);
    loom_backend_linear_backward_input(be, dx, wide, w, N, IC, V);
    loom_backend_linear_backward_weight(be, dw, NULL, wide, x, N, IC, V);
    loom_backend_linear_backward_input_dbf16(be, dx2, lg, w, N, IC, V);
    loom_backend_linear_backward_weight_dbf16(be, dw2, lg, x, NULL, N, IC, V);
    assert_memory_equal(dx, dx2, (size_t)N * IC * sizeof(float));
    assert_memory_equal(dw, dw2, (size_t)V * IC * sizeof(float));
    loom_backend_linear_backward_weight_dbf16(be, dw2, lg, NULL, xh, N, IC, V);
    loom_backend_linear_backward_weight(be, dw, NULL, wide, x, N, IC, V);
    assert_memory_equal(dw, dw2, (size_t)V * IC * sizeof(float));
    /* the vocabulary-parallel head's in-place rounding: the bf16 values */
    float *r = tk_rand((size_t)N * V, 1);
    loom_bf16 *rh = malloc((size_t)N * V * 2);
    assert_non_null(rh);
    loom_bf16_from_f32_n(rh, r, (size_t)N * V);
    loom_backend_round_bf16_values(be, r, (size_t)N * V);
    for (size_t i = 0; i < (size_t)N * V; i++) assert_true(r[i] == loom_bf16_to_f32(rh[i]));
    free(x), free(w), free(lg), free(lg2), free(xh), free(wide), free(losses), free(losses2);
    free(tg), free(dx), free(dw), free(dx2), free(dw2), free(r), free(rh);
}

static void test_bf16_logits(void **state) {
    (void)state;
    tk_reseed(4);
    const loom_backend *be = NULL;
    loom_error err = {0};
    assert_int_equal(loom_backend_cpu_bf16_open(&be, &err), LOOM_OK);
    assert_true(loom_backend_bf16_logits(be));
    assert_false(loom_backend_bf16_logits(loom_backend_cpu()));
    check_logits(be, 7, 13, 300, 1);
    check_logits(be, 33, 24, 517, 0);
    char line[256];
    loom_backend_cpu_bf16_describe(be, line, sizeof line);
    /* 33 x 24 x 517 was not prepared: 2 forwards, 2 input and 4 weight gradients */
    if (!strstr(line, ", 8 calls unprepared")) fail_msg("%s", line);
    loom_backend_close(be);
}

/* A CPU without AVX512-BF16 / AMX-BF16 (pretended): the backend runs widened and its
 * start-up line says so; its linear ops keep the contract (check_backend, as above). */
static void test_missing_cpu_feature(void **state) {
    (void)state;
    tk_reseed(6);
    setenv("LOOM_BF16_PRETEND_NO_CPU", "1", 1);
    const loom_backend *be = NULL;
    loom_error err = {0};
    assert_int_equal(loom_backend_cpu_bf16_open(&be, &err), LOOM_OK);
    unsetenv("LOOM_BF16_PRETEND_NO_CPU");
    check_backend(be, 33, 17, 37, 1);
    char line[256];
    loom_backend_cpu_bf16_describe(be, line, sizeof line);
    if (!strstr(line, "widened to fp32") || !strstr(line, "no AVX512-BF16 or AMX-BF16"))
        fail_msg("%s", line);
    loom_backend_close(be);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_widened_blocks),
        cmocka_unit_test(test_backend_table),
        cmocka_unit_test(test_bf16_logits),
        cmocka_unit_test(test_missing_cpu_feature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
