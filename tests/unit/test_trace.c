/* The trace writer: random nested compute spans and overlapping comm spans from three
 * fake ranks, serialized, merged into one file and parsed back with jansson: valid JSON,
 * well-formed events, spans nest within each (pid, tid), comm lanes never overlap,
 * drops are counted, a disabled trace is a no-op, bad arguments give errors.
 * Random inputs per run; the seed is printed and LOOM_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/trace.h"

typedef struct {
    int pid, tid;
    int64_t s, e; /* ns */
} span;

typedef struct {
    int n_x;            /* complete events in the file */
    int x_per_pid[8];   /* ... per rank */
    long dropped[8];    /* process_name args.dropped_events per rank, -1 if absent */
    long unfinished[8]; /* process_name args.unfinished_spans */
    long unmatched[8];  /* process_name args.unmatched_ends */
    int max_tid[8];     /* highest tid with a span */
    json_t *root;       /* the parsed file (caller frees) */
} trace_facts;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return x->e > y->e ? -1 : x->e < y->e; /* the longer (enclosing) first */
}

static long arg_int(json_t *args, const char *key) {
    json_t *v = json_object_get(args, key);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

/* Parses the file and asserts every structural property; returns what it found. */
static trace_facts check_file(const char *path, int n_ranks) {
    trace_facts f = {0};
    for (int r = 0; r < 8; r++) f.dropped[r] = f.unfinished[r] = f.unmatched[r] = -1;
    json_error_t jerr;
    f.root = json_load_file(path, 0, &jerr);
    if (!f.root) fail_msg("%s:%d: %s", path, jerr.line, jerr.text);
    assert_string_equal(json_string_value(json_object_get(f.root, "displayTimeUnit")), "ms");
    json_t *evs = json_object_get(f.root, "traceEvents");
    assert_true(json_is_array(evs));
    size_t n = json_array_size(evs);
    span *sp = calloc(n + 1, sizeof *sp);
    int named[8][1 + LOOM_TRACE_MAX_LANES] = {{0}};
    assert_non_null(sp);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(evs, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        json_t *pid = json_object_get(e, "pid"), *tid = json_object_get(e, "tid");
        assert_non_null(ph);
        assert_true(json_is_integer(pid) && json_is_integer(tid));
        int p = (int)json_integer_value(pid), t = (int)json_integer_value(tid);
        assert_true(p >= 0 && p < n_ranks && t >= 0 && t <= LOOM_TRACE_MAX_LANES);
        const char *name = json_string_value(json_object_get(e, "name"));
        assert_non_null(name);
        json_t *args = json_object_get(e, "args");
        if (strcmp(ph, "M") == 0) {
            assert_true(json_is_object(args));
            if (strcmp(name, "process_name") == 0) {
                char want[32];
                snprintf(want, sizeof want, "rank %d", p);
                assert_string_equal(json_string_value(json_object_get(args, "name")), want);
                f.dropped[p] = arg_int(args, "dropped_events");
                f.unfinished[p] = arg_int(args, "unfinished_spans");
                f.unmatched[p] = arg_int(args, "unmatched_ends");
            } else if (strcmp(name, "thread_name") == 0) {
                char want[32];
                if (t == 0)
                    snprintf(want, sizeof want, "compute");
                else
                    snprintf(want, sizeof want, "comm %d", t - 1);
                assert_string_equal(json_string_value(json_object_get(args, "name")), want);
                named[p][t] = 1;
            }
            continue;
        }
        assert_string_equal(ph, "X");
        assert_non_null(json_string_value(json_object_get(e, "cat")));
        json_t *ts = json_object_get(e, "ts"), *dur = json_object_get(e, "dur");
        assert_true(json_is_number(ts) && json_is_number(dur));
        int64_t s = llround(json_number_value(ts) * 1e3);
        int64_t d = llround(json_number_value(dur) * 1e3);
        assert_true(d >= 0);
        sp[f.n_x++] = (span){p, t, s, s + d};
        f.x_per_pid[p]++;
        if (t > f.max_tid[p]) f.max_tid[p] = t;
    }
    qsort(sp, (size_t)f.n_x, sizeof *sp, cmp_span);
    span *stack[LOOM_TRACE_MAX_DEPTH + 1];
    int depth = 0;
    for (int i = 0; i < f.n_x; i++) {
        span *c = &sp[i];
        assert_true(named[c->pid][c->tid]); /* every track has a name */
        if (i == 0 || c->pid != sp[i - 1].pid || c->tid != sp[i - 1].tid) depth = 0;
        while (depth > 0 && stack[depth - 1]->e <= c->s) depth--;
        if (depth > 0 && c->e > stack[depth - 1]->e)
            fail_msg("pid %d tid %d: span [%" PRId64 ", %" PRId64
                     "] ns partially overlaps [%" PRId64 ", %" PRId64 "]",
                     c->pid, c->tid, c->s, c->e, stack[depth - 1]->s, stack[depth - 1]->e);
        if (c->tid > 0 && depth > 0) /* comm lanes: no overlap at all */
            fail_msg("pid %d lane %d: span at %" PRId64 " ns overlaps the previous one", c->pid,
                     c->tid - 1, c->s);
        assert_true(depth <= LOOM_TRACE_MAX_DEPTH);
        stack[depth++] = c;
    }
    free(sp);
    return f;
}

static const char *const k_names[] = {"forward", "backward",  "attention",
                                      "mlp",     "optimizer", "embed"};

/* Random nested spans, with comm spans reported in between; returns spans begun. */
static int nested(loom_trace *t, int depth, double *cursor, int *n_comm) {
    int begun = 1;
    loom_trace_begin(t, k_names[rnd() % 6], depth == 0 ? "step" : "compute");
    int children = depth == 0 ? 1 + (int)(rnd() % 3) : depth < 5 ? (int)(rnd() % 4) : 0;
    for (int c = 0; c < children; c++) {
        begun += nested(t, depth + 1, cursor, n_comm);
        /* a small batch of overlapping collectives, reported out of order */
        double st[3], en[3];
        for (int k = 0; k < 3; k++) {
            *cursor += 20 + (double)(rnd() % 80);
            st[k] = *cursor;
            en[k] = st[k] + (double)(rnd() % 300) + (double)(rnd() % 1000) * 1e-3;
        }
        for (int k = 2; k >= 0; k--) {
            char name[64];
            snprintf(name, sizeof name, "allreduce #%d dp", (*n_comm)++);
            loom_trace_comm(t, name, st[k], en[k]);
        }
    }
    loom_trace_end(t);
    return begun;
}

static void test_three_ranks(void **state) {
    char path[512], *frag[3];
    size_t lens[3];
    int expect[3];
    snprintf(path, sizeof path, "%s/sub/trace.json", (const char *)*state);
    for (int r = 0; r < 3; r++) {
        loom_trace *t = NULL;
        loom_error err = {0};
        assert_int_equal(loom_trace_open(&t, r, 100000, &err), LOOM_OK);
        double cursor = loom_trace_now_us();
        int n_comm = 0, begun = 0;
        for (int step = 0; step < 4; step++) begun += nested(t, 0, &cursor, &n_comm);
        expect[r] = begun + n_comm;
        assert_int_equal(loom_trace_serialize(t, &frag[r], &lens[r], &err), LOOM_OK);
        assert_int_equal(strlen(frag[r]), lens[r]);
        loom_trace_close(t);
    }
    loom_error err = {0};
    assert_int_equal(loom_trace_write_file(path, frag, lens, 3, &err), LOOM_OK);
    trace_facts f = check_file(path, 3);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(f.x_per_pid[r], expect[r]);
        assert_int_equal(f.dropped[r], 0);
        assert_int_equal(f.unfinished[r], 0);
        assert_int_equal(f.unmatched[r], 0);
        assert_true(f.max_tid[r] >= 2); /* the overlapping collectives needed several lanes */
        free(frag[r]);
    }
    json_decref(f.root);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1);
}

/* Writes one rank's trace to dir/name and checks it. */
static trace_facts write_one(const loom_trace *t, const char *dir, const char *name) {
    char path[512], *frag;
    size_t len;
    loom_error err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(loom_trace_serialize(t, &frag, &len, &err), LOOM_OK);
    assert_int_equal(loom_trace_write_file(path, &frag, &len, 1, &err), LOOM_OK);
    free(frag);
    return check_file(path, 1);
}

static void test_dropped(void **state) {
    size_t cap = 1 + rnd() % 12;
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_open(&t, 0, cap, NULL), LOOM_OK);
    double cursor = loom_trace_now_us();
    int n_comm = 0, begun = 0;
    while (begun + n_comm <= (int)cap) begun += nested(t, 0, &cursor, &n_comm);
    /* nesting deeper than the stack: the deep levels are dropped, the rest still pairs */
    for (int i = 0; i < LOOM_TRACE_MAX_DEPTH + 5; i++) loom_trace_begin(t, "deep", "compute");
    for (int i = 0; i < LOOM_TRACE_MAX_DEPTH + 5; i++) loom_trace_end(t);
    loom_trace_end(t); /* one too many */
    long total = begun + n_comm + LOOM_TRACE_MAX_DEPTH + 5;
    trace_facts f = write_one(t, *state, "dropped.json");
    assert_int_equal(f.x_per_pid[0], (int)cap);
    assert_int_equal(f.dropped[0], total - (long)cap);
    assert_int_equal(f.unmatched[0], 1);
    json_decref(f.root);
    loom_trace_close(t);

    assert_int_equal(loom_trace_open(&t, 0, 1000, NULL), LOOM_OK);
    for (int i = 0; i < LOOM_TRACE_MAX_DEPTH + 5; i++) loom_trace_begin(t, "deep", "compute");
    for (int i = 0; i < LOOM_TRACE_MAX_DEPTH + 5; i++) loom_trace_end(t);
    f = write_one(t, *state, "deep.json");
    assert_int_equal(f.x_per_pid[0], LOOM_TRACE_MAX_DEPTH);
    assert_int_equal(f.dropped[0], 5);
    json_decref(f.root);
    loom_trace_close(t);
}

static void test_lanes_and_names(void **state) {
    loom_trace *t = NULL;
    assert_int_equal(loom_trace_open(&t, 0, 100, NULL), LOOM_OK);
    double b = loom_trace_now_us();
    const double iv[][2] = {{0, 10}, {5, 15}, {10, 20}, {12, 13}, {15, 16}, {30, 25}};
    const int want_tid[] = {1, 2, 1, 3, 2, 1};
    for (int i = 0; i < 6; i++) loom_trace_comm(t, "c", b + iv[i][0], b + iv[i][1]);
    const char *odd = "quote\" back\\ nl\n tab\t";
    loom_trace_comm(t, odd, b + 40, b + 41);
    loom_trace_comm(t, "bad \xff byte", b + 42, b + 43);
    char longname[100]; /* 46 ASCII bytes then two-byte characters: the cut backs up */
    memset(longname, 'a', 46);
    strcpy(longname + 46, "\xc3\xa9\xc3\xa9\xc3\xa9");
    loom_trace_comm(t, longname, b + 44, b + 45);
    loom_trace_comm(t, "nan", NAN, b);
    loom_trace_begin(t, "open", "compute"); /* never ended */
    trace_facts f = write_one(t, *state, "lanes.json");
    assert_int_equal(f.dropped[0], 1); /* the NaN span */
    assert_int_equal(f.unfinished[0], 1);
    json_t *evs = json_object_get(f.root, "traceEvents");
    int seen = 0;
    for (size_t i = 0; i < json_array_size(evs); i++) {
        json_t *e = json_array_get(evs, i);
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") != 0) continue;
        const char *name = json_string_value(json_object_get(e, "name"));
        int tid = (int)json_integer_value(json_object_get(e, "tid"));
        if (seen < 6) assert_int_equal(tid, want_tid[seen]);
        if (seen == 5) assert_true(json_number_value(json_object_get(e, "dur")) == 0.0);
        if (seen == 6) assert_string_equal(name, odd);
        if (seen == 7) assert_string_equal(name, "bad \xef\xbf\xbd byte");
        if (seen == 8) {
            assert_int_equal(strlen(name), 46);
            assert_memory_equal(name, longname, 46);
        }
        if (seen == 9) {
            assert_string_equal(name, "open");
            assert_true(json_is_true(json_object_get(json_object_get(e, "args"), "unfinished")));
        }
        seen++;
    }
    assert_int_equal(seen, 10);
    json_decref(f.root);
    loom_trace_close(t);
}

static void test_disabled(void **state) {
    loom_trace *t = (loom_trace *)&g_rng; /* must be overwritten with NULL on failure */
    loom_error err = {0};
    assert_int_equal(loom_trace_open(&t, 0, 0, &err), LOOM_ERR_INPUT);
    assert_null(t);
    assert_non_null(strstr(err.msg, "max_events"));
    assert_int_equal(loom_trace_open(&t, -1, 10, &err), LOOM_ERR_INPUT);
    assert_null(t);
    loom_trace_begin(t, "x", "y");
    loom_trace_comm(t, "c", 0, 1);
    loom_trace_end(t);
    loom_trace_close(t);
    trace_facts f = write_one(t, *state, "empty.json");
    assert_int_equal(f.n_x, 0);
    json_decref(f.root);
}

static void test_write_errors(void **state) {
    char path[512], file[512];
    loom_error err = {0};
    snprintf(file, sizeof file, "%s/plain", (const char *)*state);
    FILE *fp = fopen(file, "w");
    assert_non_null(fp);
    fclose(fp);
    char good[] = "{\"name\":\"a\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{}}", bad[] = "[1,2]";
    char *frags[2] = {good, bad};
    size_t lens[2] = {strlen(good), strlen(bad)};
    snprintf(path, sizeof path, "%s/under/trace.json", file); /* folder inside a file */
    assert_int_equal(loom_trace_write_file(path, frags, lens, 1, &err), LOOM_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    snprintf(path, sizeof path, "%s/bad.json", (const char *)*state);
    assert_int_equal(loom_trace_write_file(path, frags, lens, 2, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "rank 1"));
    assert_int_equal(access(path, F_OK), -1);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(loom_trace_write_file(path, frags, lens, 0, &err), LOOM_ERR_INPUT);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
    printf("test_trace seed: %" PRIu64 " (LOOM_TEST_SEED overrides)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_three_ranks, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_dropped, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_lanes_and_names, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_disabled, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_write_errors, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
