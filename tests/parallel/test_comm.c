/* The communication API (src/comm/comm.h) and the process mesh (src/parallel/mesh.h)
 * under MPI: every call on random data of odd sizes, checked against sums computed
 * locally in double (every rank regenerates every other rank's input from (seed, rank)),
 * plus the bookkeeping (sequence numbers, bytes, timers) and the mesh's coordinates and
 * communicator membership for every layout that fits the world.
 *
 *   mpirun -n R test_comm      (R = 1, 2, 3, 4, ...)
 *   test_comm                  (one process, no MPI: loom_comm_self)
 *
 * The seed comes from LOOM_TEST_SEED, else from the clock; rank 0 broadcasts it. The
 * last line (rank 0) is "N passed, F failed"; the exit status is 0 only when every rank
 * passed everything. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "parallel/mesh.h"
#include "comm_check.h"

static const size_t SIZES[] = {0, 1, 7, 1000, 100003};
#define N_SIZES (sizeof SIZES / sizeof SIZES[0])

/* Splits n floats into R uneven parts, some of them zero (weights cycle 3, 0, 1, 2, 5
 * from an offset), remainder to the last non-zero part. */
static void uneven_counts(size_t n, int R, int variant, int *counts) {
    static const int W[] = {3, 0, 1, 2, 5};
    long wsum = 0;
    for (int r = 0; r < R; r++) wsum += W[(r + variant) % 5];
    if (wsum == 0) { /* only possible for R = 1 with a zero weight */
        counts[0] = (int)n;
        return;
    }
    size_t given = 0;
    int last = 0;
    for (int r = 0; r < R; r++) {
        int w = W[(r + variant) % 5];
        counts[r] = (int)(n * (size_t)w / (size_t)wsum);
        given += (size_t)counts[r];
        if (w) last = r;
    }
    counts[last] += (int)(n - given);
}

/* ------------------------------------------------------------------ bookkeeping */

typedef struct {
    uint64_t seq, bytes;
    double blocked, inflight;
} snap;

static snap take(const loom_comm *c) {
    return (snap){c->seq, c->bytes, c->blocked_ms, c->inflight_ms};
}

/* After one operation was started: seq advanced by exactly one, bytes grew (strictly when
 * the payload is not empty), timers non-negative and non-decreasing. */
static void check_books(const loom_comm *c, snap before, size_t payload, const char *what) {
    CHECK(c->seq == before.seq + 1, "%s on %s: seq %llu -> %llu, expected +1", what, c->name,
          (unsigned long long)before.seq, (unsigned long long)c->seq);
    CHECK(c->bytes >= before.bytes && (payload == 0 || c->bytes > before.bytes),
          "%s on %s: bytes %llu -> %llu with a payload of %zu bytes", what, c->name,
          (unsigned long long)before.bytes, (unsigned long long)c->bytes, payload);
    CHECK(c->blocked_ms >= 0 && c->blocked_ms >= before.blocked,
          "%s on %s: blocked_ms %g -> %g (must be >= 0 and non-decreasing)", what, c->name,
          before.blocked, c->blocked_ms);
    CHECK(c->inflight_ms >= 0 && c->inflight_ms >= before.inflight,
          "%s on %s: inflight_ms %g -> %g (must be >= 0 and non-decreasing)", what, c->name,
          before.inflight, c->inflight_ms);
}

/* Waiting/testing completes an operation but starts none: seq and bytes unchanged. */
static void check_books_completion(const loom_comm *c, snap before, const char *what) {
    CHECK(c->seq == before.seq && c->bytes == before.bytes,
          "%s on %s: completion changed seq %llu -> %llu / bytes %llu -> %llu", what, c->name,
          (unsigned long long)before.seq, (unsigned long long)c->seq,
          (unsigned long long)before.bytes, (unsigned long long)c->bytes);
    CHECK(c->blocked_ms >= before.blocked && c->inflight_ms >= before.inflight,
          "%s on %s: timers went backwards (blocked %g -> %g, inflight %g -> %g)", what, c->name,
          before.blocked, c->blocked_ms, before.inflight, c->inflight_ms);
}

/* Every rank of c has the same sequence number (gathered as exact doubles). Costs one
 * operation on c (the allgather itself). */
static void check_same_seq(loom_comm *c, const char *where) {
    const int R = c->size;
    float *all = xmalloc((size_t)R * 2 * sizeof(float));
    int *counts = xmalloc((size_t)R * sizeof(int)), *displs = xmalloc((size_t)R * sizeof(int));
    for (int r = 0; r < R; r++) counts[r] = 2, displs[r] = 2 * r;
    uint64_t s = c->seq;
    /* two floats carry 48 bits exactly (24 bits each) */
    all[2 * c->rank] = (float)(s & 0xFFFFFF);
    all[2 * c->rank + 1] = (float)(s >> 24);
    OK(loom_comm_allgatherv(c, all, counts, displs, &err_));
    for (int r = 0; r < R; r++) {
        uint64_t o = (uint64_t)all[2 * r] | ((uint64_t)all[2 * r + 1] << 24);
        CHECK(o == s, "%s: %s rank %d is at seq %llu, rank %d at %llu", where, c->name, r,
              (unsigned long long)o, c->rank, (unsigned long long)s);
    }
    free(all);
    free(counts);
    free(displs);
}

/* ------------------------------------------------------------------ collectives */

static void test_allreduce(loom_comm *c) {
    const int R = c->size, me = c->rank;
    for (size_t k = 0; k < N_SIZES; k++) {
        const size_t n = SIZES[k];
        const uint64_t tag = 100 + k;
        float *buf = xmalloc((n + 1) * sizeof(float));
        fill(buf, n, me, tag);
        buf[n] = 12345.0f; /* canary past the end */
        snap b = take(c);
        OK(loom_comm_allreduce_sum(c, buf, n, &err_));
        check_books(c, b, n * 4, "allreduce_sum");
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            double want = 0, mag = 0;
            for (int r = 0; r < R; r++) {
                double v = rnd(r, tag, i);
                want += v;
                mag += fabs(v);
            }
            if (!close_enough(buf[i], want, mag, R) && bad++ == 0) first = i;
        }
        CHECK(bad == 0, "allreduce_sum n=%zu: %zu wrong elements, first at %zu", n, bad, first);
        CHECK(buf[n] == 12345.0f, "allreduce_sum n=%zu wrote past the end", n);
        free(buf);

        /* float64 */
        double *d = xmalloc((n + 1) * sizeof(double));
        for (size_t i = 0; i < n; i++) d[i] = rnd_f64(me, tag, i);
        b = take(c);
        OK(loom_comm_allreduce_sum_f64(c, d, (int)n, &err_));
        check_books(c, b, n * 8, "allreduce_sum_f64");
        bad = 0;
        for (size_t i = 0; i < n; i++) {
            double want = 0, mag = 0;
            for (int r = 0; r < R; r++) {
                want += rnd_f64(r, tag, i);
                mag += fabs(rnd_f64(r, tag, i));
            }
            if (fabs(d[i] - want) > 4.0 * R * DBL_EPSILON * mag && bad++ == 0) first = i;
        }
        CHECK(bad == 0, "allreduce_sum_f64 n=%zu: %zu wrong elements, first at %zu", n, bad, first);
        free(d);
    }
}

static void check_sum(const float *buf, size_t n, int R, uint64_t tag, const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double want = 0, mag = 0;
        for (int r = 0; r < R; r++) {
            double v = rnd(r, tag, i);
            want += v;
            mag += fabs(v);
        }
        if (!close_enough(buf[i], want, mag, R) && bad++ == 0) first = i;
    }
    CHECK(bad == 0, "%s n=%zu: %zu wrong elements, first at %zu", what, n, bad, first);
}

static void test_iallreduce(loom_comm *c) {
    const int R = c->size, me = c->rank;
    for (size_t k = 0; k < N_SIZES; k++) {
        const size_t n = SIZES[k];
        /* start + wait, with two operations in flight at once */
        const uint64_t tag1 = 200 + k, tag2 = 250 + k;
        float *x = xmalloc((n + 1) * sizeof(float)), *y = xmalloc((n + 1) * sizeof(float));
        fill(x, n, me, tag1);
        fill(y, n, me, tag2);
        loom_comm_handle h1, h2;
        snap b = take(c);
        OK(loom_comm_iallreduce_sum(c, x, n, &h1, &err_));
        check_books(c, b, n * 4, "iallreduce_sum (1st)");
        CHECK(h1.seq == c->seq, "iallreduce_sum: handle seq %llu, comm seq %llu",
              (unsigned long long)h1.seq, (unsigned long long)c->seq);
        b = take(c);
        OK(loom_comm_iallreduce_sum(c, y, n, &h2, &err_));
        check_books(c, b, n * 4, "iallreduce_sum (2nd)");
        CHECK(h2.seq == h1.seq + 1, "iallreduce_sum: handle seqs %llu then %llu",
              (unsigned long long)h1.seq, (unsigned long long)h2.seq);
        b = take(c);
        OK(loom_comm_wait(&h1, &err_));
        OK(loom_comm_wait(&h2, &err_));
        check_books_completion(c, b, "wait");
        /* waiting again on a completed handle is harmless */
        OK(loom_comm_wait(&h1, &err_));
        check_sum(x, n, R, tag1, "iallreduce_sum + wait (1st)");
        check_sum(y, n, R, tag2, "iallreduce_sum + wait (2nd)");

        /* start + test loop */
        const uint64_t tag3 = 300 + k;
        fill(x, n, me, tag3);
        loom_comm_handle h3;
        b = take(c);
        OK(loom_comm_iallreduce_sum(c, x, n, &h3, &err_));
        check_books(c, b, n * 4, "iallreduce_sum (test loop)");
        b = take(c);
        int done = 0;
        long polls = 0;
        double t0 = loom_comm_now_ms();
        while (!done) {
            OK(loom_comm_test(&h3, &done, &err_));
            polls++;
            if (loom_comm_now_ms() - t0 > 60e3) break;
        }
        CHECK(done, "iallreduce_sum n=%zu: test loop not done after %ld polls (60 s)", n, polls);
        check_books_completion(c, b, "test loop");
        int again = 0;
        OK(loom_comm_test(&h3, &again, &err_));
        CHECK(again == 1, "test on a completed handle says not done");
        check_sum(x, n, R, tag3, "iallreduce_sum + test loop");
        free(x);
        free(y);
    }
}

static void test_reduce_scatter(loom_comm *c) {
    const int R = c->size, me = c->rank;
    int *counts = xmalloc((size_t)R * sizeof(int)), *displs = xmalloc((size_t)R * sizeof(int));
    for (size_t k = 0; k < N_SIZES; k++) {
        for (int variant = 0; variant < 2; variant++) {
            const size_t n = SIZES[k];
            const uint64_t tag = 400 + 10 * k + variant;
            uneven_counts(n, R, variant, counts);
            for (int r = 0, d = 0; r < R; r++) displs[r] = d, d += counts[r];
            float *send = xmalloc((n + 1) * sizeof(float));
            fill(send, n, me, tag);
            const size_t mine = (size_t)counts[me];
            float *recv = xmalloc((mine + 1) * sizeof(float));
            for (size_t i = 0; i <= mine; i++) recv[i] = -777.0f;
            loom_comm_handle h;
            snap b = take(c);
            OK(loom_comm_ireduce_scatter_sum(c, send, recv, counts, &h, &err_));
            check_books(c, b, n * 4, "ireduce_scatter_sum");
            b = take(c);
            OK(loom_comm_wait(&h, &err_));
            check_books_completion(c, b, "ireduce_scatter wait");
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < mine; i++) {
                double want = 0, mag = 0;
                for (int r = 0; r < R; r++) {
                    double v = rnd(r, tag, (size_t)displs[me] + i);
                    want += v;
                    mag += fabs(v);
                }
                if (!close_enough(recv[i], want, mag, R) && bad++ == 0) first = i;
            }
            CHECK(bad == 0,
                  "ireduce_scatter_sum n=%zu variant %d: %zu of my %zu elements wrong, first "
                  "at %zu",
                  n, variant, bad, mine, first);
            CHECK(recv[mine] == -777.0f, "ireduce_scatter_sum n=%zu: wrote past my %zu floats", n,
                  mine);
            /* the send buffer is input only */
            size_t changed = 0;
            for (size_t i = 0; i < n; i++) changed += send[i] != rnd(me, tag, i);
            CHECK(changed == 0, "ireduce_scatter_sum n=%zu modified %zu send elements", n, changed);
            free(send);
            free(recv);
        }
    }
    free(counts);
    free(displs);
}

#define GAP 3 /* floats left between segments: must stay untouched */

static void test_allgatherv(loom_comm *c, int nonblocking) {
    const int R = c->size, me = c->rank;
    const char *what = nonblocking ? "iallgatherv" : "allgatherv";
    int *counts = xmalloc((size_t)R * sizeof(int)), *displs = xmalloc((size_t)R * sizeof(int));
    for (size_t k = 0; k < N_SIZES; k++) {
        for (int variant = 0; variant < 2; variant++) {
            const size_t n = SIZES[k];
            const uint64_t tag = (nonblocking ? 600 : 500) + 10 * k + variant;
            uneven_counts(n, R, variant + 2, counts);
            /* segments in reverse rank order with gaps, so displs matter */
            size_t total = GAP;
            for (int r = R - 1; r >= 0; r--) displs[r] = (int)total, total += counts[r] + GAP;
            float *buf = xmalloc(total * sizeof(float));
            for (size_t i = 0; i < total; i++) buf[i] = -999.0f;
            for (int i = 0; i < counts[me]; i++) buf[displs[me] + i] = rnd(me, tag, (size_t)i);
            snap b = take(c);
            if (nonblocking) {
                loom_comm_handle h;
                OK(loom_comm_iallgatherv(c, buf, counts, displs, &h, &err_));
                check_books(c, b, n * 4, what);
                snap b2 = take(c);
                OK(loom_comm_wait(&h, &err_));
                check_books_completion(c, b2, "iallgatherv wait");
            } else {
                OK(loom_comm_allgatherv(c, buf, counts, displs, &err_));
                check_books(c, b, n * 4, what);
            }
            size_t bad = 0, bad_gap = 0;
            for (int r = 0; r < R; r++)
                for (int i = 0; i < counts[r]; i++) bad += buf[displs[r] + i] != rnd(r, tag, i);
            for (size_t i = 0; i < total; i++) {
                int in_seg = 0;
                for (int r = 0; r < R; r++)
                    if ((int)i >= displs[r] && (int)i < displs[r] + counts[r]) in_seg = 1;
                if (!in_seg) bad_gap += buf[i] != -999.0f;
            }
            CHECK(bad == 0, "%s n=%zu variant %d: %zu gathered elements differ", what, n, variant,
                  bad);
            CHECK(bad_gap == 0, "%s n=%zu variant %d: %zu floats outside the segments changed",
                  what, n, variant, bad_gap);
            free(buf);
        }
    }
    free(counts);
    free(displs);
}

/* Floats rank src sends to rank dst: uneven, some zero. */
static int a2a_count(size_t n, int src, int dst) {
    if (n == 0) return 0;
    int sel = (src * 3 + dst * 5 + (int)(n % 7)) % 4;
    if (sel == 0) return 0;
    return (int)(n / (size_t)sel) - src;
}

static void test_alltoallv(loom_comm *c) {
    const int R = c->size, me = c->rank;
    int *sc = xmalloc((size_t)R * sizeof(int)), *sd = xmalloc((size_t)R * sizeof(int));
    int *rc = xmalloc((size_t)R * sizeof(int)), *rd = xmalloc((size_t)R * sizeof(int));
    for (size_t k = 0; k < N_SIZES; k++) {
        const size_t n = SIZES[k];
        const uint64_t tag = 700 + k;
        size_t stot = GAP, rtot = GAP, payload = 0;
        for (int r = 0; r < R; r++) {
            sc[r] = a2a_count(n, me, r);
            if (sc[r] < 0) sc[r] = 0;
            sd[r] = (int)stot;
            stot += sc[r] + GAP;
            payload += (size_t)sc[r] * 4;
        }
        for (int r = R - 1; r >= 0; r--) { /* received blocks in reverse order */
            rc[r] = a2a_count(n, r, me);
            if (rc[r] < 0) rc[r] = 0;
            rd[r] = (int)rtot;
            rtot += rc[r] + GAP;
        }
        float *send = xmalloc(stot * sizeof(float)), *recv = xmalloc(rtot * sizeof(float));
        for (size_t i = 0; i < stot; i++) send[i] = 0.5f;
        for (size_t i = 0; i < rtot; i++) recv[i] = -555.0f;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < sc[r]; i++)
                send[sd[r] + i] = rnd(me, tag, ((uint64_t)r << 32) | (uint64_t)i);
        snap b = take(c);
        OK(loom_comm_alltoallv(c, send, sc, sd, recv, rc, rd, &err_));
        check_books(c, b, payload, "alltoallv");
        size_t bad = 0, bad_gap = 0;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < rc[r]; i++)
                bad += recv[rd[r] + i] != rnd(r, tag, ((uint64_t)me << 32) | (uint64_t)i);
        for (size_t i = 0; i < rtot; i++) {
            int in_seg = 0;
            for (int r = 0; r < R; r++)
                if ((int)i >= rd[r] && (int)i < rd[r] + rc[r]) in_seg = 1;
            if (!in_seg) bad_gap += recv[i] != -555.0f;
        }
        CHECK(bad == 0, "alltoallv n=%zu: %zu received elements differ", n, bad);
        CHECK(bad_gap == 0, "alltoallv n=%zu: %zu floats outside the blocks changed", n, bad_gap);
        free(send);
        free(recv);
    }
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void test_bcast(loom_comm *c) {
    const int R = c->size, me = c->rank;
    const int roots[] = {R - 1, R / 2, 0}; /* non-zero roots first when R > 1 */
    for (int ri = 0; ri < 3; ri++) {
        const int root = roots[ri];
        for (size_t k = 0; k < N_SIZES; k++) {
            /* float payloads and an odd byte count */
            for (int odd = 0; odd < 2; odd++) {
                const size_t bytes = odd ? SIZES[k] * 4 + 3 : SIZES[k] * 4;
                const uint64_t tag = 800 + 10 * k + odd;
                unsigned char *buf = xmalloc(bytes + 1);
                for (size_t i = 0; i < bytes; i++)
                    buf[i] = me == root ? (unsigned char)(mix64(g_seed ^ tag ^ (i << 8)) >> 56)
                                        : (unsigned char)0xA5;
                buf[bytes] = 0x5A;
                snap b = take(c);
                OK(loom_comm_bcast(c, buf, bytes, root, &err_));
                check_books(c, b, bytes, "bcast");
                size_t bad = 0;
                for (size_t i = 0; i < bytes; i++)
                    bad += buf[i] != (unsigned char)(mix64(g_seed ^ tag ^ (i << 8)) >> 56);
                CHECK(bad == 0, "bcast root %d, %zu bytes: %zu bytes differ", root, bytes, bad);
                CHECK(buf[bytes] == 0x5A, "bcast root %d, %zu bytes: wrote past the end", root,
                      bytes);
                free(buf);
            }
        }
    }
}

/* Ring: every rank sends to the right and to the left at once (different tags), receives
 * from both sides. With R = 2 both neighbours are the same rank: tags keep them apart. */
static void test_ring(loom_comm *c) {
    const int R = c->size, me = c->rank;
    if (R == 1) return; /* point-to-point needs a peer */
    const int right = (me + 1) % R, left = (me + R - 1) % R;
    for (size_t k = 0; k < N_SIZES; k++) {
        const size_t n = SIZES[k];
        const uint64_t tag_r = 900 + k, tag_l = 950 + k;
        float *to_r = xmalloc((n + 1) * sizeof(float)), *to_l = xmalloc((n + 1) * sizeof(float));
        float *from_l = xmalloc((n + 1) * sizeof(float)),
              *from_r = xmalloc((n + 1) * sizeof(float));
        fill(to_r, n, me, tag_r);
        fill(to_l, n, me, tag_l);
        for (size_t i = 0; i <= n; i++) from_l[i] = from_r[i] = -333.0f;
        loom_comm_handle h[4];
        snap b = take(c);
        OK(loom_comm_irecv(c, from_l, n, left, 1, &h[0], &err_));
        check_books(c, b, 0, "irecv");
        b = take(c);
        OK(loom_comm_irecv(c, from_r, n, right, 2, &h[1], &err_));
        check_books(c, b, 0, "irecv");
        b = take(c);
        OK(loom_comm_isend(c, to_r, n, right, 1, &h[2], &err_));
        check_books(c, b, n * 4, "isend");
        b = take(c);
        OK(loom_comm_isend(c, to_l, n, left, 2, &h[3], &err_));
        check_books(c, b, n * 4, "isend");
        CHECK(h[1].seq == h[0].seq + 1 && h[2].seq == h[0].seq + 2 && h[3].seq == h[0].seq + 3,
              "ring: handle seqs %llu %llu %llu %llu are not consecutive",
              (unsigned long long)h[0].seq, (unsigned long long)h[1].seq,
              (unsigned long long)h[2].seq, (unsigned long long)h[3].seq);
        b = take(c);
        /* complete in a mixed order: test one in a loop, wait for the rest */
        int done = 0;
        double t0 = loom_comm_now_ms();
        while (!done && loom_comm_now_ms() - t0 < 60e3) OK(loom_comm_test(&h[3], &done, &err_));
        CHECK(done, "ring: isend to the left not done after 60 s");
        for (int i = 0; i < 3; i++) OK(loom_comm_wait(&h[i], &err_));
        check_books_completion(c, b, "ring completion");
        size_t bad_l = 0, bad_r = 0;
        for (size_t i = 0; i < n; i++) {
            bad_l += from_l[i] != rnd(left, tag_r, i);
            bad_r += from_r[i] != rnd(right, tag_l, i);
        }
        CHECK(bad_l == 0 && bad_r == 0,
              "ring n=%zu: %zu wrong from the left (rank %d), %zu from the right (rank %d)", n,
              bad_l, left, bad_r, right);
        CHECK(from_l[n] == -333.0f && from_r[n] == -333.0f, "ring n=%zu: recv wrote past the end",
              n);
        free(to_r);
        free(to_l);
        free(from_l);
        free(from_r);
    }
}

static void test_barrier(loom_comm *c) {
    snap b = take(c);
    OK(loom_comm_barrier(c, &err_));
    check_books(c, b, 0, "barrier");
    if (c->size == 1) return;
    /* Rank 0 arrives 200 ms late: every other rank must spend a good part of that inside
     * the barrier (and the timer must say so). */
    if (c->rank == 0) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    b = take(c);
    double t0 = loom_comm_now_ms();
    OK(loom_comm_barrier(c, &err_));
    double dt = loom_comm_now_ms() - t0;
    check_books(c, b, 0, "barrier (late rank 0)");
    if (c->rank != 0) {
        CHECK(dt > 20.0, "barrier returned after %.1f ms although rank 0 arrived 200 ms late", dt);
        CHECK(c->blocked_ms - b.blocked > 20.0 && c->blocked_ms - b.blocked <= dt + 1.0,
              "barrier took %.1f ms but blocked_ms grew by %.1f ms", dt, c->blocked_ms - b.blocked);
    }
}

static void test_comm_all(loom_comm *c) {
    test_allreduce(c);
    check_same_seq(c, "after allreduce");
    test_iallreduce(c);
    check_same_seq(c, "after iallreduce");
    test_reduce_scatter(c);
    check_same_seq(c, "after ireduce_scatter");
    test_allgatherv(c, 0);
    test_allgatherv(c, 1);
    check_same_seq(c, "after allgatherv");
    test_alltoallv(c);
    check_same_seq(c, "after alltoallv");
    test_bcast(c);
    check_same_seq(c, "after bcast");
    test_ring(c);
    check_same_seq(c, "after ring");
    test_barrier(c);
    check_same_seq(c, "after barrier");
}

/* ------------------------------------------------------------------ mesh */

/* dp_i: the place among the parameters' replicas, data rank * cp + cp rank. */
static int world_rank_of(loom_layout l, int dp_i, int tp_i, int pp_i) {
    return (pp_i * loom_layout_replicas(l) + dp_i) * l.tp + tp_i;
}

/* Gathers the world rank of every member of sub (in sub's rank order) and compares with
 * the expected list. */
static void check_members(loom_comm *sub, const int *want, int n, const char *what, loom_layout l) {
    CHECK(sub->size == n, "mesh dp%d tp%d pp%d ep%d: %s has size %d, expected %d", l.dp, l.tp, l.pp,
          l.ep, what, sub->size, n);
    if (sub->size != n) return;
    float *all = xmalloc((size_t)n * sizeof(float));
    int *counts = xmalloc((size_t)n * sizeof(int)), *displs = xmalloc((size_t)n * sizeof(int));
    for (int r = 0; r < n; r++) counts[r] = 1, displs[r] = r;
    all[sub->rank] = (float)g_rank;
    snap b = take(sub);
    OK(loom_comm_allgatherv(sub, all, counts, displs, &err_));
    check_books(sub, b, (size_t)n * 4, what);
    int bad = 0;
    for (int r = 0; r < n; r++) bad += (int)all[r] != want[r];
    if (bad) {
        char got_s[256] = "", want_s[256] = "";
        for (int r = 0; r < n; r++) {
            size_t gl = strlen(got_s), wl = strlen(want_s);
            snprintf(got_s + gl, sizeof got_s - gl, " %d", (int)all[r]);
            snprintf(want_s + wl, sizeof want_s - wl, " %d", want[r]);
        }
        CHECK(0, "mesh dp%d tp%d pp%d ep%d: %s holds world ranks [%s ] expected [%s ]", l.dp, l.tp,
              l.pp, l.ep, what, got_s, want_s);
    } else {
        CHECK(1, "members");
    }
    /* and a sum over it: the sub-communicator really carries traffic of its own */
    float s = (float)g_rank;
    OK(loom_comm_allreduce_sum(sub, &s, 1, &err_));
    long want_sum = 0;
    for (int r = 0; r < n; r++) want_sum += want[r];
    CHECK((long)s == want_sum, "mesh: sum of world ranks over %s is %g, expected %ld", what,
          (double)s, want_sum);
    free(all);
    free(counts);
    free(displs);
}

static void test_mesh_layout(const loom_world *w, loom_layout l) {
    loom_mesh m;
    OK(loom_mesh_create(&m, w, l, &err_));
    const int R = w->size;
    CHECK(m.rank == w->rank && m.size == R, "mesh: rank/size %d/%d, world %d/%d", m.rank, m.size,
          w->rank, R);
    const int reps = loom_layout_replicas(l);
    CHECK(m.data_rank == m.dp_rank / l.cp && m.cp_rank == m.dp_rank % l.cp && m.cp.size == l.cp &&
              m.cp.rank == m.cp_rank && !strcmp(m.cp.name, "cp"),
          "mesh dp%d cp%d: data rank %d, cp rank %d (comm %d of %d) for replica %d", l.dp, l.cp,
          m.data_rank, m.cp_rank, m.cp.rank, m.cp.size, m.dp_rank);
    CHECK(m.dp_rank >= 0 && m.dp_rank < reps && m.tp_rank >= 0 && m.tp_rank < l.tp &&
              m.pp_rank >= 0 && m.pp_rank < l.pp && m.ep_rank >= 0 && m.ep_rank < l.ep,
          "mesh dp%d tp%d pp%d ep%d: coordinates dp %d tp %d pp %d ep %d out of range", l.dp, l.tp,
          l.pp, l.ep, m.dp_rank, m.tp_rank, m.pp_rank, m.ep_rank);
    CHECK(world_rank_of(l, m.dp_rank, m.tp_rank, m.pp_rank) == w->rank,
          "mesh dp%d tp%d pp%d ep%d: world rank %d but (pp %d * dp + dp %d) * tp + tp %d = %d",
          l.dp, l.tp, l.pp, l.ep, w->rank, m.pp_rank, m.dp_rank, m.tp_rank,
          world_rank_of(l, m.dp_rank, m.tp_rank, m.pp_rank));
    CHECK(m.ep_rank == m.dp_rank % l.ep, "mesh dp%d ep%d: ep rank %d for dp rank %d", l.dp, l.ep,
          m.ep_rank, m.dp_rank);
    CHECK(m.world.size == R && m.world.rank == w->rank, "mesh: world comm %d/%d", m.world.rank,
          m.world.size);
    CHECK(m.dp.rank == m.dp_rank && m.tp.rank == m.tp_rank && m.pp.rank == m.pp_rank &&
              m.ep.rank == m.ep_rank,
          "mesh dp%d tp%d pp%d ep%d: communicator ranks dp %d tp %d pp %d ep %d differ from the "
          "coordinates dp %d tp %d pp %d ep %d",
          l.dp, l.tp, l.pp, l.ep, m.dp.rank, m.tp.rank, m.pp.rank, m.ep.rank, m.dp_rank, m.tp_rank,
          m.pp_rank, m.ep_rank);
    CHECK(!strcmp(m.world.name, "world") && !strcmp(m.dp.name, "dp") && !strcmp(m.tp.name, "tp") &&
              !strcmp(m.pp.name, "pp") && !strcmp(m.ep.name, "ep"),
          "mesh: communicator names %s %s %s %s %s", m.world.name, m.dp.name, m.tp.name, m.pp.name,
          m.ep.name);

    int *want = xmalloc((size_t)R * sizeof(int));
    for (int d = 0; d < reps; d++) want[d] = world_rank_of(l, d, m.tp_rank, m.pp_rank);
    check_members(&m.dp, want, reps, "dp", l);
    for (int c = 0; c < l.cp; c++)
        want[c] = world_rank_of(l, m.data_rank * l.cp + c, m.tp_rank, m.pp_rank);
    check_members(&m.cp, want, l.cp, "cp", l);
    for (int t = 0; t < l.tp; t++) want[t] = world_rank_of(l, m.dp_rank, t, m.pp_rank);
    check_members(&m.tp, want, l.tp, "tp", l);
    for (int p = 0; p < l.pp; p++) want[p] = world_rank_of(l, m.dp_rank, m.tp_rank, p);
    check_members(&m.pp, want, l.pp, "pp", l);
    const int block = m.dp_rank / l.ep * l.ep;
    for (int e = 0; e < l.ep; e++) want[e] = world_rank_of(l, block + e, m.tp_rank, m.pp_rank);
    check_members(&m.ep, want, l.ep, "ep", l);
    for (int r = 0; r < R; r++) want[r] = r;
    check_members(&m.world, want, R, "world", l);
    /* each communicator counted its own operations, identically on all its ranks */
    check_same_seq(&m.dp, "mesh dp");
    check_same_seq(&m.tp, "mesh tp");
    check_same_seq(&m.pp, "mesh pp");
    check_same_seq(&m.ep, "mesh ep");
    free(want);
    loom_mesh_free(&m);
}

static void test_mesh(const loom_world *w) {
    const int R = w->size;
    int layouts = 0;
    for (int dp = 1; dp <= R; dp++)
        for (int tp = 1; tp <= R; tp++)
            for (int pp = 1; pp <= R; pp++)
                for (int cp = 1; cp <= R; cp++) {
                    if (dp * tp * pp * cp != R) continue;
                    for (int ep = 1; ep <= dp * cp; ep++) {
                        if (dp * cp % ep) continue;
                        test_mesh_layout(w, (loom_layout){dp, tp, pp, ep, cp});
                        layouts++;
                    }
                }
    CHECK(layouts > 0, "no layout tested");
    /* layouts that do not fit are refused with a message naming the flags */
    const loom_layout bad[] = {{R + 1, 1, 1, 1, 1}, {R, 1, 1, R + 1, 1}, {0, 1, 1, 1, 1},
                               {2 * R, 1, 1, 3, 1}, {1, 1, 1, 1, R + 1}, {1, 1, 1, 1, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_mesh m;
        loom_error err = {0};
        loom_status st = loom_mesh_create(&m, w, bad[i], &err);
        CHECK(st == LOOM_ERR_INPUT && strstr(err.msg, "--"),
              "mesh dp%d tp%d pp%d ep%d on %d ranks: status %d, message '%s' (expected an input "
              "error naming the flags)",
              bad[i].dp, bad[i].tp, bad[i].pp, bad[i].ep, R, (int)st, err.msg);
    }
}

/* ------------------------------------------------------------------ main */

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
    CHECK(world.rank == w.rank && world.size == w.size && world.seq == 0 && world.bytes == 0,
          "world comm: rank %d size %d seq %llu bytes %llu", world.rank, world.size,
          (unsigned long long)world.seq, (unsigned long long)world.bytes);

    /* the seed: rank 0's choice, broadcast (the first operation tested) */
    uint64_t seed = 0;
    if (w.rank == 0) {
        const char *env = getenv("LOOM_TEST_SEED");
        seed = env && *env ? strtoull(env, NULL, 0)
                           : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    }
    OK(loom_comm_bcast(&world, &seed, sizeof seed, 0, &err_));
    g_seed = seed;
    if (w.rank == 0)
        printf("test_comm: seed %llu (LOOM_TEST_SEED=%llu to repeat), %d rank(s), %s\n",
               (unsigned long long)seed, (unsigned long long)seed, w.size,
               w.mpi ? "MPI" : "no MPI (loom_comm_self)");

    test_comm_all(&world);
    if (w.rank == 0) printf("test_comm: world communicator done\n");

    /* a second communicator over the same ranks: its own sequence numbers */
    if (w.mpi) {
        loom_comm dup;
        OK(loom_comm_from_mpi(&dup, MPI_COMM_WORLD, "dp", &err_));
        CHECK(dup.seq == 0 && dup.bytes == 0 && dup.blocked_ms == 0 && dup.inflight_ms == 0,
              "a new communicator starts at seq %llu bytes %llu", (unsigned long long)dup.seq,
              (unsigned long long)dup.bytes);
        uint64_t world_seq = world.seq;
        float x = 1.0f;
        OK(loom_comm_allreduce_sum(&dup, &x, 1, &err_));
        CHECK(x == (float)w.size && dup.seq == 1 && world.seq == world_seq,
              "second communicator: sum %g, its seq %llu, world seq moved %llu -> %llu", (double)x,
              (unsigned long long)dup.seq, (unsigned long long)world_seq,
              (unsigned long long)world.seq);
        loom_comm_free(&dup);
    }

    test_mesh(&w);
    if (w.rank == 0) printf("test_comm: mesh layouts done\n");

    /* totals over all ranks */
    double totals[2] = {(double)g_passed, (double)g_failed};
    OK(loom_comm_allreduce_sum_f64(&world, totals, 2, &err_));
    if (w.rank == 0) printf("%.0f passed, %.0f failed\n", totals[0], totals[1]);
    loom_comm_free(&world);
    loom_world_finalize(&w);
    return totals[1] == 0 ? 0 : 1;
}
