/* The grouped expert computation against one dense GEMM of the same FLOPs: N tokens
 * routed top-K over E experts (router on random logits, dropless), permuted so each
 * expert's rows are contiguous, then one [n_e, C] x [C, F] and one [n_e, F] x [F, C]
 * GEMM per expert; the dense baseline runs the same two GEMMs once over all N*K rows.
 * Prints one JSON object: milliseconds (best of R) of the whole grouped path (router,
 * permutation, GEMMs, combine), of its GEMMs alone, and of the dense GEMMs, and ratios. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "kernels/kernels.h"

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 2048, E = 8, K = 2;
    const int C = argc > 2 ? atoi(argv[2]) : 256, F = argc > 3 ? atoi(argv[3]) : 512, R = 5;
    const size_t NK = (size_t)N * K;
    float *x = malloc(sizeof(float) * N * C), *logits = malloc(sizeof(float) * N * E);
    float *probs = malloc(sizeof(float) * N * E), *w = malloc(sizeof(float) * NK);
    float *lse = malloc(sizeof(float) * N), *send = malloc(sizeof(float) * NK * C);
    float *h = malloc(sizeof(float) * NK * F), *y = malloc(sizeof(float) * NK * C);
    float *w1 = malloc(sizeof(float) * (size_t)E * F * C),
          *w2 = malloc(sizeof(float) * (size_t)E * C * F);
    int32_t *idx = malloc(sizeof(int32_t) * NK), *pos = malloc(sizeof(int32_t) * NK);
    int32_t load[8], kept[8], offs[8];
    srand(7);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < (size_t)N * E; i++) logits[i] = (float)rand() / RAND_MAX;
    for (size_t i = 0; i < (size_t)E * F * C; i++) w1[i] = w2[i] = (float)rand() / RAND_MAX * 0.01f;
    double best_g = 1e30, best_d = 1e30, best_gemm = 1e30;
    for (int r = 0; r < R; r++) {
        double t0 = loom_now_ms();
        loom_moe_router_forward(probs, idx, w, lse, logits, N, E, K);
        loom_moe_capacity(pos, load, kept, idx, N, K, E, 0);
        int n = 0;
        for (int e = 0; e < E; e++) offs[e] = n, n += kept[e];
        loom_moe_permute(send, x, idx, pos, offs, N, K, C);
        double tg = loom_now_ms();
        for (int e = 0; e < E; e++) {
            loom_linear_forward(h + (size_t)offs[e] * F, send + (size_t)offs[e] * C,
                                w1 + (size_t)e * F * C, NULL, kept[e], C, F);
            loom_linear_forward(y + (size_t)offs[e] * C, h + (size_t)offs[e] * F,
                                w2 + (size_t)e * C * F, NULL, kept[e], F, C);
        }
        double tg1 = loom_now_ms();
        loom_moe_combine(x, y, w, idx, pos, offs, N, K, C);
        best_gemm = tg1 - tg < best_gemm ? tg1 - tg : best_gemm;
        double t1 = loom_now_ms();
        loom_linear_forward(h, send, w1, NULL, (int)NK, C, F);
        loom_linear_forward(y, h, w2, NULL, (int)NK, F, C);
        double t2 = loom_now_ms();
        best_g = t1 - t0 < best_g ? t1 - t0 : best_g;
        best_d = t2 - t1 < best_d ? t2 - t1 : best_d;
    }
    printf("{\"tokens\": %d, \"experts\": %d, \"top_k\": %d, \"d_model\": %d, \"d_ff\": %d, "
           "\"grouped_ms\": %.3f, \"grouped_gemm_ms\": %.3f, \"dense_ms\": %.3f, "
           "\"grouped_vs_dense\": %.3f, \"grouped_gemm_vs_dense\": %.3f}\n",
           N, E, K, C, F, best_g, best_gemm, best_d, best_d / best_g, best_d / best_gemm);
    return 0;
}
