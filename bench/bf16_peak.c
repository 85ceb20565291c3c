/* bf16_peak: the practical bf16 GEMM ceiling of this machine, as loom's --precision bf16
 * sees it: oneDNN's matmul (kernels/cpu/gemm_bf16.h, bf16 inputs, fp32 accumulation and
 * output) on an N x N x N product (default 2048), the primitive made before timing, best
 * of R repetitions after one warm-up call. Prints one JSON line:
 *   {"bf16_gflops": X, "impl": "brg:avx512_core_bf16", "n": N, "reps": R, "best_ms": t}
 * Usage: bf16_peak [N [R]]. Threads: OMP_NUM_THREADS (oneDNN runs on OpenMP). On a CPU
 * without AVX512-BF16 / AMX-BF16 it measures what loom runs there, the GEMM widened to
 * fp32 for OpenBLAS (impl says so). bench/bench_train.py prints it beside sgemm_peak. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/gemm_bf16.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long parse_arg(const char *s, const char *what, long lo, long hi) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "bf16_peak: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi,
                s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? (int)parse_arg(argv[1], "N", 16, 16384) : 2048;
    const int reps = argc > 2 ? (int)parse_arg(argv[2], "reps", 1, 1000) : 5;
    const size_t count = (size_t)n * (size_t)n;
    loom_error err = {0};
    loom_gemm_bf16 *g = NULL;
    if (loom_gemm_bf16_create(&g, &err) || loom_gemm_bf16_prepare(g, LOOM_GEMM_NT, n, n, n, &err)) {
        fprintf(stderr, "bf16_peak: %s\n", err.msg);
        return 2;
    }
    loom_bf16 *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    float *c = malloc(count * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "bf16_peak: out of memory for three %d x %d matrices\n", n, n);
        return 1;
    }
    unsigned state = 12345u; /* values in [-1, 1) */
    for (size_t i = 0; i < count; i++) {
        state = state * 1664525u + 1013904223u;
        a[i] = loom_bf16_from_f32((float)(state >> 8) / 8388608.0f - 1.0f);
        state = state * 1664525u + 1013904223u;
        b[i] = loom_bf16_from_f32((float)(state >> 8) / 8388608.0f - 1.0f);
    }
    double best = 1e30;
    for (int r = -1; r < reps; r++) {                   /* r = -1: warm-up */
        for (size_t i = 0; i < count; i++) c[i] = 0.0f; /* the GEMM accumulates */
        double t0 = now_s();
        loom_gemm_bf16_run(g, LOOM_GEMM_NT, n, n, n, c, a, b);
        double dt = now_s() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    if (loom_gemm_bf16_status(g, &err)) {
        fprintf(stderr, "bf16_peak: %s\n", err.msg);
        return 1;
    }
    double check = 0.0;
    for (int i = 0; i < n; i++) check += (double)c[(size_t)i * (size_t)n + (size_t)i];
    printf("{\"bf16_gflops\": %.2f, \"impl\": \"%s\", \"n\": %d, \"reps\": %d, \"best_ms\": %.3f, "
           "\"checksum\": %.6g}\n",
           2.0 * (double)n * (double)n * (double)n / best / 1e9, loom_gemm_bf16_impl(g), n, reps,
           best * 1e3, check);
    free(a), free(b), free(c);
    loom_gemm_bf16_destroy(g);
    return 0;
}
