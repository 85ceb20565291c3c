/* sgemm_peak: the practical fp32 GEMM ceiling of this machine, as loom's BLAS sees it.
 *
 * Times cblas_sgemm on an N x N x N product (default 2048), best of R repetitions
 * after one warm-up call, and prints one JSON line:
 *   {"sgemm_gflops": X, "threads": n, "n": N, "reps": R, "best_ms": t}
 * Usage: sgemm_peak [N [R]]. Threads come from OpenBLAS (OPENBLAS_NUM_THREADS etc.).
 * bench/bench_train.py divides loom's achieved FLOP/s by this number.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long parse_arg(const char *s, const char *what, long lo, long hi) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "sgemm_peak: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi,
                s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? (int)parse_arg(argv[1], "N", 16, 16384) : 2048;
    const int reps = argc > 2 ? (int)parse_arg(argv[2], "reps", 1, 1000) : 5;
    const size_t count = (size_t)n * (size_t)n;
    float *a = malloc(count * sizeof *a);
    float *b = malloc(count * sizeof *b);
    float *c = malloc(count * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "sgemm_peak: out of memory for three %d x %d matrices\n", n, n);
        return 1;
    }
    /* Values in [-1, 1): keeps the result finite and avoids denormal slow paths. */
    unsigned state = 12345u;
    for (size_t i = 0; i < count; i++) {
        state = state * 1664525u + 1013904223u;
        a[i] = (float)(state >> 8) / 8388608.0f - 1.0f;
        state = state * 1664525u + 1013904223u;
        b[i] = (float)(state >> 8) / 8388608.0f - 1.0f;
        c[i] = 0.0f;
    }

    double best = 1e30;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (thread pool, page faults) */
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = now_s() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    const double gflops = 2.0 * (double)n * (double)n * (double)n / best / 1e9;
    /* c[] is printed into a checksum so the compiler cannot drop the work. */
    double check = 0.0;
    for (int i = 0; i < n; i++) check += (double)c[(size_t)i * (size_t)n + (size_t)i];
    printf("{\"sgemm_gflops\": %.2f, \"threads\": %d, \"n\": %d, \"reps\": %d, "
           "\"best_ms\": %.3f, \"checksum\": %.6g}\n",
           gflops, openblas_get_num_threads(), n, reps, best * 1e3, check);
    free(a);
    free(b);
    free(c);
    return 0;
}
