/* The flow sampler against exact flows: Gaussian data N(mu, s^2) per element has the
 * rectified-flow velocity v(x, t) = -mu + (t - (1-t) s^2) / sigma_t^2 * (x - (1-t) mu),
 * sigma_t^2 = (1-t)^2 s^2 + t^2, whose flow from noise z at t = 1 ends at mu + s z, along a
 * curved path when s != 1. Euler's error shrinks at order 1 and Heun's at order 2; the
 * guidance arithmetic and the call pattern match a naive float64 sampler; the noise is the
 * spec's Philox stream; runs are deterministic; bad options name their flag. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/philox.h"
#include "model/flow_sampler.h"
#include "test_common.h"

static uint64_t seed_value;

static double urand(double lo, double hi) {
    return lo + (hi - lo) * (double)(rnd() >> 11) / 9007199254740992.0;
}

#define MAXC 5      /* classes + the null class */
#define MAXE 16     /* elements per sample */
#define MAXCALL 512 /* evaluations recorded */

/* The data distribution of every class (the null class is one more row). */
typedef struct {
    int n_labels; /* rows of mu, s (the last one is the null class) */
    size_t numel;
    double mu[MAXC][MAXE], s[MAXC][MAXE];
    /* what the sampler asked for */
    int calls, count[MAXCALL];
    float t[MAXCALL];
    int n;            /* samples of the run (to check the guided call pattern) */
    int32_t null_cls; /* -1: no guidance expected */
    const int32_t *labels;
    int fail_at; /* 1-based call that fails (0: none) */
    int bad;     /* a malformed call was seen */
} field;

static void random_field(field *f, int n_labels, size_t numel) {
    memset(f, 0, sizeof *f);
    f->n_labels = n_labels;
    f->numel = numel;
    f->null_cls = -1;
    for (int c = 0; c < n_labels; c++)
        for (size_t j = 0; j < numel; j++) {
            f->mu[c][j] = urand(-1.0, 1.0);
            /* away from 1 on both sides: s = 1 would make the path straight */
            f->s[c][j] = rnd() % 2 ? urand(0.3, 0.7) : urand(1.5, 2.5);
        }
}

static double gauss_v(const field *f, int c, size_t j, double x, double t) {
    const double mu = f->mu[c][j], s2 = f->s[c][j] * f->s[c][j];
    const double sig2 = (1 - t) * (1 - t) * s2 + t * t;
    return -mu + (t - (1 - t) * s2) / sig2 * (x - (1 - t) * mu);
}

static loom_status field_fn(void *ctx, int count, const float *x, const float *t,
                            const int32_t *labels, float *v, loom_error *err) {
    field *f = ctx;
    if (f->calls < MAXCALL) {
        f->count[f->calls] = count;
        f->t[f->calls] = t[0];
    }
    f->calls++;
    if (f->fail_at && f->calls == f->fail_at)
        return loom_error_set(err, LOOM_ERR_STATE, "the field refuses call %d", f->calls);
    for (int k = 1; k < count; k++)
        if (t[k] != t[0]) f->bad = 1;
    if (f->null_cls >= 0) { /* guided: n conditional, then the same n with the null class */
        if (count != 2 * f->n) f->bad = 1;
        for (int k = 0; k < f->n && count == 2 * f->n; k++) {
            if (labels[k] != f->labels[k] || labels[f->n + k] != f->null_cls) f->bad = 1;
            if (memcmp(x + (size_t)k * f->numel, x + (size_t)(f->n + k) * f->numel,
                       f->numel * sizeof(float)))
                f->bad = 1;
        }
    } else if (count != f->n) {
        f->bad = 1;
    }
    for (int k = 0; k < count; k++) {
        if (labels[k] < 0 || labels[k] >= f->n_labels) {
            f->bad = 1;
            continue;
        }
        for (size_t j = 0; j < f->numel; j++) {
            const size_t e = (size_t)k * f->numel + j;
            v[e] = (float)gauss_v(f, labels[k], j, x[e], t[k]);
        }
    }
    return LOOM_OK;
}

static loom_flow_sample_options opts(int n, size_t numel, int steps, float cfg,
                                     loom_flow_solver solver, int32_t null_class) {
    return (loom_flow_sample_options){.n = n,
                                      .numel = numel,
                                      .steps = steps,
                                      .cfg = cfg,
                                      .solver = solver,
                                      .null_class = null_class,
                                      .seed = seed_value};
}

/* RMS distance of a run from the exact flow's end point mu + s z. */
static double exact_error(field *f, int n, const int32_t *labels, int steps,
                          loom_flow_solver solver) {
    const size_t numel = f->numel, len = (size_t)n * numel;
    float *noise = malloc(len * sizeof(float)), *x = malloc(len * sizeof(float));
    assert_non_null(noise);
    assert_non_null(x);
    loom_flow_sample_options o = opts(n, numel, steps, 1.0f, solver, -1);
    loom_error err = {0};
    f->calls = 0;
    f->n = n;
    f->labels = labels;
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, f, noise, x, &err), LOOM_OK);
    assert_int_equal(f->bad, 0);
    assert_int_equal(f->calls, loom_flow_evaluations(&o));
    double ss = 0.0;
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < numel; j++) {
            const size_t e = (size_t)k * numel + j;
            const double want = f->mu[labels[k]][j] + f->s[labels[k]][j] * noise[e];
            ss += (x[e] - want) * (x[e] - want);
        }
    free(noise);
    free(x);
    return sqrt(ss / (double)len);
}

static void check_order(loom_flow_solver solver, int n0, double order) {
    field f;
    const int n = 2 + (int)(rnd() % 3);
    random_field(&f, 3, 4 + rnd() % (MAXE - 4));
    int32_t labels[8];
    for (int k = 0; k < n; k++) labels[k] = (int32_t)(rnd() % 3);
    double e[3];
    for (int r = 0; r < 3; r++) e[r] = exact_error(&f, n, labels, n0 << r, solver);
    const double r1 = e[0] / e[1], r2 = e[1] / e[2], want = pow(2.0, order);
    if (getenv("LOOM_PRINT_ERR") || fabs(r2 / want - 1) > 0.15)
        printf("seed %llu: %s steps %d/%d/%d: errors %.3g %.3g %.3g, ratios %.3f %.3f (want %g)\n",
               (unsigned long long)seed_value, loom_flow_solver_name(solver), n0, 2 * n0, 4 * n0,
               e[0], e[1], e[2], r1, r2, want);
    assert_true(e[0] > 1e-6); /* the paths are curved: there is an error to shrink */
    assert_true(e[2] < e[1] && e[1] < e[0]);
    assert_true(fabs(r2 / want - 1) <= 0.15);
}

static void test_euler_order_1(void **state) {
    (void)state;
    check_order(LOOM_FLOW_EULER, 32, 1.0);
}

static void test_heun_order_2(void **state) {
    (void)state;
    check_order(LOOM_FLOW_HEUN, 16, 2.0);
}

/* The spec's sampler in float64, fields evaluated directly: x [len] holds the noise in
 * and the sample out. */
static void naive_sample(const field *f, int n, const int32_t *labels, int32_t null_cls, double w,
                         int steps, int heun, double *x) {
    const size_t numel = f->numel;
    double *v1 = malloc(n * numel * sizeof(double)), *v2 = malloc(n * numel * sizeof(double));
    double *xe = malloc(n * numel * sizeof(double));
    assert_non_null(v1);
    assert_non_null(v2);
    assert_non_null(xe);
    for (int i = 0; i < steps; i++) {
        const double t0 = 1.0 - (double)i / steps, t1 = 1.0 - (double)(i + 1) / steps;
        const double h = t1 - t0;
        for (int pass = 0; pass < 1 + heun; pass++) {
            const double *src = pass ? xe : x, t = pass ? t1 : t0;
            double *dst = pass ? v2 : v1;
            for (int k = 0; k < n; k++)
                for (size_t j = 0; j < numel; j++) {
                    const size_t e = (size_t)k * numel + j;
                    const double vc = gauss_v(f, labels[k], j, src[e], t);
                    const double vu = w == 1.0 ? vc : gauss_v(f, null_cls, j, src[e], t);
                    dst[e] = vu + w * (vc - vu);
                }
            if (heun && !pass)
                for (size_t e = 0; e < n * numel; e++) xe[e] = x[e] + h * v1[e];
        }
        for (size_t e = 0; e < n * numel; e++) x[e] += heun ? h * (v1[e] + v2[e]) / 2 : h * v1[e];
    }
    free(v1);
    free(v2);
    free(xe);
}

static void check_guidance(loom_flow_solver solver, float w) {
    field f;
    const int n_cls = 4, n = 1 + (int)(rnd() % 4), steps = 3 + (int)(rnd() % 6);
    random_field(&f, n_cls + 1, 1 + rnd() % MAXE);
    int32_t labels[8];
    for (int k = 0; k < n; k++) labels[k] = (int32_t)(rnd() % n_cls);
    const size_t len = (size_t)n * f.numel;
    float *noise = malloc(len * sizeof(float)), *x = malloc(len * sizeof(float));
    double *ref = malloc(len * sizeof(double));
    assert_non_null(noise);
    assert_non_null(x);
    assert_non_null(ref);
    loom_flow_sample_options o = opts(n, f.numel, steps, w, solver, n_cls);
    f.n = n;
    f.labels = labels;
    f.null_cls = w == 1.0f ? -1 : n_cls;
    loom_error err = {0};
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, &f, noise, x, &err), LOOM_OK);
    assert_int_equal(f.bad, 0);
    const int heun = solver == LOOM_FLOW_HEUN;
    assert_int_equal(f.calls, heun ? 2 * steps : steps);
    /* times: Euler t_0..t_{N-1}; Heun t_0, t_1, t_1, t_2, ..., t_{N-1}, t_N = 0 */
    for (int c = 0; c < f.calls; c++) {
        const int i = heun ? (c + 1) / 2 : c;
        assert_float_equal(f.t[c], (float)(1.0 - (double)i / steps), 0.0f);
        assert_int_equal(f.count[c], w == 1.0f ? n : 2 * n);
    }
    for (size_t e = 0; e < len; e++) ref[e] = noise[e];
    naive_sample(&f, n, labels, n_cls, w, steps, heun, ref);
    double worst = 0.0;
    for (size_t e = 0; e < len; e++) {
        const double d = fabs(x[e] - ref[e]) / (1.0 + fabs(ref[e]));
        if (d > worst) worst = d;
    }
    /* float32 against float64: rounding grows with the guidance scale's amplification */
    const double tol = 3e-6 * (1.0 + w);
    if (worst > tol || getenv("LOOM_PRINT_ERR"))
        printf("seed %llu: %s w %g n %d steps %d: worst rel err vs float64 %g\n",
               (unsigned long long)seed_value, loom_flow_solver_name(solver), (double)w, n, steps,
               worst);
    assert_true(worst <= tol);
    free(noise);
    free(x);
    free(ref);
}

static void test_guidance(void **state) {
    (void)state;
    const float ws[] = {1.0f, 0.0f, 2.5f, (float)urand(0.1, 6.0)};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 4; i++) check_guidance(s ? LOOM_FLOW_HEUN : LOOM_FLOW_EULER, ws[i]);
}

/* w = 0 is the unconditional model alone: bitwise the w = 1 run with every label null. */
static void test_guidance_zero_is_unconditional(void **state) {
    (void)state;
    field f;
    const int n = 3;
    random_field(&f, 3, 7);
    int32_t labels[3] = {0, 1, 0}, nulls[3] = {2, 2, 2};
    float a[21], b[21];
    loom_error err = {0};
    for (int s = 0; s < 2; s++) {
        loom_flow_solver solver = s ? LOOM_FLOW_HEUN : LOOM_FLOW_EULER;
        loom_flow_sample_options o0 = opts(n, 7, 5, 0.0f, solver, 2);
        loom_flow_sample_options o1 = opts(n, 7, 5, 1.0f, solver, 2);
        f.n = n;
        f.labels = labels;
        f.null_cls = 2;
        assert_int_equal(loom_flow_sample(&o0, labels, field_fn, &f, NULL, a, &err), LOOM_OK);
        f.labels = nulls;
        f.null_cls = -1;
        assert_int_equal(loom_flow_sample(&o1, nulls, field_fn, &f, NULL, b, &err), LOOM_OK);
        assert_int_equal(f.bad, 0);
        assert_memory_equal(a, b, sizeof a);
    }
}

/* The start is the spec's stream; a sample depends on its index only (first shifts it);
 * the same options give the same bits; another seed another sample. */
static void test_noise_and_determinism(void **state) {
    (void)state;
    field f;
    const size_t numel = 1 + rnd() % MAXE;
    const int n = 5;
    random_field(&f, 2, numel);
    int32_t labels[5];
    for (int k = 0; k < n; k++) labels[k] = (int32_t)(rnd() % 2);
    float noise[5 * MAXE], x[5 * MAXE], x2[5 * MAXE], part[2 * MAXE], part_noise[2 * MAXE];
    loom_flow_sample_options o = opts(n, numel, 4, 1.0f, LOOM_FLOW_HEUN, -1);
    loom_error err = {0};
    f.n = n;
    f.labels = labels;
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, &f, noise, x, &err), LOOM_OK);
    int nonzero = 0;
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < numel; j++) {
            const uint64_t idx = (uint64_t)k * numel + j;
            assert_float_equal(noise[idx], (float)loom_philox_normal(seed_value, 0x736d706cu, idx),
                               0.0f);
            nonzero += noise[idx] != 0.0f;
        }
    assert_true(nonzero > 0);
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, &f, NULL, x2, &err), LOOM_OK);
    assert_memory_equal(x, x2, n * numel * sizeof(float));
    /* samples 2 and 3 alone */
    loom_flow_sample_options op = o;
    op.n = 2;
    op.first = 2;
    f.n = 2;
    f.labels = labels + 2;
    assert_int_equal(loom_flow_sample(&op, labels + 2, field_fn, &f, part_noise, part, &err),
                     LOOM_OK);
    assert_memory_equal(part_noise, noise + 2 * numel, 2 * numel * sizeof(float));
    assert_memory_equal(part, x + 2 * numel, 2 * numel * sizeof(float));
    /* another seed */
    o.seed = seed_value + 1;
    f.n = n;
    f.labels = labels;
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, &f, NULL, x2, &err), LOOM_OK);
    assert_true(memcmp(x, x2, n * numel * sizeof(float)) != 0);
    assert_int_equal(f.bad, 0);
}

static void expect_input_error(loom_flow_sample_options o, const char *flag) {
    loom_error err = {0};
    field f;
    random_field(&f, 2, 3);
    int32_t labels[4] = {0};
    float x[64];
    assert_int_equal(loom_flow_sample_validate(&o, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, flag));
    memset(&err, 0, sizeof err);
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, &f, NULL, x, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, flag));
    assert_int_equal(f.calls, 0);
}

static void test_bad_options(void **state) {
    (void)state;
    expect_input_error(opts(0, 3, 4, 1.0f, LOOM_FLOW_EULER, 1), "--n");
    expect_input_error(opts(-3, 3, 4, 1.0f, LOOM_FLOW_EULER, 1), "--n");
    expect_input_error(opts(2, 3, 0, 1.0f, LOOM_FLOW_EULER, 1), "--steps");
    expect_input_error(opts(2, 3, 4, -0.5f, LOOM_FLOW_EULER, 1), "--cfg");
    expect_input_error(opts(2, 3, 4, NAN, LOOM_FLOW_EULER, 1), "--cfg");
    expect_input_error(opts(2, 3, 4, INFINITY, LOOM_FLOW_EULER, 1), "--cfg");
    expect_input_error(opts(2, 3, 4, 2.0f, LOOM_FLOW_EULER, -1), "--cfg"); /* no null class */
    expect_input_error(opts(2, 3, 4, 1.0f, (loom_flow_solver)7, 1), "--solver");
    expect_input_error(opts(INT32_MAX, SIZE_MAX / 8, 4, 1.0f, LOOM_FLOW_EULER, 1), "--n");
    loom_error err = {0};
    loom_flow_solver s;
    assert_int_equal(loom_flow_solver_parse("heun", &s, &err), LOOM_OK);
    assert_int_equal(s, LOOM_FLOW_HEUN);
    assert_int_equal(loom_flow_solver_parse("euler", &s, &err), LOOM_OK);
    assert_int_equal(s, LOOM_FLOW_EULER);
    assert_int_equal(loom_flow_solver_parse("rk4", &s, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "--solver"));
    assert_non_null(strstr(err.msg, "rk4"));
}

/* The callback's error stops sampling at once and comes back with the step named. */
static void test_callback_error(void **state) {
    (void)state;
    field f;
    random_field(&f, 3, 4);
    int32_t labels[2] = {0, 1};
    float x[8];
    loom_flow_sample_options o = opts(2, 4, 6, 3.0f, LOOM_FLOW_HEUN, 2);
    f.n = 2;
    f.labels = labels;
    f.null_cls = 2;
    f.fail_at = 5; /* step 3's first evaluation */
    loom_error err = {0};
    assert_int_equal(loom_flow_sample(&o, labels, field_fn, &f, NULL, x, &err), LOOM_ERR_STATE);
    assert_int_equal(f.calls, 5);
    assert_non_null(strstr(err.msg, "the field refuses call 5"));
    assert_non_null(strstr(err.msg, "step 3 of 6"));
}

static void test_images_u8(void **state) {
    (void)state;
    const float fixed[] = {-1.0f, 1.0f, 0.0f, -3.0f, 7.0f, NAN, -INFINITY, INFINITY, -0.999f};
    const uint8_t want[] = {0, 255, 128, 0, 255, 0, 0, 255, 0};
    uint8_t got[9];
    loom_flow_images_u8(fixed, 9, got);
    assert_memory_equal(got, want, 9);
    enum { N = 4096 };
    float x[N];
    uint8_t u[N];
    for (int i = 0; i < N; i++) x[i] = (float)urand(-1.3, 1.3);
    loom_flow_images_u8(x, N, u);
    int exact = 0;
    for (int i = 0; i < N; i++) {
        const double y = ((double)x[i] + 1.0) * 127.5, r = floor(y + 0.5);
        const double ref = r < 0 ? 0 : r > 255 ? 255 : r;
        if (fabs(y - floor(y) - 0.5) < 1e-4) continue; /* a tie: float and double may differ */
        assert_int_equal(u[i], (int)ref);
        exact++;
    }
    assert_true(exact > N / 2);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    seed_value = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    g_rng = seed_value;
    printf("test_flow_sampler: seed %llu (LOOM_TEST_SEED to repeat)\n",
           (unsigned long long)seed_value);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_euler_order_1),
        cmocka_unit_test(test_heun_order_2),
        cmocka_unit_test(test_guidance),
        cmocka_unit_test(test_guidance_zero_is_unconditional),
        cmocka_unit_test(test_noise_and_determinism),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_callback_error),
        cmocka_unit_test(test_images_u8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
