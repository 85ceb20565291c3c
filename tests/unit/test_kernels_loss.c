/* Kernel tests for the loss and the optimizer: fused softmax cross-entropy and AdamW,
 * against float64 references on random inputs. */
#include "test_kernels_util.h"

#include "kernels/kernels.h"
#include "kernels/cpu/vecmath.h"

static void check_crossentropy(int N, int V) {
    float *logits = tk_rand((size_t)N * V, 6);
    /* A shifted row: naive exp would overflow in float, a stable kernel must not. */
    for (int j = 0; j < V; j++) logits[j] += 120.0f;
    int32_t *tgt = malloc(sizeof(int32_t) * N);
    assert_non_null(tgt);
    for (int n = 0; n < N; n++) tgt[n] = tk_randint(V);
    const float dloss = (float)tk_uniform(0.1, 2.0);
    float *loss = tk_alloc(N), *loss2 = tk_alloc(N), *dlogits = tk_copy(logits, (size_t)N * V);
    double *rloss = tk_dalloc(N), *rdl = tk_dalloc((size_t)N * V);
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        double m = x[0], s = 0;
        for (int j = 1; j < V; j++) m = fmax(m, x[j]);
        for (int j = 0; j < V; j++) s += exp(x[j] - m);
        double lse = m + log(s);
        rloss[n] = lse - x[tgt[n]];
        for (int j = 0; j < V; j++)
            rdl[(size_t)n * V + j] = (exp(x[j] - lse) - (j == tgt[n])) * dloss;
    }
    loom_crossentropy_forward(loss, logits, tgt, N, V);
    loom_crossentropy_forward_backward(loss2, dlogits, tgt, N, V, dloss);
    tk_check("crossentropy loss", loss, rloss, N, 1e-5, 1e-5);
    tk_check("crossentropy_fb loss", loss2, rloss, N, 1e-5, 1e-5);
    tk_check("crossentropy dlogits", dlogits, rdl, (size_t)N * V, 1e-4, 1e-7);
    free(logits), free(tgt), free(loss), free(loss2), free(dlogits), free(rloss), free(rdl);
}

static void test_crossentropy(void **state) {
    (void)state;
    tk_reseed(11);
    check_crossentropy(7, 37);
    check_crossentropy(5, 101);
    check_crossentropy(3, 1);
    check_crossentropy(2, 5003);
}

static void test_adamw(void **state) {
    (void)state;
    tk_reseed(12);
    const size_t n = 1001;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = tk_rand(n, 1), *m = tk_rand(n, 0.1f), *v = tk_rand(n, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]); /* second moment is >= 0 */
    double *rp = tk_widen(p, n), *rm = tk_widen(m, n), *rv = tk_widen(v, n);
    for (int t = 1; t <= 4; t++) {
        float *g = tk_rand(n, t == 2 ? 1e-3f : 1.0f); /* include tiny gradients */
        for (size_t i = 0; i < n; i++) {
            rp[i] *= 1.0 - (double)lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            double denom = sqrt(rv[i]) / sqrt(1.0 - pow(b2, t)) + eps;
            rp[i] -= lr / (1.0 - pow(b1, t)) * rm[i] / denom;
        }
        loom_adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, t);
        /* absolute slack: float rounding of O(1) (param) and O(0.1) (m) terms that can
         * cancel, accumulated over the steps */
        tk_check("adamw param", p, rp, n, 1e-6, 5e-7);
        tk_check("adamw m", m, rm, n, 1e-5, 5e-8);
        tk_check("adamw v", v, rv, n, 1e-5, 1e-12);
        free(g);
    }
    free(p), free(m), free(v), free(rp), free(rm), free(rv);
}

/* The vectorisable exp behind softmax, cross-entropy, GELU and SwiGLU. */
static void test_vecmath(void **state) {
    (void)state;
    tk_reseed(13);
    const int n = 20001;
    float *x = tk_alloc(n), *got = tk_alloc(n);
    double *ref = tk_dalloc(n);
    for (int i = 0; i < n; i++) {
        x[i] = (float)tk_uniform(-87.0, 88.0);
        got[i] = loom_expf(x[i]);
        ref[i] = exp(x[i]);
    }
    tk_check("loom_expf", got, ref, n, 5e-7, 0);
    /* clamped outside [-87, 88]: tiny for -inf-like inputs, finite for huge ones */
    assert_true(loom_expf(-1e30f) <= 2e-38f && loom_expf(-1e30f) >= 0.0f);
    assert_true(isfinite(loom_expf(1e30f)) && loom_expf(1e30f) > 1e38f);
    assert_true(loom_expf(0.0f) == 1.0f);
    for (int i = 0; i < n; i++) x[i] = (float)tk_uniform(-50, 50);
    double s = 0, m = -INFINITY;
    for (int i = 0; i < n; i++) s += x[i], m = fmax(m, x[i]);
    double sum_ref[2] = {s, m};
    float sum_got[2] = {(float)loom_sum_f64(x, n), loom_max_f32(x, n)};
    tk_check("loom_sum_f64/loom_max_f32", sum_got, sum_ref, 2, 1e-7, 1e-6);
    free(x), free(got), free(ref);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_vecmath),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
