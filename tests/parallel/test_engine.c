/* The communication engine (src/comm/engine.h) under MPI: a random sequence of
 * all-reduces, reduce-scatters and all-gathers of odd sizes posted in one order on every
 * rank, completed in a different random order on each rank (waits and test loops), while
 * the compute thread makes blocking calls on the parent communicator; every result is
 * checked against sums computed locally in double, the same operation run twice must give
 * bitwise-identical results, and the books (sequence numbers, bytes, timers) must add up;
 * the bytes in flight at once never pass LOOM_COMM_ENGINE_INFLIGHT_BYTES unless one
 * operation alone is larger (1200007 floats: 4.6 MiB).
 *
 *   mpirun -n R test_engine    (R = 2, 3, ...: the engine thread)
 *   test_engine                (one process, no MPI: no thread, local no-ops)
 *
 * The seed comes from LOOM_TEST_SEED, else from the clock; rank 0 broadcasts it. */
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/engine.h"
#include "comm/world.h"
#include "comm_check.h"

#define MAX_OPS 48

typedef struct {
    loom_comm_op op;
    int kind;
    size_t n; /* floats of the whole operation */
    float *buf, *recv, *again;
    int *counts, *displs;
    uint64_t tag;
} item;

/* Shared by every rank: derived from the seed only. */
static uint64_t plan(uint64_t k, uint64_t salt) {
    return mix64(g_seed ^ mix64(k * 7919u + salt));
}

static void check_item(const item *it, int R, int me) {
    size_t bad = 0;
    if (it->kind == LOOM_OP_ALLREDUCE) {
        for (size_t i = 0; i < it->n; i++) {
            double want = 0, mag = 0;
            for (int r = 0; r < R; r++) want += rnd(r, it->tag, i), mag += fabs(rnd(r, it->tag, i));
            bad += !close_enough(it->buf[i], want, mag, R);
        }
    } else if (it->kind == LOOM_OP_REDUCE_SCATTER) {
        for (int i = 0; i < it->counts[me]; i++) {
            size_t at = (size_t)it->displs[me] + (size_t)i;
            double want = 0, mag = 0;
            for (int r = 0; r < R; r++)
                want += rnd(r, it->tag, at), mag += fabs(rnd(r, it->tag, at));
            bad += !close_enough(it->recv[i], want, mag, R);
        }
    } else {
        for (int r = 0; r < R; r++)
            for (int i = 0; i < it->counts[r]; i++)
                bad += it->buf[it->displs[r] + i] != rnd(r, it->tag, (size_t)i);
    }
    CHECK(bad == 0, "op kind %d n=%zu tag %llu: %zu wrong elements", it->kind, it->n,
          (unsigned long long)it->tag, bad);
}

static void prepare(item *it, int k, int R, int me) {
    memset(&it->op, 0, sizeof it->op);
    it->kind = (int)(plan((uint64_t)k, 1) % 3);
    static const size_t SIZES[] = {0, 1, 5, 1000, 40007, 300001, 1200007};
    it->n = SIZES[plan((uint64_t)k, 2) % (sizeof SIZES / sizeof SIZES[0])];
    it->tag = 1000 + (uint64_t)k;
    it->counts = xmalloc((size_t)R * sizeof(int));
    it->displs = xmalloc((size_t)R * sizeof(int));
    size_t at = 0;
    for (int r = 0; r < R; r++) { /* uneven parts, some empty */
        size_t part = r + 1 == R ? it->n - at : (it->n / R) * (plan((uint64_t)k, 3 + r) % 3) / 2;
        if (at + part > it->n) part = it->n - at;
        it->counts[r] = (int)part;
        it->displs[r] = (int)at;
        at += part;
    }
    it->buf = xmalloc((it->n + 1) * sizeof(float));
    it->recv = xmalloc(((size_t)it->counts[me] + 1) * sizeof(float));
    it->again = NULL;
    it->op.kind = (loom_comm_op_kind)it->kind;
    if (it->kind == LOOM_OP_ALLREDUCE) {
        fill(it->buf, it->n, me, it->tag);
        it->op.buf = it->buf;
        it->op.count = it->n;
    } else if (it->kind == LOOM_OP_REDUCE_SCATTER) {
        fill(it->buf, it->n, me, it->tag);
        it->op.send = it->buf;
        it->op.recv = it->recv;
        it->op.counts = it->counts;
    } else { /* my part in place, the rest garbage */
        for (size_t i = 0; i < it->n; i++) it->buf[i] = -999.0f;
        fill(it->buf + it->displs[me], (size_t)it->counts[me], me, it->tag);
        it->op.buf = it->buf;
        it->op.counts = it->counts;
        it->op.displs = it->displs;
    }
}

static int gcd(int a, int b) {
    return b ? gcd(b, a % b) : a;
}

static size_t g_largest; /* bytes of the largest operation posted so far */

static void run_round(loom_comm *world, loom_comm_engine *e, int round) {
    const int R = world->size, me = world->rank;
    const int K = 4 + (int)(plan((uint64_t)round, 99) % (MAX_OPS - 4));
    static item items[MAX_OPS];
    uint64_t seq0 = e->comm.seq, parent_seq0 = world->seq;
    for (int k = 0; k < K; k++) {
        prepare(&items[k], round * MAX_OPS + k, R, me);
        if (items[k].n * sizeof(float) > g_largest) g_largest = items[k].n * sizeof(float);
        OK(loom_comm_engine_post(e, &items[k].op, &err_));
        if (k % 5 == 2) { /* the compute thread talks MPI on the parent meanwhile */
            float x = (float)(me + 1);
            OK(loom_comm_allreduce_sum(world, &x, 1, &err_));
            CHECK(x == (float)(R * (R + 1) / 2), "blocking allreduce while the engine runs: %g",
                  (double)x);
        }
    }
    /* Complete in a different order on each rank: reversed, or test loops. */
    int step = 7; /* coprime with K: j -> j * step mod K is a permutation */
    while (gcd(step, K) != 1) step++;
    for (int j = 0; j < K; j++) {
        int k = (me % 2) ? K - 1 - j : (j * step + round) % K;
        if (items[k].op.state == LOOM_OP_IDLE) continue;
        if (j % 3 == 1) {
            int done = 0;
            double t0 = loom_comm_now_ms();
            while (!done && loom_comm_now_ms() - t0 < 60e3)
                OK(loom_comm_engine_test(e, &items[k].op, &done, &err_));
            CHECK(done, "test loop: operation %d not done after 60 s", k);
        }
        OK(loom_comm_engine_wait(e, &items[k].op, &err_));
    }
    for (int k = 0; k < K; k++) {
        CHECK(items[k].op.state == LOOM_OP_IDLE, "operation %d still active after its wait", k);
        check_item(&items[k], R, me);
    }
    const size_t bound =
        g_largest > LOOM_COMM_ENGINE_INFLIGHT_BYTES ? g_largest : LOOM_COMM_ENGINE_INFLIGHT_BYTES;
    CHECK(e->inflight_peak <= bound && (R == 1 || e->inflight_peak > 0),
          "bytes in flight at once: %zu, bound %zu (largest operation %zu)", e->inflight_peak,
          bound, g_largest);
    if (R > 1)
        CHECK(e->comm.seq == seq0 + (uint64_t)K, "engine seq %llu -> %llu for %d operations",
              (unsigned long long)seq0, (unsigned long long)e->comm.seq, K);
    CHECK(world->seq - parent_seq0 == (uint64_t)((K + 2) / 5),
          "the parent's seq moved by %llu (its own blocking calls only)",
          (unsigned long long)(world->seq - parent_seq0));
    /* The same all-reduce twice: bitwise identical. */
    for (int k = 0; k < K; k++) {
        item *it = &items[k];
        if (it->kind != LOOM_OP_ALLREDUCE) continue;
        it->again = xmalloc((it->n + 1) * sizeof(float));
        fill(it->again, it->n, me, it->tag);
        loom_comm_op op = {0};
        op.kind = LOOM_OP_ALLREDUCE;
        op.buf = it->again;
        op.count = it->n;
        OK(loom_comm_engine_post(e, &op, &err_));
        OK(loom_comm_engine_wait(e, &op, &err_));
        CHECK(memcmp(it->again, it->buf, it->n * sizeof(float)) == 0,
              "the same all-reduce twice differs (n=%zu)", it->n);
    }
    for (int k = 0; k < K; k++) {
        free(items[k].buf);
        free(items[k].recv);
        free(items[k].again);
        free(items[k].counts);
        free(items[k].displs);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    loom_world w;
    {
        loom_error err = {0};
        if (loom_world_init(&w, &argc, &argv, &err) != LOOM_OK) {
            fprintf(stderr, "FAIL: loom_world_init: %s\n", err.msg);
            return 1;
        }
    }
    g_rank = w.rank;
    g_size = w.size;
    g_mpi = w.mpi;
    loom_comm world;
    if (w.mpi) {
        OK(loom_comm_from_mpi(&world, MPI_COMM_WORLD, "world", &err_));
    } else {
        loom_comm_self(&world, "world");
    }
    uint64_t seed = 0;
    if (w.rank == 0) {
        const char *env = getenv("LOOM_TEST_SEED");
        seed = env && *env ? strtoull(env, NULL, 0)
                           : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    }
    OK(loom_comm_bcast(&world, &seed, sizeof seed, 0, &err_));
    g_seed = seed;
    if (w.rank == 0)
        printf("test_engine: seed %llu (LOOM_TEST_SEED=%llu to repeat), %d rank(s)\n",
               (unsigned long long)seed, (unsigned long long)seed, w.size);
    loom_comm_engine e;
    OK(loom_comm_engine_start(&e, &world, MAX_OPS, &err_));
    CHECK(e.threaded == (w.size > 1), "engine threaded %d with %d rank(s)", e.threaded, w.size);
    for (int round = 0; round < 3; round++) run_round(&world, &e, round);
    if (w.size > 1)
        CHECK(e.comm.inflight_ms > 0 && e.comm.blocked_ms >= 0 && e.comm.bytes > 0,
              "engine books: inflight %.3f ms, blocked %.3f ms, %llu bytes", e.comm.inflight_ms,
              e.comm.blocked_ms, (unsigned long long)e.comm.bytes);
    loom_comm_engine_stop(&e);
    double totals[2] = {(double)g_passed, (double)g_failed};
    OK(loom_comm_allreduce_sum_f64(&world, totals, 2, &err_));
    if (w.rank == 0) printf("%.0f passed, %.0f failed\n", totals[0], totals[1]);
    loom_comm_free(&world);
    loom_world_finalize(&w);
    return totals[1] == 0 ? 0 : 1;
}
