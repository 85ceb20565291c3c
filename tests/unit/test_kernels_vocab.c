/* Vocabulary-parallel kernels (tensor parallelism): the vocabulary is cut into S shards,
 * each shard's pieces are computed on its own and combined as the TP group does (max of
 * the row maxima, sums of the partial sums); the results must equal float64 naive
 * versions of the unsharded embedding and softmax-cross-entropy. */
#include "test_kernels_util.h"

#include <string.h>

#include "kernels/kernels.h"

static void check_crossentropy_shards(int N, int V, int S) {
    const int Vs = V / S;
    float *logits = tk_rand((size_t)N * V, 6);
    for (int j = 0; j < V; j++) logits[j] += 120.0f; /* overflow in float if not stable */
    int32_t *tgt = malloc(sizeof(int32_t) * N);
    assert_non_null(tgt);
    for (int n = 0; n < N; n++) tgt[n] = tk_randint(V);
    const float dloss = (float)tk_uniform(0.1, 2.0);
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
    /* Each shard's logits: columns [s*Vs, (s+1)*Vs), contiguous per shard. */
    float **shard = malloc(sizeof(float *) * S);
    assert_non_null(shard);
    float *maxes = tk_alloc(N), *m_s = tk_alloc(N), *loss = tk_alloc(N), *loss_eval = tk_alloc(N);
    double *sums = tk_dalloc(N), *tl = tk_dalloc(N), *s_s = tk_dalloc(N), *t_s = tk_dalloc(N);
    double *sums_eval = tk_dalloc(N), *tl_eval = tk_dalloc(N);
    for (int n = 0; n < N; n++) {
        maxes[n] = -INFINITY;
        sums[n] = tl[n] = sums_eval[n] = tl_eval[n] = 0.0;
    }
    for (int s = 0; s < S; s++) {
        shard[s] = tk_alloc((size_t)N * Vs);
        for (int n = 0; n < N; n++)
            memcpy(shard[s] + (size_t)n * Vs, logits + (size_t)n * V + s * Vs, sizeof(float) * Vs);
        loom_crossentropy_shard_max(m_s, shard[s], N, Vs);
        for (int n = 0; n < N; n++) maxes[n] = fmaxf(maxes[n], m_s[n]);
    }
    for (int s = 0; s < S; s++) {
        loom_crossentropy_shard_sums(s_s, t_s, shard[s], tgt, maxes, N, Vs, s * Vs);
        for (int n = 0; n < N; n++) sums_eval[n] += s_s[n], tl_eval[n] += t_s[n];
        loom_crossentropy_shard_exp(s_s, t_s, shard[s], tgt, maxes, N, Vs, s * Vs);
        for (int n = 0; n < N; n++) sums[n] += s_s[n], tl[n] += t_s[n];
    }
    loom_crossentropy_shard_losses(loss_eval, maxes, sums_eval, tl_eval, N);
    loom_crossentropy_shard_losses(loss, maxes, sums, tl, N);
    tk_check("shard crossentropy loss (eval)", loss_eval, rloss, N, 1e-5, 1e-5);
    tk_check("shard crossentropy loss", loss, rloss, N, 1e-5, 1e-5);
    float *dl = tk_alloc((size_t)N * V);
    for (int s = 0; s < S; s++) {
        loom_crossentropy_shard_backward(shard[s], tgt, sums, N, Vs, s * Vs, dloss);
        for (int n = 0; n < N; n++)
            memcpy(dl + (size_t)n * V + s * Vs, shard[s] + (size_t)n * Vs, sizeof(float) * Vs);
        free(shard[s]);
    }
    tk_check("shard crossentropy dlogits", dl, rdl, (size_t)N * V, 1e-4, 1e-7);
    free(shard), free(maxes), free(m_s), free(loss), free(loss_eval), free(sums), free(tl);
    free(s_s), free(t_s), free(sums_eval), free(tl_eval), free(dl);
    free(logits), free(tgt), free(rloss), free(rdl);
}

static void test_crossentropy_shards(void **state) {
    (void)state;
    tk_reseed(21);
    check_crossentropy_shards(7, 40, 2);
    check_crossentropy_shards(5, 100, 4);
    check_crossentropy_shards(3, 6, 3);
    check_crossentropy_shards(2, 5000, 1);
}

static void check_embedding_shards(int B, int T, int C, int V, int S, int with_wpe) {
    const int Vs = V / S, N = B * T;
    float *wte = tk_rand((size_t)V * C, 1), *wpe = with_wpe ? tk_rand((size_t)T * C, 1) : NULL;
    int32_t *tok = malloc(sizeof(int32_t) * N);
    assert_non_null(tok);
    for (int i = 0; i < N; i++) tok[i] = tk_randint(V);
    tok[0] = tok[N - 1]; /* a repeated token: its gradient rows accumulate */
    float *dout = tk_rand((size_t)N * C, 1);
    double *rout = tk_dalloc((size_t)N * C), *rdwte = tk_dalloc((size_t)V * C);
    double *rdwpe = tk_dalloc((size_t)T * C);
    memset(rdwte, 0, sizeof(double) * V * C);
    memset(rdwpe, 0, sizeof(double) * T * C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            rout[(size_t)i * C + c] =
                (double)wte[(size_t)tok[i] * C + c] + (wpe ? wpe[(size_t)(i % T) * C + c] : 0.0);
            rdwte[(size_t)tok[i] * C + c] += dout[(size_t)i * C + c];
            rdwpe[(size_t)(i % T) * C + c] += dout[(size_t)i * C + c];
        }
    float *out = tk_alloc((size_t)N * C), *part = tk_alloc((size_t)N * C);
    float *dwte = tk_alloc((size_t)V * C), *dwpe = tk_alloc((size_t)T * C);
    memset(out, 0, sizeof(float) * N * C);
    memset(dwte, 0, sizeof(float) * V * C);
    memset(dwpe, 0, sizeof(float) * T * C);
    for (int s = 0; s < S; s++) {
        /* positions added by shard 0 only, as the TP group does */
        loom_embedding_forward_shard(part, tok, wte + (size_t)s * Vs * C, s == 0 ? wpe : NULL,
                                     s * Vs, Vs, B, T, C);
        for (size_t i = 0; i < (size_t)N * C; i++) out[i] += part[i];
        loom_embedding_backward_shard(dwte + (size_t)s * Vs * C, s == 0 ? dwpe : NULL, dout, tok,
                                      s * Vs, Vs, B, T, C);
    }
    tk_check("shard embedding forward", out, rout, (size_t)N * C, 1e-6, 1e-7);
    tk_check("shard embedding dwte", dwte, rdwte, (size_t)V * C, 1e-6, 1e-6);
    if (wpe) tk_check("shard embedding dwpe", dwpe, rdwpe, (size_t)T * C, 1e-6, 1e-6);
    free(wte), free(wpe), free(tok), free(dout), free(rout), free(rdwte), free(rdwpe);
    free(out), free(part), free(dwte), free(dwpe);
}

static void test_embedding_shards(void **state) {
    (void)state;
    tk_reseed(22);
    check_embedding_shards(2, 5, 70, 12, 2, 1);
    check_embedding_shards(3, 4, 16, 20, 4, 0);
    check_embedding_shards(1, 7, 130, 9, 3, 1);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crossentropy_shards),
        cmocka_unit_test(test_embedding_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
