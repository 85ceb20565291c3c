/* Checks and random data shared by the MPI tests (test_comm.c, test_engine.c): named
 * checks counted per rank, a fatal path for failed calls (ranks out of step would hang),
 * and inputs that are a pure function of (seed, rank, tag, index), so every rank can
 * compute every other rank's data. Include once per test program. */
#ifndef LOOM_TESTS_PARALLEL_COMM_CHECK_H
#define LOOM_TESTS_PARALLEL_COMM_CHECK_H

#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"

static int g_rank = 0, g_size = 1, g_mpi = 0;
static long g_passed = 0, g_failed = 0;

/* ------------------------------------------------------------------ checks */

/* A named check: counts one pass or one failure (printed with the rank). */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr, "FAIL [rank %d/%d] %s:%d: ", g_rank, g_size, __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* A call that returns an error leaves the ranks out of step (a later collective would
 * hang), so it ends the job at once. */
static inline void fatal_status(loom_status st, const loom_error *err, const char *what, int line) {
    fprintf(stderr, "FAIL [rank %d/%d] line %d: %s returned %d: %s\n", g_rank, g_size, line, what,
            (int)st, err->msg);
    fflush(stderr);
    if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        loom_error err_ = {0};                                                                     \
        loom_status st_ = (call);                                                                  \
        if (st_ != LOOM_OK) fatal_status(st_, &err_, #call, __LINE__);                             \
    } while (0)

/* ------------------------------------------------------------------ random data */

static uint64_t g_seed;

static inline uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Element idx of rank's input number `tag`: uniform in [-1, 1), a pure function of
 * (seed, rank, tag, idx), so any rank can compute any other rank's data. */
static inline float rnd(int rank, uint64_t tag, uint64_t idx) {
    uint64_t h = mix64(g_seed ^ mix64(((uint64_t)rank << 48) ^ mix64(tag) ^ mix64(idx + 1)));
    return (float)((double)(h >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static inline double rnd_f64(int rank, uint64_t tag, uint64_t idx) {
    uint64_t h = mix64(g_seed ^ mix64(((uint64_t)rank << 48) ^ mix64(tag ^ 0xD0D0ull) ^ idx));
    return (double)(h >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static inline void fill(float *x, size_t n, int rank, uint64_t tag) {
    for (size_t i = 0; i < n; i++) x[i] = rnd(rank, tag, i);
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "FAIL [rank %d]: out of memory (%zu bytes)\n", g_rank, bytes);
        if (g_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
    }
    return p;
}

/* Float sums of R values may differ from the double sum by about R ulps of the sum of
 * magnitudes (any reduction order). */
static inline int close_enough(float got, double want, double abs_sum, int R) {
    return fabs((double)got - want) <= 4.0 * R * FLT_EPSILON * abs_sum + 1e-30;
}

#endif
