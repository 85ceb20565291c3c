/* cp_attention: times context-parallel attention (src/cp) forward + backward under MPI,
 * one rank per context-parallel rank, on random inputs of one micro-batch.
 *
 *   mpirun -n N cp_attention --mode ring|ulysses [--T 4096] [--B 1] [--H 8] [--KV 8]
 *                            [--hd 64] [--causal 0|1] [--no-zigzag] [--iters 5]
 *
 * After one warm-up iteration it runs --iters iterations and prints ONE JSON line (rank
 * 0), every time per iteration in milliseconds:
 *   compute_ms[r]   attention kernels on rank r (loom_cp.compute_ms), the balance view;
 *   inflight_ms[r], blocked_ms[r]  the cp communicator's timers: lifetime of its
 *                   operations and the part the rank waited for, so the hidden share of
 *                   the transfers is 1 - blocked / inflight (hidden[r], and hidden over
 *                   all ranks); Ulysses' all-to-alls are blocking (hidden 0);
 *   fwd_ms, bwd_ms, total_ms  slowest rank's wall time; imbalance = max / mean compute.
 * bench/bench_cp.py runs it for "compute balance with and without zigzag" and "transfer
 * time hidden". Exit status 2 on bad arguments, 1 on a failure. */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "cp/cp.h"

typedef struct {
    loom_cp_mode mode;
    int T, B, H, KV, hd, causal, no_zigzag, iters;
} args;

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "cp_attention: %s needs an integer in [%d, %d], got '%s'\n", flag, lo, hi,
                s ? s : "");
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){LOOM_CP_RING, 4096, 1, 8, 8, 64, 1, 0, 5};
    int mode_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        loom_error err = {0};
        int ok = 1;
        if (strcmp(f, "--mode") == 0) {
            ok = loom_cp_mode_parse(v, &a->mode, &err) == LOOM_OK;
            if (!ok) fprintf(stderr, "cp_attention: %s\n", err.msg);
            mode_given = 1, i++;
        } else if (strcmp(f, "--no-zigzag") == 0) {
            a->no_zigzag = 1;
        } else {
            static const char *names[] = {"--T",  "--B",      "--H",    "--KV",
                                          "--hd", "--causal", "--iters"};
            int *dst[] = {&a->T, &a->B, &a->H, &a->KV, &a->hd, &a->causal, &a->iters};
            const int hi[] = {1 << 20, 1024, 1024, 1024, 1024, 1, 100000};
            const int lo[] = {1, 1, 1, 1, 1, 0, 1};
            int k = 0;
            while (k < 7 && strcmp(f, names[k]) != 0) k++;
            if (k == 7) {
                fprintf(stderr, "cp_attention: unknown argument '%s'\n", f);
                return 0;
            }
            ok = parse_int(f, v, lo[k], hi[k], dst[k]), i++;
        }
        if (!ok) return 0;
    }
    if (!mode_given) {
        fprintf(stderr, "cp_attention: --mode ring|ulysses is required\n");
        return 0;
    }
    return 1;
}

static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

static void json_array(const char *name, const double *v, int n, double scale) {
    printf("\"%s\": [", name);
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? ", " : "", v[i] * scale);
    printf("], ");
}

int main(int argc, char **argv) {
    loom_world w;
    loom_error err = {0};
    if (loom_world_init(&w, &argc, &argv, &err) != LOOM_OK) {
        fprintf(stderr, "cp_attention: %s\n", err.msg);
        return 1;
    }
    args a;
    if (!parse(argc, argv, &a)) {
        loom_world_finalize(&w);
        return 2;
    }
    loom_comm comm;
    if (w.mpi) {
        if (loom_comm_from_mpi(&comm, MPI_COMM_WORLD, "cp", &err) != LOOM_OK) {
            fprintf(stderr, "cp_attention: %s\n", err.msg);
            return 1;
        }
    } else {
        loom_comm_self(&comm, "cp");
    }
    const int N = comm.size;
    loom_cp_options o = {a.mode, a.causal, a.no_zigzag, a.B, a.T, a.H, a.KV, a.hd, 0, 0};
    loom_cp cp;
    if (loom_cp_create(&cp, &comm, &o, loom_backend_cpu(), &err) != LOOM_OK) {
        if (w.rank == 0) fprintf(stderr, "cp_attention: %s\n", err.msg);
        loom_comm_free(&comm);
        loom_world_finalize(&w);
        return 2;
    }
    const size_t Nl = (size_t)a.B * cp.Tl, R = (size_t)(a.H + 2 * a.KV) * a.hd;
    const size_t OC = (size_t)a.H * a.hd, nlse = (size_t)a.B * a.H * cp.Tl;
    float *qkv = malloc(Nl * R * 4), *dout = malloc(Nl * OC * 4), *out = malloc(Nl * OC * 4);
    float *lse = malloc(nlse * 4), *dqkv = malloc(Nl * R * 4);
    if (!qkv || !dout || !out || !lse || !dqkv) {
        fprintf(stderr, "cp_attention: out of memory\n");
        return 1;
    }
    fill(qkv, Nl * R, 1000 + (uint64_t)w.rank);
    fill(dout, Nl * OC, 2000 + (uint64_t)w.rank);

    double fwd = 0, bwd = 0, c0 = 0, b0 = 0, i0 = 0;
    for (int it = -1; it < a.iters; it++) { /* it = -1: warm-up */
        if (it == 0) c0 = cp.compute_ms, b0 = comm.blocked_ms, i0 = comm.inflight_ms;
        memset(dqkv, 0, Nl * R * 4);
        if (w.mpi) MPI_Barrier(MPI_COMM_WORLD);
        double t0 = loom_comm_now_ms();
        loom_status st = loom_cp_attention_forward(&cp, out, lse, qkv);
        double t1 = loom_comm_now_ms();
        if (!st) st = loom_cp_attention_backward(&cp, dqkv, dout, qkv, out, lse);
        double t2 = loom_comm_now_ms();
        if (st) {
            fprintf(stderr, "cp_attention: rank %d: %s\n", w.rank, err.msg);
            if (w.mpi) MPI_Abort(MPI_COMM_WORLD, 1);
            return 1;
        }
        if (it >= 0) fwd += t1 - t0, bwd += t2 - t1;
    }
    /* per rank: compute, inflight, blocked, fwd, bwd (per iteration) */
    double mine[5] = {(cp.compute_ms - c0) / a.iters, (comm.inflight_ms - i0) / a.iters,
                      (comm.blocked_ms - b0) / a.iters, fwd / a.iters, bwd / a.iters};
    double *all = malloc(sizeof(double) * 5 * N);
    if (w.mpi)
        MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    else
        memcpy(all, mine, sizeof mine);
    if (w.rank == 0) {
        double *col[5];
        for (int k = 0; k < 5; k++) {
            col[k] = malloc(sizeof(double) * N);
            for (int r = 0; r < N; r++) col[k][r] = all[5 * r + k];
        }
        double cmax = 0, csum = 0, isum = 0, bsum = 0, fmx = 0, bmx = 0, tmx = 0;
        double *hidden = malloc(sizeof(double) * N);
        for (int r = 0; r < N; r++) {
            cmax = fmax(cmax, col[0][r]), csum += col[0][r];
            isum += col[1][r], bsum += col[2][r];
            fmx = fmax(fmx, col[3][r]), bmx = fmax(bmx, col[4][r]);
            tmx = fmax(tmx, col[3][r] + col[4][r]);
            hidden[r] = col[1][r] > 0 ? 1.0 - col[2][r] / col[1][r] : 0.0;
        }
        printf("{\"bench\": \"cp_attention\", \"mode\": \"%s\", \"cp\": %d, \"T\": %d, \"B\": %d, "
               "\"H\": %d, \"KV\": %d, \"hd\": %d, \"causal\": %d, \"zigzag\": %d, \"iters\": %d, "
               "\"threads\": %d, ",
               loom_cp_mode_name(a.mode), N, a.T, a.B, a.H, a.KV, a.hd, a.causal, cp.n_chunks == 2,
               a.iters, omp_get_max_threads());
        json_array("compute_ms", col[0], N, 1);
        json_array("inflight_ms", col[1], N, 1);
        json_array("blocked_ms", col[2], N, 1);
        json_array("hidden", hidden, N, 1);
        printf("\"hidden_all\": %.4f, \"imbalance\": %.4f, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, "
               "\"total_ms\": %.4f, \"buffer_bytes\": %zu}\n",
               isum > 0 ? 1.0 - bsum / isum : 0.0, csum > 0 ? cmax / (csum / N) : 0.0, fmx, bmx,
               tmx, loom_cp_buffer_bytes(N, &o));
        for (int k = 0; k < 5; k++) free(col[k]);
        free(hidden);
    }
    free(all), free(qkv), free(dout), free(out), free(lse), free(dqkv);
    loom_cp_free(&cp);
    loom_comm_free(&comm);
    loom_world_finalize(&w);
    return 0;
}
