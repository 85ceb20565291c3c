/* bf16 GEMMs on oneDNN (kernels/cpu/gemm_bf16.h) against float64, every kind, prepared
 * and run-time shapes, accumulating into random C.
 *
 * The bound (derived in gemm_bf16.h): inputs rounded to bf16 (8-bit significand) carry a
 * relative error of at most u = 2^-8 each, so a product a*b is off by (2u + u^2)|ab|;
 * fp32 accumulation of the K products and the C already there adds at most gamma_{K+1} =
 * (K+1) 2^-24 / (1 - (K+1) 2^-24) times (|c| + sum |ab|). So against float64 of the
 * fp32 inputs: |C - C64| <= (2u + u^2 + gamma_{K+1}) (|c| + sum |ab|); against float64
 * of the bf16-rounded inputs only gamma_{K+1} is left (the products of two 8-bit
 * significands are exact in fp32). Small integers are exact: checked for equality. */
#include "test_kernels_util.h"

#include "kernels/cpu/gemm_bf16.h"

/* element (i, k) of A and (k, j) of B for each kind's storage */
static size_t a_at(loom_gemm_kind kind, int M, int K, int i, int k) {
    return kind == LOOM_GEMM_TN ? (size_t)k * M + i : (size_t)i * K + k;
}
static size_t b_at(loom_gemm_kind kind, int N, int K, int k, int j) {
    return kind == LOOM_GEMM_NT ? (size_t)j * K + k : (size_t)k * N + j;
}

static void check(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K, int prepare,
                  int integers) {
    loom_error err = {0};
    if (prepare) assert_int_equal(loom_gemm_bf16_prepare(g, kind, M, N, K, &err), LOOM_OK);
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
    size_t before = loom_gemm_bf16_unprepared_calls(g);
    loom_gemm_bf16_run(g, kind, M, N, K, out, ah, bh);
    assert_int_equal(loom_gemm_bf16_status(g, &err), LOOM_OK);
    assert_int_equal(loom_gemm_bf16_unprepared_calls(g) - before, prepare ? 0 : 1);
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

static void test_kinds(void **state) {
    (void)state;
    tk_reseed(1);
    loom_gemm_bf16 *g = NULL;
    loom_error err = {0};
    assert_int_equal(loom_gemm_bf16_create(&g, "--precision", &err), LOOM_OK);
    const int shapes[][3] = {{7, 13, 5}, {33, 17, 37}, {1, 1, 1}, {64, 96, 128}, {67, 129, 71}};
    for (int k = 0; k < 3; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int prep = 0; prep < 2; prep++) {
                check(g, (loom_gemm_kind)k, shapes[s][0], shapes[s][1], shapes[s][2], prep, 0);
                check(g, (loom_gemm_kind)k, shapes[s][0], shapes[s][1], shapes[s][2], prep, 1);
            }
    /* K = 1000: fp32 accumulation's share of the bound grows */
    check(g, LOOM_GEMM_TN, 24, 40, 1000, 1, 0);
    fprintf(stderr, "oneDNN bf16 matmul: %s (%zu shapes prepared)\n", loom_gemm_bf16_impl(g),
            loom_gemm_bf16_prepared(g));
    loom_gemm_bf16_destroy(g);
}

/* A CPU without AVX512-BF16 / AMX-BF16 (pretended): one error naming the flag. */
static void test_missing_cpu_feature(void **state) {
    (void)state;
    setenv("LOOM_BF16_PRETEND_NO_CPU", "1", 1);
    loom_gemm_bf16 *g = NULL;
    loom_error err = {0};
    assert_int_equal(loom_gemm_bf16_create(&g, "--precision", &err), LOOM_ERR_INPUT);
    assert_null(g);
    assert_non_null(strstr(err.msg, "--precision"));
    assert_non_null(strstr(err.msg, "AVX512-BF16"));
    unsetenv("LOOM_BF16_PRETEND_NO_CPU");
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_missing_cpu_feature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
