/* The NCCL transport (src/comm/comm_nccl.c) behind loom_comm on device buffers: every
 * collective through the same loom_comm_* calls as on the host, on random data of odd
 * sizes, checked against sums computed locally in double (every rank regenerates every
 * other rank's input from (seed, rank)), with both kinds of wait (a compute stream, and
 * the host). One rank per GPU:
 *
 *   test_nccl                 (one process, no MPI)
 *   mpirun -n R test_nccl     (R <= number of GPUs)
 *
 * Exit 77 (skipped) without a CUDA device, or with fewer GPUs than ranks (NCCL refuses
 * two ranks on one device). Last line (rank 0): "N passed, F failed". */
#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "comm/world.h"
#include "kernels/cuda/kernels_cuda.h"

static int g_rank, g_size;
static long g_passed, g_failed;
static uint64_t g_seed;

static float value(int rank, size_t i, int salt) { /* deterministic per (seed, rank, i) */
    uint64_t z = g_seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)i * 0x94D049BB133111EBull + (uint64_t)salt;
    z ^= z >> 31;
    z *= 0xD6E8FEB86659FD93ull;
    z ^= z >> 32;
    return (float)((z >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void check(const char *name, int ok) {
    if (ok) {
        g_passed++;
        return;
    }
    g_failed++;
    fprintf(stderr, "FAIL [rank %d/%d] %s (seed %llu)\n", g_rank, g_size, name,
            (unsigned long long)g_seed);
}

static void must(loom_status st, loom_error *err) {
    if (st == LOOM_OK) return;
    fprintf(stderr, "FATAL [rank %d/%d]: %s\n", g_rank, g_size, err->msg);
    exit(1);
}

static float *dev_from(const float *h, size_t n) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * 4 + 4) != cudaSuccess) exit(1);
    cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
    return d;
}

static float *host_from(const float *d, size_t n) {
    float *h = malloc(n * 4 + 4);
    cudaDeviceSynchronize();
    cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost);
    return h;
}

static int close_to(const float *got, const double *want, size_t n, double tol) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])))) return 0;
    return 1;
}

int main(int argc, char **argv) {
    loom_world world;
    loom_error err = {0};
    if (loom_world_init(&world, &argc, &argv, &err) != LOOM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    g_rank = world.rank, g_size = world.size;
    loom_comm comm;
    if (world.mpi)
        must(loom_comm_from_mpi(&comm, MPI_COMM_WORLD, "world", &err), &err);
    else
        loom_comm_self(&comm, "world");
    const char *env = getenv("LOOM_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    must(loom_comm_bcast(&comm, &g_seed, sizeof g_seed, 0, &err), &err);

    loom_cuda_device devs[16];
    int ndev = 0, skip = 0;
    if (loom_cuda_devices(devs, 16, &ndev, &err) != LOOM_OK) {
        if (g_rank == 0) printf("SKIP: %s\n", err.msg);
        skip = 1;
    } else if (ndev < g_size) {
        if (g_rank == 0) printf("SKIP: %d ranks need %d GPUs, found %d\n", g_size, g_size, ndev);
        skip = 1;
    }
    if (skip) {
        loom_comm_free(&comm);
        loom_world_finalize(&world);
        return 77;
    }
    if (g_rank == 0) printf("test_nccl: seed %llu, %d ranks\n", (unsigned long long)g_seed, g_size);
    cudaSetDevice(g_rank);
    cudaStream_t compute;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    must(loom_comm_use_nccl(&comm, g_rank, compute, &err), &err);
    check("a device communicator", comm.device == LOOM_COMM_CUDA);

    /* all-reduce, odd count; waited on by a consumer stream */
    const size_t n = 100003;
    float *h = malloc(n * 4);
    double *want = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        h[i] = value(g_rank, i, 1);
        for (int r = 0; r < g_size; r++) want[i] += value(r, i, 1);
    }
    float *d = dev_from(h, n);
    loom_comm_handle hd;
    uint64_t seq0 = comm.seq;
    must(loom_comm_iallreduce_sum(&comm, d, n, &hd, &err), &err);
    must(loom_comm_wait(&hd, &err), &err); /* the compute stream waits */
    float *got = host_from(d, n);
    check("allreduce sum", close_to(got, want, n, 1e-5));
    check("allreduce bookkeeping: one sequence number, bytes counted",
          comm.seq == seq0 + 1 && comm.bytes >= n * 4);
    free(got);
    loom_comm_nccl_set_stream(&comm, NULL); /* from here on the host waits */

    /* reduce-scatter: equal and unequal shards; host wait */
    for (int uneven = 0; uneven <= 1; uneven++) {
        int counts[64];
        size_t total = 0, off = 0;
        for (int r = 0; r < g_size; r++) total += (size_t)(counts[r] = 997 + uneven * 13 * r);
        for (int r = 0; r < g_rank; r++) off += (size_t)counts[r];
        float *hs = malloc(total * 4);
        for (size_t i = 0; i < total; i++) hs[i] = value(g_rank, i, 2 + uneven);
        double *w = calloc(counts[g_rank], sizeof(double));
        for (int i = 0; i < counts[g_rank]; i++)
            for (int r = 0; r < g_size; r++) w[i] += value(r, off + i, 2 + uneven);
        float *ds = dev_from(hs, total), *dr = dev_from(hs, counts[g_rank]);
        must(loom_comm_ireduce_scatter_sum(&comm, ds, dr, counts, &hd, &err), &err);
        must(loom_comm_wait(&hd, &err), &err);
        got = host_from(dr, counts[g_rank]);
        check(uneven ? "reduce_scatter (unequal shards)" : "reduce_scatter",
              close_to(got, w, counts[g_rank], 1e-5));
        free(got), free(hs), free(w), cudaFree(ds), cudaFree(dr);
    }

    /* all-gatherv: packed and unequal, in place */
    for (int uneven = 0; uneven <= 1; uneven++) {
        int counts[64], displs[64];
        size_t total = 0;
        for (int r = 0; r < g_size; r++) {
            counts[r] = 501 + uneven * 7 * r;
            displs[r] = (int)total;
            total += (size_t)counts[r];
        }
        float *hg = malloc(total * 4);
        double *w = calloc(total, sizeof(double));
        for (int r = 0; r < g_size; r++)
            for (int i = 0; i < counts[r]; i++) {
                w[displs[r] + i] = value(r, i, 5);
                hg[displs[r] + i] = r == g_rank ? value(r, i, 5) : NAN; /* poisoned */
            }
        float *dg = dev_from(hg, total);
        must(loom_comm_iallgatherv(&comm, dg, counts, displs, &hd, &err), &err);
        int done = 0;
        while (!done) must(loom_comm_test(&hd, &done, &err), &err);
        got = host_from(dg, total);
        check(uneven ? "allgatherv (unequal)" : "allgatherv", close_to(got, w, total, 0.0));
        free(got), free(hg), free(w), cudaFree(dg);
    }

    /* broadcast from the last rank */
    {
        float *hb = malloc(333 * 4);
        double w[333];
        for (int i = 0; i < 333; i++) {
            w[i] = value(g_size - 1, i, 6);
            hb[i] = g_rank == g_size - 1 ? (float)w[i] : NAN;
        }
        float *db = dev_from(hb, 333);
        must(loom_comm_bcast(&comm, db, 333 * 4, g_size - 1, &err), &err); /* blocking */
        got = host_from(db, 333);
        check("bcast", close_to(got, w, 333, 0.0));
        free(got), free(hb), cudaFree(db);
    }

    /* all-to-all-v: rank r sends (r + p + 1) floats to rank p */
    {
        int sc[64], sd[64], rc[64], rd[64], st = 0, rt = 0;
        for (int p = 0; p < g_size; p++) {
            sc[p] = g_rank + p + 1, sd[p] = st, st += sc[p];
            rc[p] = p + g_rank + 1, rd[p] = rt, rt += rc[p];
        }
        float *hs = malloc(st * 4);
        for (int i = 0; i < st; i++) hs[i] = value(g_rank, i, 7);
        double *w = calloc(rt, sizeof(double));
        for (int p = 0; p < g_size; p++) { /* what p sent me: its block at its displacement */
            int off = 0;
            for (int q = 0; q < g_rank; q++) off += p + q + 1;
            for (int i = 0; i < rc[p]; i++) w[rd[p] + i] = value(p, off + i, 7);
        }
        float *ds = dev_from(hs, st), *dr = dev_from(hs, rt);
        must(loom_comm_ialltoallv(&comm, ds, sc, sd, dr, rc, rd, &hd, &err), &err);
        must(loom_comm_wait(&hd, &err), &err);
        got = host_from(dr, rt);
        check("alltoallv", close_to(got, w, rt, 0.0));
        free(got), free(hs), free(w), cudaFree(ds), cudaFree(dr);
    }

    /* bf16 all-reduce of small integers (exact in bf16) */
    {
        const size_t m = 4099;
        uint16_t *hb = malloc(m * 2);
        double *w = calloc(m, sizeof(double));
        float *f = malloc(m * 4);
        for (size_t i = 0; i < m; i++) {
            float v = (float)((int)(value(g_rank, i, 8) * 8.0f));
            uint32_t u;
            memcpy(&u, &v, 4);
            hb[i] = (uint16_t)(u >> 16);
            for (int r = 0; r < g_size; r++) w[i] += (float)((int)(value(r, i, 8) * 8.0f));
        }
        void *db = NULL;
        cudaMalloc(&db, m * 2);
        cudaMemcpy(db, hb, m * 2, cudaMemcpyHostToDevice);
        must(loom_comm_iallreduce_sum_bf16(&comm, db, m, &hd, &err), &err);
        must(loom_comm_wait(&hd, &err), &err);
        cudaMemcpy(hb, db, m * 2, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < m; i++) {
            uint32_t u = (uint32_t)hb[i] << 16;
            memcpy(&f[i], &u, 4);
        }
        check("allreduce sum bf16", close_to(f, w, m, 0.0));
        free(hb), free(w), free(f), cudaFree(db);
    }

    /* ring send/recv (size > 1) */
    if (g_size > 1) {
        const size_t m = 1237;
        int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
        float *hs = malloc(m * 4);
        double *w = calloc(m, sizeof(double));
        for (size_t i = 0; i < m; i++) hs[i] = value(g_rank, i, 9), w[i] = value(prev, i, 9);
        float *ds = dev_from(hs, m), *dr = dev_from(hs, m);
        loom_comm_handle hs_, hr_;
        /* NCCL send/recv pairs must be issued in a group or in a matching order: even
         * ranks send first, odd ranks receive first. */
        if (g_rank % 2 == 0) {
            must(loom_comm_isend(&comm, ds, m, next, 0, &hs_, &err), &err);
            must(loom_comm_irecv(&comm, dr, m, prev, 0, &hr_, &err), &err);
        } else {
            must(loom_comm_irecv(&comm, dr, m, prev, 0, &hr_, &err), &err);
            must(loom_comm_isend(&comm, ds, m, next, 0, &hs_, &err), &err);
        }
        must(loom_comm_wait(&hs_, &err), &err);
        must(loom_comm_wait(&hr_, &err), &err);
        got = host_from(dr, m);
        check("send/recv ring", close_to(got, w, m, 0.0));
        free(got), free(hs), free(w), cudaFree(ds), cudaFree(dr);
    }

    free(h), free(want), cudaFree(d);
    /* a blocking f64 sum (on the device) */
    {
        double hv[3] = {g_rank, 1.0, -0.5 * g_rank}, *dv = NULL;
        cudaMalloc((void **)&dv, sizeof hv);
        cudaMemcpy(dv, hv, sizeof hv, cudaMemcpyHostToDevice);
        must(loom_comm_allreduce_sum_f64(&comm, dv, 3, &err), &err);
        cudaMemcpy(hv, dv, sizeof hv, cudaMemcpyDeviceToHost);
        const double tri = 0.5 * g_size * (g_size - 1);
        check("allreduce sum f64", hv[0] == tri && hv[1] == g_size && hv[2] == -0.5 * tri);
        cudaFree(dv);
    }

    loom_comm_free(&comm); /* the NCCL communicator goes with it */
    cudaStreamDestroy(compute);
    long totals[2] = {g_passed, g_failed};
    if (world.mpi) MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("%ld passed, %ld failed\n", totals[0], totals[1]);
    loom_world_finalize(&world);
    return totals[1] ? 1 : 0;
}
