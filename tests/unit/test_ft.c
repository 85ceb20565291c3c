/* Fault-tolerance building blocks: the heartbeat record and its authentication (a
 * forged or malformed datagram is ignored, also through the supervisor's socket), the
 * progress record, fault specs and their arming, the skipped-batch order. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/fault.h"
#include "core/progress.h"
#include "ft/beat.h"
#include "ft/detect.h"
#include "ft/launch_argv.h"
#include "ft/monitor.h"
#include "ft/slurm.h"
#include "train/batch_skip.h"
#include "test_common.h"

static void random_token(uint8_t t[LOOM_BEAT_TOKEN_BYTES]) {
    for (int i = 0; i < LOOM_BEAT_TOKEN_BYTES; i++) t[i] = (uint8_t)rnd();
}

static void test_beat_token(void **state) {
    (void)state;
    uint8_t a[LOOM_BEAT_TOKEN_BYTES], b[LOOM_BEAT_TOKEN_BYTES];
    loom_error err;
    assert_int_equal(loom_beat_token_new(a, &err), LOOM_OK);
    char hex[33];
    loom_beat_token_hex(a, hex);
    assert_int_equal(strlen(hex), 32);
    assert_int_equal(loom_beat_token_parse(b, hex, &err), LOOM_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(loom_beat_token_parse(b, "abc", &err), LOOM_ERR_INPUT);
    hex[5] = 'g';
    assert_int_equal(loom_beat_token_parse(b, hex, &err), LOOM_ERR_INPUT);
}

static void test_beat_accept(void **state) {
    (void)state;
    uint8_t token[LOOM_BEAT_TOKEN_BYTES], other[LOOM_BEAT_TOKEN_BYTES];
    random_token(token);
    memcpy(other, token, sizeof other);
    other[rnd() % LOOM_BEAT_TOKEN_BYTES] ^= (uint8_t)(1u << (rnd() % 8));
    const int world = 2 + (int)(rnd() % 30), rank = (int)(rnd() % (uint64_t)world);
    loom_beat b = {0}, got;
    loom_beat_fill(&b, token, rank, world, 0, "host-a");
    assert_int_equal(loom_beat_accept(&b, sizeof b, token, &got), 1);
    assert_int_equal(got.rank, rank);
    assert_string_equal(got.host, "host-a");
    /* Without the token, truncated, padded: ignored. */
    assert_int_equal(loom_beat_accept(&b, sizeof b, other, &got), 0);
    assert_int_equal(loom_beat_accept(&b, sizeof b - 1, token, &got), 0);
    unsigned char big[sizeof b + 8];
    memcpy(big, &b, sizeof b);
    assert_int_equal(loom_beat_accept(big, sizeof big, token, &got), 0);
    /* Out-of-range fields: ignored. */
    loom_beat bad = b;
    bad.rank = world;
    assert_int_equal(loom_beat_accept(&bad, sizeof bad, token, &got), 0);
    bad = b;
    bad.n_comms = LOOM_PROGRESS_COMMS + 1;
    assert_int_equal(loom_beat_accept(&bad, sizeof bad, token, &got), 0);
    /* Unterminated strings come out terminated. */
    bad = b;
    memset(bad.host, 'x', sizeof bad.host);
    memset(bad.msg, 'y', sizeof bad.msg);
    assert_int_equal(loom_beat_accept(&bad, sizeof bad, token, &got), 1);
    assert_int_equal(strlen(got.host), sizeof got.host - 1);
    assert_int_equal(strlen(got.msg), sizeof got.msg - 1);
    /* Random bytes of the right size never pass (the token is 128 bits). */
    for (int i = 0; i < 1000; i++) {
        unsigned char junk[sizeof b];
        for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)rnd();
        assert_int_equal(loom_beat_accept(junk, sizeof junk, token, &got), 0);
    }
}

static int udp_to(const char *addr) {
    char host[64];
    const char *colon = strrchr(addr, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0) return -1;
    int fd = socket(res->ai_family, SOCK_DGRAM, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static void drain_until(loom_monitor *m, int64_t accepted, int64_t rejected) {
    for (int i = 0; i < 200 && (m->accepted < accepted || m->rejected < rejected); i++) {
        loom_monitor_drain(m, 0);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Through the supervisor's socket: a forged beat (another token) claiming a hang is
 * ignored and changes nothing; the genuine one is taken. */
static void test_monitor_ignores_forged(void **state) {
    (void)state;
    loom_monitor m;
    loom_error err;
    assert_int_equal(loom_monitor_open(&m, "127.0.0.1", "", 10, &err), LOOM_OK);
    assert_int_equal(loom_monitor_reset(&m, 4, 0, &err), LOOM_OK);
    int fd = udp_to(m.addr);
    assert_true(fd >= 0);
    uint8_t forged_token[LOOM_BEAT_TOKEN_BYTES];
    random_token(forged_token);
    loom_beat b = {0};
    loom_beat_fill(&b, forged_token, 1, 4, 0, "evil");
    b.n_comms = 1;
    snprintf(b.comms[0].name, sizeof b.comms[0].name, "dp");
    b.comms[0].waiting_seq = 7;
    b.comms[0].waited_ms = 1e9;
    assert_int_equal(send(fd, &b, sizeof b, 0), (ssize_t)sizeof b);
    unsigned char junk[64 + rnd() % 1500];
    for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)rnd();
    assert_int_equal(send(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    drain_until(&m, 0, 2);
    assert_int_equal(m.rejected, 2);
    assert_int_equal(m.accepted, 0);
    for (int r = 0; r < 4; r++) assert_int_equal(m.ranks[r].seen, 0);
    loom_beat good = {0};
    loom_beat_fill(&good, m.token, 2, 4, 0, "good");
    assert_int_equal(send(fd, &good, sizeof good, 0), (ssize_t)sizeof good);
    /* A beat of another attempt (a straggling old process) is ignored too. */
    loom_beat old = {0};
    loom_beat_fill(&old, m.token, 3, 4, 5, "old");
    assert_int_equal(send(fd, &old, sizeof old, 0), (ssize_t)sizeof old);
    drain_until(&m, 1, 3);
    assert_int_equal(m.accepted, 1);
    assert_int_equal(m.rejected, 3);
    assert_int_equal(m.ranks[2].seen, 1);
    assert_int_equal(m.ranks[3].seen, 0);
    close(fd);
    loom_monitor_close(&m);
}

static void test_progress(void **state) {
    (void)state;
    loom_progress_set_step(0);
    const int steps = 3 + (int)(rnd() % 20);
    double loss[64];
    for (int s = 1; s <= steps; s++) {
        loss[s] = 1.0 + (double)(rnd() % 1000) / 100.0;
        loom_progress_phase(LOOM_PHASE_FORWARD);
        loom_progress_comm_start("dp", (uint64_t)s, "allreduce", 0);
        loom_progress_comm_wait("dp", (uint64_t)s, "allreduce");
        loom_progress_comm_done("dp");
        loom_progress_step_done(s, loss[s], 10.0 + s);
    }
    loom_progress_comm_start("world", 99, "bcast", 1); /* blocking: waiting at once */
    loom_progress_snapshot snap;
    loom_progress_read(&snap);
    assert_int_equal(snap.steps_done, steps);
    assert_int_equal(snap.phase, LOOM_PHASE_FORWARD);
    int n = steps < LOOM_PROGRESS_RING - 1 ? steps : LOOM_PROGRESS_RING - 1;
    assert_int_equal(snap.n_recent, n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(snap.recent[i].step, steps - i);
        assert_true(snap.recent[i].loss == loss[steps - i]);
        /* compute = wall - blocked, never more than the wall time */
        assert_true(snap.recent[i].compute_ms <= 10.0 + (steps - i) + 1e-9);
    }
    int dp = -1, world = -1;
    for (int i = 0; i < snap.n_comms; i++) {
        if (!strcmp(snap.comms[i].name, "dp")) dp = i;
        if (!strcmp(snap.comms[i].name, "world")) world = i;
    }
    assert_true(dp >= 0 && world >= 0);
    assert_int_equal(snap.comms[dp].started, steps);
    assert_int_equal(snap.comms[dp].waiting_seq, 0);
    assert_int_equal(snap.comms[world].waiting_seq, 99);
    assert_string_equal(snap.comms[world].waiting_op, "bcast");
    loom_progress_comm_done("world");
}

static void test_fault_parse(void **state) {
    (void)state;
    loom_fault_list l = {0};
    loom_error err;
    int step = 1 + (int)(rnd() % 1000), rank = (int)(rnd() % 64);
    char spec[256];
    snprintf(spec, sizeof spec, "crash@%d:%d,hang@%d,slow@%d:%d:2.5+,nan@3", step, rank, step + 1,
             step, rank);
    assert_int_equal(loom_fault_parse(&l, spec, "--inject", &err), LOOM_OK);
    assert_int_equal(l.n, 4);
    assert_int_equal(l.items[0].kind, LOOM_FAULT_CRASH);
    assert_int_equal(l.items[0].step, step);
    assert_int_equal(l.items[0].rank, rank);
    assert_int_equal(l.items[1].rank, 0);
    assert_true(l.items[2].arg == 2.5 && l.items[2].every);
    const char *bad[] = {"boom@3",     "crash",     "crash@0",       "crash@x",
                         "crash@3:-1", "nan@3:1:2", "crash@3:1:2:4", "slow@3:1:0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        loom_fault_list b = {0};
        assert_int_equal(loom_fault_parse(&b, bad[i], "--inject", &err), LOOM_ERR_INPUT);
        assert_non_null(strstr(err.msg, bad[i]));
    }
    /* Arming: only this rank's faults, and after a restart only the '+' ones. */
    loom_fault_arm(&l, rank, 0);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_CRASH, step), 1);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_CRASH, step + 1), 0);
    loom_fault_arm(&l, rank, 1);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_CRASH, step), 0);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_SLOW, step), 1);
    loom_fault_list later = {0};
    assert_int_equal(loom_fault_parse(&later, "crash@4:2/3", "LOOM_INJECT", &err), LOOM_OK);
    loom_fault_arm(&later, 2, 0);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_CRASH, 4), 0);
    loom_fault_arm(&later, 2, 3);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_CRASH, 4), 1);
    assert_int_equal(loom_fault_parse(&later, "crash@4/x", "LOOM_INJECT", &err), LOOM_ERR_INPUT);
    loom_fault_arm(&l, rank + 1, 0);
    assert_int_equal(loom_fault_armed(LOOM_FAULT_CRASH, step), 0);
    loom_fault_list none = {0};
    loom_fault_arm(&none, 0, 0);
}

/* Step s trains on the s-th batch not in the list: against counting it out. */
static void test_batch_skip(void **state) {
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        char list[512] = "";
        int n = (int)(rnd() % 8), len = 0, skipped[200] = {0};
        for (int i = 0; i < n; i++) {
            int b = 1 + (int)(rnd() % 60);
            skipped[b] = 1;
            len += snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", b);
        }
        loom_batch_skip k;
        loom_error err;
        assert_int_equal(loom_batch_skip_parse(&k, list, &err), LOOM_OK);
        int b = 0;
        for (int s = 1; s <= 100; s++) {
            do b++;
            while (skipped[b]);
            assert_int_equal(loom_batch_skip_batch_of(&k, s), b);
        }
    }
    loom_batch_skip k;
    loom_error err;
    assert_int_equal(loom_batch_skip_parse(&k, "3,x", &err), LOOM_ERR_INPUT);
    assert_int_equal(loom_batch_skip_parse(&k, "0", &err), LOOM_ERR_INPUT);
}

static int index_of(const loom_launch_cmd *c, const char *arg, int from) {
    for (int i = from; i < c->argc; i++)
        if (strcmp(c->argv[i], arg) == 0) return i;
    return -1;
}

/* The launcher's command line: srun (run for real by tests/hosts/test_slurm.py) and mpirun,
 * for random layouts, hosts and train options. */
static void test_launch_cmd(void **state) {
    (void)state;
    for (int trial = 0; trial < 100; trial++) {
        const int srun = trial % 2, world = 1 + (int)(rnd() % 64), hosts = rnd() % 2;
        char host_list[64] = "", node_list[64] = "", dir[64], exe[32], skips[32] = "";
        char args[8][16], *train[8];
        if (hosts) { /* with mpirun's slots sometimes: srun's --nodelist drops them */
            const int h = (int)(rnd() % 9), slots = (int)(rnd() % 3);
            if (slots)
                snprintf(host_list, sizeof host_list, "n%d:%d,n%d", h, slots, 10);
            else
                snprintf(host_list, sizeof host_list, "n%d,n%d", h, 10);
            snprintf(node_list, sizeof node_list, "n%d,n%d", h, 10);
        }
        snprintf(dir, sizeof dir, "/runs/r%d/attempt_%d", (int)(rnd() % 1000), trial);
        snprintf(exe, sizeof exe, "/opt/loom%d", (int)(rnd() % 100));
        const int n_train = (int)(rnd() % 8);
        for (int i = 0; i < n_train; i++) {
            snprintf(args[i], sizeof args[i], "--opt%d", (int)(rnd() % 1000));
            train[i] = args[i];
        }
        if (rnd() % 2) snprintf(skips, sizeof skips, "%d,%d", (int)(rnd() % 50) + 1, 77);
        const int resume = rnd() % 2, dp = 1 + (int)(rnd() % world);
        const long cores = 1 + (long)(rnd() % 32);
        if (rnd() % 2)
            setenv("LOOM_FT_TOKEN", "00112233445566778899aabbccddeeff", 1);
        else
            unsetenv("LOOM_FT_TOKEN");
        loom_launch_spec spec = {srun ? "srun" : "mpirun",
                                 host_list,
                                 world,
                                 dp,
                                 dir,
                                 exe,
                                 NULL,
                                 train,
                                 n_train,
                                 skips,
                                 resume,
                                 (int)(rnd() % 2),
                                 cores,
                                 NULL};
        static loom_launch_cmd c;
        loom_launch_cmd_build(&c, &spec);
        char want[160];
        assert_null(c.argv[c.argc]);
        assert_string_equal(c.argv[0], srun ? "srun" : "mpirun");
        assert_string_equal(c.argv[1], "-n");
        assert_int_equal(atoi(c.argv[2]), world);
        /* then loom train, the user's options in order, the supervisor's after them */
        int at = index_of(&c, exe, 3);
        assert_true(at > 0);
        assert_string_equal(c.argv[at + 1], "train");
        for (int i = 0; i < n_train; i++) assert_ptr_equal(c.argv[at + 2 + i], train[i]);
        int p = at + 2 + n_train;
        assert_string_equal(c.argv[p], "--dp");
        assert_int_equal(atoi(c.argv[p + 1]), dp);
        p += 2;
        if (skips[0]) {
            assert_string_equal(c.argv[p], "--skip-steps");
            assert_string_equal(c.argv[p + 1], skips);
            p += 2;
        }
        if (resume) {
            assert_string_equal(c.argv[p], "--resume");
            assert_string_equal(c.argv[p + 1], "auto");
            p += 2;
        }
        assert_int_equal(p, c.argc);
        int r = (int)(rnd() % (unsigned)world);
        char log[256];
        loom_launch_rank_log(spec.launcher, dir, r, log, sizeof log);
        if (srun) {
            /* every rank's output where the supervisor reads it: --output's %t is the rank */
            assert_true(index_of(&c, "--kill-on-bad-exit=1", 3) > 0 &&
                        index_of(&c, "--export=ALL", 3) > 0);
            snprintf(want, sizeof want, "--output=%s/rank_%%t.log", dir);
            assert_true(index_of(&c, want, 3) > 0 && index_of(&c, want, 3) < at);
            snprintf(want, sizeof want, "%s/rank_%d.log", dir, r);
            assert_string_equal(log, want);
            snprintf(want, sizeof want, "--nodelist=%s", node_list);
            assert_int_equal(index_of(&c, want, 3) > 0, hosts);
            assert_true(index_of(&c, "--mpi=pmix", 3) > 0 && index_of(&c, "--mpi=pmix", 3) < at);
            assert_int_equal(index_of(&c, "-x", 3), -1); /* mpirun's flags never */
            assert_int_equal(index_of(&c, "--oversubscribe", 3), -1);
            assert_int_equal(index_of(&c, "--allow-run-as-root", 3), -1);
        } else {
            snprintf(want, sizeof want, "%s/ranks", dir);
            int o = index_of(&c, "--output-filename", 3);
            assert_true(o > 0 && o < at);
            assert_string_equal(c.argv[o + 1], want);
            snprintf(want, sizeof want, "%s/ranks/1/rank.%d/stderr", dir, r);
            assert_string_equal(log, want);
            assert_int_equal(index_of(&c, "--allow-run-as-root", 3) > 0, spec.as_root);
            assert_int_equal(index_of(&c, "--oversubscribe", 3) > 0, !hosts && world > cores);
            int h = index_of(&c, "--host", 3);
            assert_int_equal(h > 0, hosts);
            if (hosts) assert_string_equal(c.argv[h + 1], host_list);
            int x = index_of(&c, "LOOM_FT_TOKEN", 3);
            assert_int_equal(x > 0, getenv("LOOM_FT_TOKEN") != NULL);
            if (x > 0) assert_string_equal(c.argv[x - 1], "-x");
        }
    }
    unsetenv("LOOM_FT_TOKEN");
}

/* Slurm host lists (SLURM_JOB_NODELIST) against --hosts' names. */
static void test_slurm_list(void **state) {
    (void)state;
    const char *list = "loomh[1-2],gpu[01-03,07]x,login,n[9]";
    const char *in[] = {"loomh1", "loomh2", "gpu01x", "gpu03x", "gpu07x", "login", "n9"};
    const char *out[] = {"loomh3", "loomh",  "loomh01", "gpu1x", "gpu04x",        "gpu07",
                         "logi",   "login2", "n10",     "",      "gpu[01-03,07]x"};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++)
        assert_true(loom_slurm_list_has(list, in[i]));
    for (size_t i = 0; i < sizeof out / sizeof *out; i++)
        assert_false(loom_slurm_list_has(list, out[i]));
    assert_true(loom_slurm_list_has("vm", "vm"));
    assert_false(loom_slurm_list_has(NULL, "vm"));
}

static double urand(double lo, double hi) { /* uniform in [lo, hi) */
    return lo + (hi - lo) * (double)(rnd() >> 11) / 9007199254740992.0;
}

static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n) {
    double s[64];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_dbl);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* A monitor built by hand for the detection rules: n_hosts hosts "loomh<h>" (beats from
 * 10.0.0.<h+1>), 1-4 ranks each, spread over the world at random (host_of[r]); every rank
 * seen at now_ms, training (phase forward, random steps done). */
static int fake_monitor(loom_monitor *m, int n_hosts, int *host_of, double now_ms) {
    memset(m, 0, sizeof *m);
    int world = 0;
    for (int h = 0; h < n_hosts; h++)
        for (int k = 1 + (int)(rnd() % 4); k > 0; k--) host_of[world++] = h;
    for (int i = world - 1; i > 0; i--) { /* shuffle: hosts' ranks need not be contiguous */
        const int j = (int)(rnd() % (uint64_t)(i + 1)), t = host_of[i];
        host_of[i] = host_of[j];
        host_of[j] = t;
    }
    m->world = world;
    m->ranks = calloc((size_t)world, sizeof *m->ranks);
    assert_non_null(m->ranks);
    for (int r = 0; r < world; r++) {
        loom_rank_state *s = &m->ranks[r];
        s->seen = 1;
        s->last_beat_ms = now_ms;
        s->beat.rank = r;
        s->beat.world = world;
        s->beat.pid = 1000 + r;
        s->beat.phase = LOOM_PHASE_FORWARD;
        s->beat.steps_done = 10 + (int64_t)(rnd() % 1000);
        snprintf(s->beat.host, sizeof s->beat.host, "loomh%d", host_of[r]);
        snprintf(s->from, sizeof s->from, "10.0.0.%d", host_of[r] + 1);
    }
    return world;
}

/* The ranks of host h in order; their count. */
static int ranks_on(const int *host_of, int world, int h, int *ranks) {
    int n = 0;
    for (int r = 0; r < world; r++)
        if (host_of[r] == h) ranks[n++] = r;
    return n;
}

/* f names host h as cut off: kind, host, its ranks as culprits, the job's next step. */
static void assert_partition_of(const loom_monitor *m, const loom_failure *f, const int *host_of,
                                int h) {
    int ranks[64];
    const int n = ranks_on(host_of, m->world, h, ranks);
    char want[64];
    snprintf(want, sizeof want, "loomh%d", h);
    assert_int_equal(f->kind, LOOM_FAIL_PARTITION);
    assert_string_equal(loom_fail_kind_name(f->kind), "partition");
    assert_string_equal(f->host, want);
    assert_int_equal(f->rank, ranks[0]);
    assert_int_equal(f->n_culprits, n);
    for (int i = 0; i < n; i++) assert_int_equal(f->culprits[i], ranks[i]);
    assert_int_equal(f->step, loom_monitor_step(m) + 1);
    assert_non_null(strstr(f->detail, want));
    assert_non_null(strstr(f->detail, "cut off"));
}

/* The partition rule: one host's ranks all silent (one for the full timeout, the others
 * for half of it) while another host is heard, or has finished, is that host cut off;
 * no partition while every host is heard, or while two hosts are silent. */
static void test_detect_partition(void **state) {
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        const int n_hosts = 2 + (int)(rnd() % 3);
        const double now = 1e6 + urand(0, 1e6), silent = urand(500, 20000);
        int host_of[64];
        loom_monitor m;
        const int world = fake_monitor(&m, n_hosts, host_of, now);
        const int v = (int)(rnd() % (unsigned)n_hosts);
        int vr[64];
        const int nv = ranks_on(host_of, world, v, vr);
        loom_failure f;
        /* (c) every host heard within half the timeout: nothing */
        for (int r = 0; r < world; r++) m.ranks[r].last_beat_ms = now - urand(0, 0.49 * silent);
        assert_int_equal(loom_detect_partition(&m, now, silent, &f), 0);
        /* the victim's ranks silent for half the timeout, none for all of it: not yet */
        for (int i = 0; i < nv; i++)
            m.ranks[vr[i]].last_beat_ms = now - urand(0.5 * silent, 0.99 * silent);
        assert_int_equal(loom_detect_partition(&m, now, silent, &f), 0);
        /* (a) one of them silent for the full timeout: the victim's host is cut off */
        const int loud = vr[rnd() % (unsigned)nv];
        m.ranks[loud].last_beat_ms = now - silent - urand(0, 5 * silent);
        assert_int_equal(loom_detect_partition(&m, now, silent, &f), 1);
        assert_partition_of(&m, &f, host_of, v);
        /* ... but not while another of its ranks is still heard */
        const int other = vr[0] == loud && nv > 1 ? vr[1] : vr[0];
        if (other != loud) {
            const double was = m.ranks[other].last_beat_ms;
            m.ranks[other].last_beat_ms = now - urand(0, 0.49 * silent);
            assert_int_equal(loom_detect_partition(&m, now, silent, &f), 0);
            m.ranks[other].last_beat_ms = was;
        }
        /* two hosts silent: no single host to blame */
        if (n_hosts >= 3) {
            loom_monitor two = m;
            two.ranks = calloc((size_t)world, sizeof *two.ranks);
            assert_non_null(two.ranks);
            memcpy(two.ranks, m.ranks, (size_t)world * sizeof *m.ranks);
            const int w = (v + 1) % n_hosts;
            for (int r = 0; r < world; r++)
                if (host_of[r] == w) two.ranks[r].last_beat_ms = now - silent - urand(0, silent);
            assert_int_equal(loom_detect_partition(&two, now, silent, &f), 0);
            free(two.ranks);
        }
        /* (b) every rank of the other hosts finished (silent by design, long ago): still a
         * partition of the victim's host */
        for (int r = 0; r < world; r++)
            if (host_of[r] != v) {
                m.ranks[r].beat.phase = LOOM_PHASE_DONE;
                m.ranks[r].last_beat_ms = now - silent - urand(0, 10 * silent);
            }
        memset(&f, 0, sizeof f);
        assert_int_equal(loom_detect_partition(&m, now, silent, &f), 1);
        assert_partition_of(&m, &f, host_of, v);
        /* a finished rank on the victim's host is skipped too (heard or not) */
        if (other != loud) {
            m.ranks[other].beat.phase = LOOM_PHASE_DONE;
            m.ranks[other].last_beat_ms = now - urand(0, 0.49 * silent);
            assert_int_equal(loom_detect_partition(&m, now, silent, &f), 1);
            assert_partition_of(&m, &f, host_of, v);
        }
        /* a rank never heard of: start-up, judged by the silence rules */
        m.ranks[rnd() % (unsigned)world].seen = 0;
        assert_int_equal(loom_detect_partition(&m, now, silent, &f), 0);
        free(m.ranks);
    }
}

/* The host of a rank taken as cut off: filled as a partition of that host; a rank never
 * heard of (or out of range) gives nothing. */
static void test_detect_host_cut(void **state) {
    (void)state;
    for (int trial = 0; trial < 100; trial++) {
        const int n_hosts = 1 + (int)(rnd() % 4);
        const double now = 1e6 + urand(0, 1e6);
        int host_of[64];
        loom_monitor m;
        const int world = fake_monitor(&m, n_hosts, host_of, now);
        for (int r = 0; r < world; r++) m.ranks[r].last_beat_ms = now - urand(0, 30000);
        const int rank = (int)(rnd() % (unsigned)world);
        loom_failure f;
        assert_int_equal(loom_detect_host_cut(&m, rank, now, &f), 1);
        assert_partition_of(&m, &f, host_of, host_of[rank]);
        assert_int_equal(loom_detect_host_cut(&m, -1, now, &f), 0);
        assert_int_equal(loom_detect_host_cut(&m, world, now, &f), 0);
        m.ranks[rank].seen = 0;
        f.kind = LOOM_FAIL_NONE;
        assert_int_equal(loom_detect_host_cut(&m, rank, now, &f), 0);
        assert_int_equal(f.kind, LOOM_FAIL_NONE);
        free(m.ranks);
    }
}

/* Probe samples, n_total written into the ring: the last LOOM_LINK_WINDOW from [lo, hi)
 * (with a few outliers 100x hi when spikes), the older ones 1000 ms (outside the window,
 * never judged); their median into *med. */
static void fill_probe(loom_link_probe *p, int h, int n_total, double lo, double hi, int spikes,
                       double *med) {
    memset(p, 0, sizeof *p);
    snprintf(p->addr, sizeof p->addr, "10.0.0.%d", h + 1);
    snprintf(p->host, sizeof p->host, "loomh%d", h);
    double win[LOOM_LINK_WINDOW];
    for (int k = 0; k < n_total; k++) {
        double v = 1000.0;
        if (k >= n_total - LOOM_LINK_WINDOW) {
            v = urand(lo, hi);
            if (spikes && rnd() % 8 == 0 && (k - (n_total - LOOM_LINK_WINDOW)) % 5 == 0)
                v = 100 * hi;
            win[k - (n_total - LOOM_LINK_WINDOW)] = v;
        }
        p->rtt_ms[k % LOOM_LINK_SAMPLES] = v;
    }
    p->n = n_total;
    if (med) *med = n_total >= LOOM_LINK_WINDOW ? median_of(win, LOOM_LINK_WINDOW) : NAN;
}

/* Per-step waiting and computing of every rank: the newest 4 steps from the given ranges,
 * the older ones the other way round (never judged). */
static void fill_steps(loom_monitor *m, double blk_lo, double blk_hi, double cmp_lo,
                       double cmp_hi) {
    for (int r = 0; r < m->world; r++) {
        loom_rank_state *s = &m->ranks[r];
        s->hist_n = 4 + (int)(rnd() % 60);
        for (int k = 0; k < s->hist_n; k++) {
            const int i = k % LOOM_MONITOR_HISTORY, recent = k >= s->hist_n - 4;
            s->hist_step[i] = k + 1;
            s->hist_blocked[i] = recent ? urand(blk_lo, blk_hi) : urand(cmp_lo, cmp_hi);
            s->hist_compute[i] = recent ? urand(cmp_lo, cmp_hi) : urand(blk_lo, blk_hi);
        }
    }
}

/* The slow-link rule: one host whose median round trip is >= 5 ms and >= factor x every
 * other probed host's (floor 0.5 ms) while the ranks wait more than they compute is
 * named once; one probed host alone, all hosts alike, or ranks that compute more than
 * they wait: nothing. */
static void test_detect_slow_link(void **state) {
    (void)state;
    const int W = LOOM_LINK_WINDOW;
    for (int trial = 0; trial < 200; trial++) {
        const int n_hosts = 3;
        const double now = 1e6, factor = urand(2.5, 10);
        int host_of[64];
        loom_monitor m;
        const int world = fake_monitor(&m, n_hosts, host_of, now);
        const int by_name = rnd() % 2; /* beats without an address: found by host name */
        if (by_name)
            for (int r = 0; r < world; r++) m.ranks[r].from[0] = 0;
        fill_steps(&m, 20, 100, 1, 19);
        const int slow = (int)(rnd() % n_hosts);
        loom_link_probe p[3];
        double med[3], others = 0;
        for (int h = 0; h < n_hosts; h++) {
            const int n = W + (int)(rnd() % (3 * LOOM_LINK_SAMPLES));
            if (h == slow)
                fill_probe(&p[h], h, n, 2.4 * factor + 5, 2.4 * factor + 60, 0, &med[h]);
            else
                fill_probe(&p[h], h, n, 0.05, 2.0, 1, &med[h]);
            if (h != slow && med[h] > others) others = med[h];
        }
        loom_slow_link out;
        /* one slow host among three: named, with its ranks */
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, factor, &out), 1);
        char want[64], ranks[256] = "";
        snprintf(want, sizeof want, "loomh%d", slow);
        assert_string_equal(out.host, want);
        assert_string_equal(out.addr, p[slow].addr);
        int vr[64], len = 0;
        const int nv = ranks_on(host_of, world, slow, vr);
        for (int i = 0; i < nv; i++)
            len += snprintf(ranks + len, sizeof ranks - len, "%s%d", i ? "," : "", vr[i]);
        assert_string_equal(out.ranks, ranks);
        assert_null(strstr(out.others, want));
        for (int h = 0; h < n_hosts; h++) {
            char name[64];
            snprintf(name, sizeof name, "loomh%d", h);
            if (h != slow) assert_non_null(strstr(out.others, name));
        }
        assert_true(fabs(out.rtt_ms - med[slow]) < 1e-9);
        assert_true(fabs(out.others_rtt_ms - others) < 1e-9);
        assert_true(out.blocked_ms > out.compute_ms);
        assert_true(out.blocked_ms >= 20 && out.blocked_ms < 100);
        assert_true(out.compute_ms >= 1 && out.compute_ms < 19);
        for (int h = 0; h < n_hosts; h++) assert_int_equal(p[h].reported, h == slow);
        /* named once per attempt */
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, factor, &out), 0);
        p[slow].reported = 0;
        /* only one probed host (the others alone, or with too few samples): nothing */
        assert_int_equal(loom_detect_slow_link(&m, &p[slow], 1, factor, &out), 0);
        loom_link_probe few[3];
        memcpy(few, p, sizeof few);
        for (int h = 0; h < n_hosts; h++)
            if (h != slow) few[h].n = (int)(rnd() % (unsigned)W);
        assert_int_equal(loom_detect_slow_link(&m, few, n_hosts, factor, &out), 0);
        assert_int_equal(few[slow].reported, 0);
        /* slow round trips, but the ranks compute more than they wait: nothing */
        fill_steps(&m, 1, 19, 20, 100);
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, factor, &out), 0);
        assert_int_equal(p[slow].reported, 0);
        fill_steps(&m, 20, 100, 1, 19);
        /* below 5 ms: no slow link, however fast the others */
        fill_probe(&p[slow], slow, W + (int)(rnd() % 40), 3.0, 4.9, 0, NULL);
        for (int h = 0; h < n_hosts; h++)
            if (h != slow) fill_probe(&p[h], h, W + (int)(rnd() % 40), 0.01, 0.1, 0, NULL);
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, factor, &out), 0);
        /* the others' floor of 0.5 ms: against hosts at 0.01-0.1 ms, a big factor wants
         * factor x 0.5 ms, not factor x their round trip */
        const double big = urand(12, 40);
        fill_probe(&p[slow], slow, W + (int)(rnd() % 40), 5.5, 0.5 * big * 0.95, 0, NULL);
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, big, &out), 0);
        fill_probe(&p[slow], slow, W + (int)(rnd() % 40), 0.5 * big * 1.05, 0.5 * big * 3, 0,
                   &med[slow]);
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, big, &out), 1);
        assert_string_equal(out.host, want);
        assert_true(fabs(out.rtt_ms - med[slow]) < 1e-9);
        p[slow].reported = 0;
        /* every host alike slow (within a factor < factor): nothing */
        const double lo = urand(5, 50);
        for (int h = 0; h < n_hosts; h++)
            fill_probe(&p[h], h, W + (int)(rnd() % 40), lo, 2 * lo, 0, NULL);
        assert_int_equal(loom_detect_slow_link(&m, p, n_hosts, factor, &out), 0);
        for (int h = 0; h < n_hosts; h++) assert_int_equal(p[h].reported, 0);
        free(m.ranks);
    }
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* A rank whose program is not on its node: named with the node and the path, from srun's
 * rank logs (the lowest such rank) and from mpirun's launcher log; nothing otherwise. */
static void test_detect_not_started(void **state) {
    const char *dir = *state;
    loom_not_started ns;
    const int world = 2 + (int)(rnd() % 6), bad = 1 + (int)(rnd() % (unsigned)(world - 1));
    for (int r = 0; r < world; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank_%d.log", r);
        write_text(dir, name,
                   r < bad ? "loom: rank up\n"
                           : "srun: a line\n"
                             "slurmstepd-loomh2: error: execve(): /tmp/x y/loom: No such file or "
                             "directory\n");
    }
    assert_int_equal(loom_detect_not_started("srun", dir, world, &ns), 1);
    assert_int_equal(ns.rank, bad);
    assert_string_equal(ns.node, "loomh2");
    assert_string_equal(ns.path, "/tmp/x y/loom");
    assert_string_equal(ns.why, "no such file or directory");
    assert_int_equal(loom_detect_not_started("srun", dir, bad, &ns), 0);
    write_text(dir, "launcher.log",
               "-----\nmpirun was unable to launch the specified application as it could not "
               "access\nor execute an executable:\n\nExecutable: /tmp/nonexist/loom\nNode: vm\n"
               "\nwhile attempting to start process rank 3.\n-----\n2 total processes failed\n");
    assert_int_equal(loom_detect_not_started("mpirun", dir, 4, &ns), 1);
    assert_int_equal(ns.rank, 3);
    assert_string_equal(ns.node, "vm");
    assert_string_equal(ns.path, "/tmp/nonexist/loom");
    assert_string_equal(ns.why, "");
    write_text(dir, "launcher.log",
               "mpirun noticed that process rank 2 with PID 0 on node vm "
               "exited on signal 9 (Killed).\n");
    assert_int_equal(loom_detect_not_started("mpirun", dir, 4, &ns), 0);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_ft: seed %u (LOOM_TEST_SEED to repeat)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_beat_token),
        cmocka_unit_test(test_beat_accept),
        cmocka_unit_test(test_monitor_ignores_forged),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_fault_parse),
        cmocka_unit_test(test_batch_skip),
        cmocka_unit_test(test_launch_cmd),
        cmocka_unit_test(test_slurm_list),
        cmocka_unit_test(test_detect_partition),
        cmocka_unit_test(test_detect_host_cut),
        cmocka_unit_test(test_detect_slow_link),
        cmocka_unit_test_setup_teardown(test_detect_not_started, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
