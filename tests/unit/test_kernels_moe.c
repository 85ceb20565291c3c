/* Mixture-of-experts routing kernels against float64 naive versions: router softmax,
 * top-k and renormalisation, the capacity rule, the permutations to and from
 * expert-contiguous rows, and the router backward (against central finite differences
 * of a float64 forward). */
#include "test_kernels_util.h"

#include <string.h>

#include "kernels/kernels.h"

/* float64 router forward of one row with the chosen experts given (for differences). */
static double row_objective(const double *l, int E, const int32_t *ix, int K, const double *g,
                            const double *a, double z) {
    double m = l[0], s = 0.0, S = 0.0, f = 0.0;
    for (int e = 1; e < E; e++) m = fmax(m, l[e]);
    for (int e = 0; e < E; e++) s += exp(l[e] - m);
    for (int j = 0; j < K; j++) S += exp(l[ix[j]] - m) / s;
    for (int j = 0; j < K; j++) f += g[j] * (exp(l[ix[j]] - m) / s) / S;
    for (int e = 0; e < E; e++) f += a[e] * exp(l[e] - m) / s;
    const double lse = m + log(s);
    return f + z * lse * lse;
}

static void check_router(int N, int E, int K) {
    float *logits = tk_rand((size_t)N * E, 3);
    float *probs = tk_alloc((size_t)N * E), *w = tk_alloc((size_t)N * K), *lse = tk_alloc(N);
    int32_t *idx = malloc(sizeof(int32_t) * N * K);
    assert_non_null(idx);
    loom_moe_router_forward(probs, idx, w, lse, logits, N, E, K);
    double *rp = tk_dalloc((size_t)N * E), *rw = tk_dalloc((size_t)N * K), *rl = tk_dalloc(N);
    for (int t = 0; t < N; t++) {
        const float *l = logits + (size_t)t * E;
        double m = l[0], s = 0.0;
        for (int e = 1; e < E; e++) m = fmax(m, l[e]);
        for (int e = 0; e < E; e++) s += exp(l[e] - m);
        for (int e = 0; e < E; e++) rp[(size_t)t * E + e] = exp(l[e] - m) / s;
        rl[t] = m + log(s);
        /* top-k by float64 probability: each choice the largest not yet taken */
        int taken[64] = {0};
        double S = 0.0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || rp[(size_t)t * E + e] > rp[(size_t)t * E + best]))
                    best = e;
            taken[best] = 1;
            assert_int_equal(idx[t * K + j], best);
            S += rp[(size_t)t * E + best];
        }
        for (int j = 0; j < K; j++) rw[t * K + j] = rp[(size_t)t * E + idx[t * K + j]] / S;
    }
    tk_check("router probs", probs, rp, (size_t)N * E, 1e-6, 1e-7);
    tk_check("router weights", w, rw, (size_t)N * K, 1e-6, 1e-7);
    tk_check("router lse", lse, rl, N, 1e-6, 1e-6);

    /* backward: objective sum_j g_j w_j + sum_e a_e p_e + z lse^2 per row */
    float *dw = tk_rand((size_t)N * K, 1), *dprob = tk_rand(E, 0.5f);
    const float z = (float)tk_uniform(0.0, 0.3);
    float *dl = tk_alloc((size_t)N * E);
    loom_moe_router_backward(dl, probs, idx, w, dw, lse, dprob, z, N, E, K);
    double *rd = tk_dalloc((size_t)N * E), g[64], a[64], l[64];
    for (int e = 0; e < E; e++) a[e] = dprob[e];
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < K; j++) g[j] = dw[t * K + j];
        for (int e = 0; e < E; e++) l[e] = logits[(size_t)t * E + e];
        for (int e = 0; e < E; e++) {
            const double h = 1e-6, keep = l[e];
            l[e] = keep + h;
            double up = row_objective(l, E, idx + t * K, K, g, a, z);
            l[e] = keep - h;
            double down = row_objective(l, E, idx + t * K, K, g, a, z);
            l[e] = keep;
            rd[(size_t)t * E + e] = (up - down) / (2 * h);
        }
    }
    tk_check("router backward", dl, rd, (size_t)N * E, 1e-4, 1e-6);
    free(logits), free(probs), free(w), free(lse), free(idx), free(rp), free(rw), free(rl);
    free(dw), free(dprob), free(dl), free(rd);
}

static void test_router(void **state) {
    (void)state;
    tk_reseed(31);
    check_router(37, 8, 2);
    check_router(10, 5, 5);
    check_router(64, 16, 1);
    check_router(9, 3, 2);
}

/* Random distinct experts per token. */
static void random_choices(int32_t *idx, int N, int K, int E) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = tk_randint(E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= idx[t * K + i] == e;
            } while (dup);
            idx[t * K + j] = e;
        }
}

static void check_dispatch(int N, int K, int E, int C, int cap) {
    int32_t *idx = malloc(sizeof(int32_t) * N * K), *pos = malloc(sizeof(int32_t) * N * K);
    int32_t load[64], kept[64], offs[64];
    assert_non_null(idx);
    assert_non_null(pos);
    random_choices(idx, N, K, E);
    const int dropped = loom_moe_capacity(pos, load, kept, idx, N, K, E, cap);
    /* The rule, naively: visit slot-major, keep while the expert has room. */
    int n_load[64] = {0}, n_kept[64] = {0}, n_drop = 0;
    for (int j = 0; j < K; j++)
        for (int t = 0; t < N; t++) {
            const int e = idx[t * K + j];
            n_load[e]++;
            const int want = (cap <= 0 || n_kept[e] < cap) ? n_kept[e]++ : -1;
            n_drop += want < 0;
            assert_int_equal(pos[t * K + j], want);
        }
    assert_int_equal(dropped, n_drop);
    int rows = 0;
    for (int e = 0; e < E; e++) {
        assert_int_equal(load[e], n_load[e]);
        assert_int_equal(kept[e], n_kept[e]);
        offs[e] = rows;
        rows += kept[e];
    }
    /* permute, combine, combine backward, unpermute against float64 loops */
    float *x = tk_rand((size_t)N * C, 1), *send = tk_alloc((size_t)N * K * C);
    loom_moe_permute(send, x, idx, pos, offs, N, K, C);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++)
            if (pos[t * K + j] >= 0)
                assert_memory_equal(send + (size_t)(offs[idx[t * K + j]] + pos[t * K + j]) * C,
                                    x + (size_t)t * C, sizeof(float) * C);
    float *ret = tk_rand((size_t)rows * C + 1, 1), *w = tk_rand((size_t)N * K, 1);
    float *out = tk_alloc((size_t)N * C), *dout = tk_rand((size_t)N * C, 1);
    float *dret = tk_alloc((size_t)rows * C + 1), *dw = tk_alloc((size_t)N * K);
    float *dx = tk_rand((size_t)N * C, 1), *dx0 = tk_copy(dx, (size_t)N * C);
    loom_moe_combine(out, ret, w, idx, pos, offs, N, K, C);
    loom_moe_combine_backward(dret, dw, dout, ret, w, idx, pos, offs, N, K, C);
    loom_moe_unpermute_add(dx, dret, idx, pos, offs, N, K, C);
    double *rout = tk_dalloc((size_t)N * C), *rdw = tk_dalloc((size_t)N * K);
    double *rdret = tk_dalloc((size_t)rows * C + 1), *rdx = tk_widen(dx0, (size_t)N * C);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int a = t * K + j;
            rdw[a] = 0.0;
            if (pos[a] < 0) continue;
            const size_t r = (size_t)(offs[idx[a]] + pos[a]) * C;
            for (int c = 0; c < C; c++) {
                rout[(size_t)t * C + c] += (double)w[a] * ret[r + c];
                rdw[a] += (double)dout[(size_t)t * C + c] * ret[r + c];
                rdret[r + c] = (double)w[a] * dout[(size_t)t * C + c];
            }
        }
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int a = t * K + j;
            if (pos[a] < 0) continue;
            const size_t r = (size_t)(offs[idx[a]] + pos[a]) * C;
            for (int c = 0; c < C; c++) rdx[(size_t)t * C + c] += (double)(float)rdret[r + c];
        }
    tk_check("combine", out, rout, (size_t)N * C, 1e-6, 1e-6);
    tk_check("combine backward dw", dw, rdw, (size_t)N * K, 1e-5, 1e-5);
    tk_check("combine backward dret", dret, rdret, (size_t)rows * C, 1e-6, 1e-7);
    tk_check("unpermute", dx, rdx, (size_t)N * C, 1e-6, 1e-6);
    free(idx), free(pos), free(x), free(send), free(ret), free(w), free(out), free(dout);
    free(dret), free(dw), free(dx), free(dx0), free(rout), free(rdw), free(rdret), free(rdx);
}

static void test_dispatch(void **state) {
    (void)state;
    tk_reseed(32);
    check_dispatch(40, 2, 8, 12, 0);  /* dropless */
    check_dispatch(40, 2, 8, 12, 10); /* capacity 1.0 */
    check_dispatch(33, 3, 5, 7, 4);   /* heavy dropping */
    check_dispatch(16, 1, 4, 9, 1);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
