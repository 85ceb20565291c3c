/* bf16 conversions (kernels/bf16.h) against a float64 reference: round to nearest with
 * ties to even, decided in double from the two bf16 neighbours of each value, never from
 * the bit trick under test; the corner cases (ties, subnormals, inf, NaN, the largest
 * finite, overflow); AVX512-BF16 against the scalar path bit for bit (where the CPU has
 * it); stochastic rounding: always a neighbour, unbiased, the same bits for any split.
 * The bf16-input GELU and SwiGLU (the pre-activation kept in bf16): against float64 of the
 * widened input, and bit for bit the fp32 kernels on it. */
#include "test_kernels_util.h"

#include <float.h>

#include "kernels/bf16.h"
#include "kernels/kernels.h"

/* The value of a finite bf16 in double (exact). */
static double bf16_value(uint16_t h) {
    return (double)loom_bf16_to_f32(h);
}

/* float64 reference for a finite, normal fp32 x: the nearer of the two bf16 neighbours of
 * |x| (truncation t and t + 1 ulp), ties to the even mantissa; past the largest finite the
 * upper neighbour is 2^128, which is inf. */
static uint16_t ref_round(float x) {
    uint32_t u = loom_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u), t = (uint16_t)((u >> 16) & 0x7FFFu);
    double ax = fabs((double)x), lo = bf16_value(t);
    double hi = t + 1 == 0x7F80 ? ldexp(1.0, 128) : bf16_value((uint16_t)(t + 1));
    double dl = ax - lo, dh = hi - ax;
    uint16_t r = dl < dh ? t : dh < dl ? (uint16_t)(t + 1) : (t & 1u) ? (uint16_t)(t + 1) : t;
    return (uint16_t)(sign | r);
}

static uint16_t conv(uint32_t bits) {
    return loom_bf16_from_f32(loom_f32_from_bits(bits));
}

static void test_corner_cases(void **state) {
    (void)state;
    /* ties to even: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7 (odd) */
    assert_int_equal(loom_bf16_from_f32(1.0f + 0x1p-8f), 0x3F80);
    /* 1 + 2^-7 + 2^-8: halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even) */
    assert_int_equal(loom_bf16_from_f32(1.0f + 0x1p-7f + 0x1p-8f), 0x3F82);
    assert_int_equal(loom_bf16_from_f32(-(1.0f + 0x1p-8f)), 0xBF80);
    /* just above and below a tie */
    assert_int_equal(conv(0x3F808001u), 0x3F81);
    assert_int_equal(conv(0x3F807FFFu), 0x3F80);
    /* subnormals flush to a zero of the same sign (as VCVTNE2PS2BF16 does) */
    assert_int_equal(conv(0x00000001u), 0x0000);
    assert_int_equal(conv(0x007FFFFFu), 0x0000);
    assert_int_equal(conv(0x80400000u), 0x8000);
    assert_int_equal(conv(0x00000000u), 0x0000);
    assert_int_equal(conv(0x80000000u), 0x8000);
    /* the smallest normal stays */
    assert_int_equal(conv(0x00800000u), 0x0080);
    /* inf */
    assert_int_equal(loom_bf16_from_f32(INFINITY), 0x7F80);
    assert_int_equal(loom_bf16_from_f32(-INFINITY), 0xFF80);
    /* NaN stays NaN, quiet: payload only in the low half, signalling, negative */
    assert_int_equal(conv(0x7F800001u), 0x7FC0);
    assert_int_equal(conv(0x7FA00000u), 0x7FE0);
    assert_int_equal(conv(0xFFC00000u), 0xFFC0);
    uint16_t qn = loom_bf16_from_f32(NAN);
    assert_true(isnan(loom_bf16_to_f32(qn)));
    /* largest finite bf16 (0x7F7F = 3.3895e38) stays; below half an ulp above it too */
    assert_int_equal(conv(0x7F7F0000u), 0x7F7F);
    assert_int_equal(conv(0x7F7F7FFFu), 0x7F7F);
    /* overflow: the tie above it goes to even, which is inf; FLT_MAX too */
    assert_int_equal(conv(0x7F7F8000u), 0x7F80);
    assert_int_equal(loom_bf16_from_f32(FLT_MAX), 0x7F80);
    assert_int_equal(loom_bf16_from_f32(-FLT_MAX), 0xFF80);
    /* the reference agrees on the finite ones */
    assert_int_equal(ref_round(1.0f + 0x1p-8f), 0x3F80);
    assert_int_equal(ref_round(loom_f32_from_bits(0x7F7F8000u)), 0x7F80);
    /* widening is exact */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = loom_bf16_to_f32((uint16_t)h);
        assert_int_equal(loom_f32_bits(f), h << 16);
    }
}

/* Random bit patterns over every exponent (and the special ones mixed in), checked
 * against the float64 reference; then the AVX512-BF16 and AVX2 array paths bit for bit
 * (where the CPU has them), odd lengths. */
static void test_random_against_float64(void **state) {
    (void)state;
    tk_reseed(2);
    const size_t n = 200003;
    float *x = tk_alloc(n);
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    assert_non_null(a), assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)tk_next();
        if (i % 7 == 0) u = (u & 0xFFFF0000u) | 0x8000u; /* exact ties */
        if (i % 101 == 0) u |= 0x7F800000u;              /* inf / NaN */
        if (i % 103 == 0) u &= 0x807FFFFFu;              /* subnormal / zero */
        x[i] = loom_f32_from_bits(u);
    }
    loom_bf16_from_f32_n_scalar(a, x, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = loom_f32_bits(x[i]), e = u & 0x7F800000u;
        uint16_t want;
        if (e == 0x7F800000u)
            want = (u & 0x7FFFFFu) ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)(u >> 16);
        else if (e == 0)
            want = (uint16_t)((u >> 16) & 0x8000u);
        else
            want = ref_round(x[i]);
        if (a[i] != want)
            fail_msg("x bits %08x: got %04x want %04x (LOOM_TEST_SEED=%llu)", u, a[i], want,
                     (unsigned long long)tk_seed);
        if (e != 0x7F800000u && e != 0 && (a[i] & 0x7F80u) != 0x7F80u) {
            /* error bound: |bf16(x) - x| <= 2^-8 |x| (half an ulp of a 7-bit mantissa) */
            double err = fabs(bf16_value(a[i]) - (double)x[i]);
            assert_true(err <= ldexp(fabs((double)x[i]), -8));
        }
    }
    size_t lens[] = {n, 1, 15, 16, 17, 31, 32, 33, 1000};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        memset(b, 0xAB, n * 2);
        if (!loom_bf16_from_f32_n_avx512(b, x, lens[k])) {
            fprintf(stderr, "no AVX512-BF16 here: its path was not checked\n");
            break;
        }
        assert_memory_equal(a, b, lens[k] * 2);
        if (lens[k] < n) assert_int_equal(b[lens[k]], 0xABAB); /* the masked tail */
    }
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        memset(b, 0xAB, n * 2);
        if (!loom_bf16_from_f32_n_avx2(b, x, lens[k])) {
            fprintf(stderr, "no AVX2 here: its path was not checked\n");
            break;
        }
        assert_memory_equal(a, b, lens[k] * 2);
        if (lens[k] < n) assert_int_equal(b[lens[k]], 0xABAB); /* stops at n */
    }
    memset(b, 0, n * 2);
    loom_bf16_from_f32_n(b, x, n); /* the dispatching, threaded one */
    assert_memory_equal(a, b, n * 2);
    free(x), free(a), free(b);
}

static void test_stochastic(void **state) {
    (void)state;
    tk_reseed(3);
    const size_t n = 1 << 16;
    float *x = tk_alloc(n);
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    assert_non_null(a), assert_non_null(b);
    uint64_t seed = tk_next();
    for (size_t i = 0; i < n; i++) x[i] = (float)tk_uniform(-3, 3);
    loom_bf16_from_f32_stochastic_n(a, x, n, seed, 7, 1000);
    /* the same bits for any split of the range */
    loom_bf16_from_f32_stochastic_n(b, x, 12345, seed, 7, 1000);
    loom_bf16_from_f32_stochastic_n(b + 12345, x + 12345, n - 12345, seed, 7, 1000 + 12345);
    assert_memory_equal(a, b, n * 2);
    for (size_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(loom_f32_bits(x[i]) >> 16);
        assert_true(a[i] == t || a[i] == (uint16_t)(t + 1)); /* a neighbour */
        assert_int_equal(a[i], loom_bf16_from_f32_sr(x[i], loom_bf16_sr_bits(seed, 7, 1000 + i)));
    }
    /* unbiased: one value rounded 2^16 times (elements of one stream): the mean is x
     * within 5 standard errors (each draw is one of two values an ulp u apart: sd <= u/2) */
    float v = 1.0f + 0x1p-9f * 3.0f; /* 0.375 of the way from 1 to 1 + 2^-7 (one ulp) */
    for (size_t i = 0; i < n; i++) x[i] = v;
    loom_bf16_from_f32_stochastic_n(a, x, n, seed, 9, 0);
    double mean = 0.0;
    for (size_t i = 0; i < n; i++) mean += bf16_value(a[i]);
    mean /= (double)n;
    double se = 0x1p-7 / 2.0 / sqrt((double)n);
    if (fabs(mean - (double)v) > 5.0 * se)
        fail_msg("stochastic mean %.9g for %.9g (LOOM_TEST_SEED=%llu)", mean, (double)v,
                 (unsigned long long)tk_seed);
    /* specials as in nearest rounding */
    assert_int_equal(loom_bf16_from_f32_sr(INFINITY, 0xFFFF), 0x7F80);
    assert_int_equal(loom_bf16_from_f32_sr(loom_f32_from_bits(0x7F800001u), 0), 0x7FC0);
    assert_int_equal(loom_bf16_from_f32_sr(loom_f32_from_bits(0x80000001u), 0xFFFF), 0x8000);
    free(x), free(a), free(b);
}

/* n random values of scale s rounded to bf16: h, and their exact widening (returned). */
static float *rand_bf16(loom_bf16 **h, size_t n, float s) {
    float *x = tk_rand(n, s);
    *h = malloc(n * sizeof **h);
    assert_non_null(*h);
    loom_bf16_from_f32_n(*h, x, n);
    loom_bf16_to_f32_n(x, *h, n);
    return x;
}

/* The threaded conversions over several blocks (kernels/cpu/bf16.c: 65536 values a block;
 * one block or less runs without an OpenMP region) against the one-value functions, for
 * lengths on both sides of the block and split anywhere. */
static void test_blocks(void **state) {
    (void)state;
    tk_reseed(4);
    const size_t n = 3 * 65536 + 4321, lens[] = {n, 65536, 65537, 1, 70000};
    float *x = tk_alloc(n), *w = malloc(n * sizeof(float));
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    assert_non_null(w), assert_non_null(a), assert_non_null(b);
    for (size_t i = 0; i < n; i++) x[i] = (float)tk_uniform(-5, 5);
    const uint64_t seed = tk_next();
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        const size_t len = lens[k];
        loom_bf16_from_f32_n(a, x, len);
        loom_bf16_to_f32_n(w, a, len);
        for (size_t i = 0; i < len; i++) {
            assert_int_equal(a[i], loom_bf16_from_f32(x[i]));
            assert_true(loom_f32_bits(w[i]) == (uint32_t)a[i] << 16);
        }
        loom_bf16_from_f32_stochastic_n(b, x, len, seed, 3, 77);
        for (size_t i = 0; i < len; i++)
            assert_int_equal(b[i], loom_bf16_from_f32_sr(x[i], loom_bf16_sr_bits(seed, 3, 77 + i)));
    }
    free(x), free(w), free(a), free(b);
}

static void test_gelu_bf16_input(void **state) {
    (void)state;
    tk_reseed(31);
    const size_t n = 1003; /* a tail past any vector width */
    loom_bf16 *h;
    float *x = rand_bf16(&h, n, 6), *out = tk_alloc(n), *out32 = tk_alloc(n);
    float *dy = tk_rand(n, 1), *dx = tk_rand(n, 1), *dx32 = tk_copy(dx, n);
    double *rout = tk_dalloc(n), *rdx = tk_widen(dx, n);
    const double s = sqrt(2.0 / M_PI), k = 0.044715;
    for (size_t i = 0; i < n; i++) {
        double v = x[i], th = tanh(s * (v + k * v * v * v));
        rout[i] = 0.5 * v * (1 + th);
        rdx[i] += dy[i] * (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * s * (1 + 3 * k * v * v));
    }
    loom_gelu_forward_bf16(out, h, n);
    loom_gelu_backward_bf16(dx, h, dy, n);
    tk_check("gelu bf16 out", out, rout, n, 1e-5, 1e-6);
    tk_check("gelu bf16 dinp", dx, rdx, n, 1e-5, 1e-6);
    loom_gelu_forward(out32, x, n);
    loom_gelu_backward(dx32, x, dy, n);
    assert_memory_equal(out, out32, n * sizeof *out);
    assert_memory_equal(dx, dx32, n * sizeof *dx);
    free(x), free(h), free(out), free(out32), free(dy), free(dx), free(dx32), free(rout), free(rdx);
}

static void test_swiglu_bf16_input(void **state) {
    (void)state;
    tk_reseed(32);
    const int N = 9, F = 37;
    const size_t nf = (size_t)N * F, n2 = 2 * nf;
    loom_bf16 *h;
    float *x = rand_bf16(&h, n2, 5), *out = tk_alloc(nf), *out32 = tk_alloc(nf);
    float *dy = tk_rand(nf, 1), *dx = tk_rand(n2, 1), *dx32 = tk_copy(dx, n2);
    double *rout = tk_dalloc(nf), *rdx = tk_widen(dx, n2);
    for (int r = 0; r < N; r++)
        for (int f = 0; f < F; f++) {
            double g = x[r * 2 * F + f], u = x[r * 2 * F + F + f], sig = 1 / (1 + exp(-g));
            rout[r * F + f] = g * sig * u;
            rdx[r * 2 * F + f] += dy[r * F + f] * u * (sig + g * sig * (1 - sig));
            rdx[r * 2 * F + F + f] += dy[r * F + f] * g * sig;
        }
    loom_swiglu_forward_bf16(out, h, N, F);
    loom_swiglu_backward_bf16(dx, dy, h, N, F);
    tk_check("swiglu bf16 out", out, rout, nf, 1e-5, 1e-6);
    tk_check("swiglu bf16 dinp", dx, rdx, n2, 1e-5, 1e-6);
    loom_swiglu_forward(out32, x, N, F);
    loom_swiglu_backward(dx32, dy, x, N, F);
    assert_memory_equal(out, out32, nf * sizeof *out);
    assert_memory_equal(dx, dx32, n2 * sizeof *dx);
    free(x), free(h), free(out), free(out32), free(dy), free(dx), free(dx32), free(rout), free(rdx);
}

/* In place: d = d(input) from d = d(output), bit for bit the accumulation into zero (signed
 * zeros included). */
static void test_gelu_bf16_inplace(void **state) {
    (void)state;
    tk_reseed(33);
    const size_t n = 1003;
    loom_bf16 *h;
    float *x = rand_bf16(&h, n, 6), *dy = tk_rand(n, 1), *ref = tk_alloc(n);
    dy[0] = -0.0f, dy[1] = 0.0f, x[2] = 0.0f;
    h[2] = 0x8000; /* -0 input */
    float *d = tk_copy(dy, n);
    memset(ref, 0, n * sizeof *ref);
    loom_gelu_backward_bf16(ref, h, dy, n);
    loom_gelu_backward_bf16_inplace(d, h, n);
    assert_memory_equal(d, ref, n * sizeof *d);
    free(x), free(h), free(dy), free(ref), free(d);
}

/* The causal backward from bf16 qkv and out: bit for bit the fp32 kernel on the widened
 * tensors (which tests/unit/test_kernels_attention.c checks against float64), with GQA, a tail
 * past the 64-row block and accumulation into a non-zero dqkv. */
static void test_attention_backward_bf16(void **state) {
    (void)state;
    tk_reseed(34);
    const int B = 2, T = 70, H = 4, KV = 2, hd = 8;
    const size_t nq = (size_t)B * T * (H + 2 * KV) * hd, no = (size_t)B * T * H * hd;
    loom_bf16 *hq, *ho = malloc(no * sizeof *ho);
    float *qkv = rand_bf16(&hq, nq, 1), *out = tk_alloc(no), *lse = tk_alloc((size_t)B * H * T);
    float *s32 = tk_alloc(loom_attention_scratch_floats(T));
    float *s16 = tk_alloc(loom_attention_scratch_floats_bf16(T, hd));
    assert_non_null(ho);
    loom_attention_forward(out, lse, qkv, s32, B, T, H, KV, hd);
    loom_bf16_from_f32_n(ho, out, no); /* out kept in bf16, as the model does */
    loom_bf16_to_f32_n(out, ho, no);
    float *dout = tk_rand(no, 1), *d32 = tk_rand(nq, 1), *d16 = tk_copy(d32, nq);
    loom_attention_backward(d32, s32, dout, qkv, out, lse, B, T, H, KV, hd);
    loom_attention_backward_bf16(d16, s16, dout, hq, ho, lse, B, T, H, KV, hd);
    assert_memory_equal(d16, d32, nq * sizeof *d16);
    free(hq), free(ho), free(qkv), free(out), free(lse), free(s32), free(s16), free(dout),
        free(d32), free(d16);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corner_cases),      cmocka_unit_test(test_random_against_float64),
        cmocka_unit_test(test_stochastic),        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_gelu_bf16_input),   cmocka_unit_test(test_swiglu_bf16_input),
        cmocka_unit_test(test_gelu_bf16_inplace), cmocka_unit_test(test_attention_backward_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
