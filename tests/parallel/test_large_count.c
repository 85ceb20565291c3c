/* Past 2^31 elements: a kernel and MPI collectives against references.
 *
 *   mpirun -n 2 test_large_count [--seed S]
 *
 * 1. Kernels (rank 0; 8 GiB): loom_scale and loom_sum_squares over 2^31 + 7 floats filled
 *    from the seed; every element checked exact (scaling by 0.5 is exact) and the sum of
 *    squares against a float64 loop (relative 1e-9). The elements past 2^31 are the ones an
 *    int index would never reach.
 * 2. Collectives (2 GiB per rank): a broadcast of 2^31 + 7 bytes (comm.c's bcast splits it
 *    through comm_large.c: OpenMPI 4.1 takes int counts), every byte checked on the
 *    receiver; allreduce_sum_large and allgatherv_large with small chunks (the same code
 *    path, cheap) against sums and copies computed here, allgatherv_large's size_t
 *    displacements past the chunk taking the per-rank broadcast path.
 * Labelled `large` (not in the quick suite): about 10 GiB touched, tens of seconds. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "core/philox.h"
#include "kernels/kernels.h"

static int failures;

static void check(int ok, const char *what, uint64_t seed) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) {
        failures++;
        printf("  (seed %" PRIu64 ")\n", seed);
    }
}

/* Element i's value: a multiple of 2^-10 in [-1, 1) from the seed. */
static float value(uint64_t seed, size_t i) {
    return (float)((int)((i * 2654435761u + seed) % 2048u) - 1024) / 1024.0f;
}

static void test_kernels(uint64_t seed) {
    const size_t n = ((size_t)1 << 31) + 7;
    float *x = malloc(n * sizeof(float));
    if (!x) {
        check(0, "kernels: 8 GiB for 2^31 + 7 floats", seed);
        return;
    }
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = value(seed, i);
    double ref = 0.0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    const double got = loom_sum_squares(x, n);
    char what[160];
    snprintf(what, sizeof what, "loom_sum_squares over 2^31 + 7 floats: %.6f vs %.6f", got, ref);
    check(fabs(got - ref) <= 1e-9 * ref, what, seed);
    loom_scale(x, 0.5f, n);
    size_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (size_t i = 0; i < n; i++) bad += x[i] != 0.5f * value(seed, i);
    snprintf(what, sizeof what, "loom_scale over 2^31 + 7 floats: %zu wrong (last %g)", bad,
             (double)x[n - 1]);
    check(bad == 0, what, seed);
    free(x);
}

static void test_bcast(loom_comm *c, uint64_t seed) {
    const size_t bytes = ((size_t)1 << 31) + 7;
    uint8_t *b = malloc(bytes);
    loom_error err;
    if (!b) {
        check(0, "bcast: 2 GiB", seed);
        return;
    }
    if (c->rank == 0)
        for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)(i * 31 + seed);
    else
        memset(b, 0, bytes);
    loom_status st = loom_comm_bcast(c, b, bytes, 0, &err);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += b[i] != (uint8_t)(i * 31 + seed);
    char what[160];
    snprintf(what, sizeof what, "bcast of 2^31 + 7 bytes (rank %d): status %d, %zu wrong", c->rank,
             (int)st, bad);
    check(st == LOOM_OK && bad == 0, what, seed);
    free(b);
}

static void test_chunked(loom_comm *c, uint64_t seed) {
    const int R = c->size;
    const size_t n = 100003, chunk = 1000;
    float *x = malloc(n * sizeof(float));
    loom_error err;
    for (size_t i = 0; i < n; i++) x[i] = value(seed + (uint64_t)c->rank, i);
    loom_status st = loom_comm_allreduce_sum_large(c, x, n, chunk, &err);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0.0f; /* MPI's sum of R values in rank order (exact: multiples of 2^-10) */
        for (int r = 0; r < R; r++) want += value(seed + (uint64_t)r, i);
        bad += x[i] != want;
    }
    char what[160];
    snprintf(what, sizeof what, "allreduce_sum_large, %zu floats in chunks of %zu: %zu wrong", n,
             chunk, bad);
    check(st == LOOM_OK && bad == 0, what, seed);
    /* allgatherv_large: uneven parts, size_t displacements, chunk smaller than the buffer */
    size_t *counts = malloc((size_t)R * sizeof(size_t)),
           *displs = malloc((size_t)R * sizeof(size_t));
    size_t at = 0;
    for (int r = 0; r < R; r++) {
        displs[r] = at;
        counts[r] = n / (size_t)R + (size_t)(r == R - 1 ? n % (size_t)R : 0);
        at += counts[r];
    }
    for (int pass = 0; pass < 2; pass++) { /* chunk 1000: broadcasts; 0: one allgatherv */
        for (size_t i = 0; i < n; i++) x[i] = -1.0f;
        for (size_t i = displs[c->rank]; i < displs[c->rank] + counts[c->rank]; i++)
            x[i] = value(seed, i);
        st = loom_comm_allgatherv_large(c, x, counts, displs, pass ? 0 : chunk, &err);
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += x[i] != value(seed, i);
        snprintf(what, sizeof what, "allgatherv_large (%s): %zu wrong",
                 pass ? "one allgatherv" : "broadcasts in chunks of 1000", bad);
        check(st == LOOM_OK && bad == 0, what, seed);
    }
    free(counts);
    free(displs);
    free(x);
}

int main(int argc, char **argv) {
    loom_world w;
    loom_error err;
    if (loom_world_init(&w, &argc, &argv, &err) != LOOM_OK) {
        fprintf(stderr, "FAIL: loom_world_init: %s\n", err.msg);
        return 1;
    }
    uint64_t seed = (uint64_t)time(NULL);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--seed") == 0) seed = strtoull(argv[i + 1], NULL, 10);
    loom_comm c;
    if (loom_comm_from_mpi(&c, MPI_COMM_WORLD, "world", &err) != LOOM_OK) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    loom_comm_bcast(&c, &seed, sizeof seed, 0, &err); /* one seed for every rank */
    if (c.rank == 0) test_kernels(seed);
    loom_comm_barrier(&c, &err);
    test_chunked(&c, seed);
    test_bcast(&c, seed);
    int total = failures;
    const int rank = c.rank;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    loom_comm_free(&c);
    loom_world_finalize(&w);
    if (rank == 0) printf("%s\n", total ? "FAILED" : "all passed");
    return total ? 1 : 0;
}
