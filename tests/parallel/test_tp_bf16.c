/* The tensor-parallel collectives under --precision bf16 (tp/tp.h's loom_tp_reduce_linear and
 * loom_tp_gather_linear after loom_tp_wire_bf16), bit for bit against what they promise:
 *  - reduce with sequence parallelism: this rank's rows = sum over ranks r = 0, 1, ... (in
 *    that order, in fp32) of widen(round(partial_r)), round to nearest even;
 *  - reduce without: the same sums for every row, rounded to bf16 once more (the all-gather);
 *  - gather: every rank's rows widened from their rounding;
 *  - the bytes sent (tp->bytes_bf16) exactly half of what the fp32 calls count (bytes_f32).
 * Every rank regenerates every other rank's input from (seed, rank), rows that do and do not
 * divide by the group, and loom_tp_set_rows to fewer rows.
 *
 *   mpirun -n R test_tp_bf16      (R = 2, 3)
 *
 * The seed comes from LOOM_TEST_SEED, else from the clock; rank 0 broadcasts it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "kernels/bf16.h"
#include "tp/tp.h"
#include "comm_check.h"

enum { WIDTH = 5 };
static loom_error g_err; /* where the tp calls report */

static float rounded(float x) {
    return loom_bf16_to_f32(loom_bf16_from_f32(x));
}

/* Element i of rank r's input `tag`, scaled so sums of roundings are not exact by accident. */
static float input(int r, uint64_t tag, size_t i) {
    return rnd(r, tag, i) * (float)(1 + (i % 7) * 37);
}

static size_t bad_bits(const float *got, const float *want, size_t n, size_t *first) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) && !bad++) *first = i;
    return bad;
}

static void test_one(loom_comm *c, int sp, int max_rows, int rows) {
    const int R = c->size, me = c->rank;
    loom_tp f32, bf;
    OK(loom_tp_create(&f32, c, sp, max_rows, WIDTH, &err_));
    OK(loom_tp_create(&bf, c, sp, max_rows, WIDTH, &err_));
    OK(loom_tp_wire_bf16(&bf, &err_));
    f32.err = bf.err = &g_err;
    CHECK(bf.wire_bf16 == 1 && f32.wire_bf16 == 0, "wire_bf16: %d and %d", bf.wire_bf16,
          f32.wire_bf16);
    if (rows != max_rows) {
        OK(loom_tp_set_rows(&f32, rows, &err_));
        OK(loom_tp_set_rows(&bf, rows, &err_));
    }
    const size_t n = (size_t)rows * WIDTH, local = sp ? n / (size_t)R : n;
    const uint64_t tag = (uint64_t)(sp * 1000 + rows);
    float *partial = xmalloc(n * sizeof(float)), *p32 = xmalloc(n * sizeof(float));
    float *out = xmalloc(n * sizeof(float)), *o32 = xmalloc(n * sizeof(float));
    float *want = xmalloc(n * sizeof(float)), *full = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) partial[i] = p32[i] = input(me, tag, i);
    /* reduce: the expected sums of the rounded pieces, in rank order */
    for (size_t i = 0; i < n; i++) {
        float s = rounded(input(0, tag, i));
        for (int r = 1; r < R; r++) s += rounded(input(r, tag, i));
        want[i] = sp ? s : rounded(s);
    }
    OK(loom_tp_reduce_linear(&bf, partial, out));
    OK(loom_tp_reduce_linear(&f32, p32, o32));
    const float *got = sp ? out : partial, *expect = sp ? want + (size_t)me * local : want;
    size_t first = 0, bad = bad_bits(got, expect, local, &first);
    CHECK(bad == 0,
          "reduce (sp %d, %d rows of %d, %d ranks): %zu of %zu elements differ, first %zu", sp,
          rows, max_rows, R, bad, local, first);
    /* gather: every rank's local rows, rounded */
    const float *inp = NULL;
    float *mine = xmalloc(local * sizeof(float));
    for (size_t i = 0; i < local; i++) mine[i] = input(me, tag + 7, i);
    for (int r = 0; r < R; r++)
        for (size_t i = 0; i < local; i++)
            want[sp ? (size_t)r * local + i : i] = rounded(input(sp ? r : me, tag + 7, i));
    OK(loom_tp_gather_linear(&bf, mine, full, &inp));
    bad = bad_bits(inp, sp ? want : mine, sp ? n : local, &first);
    CHECK(inp == (sp ? full : mine) && bad == 0,
          "gather (sp %d, %d rows, %d ranks): %zu elements differ, first %zu", sp, rows, R, bad,
          first);
    OK(loom_tp_gather_linear(&f32, mine, full, &inp));
    /* the bytes: bf16 half of fp32's for the same calls (rows divisible: equal pieces) */
    if (rows % R == 0)
        CHECK(bf.bytes_f32 == 0 && bf.bytes_bf16 * 2 == f32.bytes_f32 && f32.bytes_bf16 == 0,
              "bytes (sp %d, %d rows, %d ranks): bf16 %g (fp32 %g), fp32 run %g", sp, rows, R,
              bf.bytes_bf16, bf.bytes_f32, f32.bytes_f32);
    free(partial), free(p32), free(out), free(o32), free(want), free(full), free(mine);
    loom_tp_free(&f32);
    loom_tp_free(&bf);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    loom_world w;
    {
        loom_error err = {0};
        if (loom_world_init(&w, &argc, &argv, &err) != LOOM_OK || !w.mpi || w.size < 2) {
            fprintf(stderr, "FAIL: test_tp_bf16 needs mpirun -n 2 or more: %s\n", err.msg);
            return 1;
        }
    }
    g_rank = w.rank, g_size = w.size, g_mpi = w.mpi;
    loom_comm world;
    OK(loom_comm_from_mpi(&world, MPI_COMM_WORLD, "tp", &err_));
    uint64_t seed = 0;
    if (w.rank == 0) {
        const char *env = getenv("LOOM_TEST_SEED");
        seed = env && *env ? strtoull(env, NULL, 0)
                           : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    }
    OK(loom_comm_bcast(&world, &seed, sizeof seed, 0, &err_));
    g_seed = seed;
    if (w.rank == 0)
        printf("test_tp_bf16: seed %llu (LOOM_TEST_SEED=%llu to repeat), %d ranks\n",
               (unsigned long long)seed, (unsigned long long)seed, w.size);
    const int R = w.size;
    for (int sp = 0; sp <= 1; sp++) {
        test_one(&world, sp, 12 * R, 12 * R);
        test_one(&world, sp, 12 * R, 4 * R);                   /* loom_tp_set_rows */
        if (!sp) test_one(&world, sp, 12 * R + 1, 12 * R + 1); /* uneven rows of the sum */
    }
    double totals[2] = {(double)g_passed, (double)g_failed};
    OK(loom_comm_allreduce_sum_f64(&world, totals, 2, &err_));
    if (w.rank == 0) printf("%.0f passed, %.0f failed\n", totals[0], totals[1]);
    loom_comm_free(&world);
    loom_world_finalize(&w);
    return totals[1] == 0 ? 0 : 1;
}
