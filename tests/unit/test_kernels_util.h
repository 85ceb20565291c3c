/* Shared helpers for the kernel unit tests: seeded random inputs (LOOM_TEST_SEED or the
 * clock), float64 buffers for references, and a combined abs+rel comparison that
 * reports the seed on failure. Header-only: each test_kernels*.c is its own binary. */
#ifndef LOOM_TEST_KERNELS_UTIL_H
#define LOOM_TEST_KERNELS_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>
#include <cmocka.h>

static uint64_t tk_seed;
static uint64_t tk_state;

/* splitmix64: tiny, good enough, and reproducible across platforms. */
static inline uint64_t tk_next(void) {
    uint64_t z = (tk_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void tk_init_seed(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    tk_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    tk_state = tk_seed;
    fprintf(stderr, "kernel tests: LOOM_TEST_SEED=%llu\n", (unsigned long long)tk_seed);
}

/* Each test reseeds from the run seed and its own id, so one test can be rerun alone. */
static inline void tk_reseed(uint64_t test_id) {
    tk_state = tk_seed * 0x100000001B3ull + test_id;
}

static inline double tk_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(tk_next() >> 11) * (1.0 / 9007199254740992.0);
}
static inline int tk_randint(int n) {
    return (int)(tk_next() % (uint64_t)n);
}

static inline float *tk_alloc(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    return p;
}
static inline double *tk_dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}
static inline float *tk_rand(size_t n, float scale) {
    float *p = tk_alloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (float)tk_uniform(-scale, scale);
    return p;
}
static inline float *tk_copy(const float *x, size_t n) {
    float *p = tk_alloc(n);
    for (size_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}
/* float buffer -> float64 copy (exact), the starting point of every reference */
static inline double *tk_widen(const float *x, size_t n) {
    double *p = tk_dalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}

/* |got - ref| <= atol + rtol * |ref| elementwise; on failure print where and the seed. */
static inline void tk_check(const char *what, const float *got, const double *ref, size_t n,
                            double rtol, double atol) {
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        double tol = atol + rtol * fabs(ref[i]);
        if (!(err <= tol)) { /* also catches NaN */
            if (!bad) first = i;
            bad++;
        }
        if (err / (tol > 0 ? tol : 1) > worst) worst = err / (tol > 0 ? tol : 1);
    }
    if (bad) {
        fprintf(stderr,
                "%s: %zu/%zu mismatches, first [%zu] got %.9g want %.9g (worst err/tol %.3g); "
                "rerun with LOOM_TEST_SEED=%llu\n",
                what, bad, n, first, (double)got[first], ref[first], worst,
                (unsigned long long)tk_seed);
        fail();
    }
}

#endif
