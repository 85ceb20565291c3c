/* Kernel tests for RoPE and causal GQA attention against naive float64 references.
 * The attention backward is checked against the analytic gradient of an explicit
 * float64 softmax attention (softmax Jacobian written out, no finite differences). */
#include "test_kernels_util.h"

#include <string.h>

#include "kernels/kernels.h"

/* ---- RoPE ---- */
static void ref_rope_at(double *x, int B, int T, int H, int KV, int hd, double theta, int inverse,
                        int pos0) {
    int R = (H + 2 * KV) * hd, half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H + KV; h++)
                for (int i = 0; i < half; i++) {
                    double ang = (pos0 + t) * pow(theta, -2.0 * i / hd), c = cos(ang), s = sin(ang);
                    if (inverse) s = -s;
                    double *p = x + ((size_t)b * T + t) * R + (size_t)h * hd;
                    double lo = p[i], hi = p[i + half];
                    p[i] = lo * c - hi * s;
                    p[i + half] = hi * c + lo * s;
                }
}

static void ref_rope(double *x, int B, int T, int H, int KV, int hd, double theta, int inverse) {
    ref_rope_at(x, B, T, H, KV, hd, theta, inverse, 0);
}

/* Positions pos0 .. pos0+T-1 (a context-parallel rank's chunk): forward and backward
 * against the reference, and backward undoes forward. */
static void check_rope_at(int B, int T, int H, int KV, int hd, float theta, int pos0) {
    size_t n = (size_t)B * T * (H + 2 * KV) * hd;
    float *x = tk_rand(n, 2), *y = tk_rand(n, 2);
    float *fx = tk_copy(x, n), *by = tk_copy(y, n);
    double *rx = tk_widen(x, n), *ry = tk_widen(y, n), *xd = tk_widen(x, n);
    ref_rope_at(rx, B, T, H, KV, hd, theta, 0, pos0);
    ref_rope_at(ry, B, T, H, KV, hd, theta, 1, pos0);
    loom_rope_forward_at(fx, B, T, H, KV, hd, theta, pos0);
    loom_rope_backward_at(by, B, T, H, KV, hd, theta, pos0);
    tk_check("rope forward at pos0", fx, rx, n, 1e-5, 1e-5);
    tk_check("rope backward at pos0", by, ry, n, 1e-5, 1e-5);
    loom_rope_backward_at(fx, B, T, H, KV, hd, theta, pos0);
    tk_check("rope round trip at pos0", fx, xd, n, 1e-5, 1e-5);
    free(x), free(y), free(fx), free(by), free(rx), free(ry), free(xd);
}

static void check_rope(int B, int T, int H, int KV, int hd, float theta) {
    size_t n = (size_t)B * T * (H + 2 * KV) * hd;
    float *x = tk_rand(n, 2), *y = tk_rand(n, 2);
    float *fx = tk_copy(x, n), *by = tk_copy(y, n);
    double *rx = tk_widen(x, n), *ry = tk_widen(y, n);
    ref_rope(rx, B, T, H, KV, hd, theta, 0);
    ref_rope(ry, B, T, H, KV, hd, theta, 1);
    loom_rope_forward(fx, B, T, H, KV, hd, theta);
    loom_rope_backward(by, B, T, H, KV, hd, theta);
    /* value heads are copied through exactly by both references */
    tk_check("rope forward", fx, rx, n, 1e-5, 1e-5);
    tk_check("rope backward", by, ry, n, 1e-5, 1e-5);
    /* backward is the transpose of forward: <rope(x), y> == <x, rope_backward(y)> */
    double lhs = 0, rhs = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        lhs += (double)fx[i] * y[i];
        rhs += (double)x[i] * by[i];
        mag += fabs((double)x[i] * y[i]);
    }
    if (!(fabs(lhs - rhs) <= 1e-6 * mag)) {
        fprintf(stderr, "rope adjoint: %.10g vs %.10g; LOOM_TEST_SEED=%llu\n", lhs, rhs,
                (unsigned long long)tk_seed);
        fail();
    }
    /* and it undoes the forward (the rotation is orthogonal) */
    loom_rope_backward(fx, B, T, H, KV, hd, theta);
    double *xd = tk_widen(x, n);
    tk_check("rope round trip", fx, xd, n, 1e-5, 1e-5);
    free(x), free(y), free(fx), free(by), free(rx), free(ry), free(xd);
}

static void test_rope(void **state) {
    (void)state;
    tk_reseed(21);
    check_rope(1, 5, 6, 2, 6, 10000.0f);
    check_rope(2, 17, 6, 3, 10, 10000.0f);
    check_rope(2, 33, 6, 6, 10, 500000.0f);
    check_rope(1, 7, 2, 1, 130, 10000.0f); /* more pairs than one cos/sin chunk */
    check_rope_at(2, 8, 4, 2, 8, 10000.0f, 24);
    check_rope_at(1, 5, 6, 3, 10, 500000.0f, 1000);
}

/* ---- attention ---- */
typedef struct {
    int B, T, H, KV, hd;
} attn_shape;

/* Naive float64 causal attention forward + backward (dqkv accumulates). */
static void ref_attention(double *out, double *lse, double *dqkv, const float *qkv,
                          const float *dout, attn_shape s) {
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
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)q[i * R + c] * k[j * R + c];
                    P[i * T + j] = d * scale;
                    m = fmax(m, d * scale);
                }
                for (int j = 0; j <= i; j++) sum += exp(P[i * T + j] - m);
                for (int j = 0; j <= i; j++) P[i * T + j] = exp(P[i * T + j] - m) / sum;
                lse[((size_t)b * s.H + h) * T + i] = m + log(sum);
                for (int c = 0; c < hd; c++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++) acc += P[i * T + j] * v[j * R + c];
                    o[i * OC + c] = acc;
                }
            }
            for (int i = 0; i < T; i++) {
                double pdp = 0; /* sum_k P_ik dP_ik, the softmax Jacobian's rank-1 term */
                for (int j = 0; j <= i; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)dy[i * OC + c] * v[j * R + c];
                    dP[i * T + j] = d;
                    pdp += P[i * T + j] * d;
                }
                for (int j = 0; j <= i; j++) {
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

static void check_attention(attn_shape s) {
    size_t nqkv = (size_t)s.B * s.T * (s.H + 2 * s.KV) * s.hd;
    size_t nout = (size_t)s.B * s.T * s.H * s.hd, nlse = (size_t)s.B * s.H * s.T;
    size_t nscratch = loom_attention_scratch_floats(s.T);
    float *qkv = tk_rand(nqkv, 1.5f), *dout = tk_rand(nout, 1), *dqkv = tk_rand(nqkv, 1);
    float *out = tk_alloc(nout), *lse = tk_alloc(nlse), *scratch = tk_alloc(nscratch);
    for (size_t i = 0; i < nscratch; i++) scratch[i] = NAN; /* stale scratch must not leak */
    double *rout = tk_dalloc(nout), *rlse = tk_dalloc(nlse), *rdqkv = tk_widen(dqkv, nqkv);
    ref_attention(rout, rlse, rdqkv, qkv, dout, s);
    loom_attention_forward(out, lse, qkv, scratch, s.B, s.T, s.H, s.KV, s.hd);
    tk_check("attention out", out, rout, nout, 1e-4, 1e-5);
    tk_check("attention lse", lse, rlse, nlse, 1e-5, 1e-5);
    for (size_t i = 0; i < nscratch; i++) scratch[i] = NAN;
    loom_attention_backward(dqkv, scratch, dout, qkv, out, lse, s.B, s.T, s.H, s.KV, s.hd);
    tk_check("attention dqkv", dqkv, rdqkv, nqkv, 1e-4, 2e-5);
    free(qkv), free(dout), free(dqkv), free(out), free(lse), free(scratch);
    free(rout), free(rlse), free(rdqkv);
}

static void test_attention(void **state) {
    (void)state;
    tk_reseed(22);
    const attn_shape shapes[] = {
        {1, 1, 6, 6, 6},   {2, 5, 6, 2, 6},  {1, 17, 6, 3, 10}, {2, 33, 6, 6, 10},
        {1, 130, 6, 2, 6}, {2, 65, 4, 1, 8}, {1, 64, 2, 2, 64},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) check_attention(shapes[i]);
}

static void test_attention_scratch(void **state) {
    (void)state;
    /* backward keeps P and dS for one head: at least 2 T^2 floats */
    assert_true(loom_attention_scratch_floats(257) >= 2u * 257 * 257);
    assert_true(loom_attention_scratch_floats(1) >= 2);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
