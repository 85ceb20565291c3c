/* The machine profile reader (plan/profile.h): a hand-built profile parses, every lookup
 * equals the value computed by hand from the documented models (docs/PROFILE.md): GEMM's
 * peak x efficiency curve and its measured grid (log-space interpolation), attention's grid
 * (interpolated and extrapolated) and flop model, elementwise and AdamW lines, collectives
 * by group (exact, interpolated in log(group), clamped) with nccl-tests' bus factors, and
 * the thread-count entry chosen. Bad profiles are refused with LOOM_ERR_INPUT naming the
 * file and the field: a missing term, a wrong type, a negative rate, a grid of the wrong
 * size, a missing collective kind, a published profile without sources, broken JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/profile.h"

static json_t *line(double alpha, const char *unit, double r) {
    return json_pack("{s:f, s:f}", "alpha_us", alpha, unit, r);
}

static json_t *compute_entry(int threads, double peak) {
    json_t *gemm = json_object(), *att = json_object(), *ew = json_object();
    for (int i = 0; i < LOOM_GEMM_OPS; i++)
        json_object_set_new(gemm, loom_gemm_op_name((loom_gemm_op)i),
                            json_pack("{s:f, s:f, s:f, s:f}", "peak_gflops", peak, "efficiency",
                                      0.5, "latency_us", 10.0, "half_dim", 64.0));
    for (int i = 0; i < LOOM_ATT_KINDS; i++)
        json_object_set_new(att, loom_attention_kind_name((loom_attention_kind)i),
                            json_pack("{s:f, s:f}", "gflops", 1000.0, "latency_us", 5.0));
    for (int i = 0; i < LOOM_EW_KINDS; i++)
        json_object_set_new(ew, loom_elementwise_kind_name((loom_elementwise_kind)i),
                            line(2.0, "gbps", 10.0));
    return json_pack("{s:i, s:o, s:o, s:o, s:o}", "threads", threads, "gemm", gemm, "attention",
                     att, "elementwise", ew, "adamw", line(1.0, "ns_per_param", 2.0));
}

static json_t *base(void) {
    json_t *coll = json_array();
    for (int k = 0; k < LOOM_COLL_KINDS; k++) {
        const char *name = loom_collective_kind_name((loom_collective_kind)k);
        json_array_append_new(coll, json_pack("{s:s, s:i, s:f, s:f, s:[[f,f],[f,f]]}", "kind", name,
                                              "group", 2, "alpha_us", 10.0, "busbw_gbs", 5.0,
                                              "points", 4096.0, 11.0, 65536.0, 23.0));
        json_array_append_new(coll, json_pack("{s:s, s:i, s:f, s:f}", "kind", name, "group", 8,
                                              "alpha_us", 30.0, "busbw_gbs", 2.0));
    }
    return json_pack("{s:s, s:i, s:s, s:s, s:{s:s, s:f, s:i}, s:[o, o], s:o, s:{s:f, s:f, s:f}}",
                     "format", "loom-profile", "version", 1, "name", "test", "source", "measured",
                     "machine", "description", "a test machine", "memory_gib", 16.0,
                     "devices_per_node", 1, "compute", compute_entry(1, 100.0),
                     compute_entry(4, 400.0), "collectives", coll, "engine", "cpu_us_per_op", 3.0,
                     "cpu_us_per_mib", 0.5, "post_us", 1.0);
}

/* The value at a path like "compute[0].gemm.nt" (its parent and last key or index). */
static json_t *walk(json_t *root, const char *path, char *last, int *index) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = root, *parent = NULL;
    *index = -1;
    for (char *tok = strtok(buf, "."); tok; tok = strtok(NULL, ".")) {
        char *br = strchr(tok, '[');
        int idx = br ? atoi(br + 1) : -1;
        if (br) *br = 0;
        parent = cur;
        cur = json_object_get(cur, tok);
        snprintf(last, 64, "%s", tok);
        *index = -1;
        if (idx >= 0) {
            parent = cur;
            cur = json_array_get(cur, (size_t)idx);
            *index = idx;
        }
    }
    assert_non_null(parent);
    return parent;
}

static void set(json_t *root, const char *path, json_t *v) {
    char last[64];
    int index;
    json_t *parent = walk(root, path, last, &index);
    if (index >= 0)
        json_array_set_new(parent, (size_t)index, v);
    else
        json_object_set_new(parent, last, v);
}

static void del(json_t *root, const char *path) {
    char last[64];
    int index;
    json_t *parent = walk(root, path, last, &index);
    if (index >= 0)
        json_array_remove(parent, (size_t)index);
    else
        json_object_del(parent, last);
}

static loom_status parse(json_t *root, loom_profile **p, loom_error *err) {
    char *text = json_dumps(root, 0);
    assert_non_null(text);
    loom_status st = loom_profile_parse(p, text, "f.json", err);
    free(text);
    json_decref(root);
    return st;
}

static loom_profile *parse_ok(json_t *root) {
    loom_profile *p = NULL;
    loom_error err = {0};
    loom_status st = parse(root, &p, &err);
    if (st) fprintf(stderr, "unexpected: %s\n", err.msg);
    assert_int_equal(st, LOOM_OK);
    return p;
}

static void near(double got, double want) {
    if (fabs(got - want) > 1e-9 * fmax(1.0, fabs(want))) {
        fprintf(stderr, "got %.12g, want %.12g\n", got, want);
        fail();
    }
}

static void test_parse_and_models(void **state) {
    (void)state;
    loom_profile *p = parse_ok(base());
    loom_error err = {0};
    double ms;
    assert_string_equal(loom_profile_name(p), "test");
    assert_string_equal(loom_profile_source(p), "measured");
    near(loom_profile_memory_bytes(p, 4), 16.0 * 1073741824.0); /* a device's own */
    assert_int_equal(loom_profile_devices_per_node(p), 1);
    near(loom_profile_engine_cpu_us(p, 1 << 20), 3.0 + 0.5);
    near(loom_profile_engine_post_us(p), 1.0);
    /* GEMM: 10 us + 2*128^3 flops at 100 * 0.5 * 128 / (128 + 64) GFLOP/s */
    assert_int_equal(loom_profile_gemm_ms(p, LOOM_GEMM_NT, 128, 128, 128, 1, &ms, &err), 0);
    near(ms, 0.01 + 2.0 * 128 * 128 * 128 / (100 * 0.5 * 128.0 / 192.0 * 1e6));
    /* the smallest dimension sets the efficiency: (M, N, K) = (4096, 32, 1024) */
    assert_int_equal(loom_profile_gemm_ms(p, LOOM_GEMM_TN, 4096, 32, 1024, 1, &ms, &err), 0);
    near(ms, 0.01 + 2.0 * 4096 * 32 * 1024 / (100 * 0.5 * 32.0 / 96.0 * 1e6));
    /* thread entries: 2 and 3 threads use the 1-thread entry, 4 and 64 the 4-thread one */
    double one, four;
    loom_profile_gemm_ms(p, LOOM_GEMM_NN, 512, 512, 512, 3, &one, &err);
    loom_profile_gemm_ms(p, LOOM_GEMM_NN, 512, 512, 512, 64, &four, &err);
    double flops = 2.0 * 512 * 512 * 512, eff = 0.5 * 512.0 / 576.0;
    near(one, 0.01 + flops / (100 * eff * 1e6));
    near(four, 0.01 + flops / (400 * eff * 1e6));
    /* attention, flop model: causal forward 2 T^2 hd per head, backward 2.5x */
    assert_int_equal(loom_profile_attention_ms(p, LOOM_ATT_CAUSAL_FWD, 8, 1024, 128, 1, &ms, &err),
                     0);
    near(ms, 0.005 + 8 * 2.0 * 1024 * 1024 * 128 / 1e9); /* 1000 GFLOP/s */
    loom_profile_attention_ms(p, LOOM_ATT_BIDIR_BWD, 2, 256, 64, 1, &ms, &err);
    near(ms, 0.005 + 2 * 2.5 * 4.0 * 256 * 256 * 64 / 1e9);
    /* elementwise: 2 us + bytes at 10 GB/s; adamw: 1 us + 2 ns per parameter */
    assert_int_equal(loom_profile_elementwise_ms(p, LOOM_EW_GELU_FWD, 1e6, 1, &ms, &err), 0);
    near(ms, 0.002 + 1e6 / 1e7);
    assert_int_equal(loom_profile_adamw_ms(p, 1e6, 1, &ms, &err), 0);
    near(ms, 0.001 + 2.0);
    /* bytes formulas */
    near(loom_profile_elementwise_bytes(LOOM_EW_LAYERNORM_FWD, 10, 768), 2 * 10 * 768 * 4.0);
    near(loom_profile_elementwise_bytes(LOOM_EW_SWIGLU_BWD, 10, 100), 7 * 10 * 100 * 4.0);
    /* collectives: exact group 2, all-reduce factor 2(n-1)/n = 1 */
    assert_int_equal(
        loom_profile_collective_ms(p, LOOM_COLL_ALLREDUCE, 2, LOOM_PLACE_ANY, 1e6, &ms, &err), 0);
    near(ms, 0.010 + 1e6 / 5e6);
    /* group 4: halfway in log(group) between 2 and 8 -> alpha 20 us, busbw 3.5 GB/s */
    loom_profile_collective_ms(p, LOOM_COLL_ALLREDUCE, 4, LOOM_PLACE_INTRA, 1e6, &ms, &err);
    near(ms, 0.020 + 1.5 * 1e6 / 3.5e6);
    /* group 16: beyond the largest, the group-8 line with group 16's factor */
    loom_profile_collective_ms(p, LOOM_COLL_ALLGATHER, 16, LOOM_PLACE_ANY, 1e6, &ms, &err);
    near(ms, 0.030 + (15.0 / 16) * 1e6 / 2e6);
    loom_profile_collective_ms(p, LOOM_COLL_SENDRECV, 2, LOOM_PLACE_ANY, 1e6, &ms, &err);
    near(ms, 0.010 + 1e6 / 5e6);
    /* one rank communicates nothing; monotone in bytes */
    loom_profile_collective_ms(p, LOOM_COLL_ALLTOALL, 1, LOOM_PLACE_ANY, 1e6, &ms, &err);
    near(ms, 0);
    double prev = 0;
    for (double b = 4096; b <= 64 << 20; b *= 2) {
        loom_profile_collective_ms(p, LOOM_COLL_REDUCE_SCATTER, 8, LOOM_PLACE_ANY, b, &ms, &err);
        assert_true(ms > prev);
        prev = ms;
    }
    /* no inter-node entries in this profile: named refusal */
    assert_int_equal(
        loom_profile_collective_ms(p, LOOM_COLL_ALLREDUCE, 16, LOOM_PLACE_INTER, 1e6, &ms, &err),
        LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "no allreduce entry for inter_node groups"));
    assert_int_equal(loom_profile_gemm_ms(p, LOOM_GEMM_NT, 0, 1, 1, 1, &ms, &err), LOOM_ERR_INPUT);
    loom_profile_free(p);
}

static void test_grids(void **state) {
    (void)state;
    json_t *root = base();
    /* GEMM grid over M {64, 256} x N {64} x K {64, 256} */
    set(root, "compute[0].gemm.nt.grid",
        json_pack("{s:[f,f], s:[f], s:[f,f], s:[f,f,f,f]}", "M", 64.0, 256.0, "N", 64.0, "K", 64.0,
                  256.0, "gflops", 10.0, 40.0, 20.0, 80.0));
    /* attention grid over T {128, 256} x hd {64} */
    set(root, "compute[0].attention.causal_fwd",
        json_pack("{s:{s:[f,f], s:[f], s:[f,f]}}", "grid", "T", 128.0, 256.0, "hd", 64.0,
                  "us_per_head", 100.0, 400.0));
    loom_profile *p = parse_ok(root);
    loom_error err = {0};
    double ms;
    /* at a grid point: its rate */
    loom_profile_gemm_ms(p, LOOM_GEMM_NT, 256, 64, 64, 1, &ms, &err);
    near(ms, 2.0 * 256 * 64 * 64 / (20.0 * 1e6));
    /* the centre (M, K) = (128, 128): the geometric mean of the four rates */
    loom_profile_gemm_ms(p, LOOM_GEMM_NT, 128, 64, 128, 1, &ms, &err);
    near(ms, 2.0 * 128 * 64 * 128 / (pow(10.0 * 40 * 20 * 80, 0.25) * 1e6));
    /* outside the grid: the curve's shape (latency 10 us, half_dim 64) through the nearest
     * grid shape, each dimension clamped into the grid. N = 32 < 64: from (128, 64, 128),
     * stretched by the smaller N's shortfall (1 + 64/32 against 1 + 64/64). */
    const double at_centre = 2.0 * 128 * 64 * 128 / (pow(10.0 * 40 * 20 * 80, 0.25) * 1e6);
    loom_profile_gemm_ms(p, LOOM_GEMM_NT, 128, 32, 128, 1, &ms, &err);
    near(ms, 0.01 + (at_centre - 0.01) * (32.0 * 3) / (64.0 * 2));
    /* M = 1,024 > 256 with N = 64 the smallest: the rate measured at M = 256 (time x 4 less
     * the latency), not the curve's peak x efficiency (which would be 25 GFLOP/s here) */
    const double at_edge = 2.0 * 256 * 64 * 128 / (pow(20.0 * 80, 0.5) * 1e6);
    loom_profile_gemm_ms(p, LOOM_GEMM_NT, 1024, 64, 128, 1, &ms, &err);
    near(ms, 0.01 + (at_edge - 0.01) * 4);
    /* every dimension beyond the grid: never more than the curve's (1 + h/64)/(1 + h/d) */
    loom_profile_gemm_ms(p, LOOM_GEMM_NT, 4096, 4096, 4096, 1, &ms, &err);
    const double at_corner = 2.0 * 256 * 64 * 256 / (80.0 * 1e6);
    near(ms, 0.01 + (at_corner - 0.01) * (4096.0 * 4096 * 4096 * (1 + 64.0 / 4096)) /
                        (256.0 * 64 * 256 * 2));
    /* a GEMM without a grid: the curve */
    loom_profile_gemm_ms(p, LOOM_GEMM_NN, 128, 32, 128, 1, &ms, &err);
    near(ms, 0.01 + 2.0 * 128 * 32 * 128 / (100 * 0.5 * 32.0 / 96.0 * 1e6));
    /* attention: T = sqrt(128 * 256) -> 200 us; T = 512 extrapolates T^2 -> 1600 us */
    loom_profile_attention_ms(p, LOOM_ATT_CAUSAL_FWD, 3, sqrt(128.0 * 256), 64, 1, &ms, &err);
    near(ms, 3 * 200e-3);
    loom_profile_attention_ms(p, LOOM_ATT_CAUSAL_FWD, 3, 512, 64, 1, &ms, &err);
    near(ms, 3 * 1600e-3);
    /* one head width measured: time scales with hd */
    loom_profile_attention_ms(p, LOOM_ATT_CAUSAL_FWD, 1, 128, 128, 1, &ms, &err);
    near(ms, 200e-3);
    loom_profile_free(p);
}

typedef struct {
    const char *path;     /* what is changed */
    json_t *value;        /* NULL: deleted */
    const char *expected; /* in the message */
} refusal;

static void expect_refusal(json_t *root, const char *expected) {
    loom_profile *p = NULL;
    loom_error err = {0};
    assert_int_equal(parse(root, &p, &err), LOOM_ERR_INPUT);
    assert_null(p);
    if (!strstr(err.msg, expected)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", err.msg, expected);
        fail();
    }
}

static void test_refusals(void **state) {
    (void)state;
    refusal cases[] = {
        {"compute[0].gemm.nt.peak_gflops", NULL, "f.json: compute[0].gemm.nt.peak_gflops: missing"},
        {"compute[1].gemm.tn.peak_gflops", json_string("fast"),
         "f.json: compute[1].gemm.tn.peak_gflops: expected a positive number"},
        {"compute[0].elementwise.rmsnorm_bwd.gbps", json_real(-3),
         "f.json: compute[0].elementwise.rmsnorm_bwd.gbps: expected a positive number"},
        {"compute[0].elementwise.swiglu_fwd", NULL, "compute[0].elementwise.swiglu_fwd: missing"},
        {"compute[0].attention.block_bwd", NULL, "compute[0].attention.block_bwd: missing"},
        {"compute[0].adamw.ns_per_param", json_real(0), "compute[0].adamw.ns_per_param"},
        {"compute[0].gemm.nn.efficiency", json_real(1.5), "expected a number in (0, 1]"},
        {"compute[0].gemm.nn.latency_us", json_real(-1), "compute[0].gemm.nn.latency_us"},
        {"compute[1].threads", json_integer(1), "compute[1].threads: two entries"},
        {"compute[0].threads", json_real(1.5), "compute[0].threads: expected an integer"},
        {"collectives[3].busbw_gbs", NULL, "f.json: collectives[3].busbw_gbs: missing"},
        {"collectives[0].alpha_us", json_real(-1), "collectives[0].alpha_us"},
        {"collectives[0].kind", json_string("broadcast"), "collectives[0].kind: expected one of"},
        {"collectives[2].group", json_integer(1), "collectives[2].group: expected an integer >= 2"},
        {"collectives[0].placement", json_string("moon"), "collectives[0].placement"},
        {"collectives[0].points", json_pack("[[f,f]]", -1.0, 2.0), "collectives[0].points[0]"},
        {"engine", NULL, "f.json: engine: missing"},
        {"engine.post_us", json_string("x"), "engine.post_us"},
        {"machine.memory_gib", NULL, "machine.memory_gib: missing"},
        {"machine.devices_per_node", json_real(2.5), "machine.devices_per_node"},
        {"compute", json_array(), "f.json: compute: expected a non-empty array"},
        {"source", json_string("guessed"), "f.json: source: expected"},
        {"version", json_integer(2), "f.json: version: expected 1"},
        {"format", NULL, "f.json: format"},
        {"machine.corun", json_string("x"), "f.json: machine.corun: expected an array"},
        {"machine.corun",
         json_pack("[{s:i, s:f, s:f}]", "processes", 1, "gemm", 1.1, "memory", 1.2),
         "f.json: machine.corun[0]: processes: expected an integer >= 2"},
        {"machine.corun",
         json_pack("[{s:i, s:f, s:f}, {s:i, s:f, s:f}]", "processes", 4, "gemm", 1.1, "memory", 1.2,
                   "processes", 2, "gemm", 1.1, "memory", 1.2),
         "f.json: machine.corun[1]: processes: expected an integer >= 2, increasing"},
        {"machine.corun",
         json_pack("[{s:i, s:f, s:f}]", "processes", 2, "gemm", 0.0, "memory", 1.2),
         "f.json: machine.corun[0].gemm: expected a positive number"},
        {"machine.corun", json_pack("[{s:i, s:f}]", "processes", 2, "gemm", 1.1),
         "f.json: machine.corun[0].memory: missing"},
        {"machine.corun",
         json_pack("[{s:i, s:f, s:f}]", "processes", 2, "gemm", 20.0, "memory", 1.2),
         "f.json: machine.corun[0]: gemm and memory: expected slowdowns in (0, 16]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *root = base();
        if (cases[i].value)
            set(root, cases[i].path, cases[i].value);
        else
            del(root, cases[i].path);
        expect_refusal(root, cases[i].expected);
    }
    /* a kind with no entry at all: both sendrecv entries removed (the last two) */
    json_t *root = base();
    del(root, "collectives[9]");
    del(root, "collectives[8]");
    expect_refusal(root, "f.json: collectives: no entry of kind \"sendrecv\"");
    /* a grid of the wrong size; a grid axis that does not increase */
    root = base();
    set(root, "compute[0].gemm.nt.grid",
        json_pack("{s:[f,f], s:[f], s:[f], s:[f]}", "M", 64.0, 256.0, "N", 64.0, "K", 64.0,
                  "gflops", 10.0));
    expect_refusal(root, "compute[0].gemm.nt.grid.gflops: expected an array of 2");
    root = base();
    set(root, "compute[0].attention.bidir_fwd",
        json_pack("{s:{s:[f,f], s:[f], s:[f,f]}}", "grid", "T", 256.0, 128.0, "hd", 64.0,
                  "us_per_head", 1.0, 2.0));
    expect_refusal(root, "compute[0].attention.bidir_fwd.grid.T: expected a non-empty array");
    root = base();
    set(root, "compute[0].attention.bidir_fwd",
        json_pack("{s:{s:[f], s:[f], s:[f]}}", "grid", "T", 256.0, "hd", 64.0, "us_per_head", 0.0));
    expect_refusal(root, "compute[0].attention.bidir_fwd.grid.us_per_head[0]");
    /* a node's memory shared by its ranks */
    root = base();
    set(root, "machine.memory_shared", json_true());
    loom_profile *shared = parse_ok(root);
    near(loom_profile_memory_bytes(shared, 4), 4.0 * 1073741824.0);
    loom_profile_free(shared);
    root = base();
    set(root, "machine.memory_shared", json_string("yes"));
    expect_refusal(root, "f.json: machine.memory_shared: expected true or false");
    /* a published profile cites every term */
    root = base();
    set(root, "source", json_string("published"));
    expect_refusal(root, "f.json: machine.sources: missing");
    /* not JSON; no file */
    loom_profile *p = NULL;
    loom_error err = {0};
    assert_int_equal(loom_profile_parse(&p, "{\"format\": ", "g.json", &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "g.json: not valid JSON"));
    assert_int_equal(loom_profile_load(&p, "/nonexistent/p.json", &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "/nonexistent/p.json"));
}

/* machine.corun: linear in the busy processes from 1 at one through the measured points,
 * flat after the last; 1 without it. */
static void test_corun(void **state) {
    (void)state;
    double g, m;
    loom_profile *none = parse_ok(base());
    loom_profile_corun(none, 8, &g, &m);
    near(g, 1), near(m, 1);
    loom_profile_free(none);
    json_t *root = base();
    set(root, "machine.corun",
        json_pack("[{s:i, s:f, s:f}, {s:i, s:f, s:f}]", "processes", 2, "gemm", 1.1, "memory", 1.5,
                  "processes", 4, "gemm", 1.3, "memory", 2.5));
    loom_profile *p = parse_ok(root);
    const double busy[] = {0.5, 1, 1.5, 2, 3, 4, 16};
    const double want_g[] = {1, 1, 1.05, 1.1, 1.2, 1.3, 1.3};
    const double want_m[] = {1, 1, 1.25, 1.5, 2.0, 2.5, 2.5};
    for (int i = 0; i < 7; i++) {
        loom_profile_corun(p, busy[i], &g, &m);
        near(g, want_g[i]), near(m, want_m[i]);
    }
    loom_profile_free(p);
}

static void test_bus_factors(void **state) {
    (void)state;
    near(loom_collective_bus_factor(LOOM_COLL_ALLREDUCE, 8), 2.0 * 7 / 8);
    near(loom_collective_bus_factor(LOOM_COLL_REDUCE_SCATTER, 4), 0.75);
    near(loom_collective_bus_factor(LOOM_COLL_ALLGATHER, 2), 0.5);
    near(loom_collective_bus_factor(LOOM_COLL_ALLTOALL, 8), 7.0 / 8);
    near(loom_collective_bus_factor(LOOM_COLL_SENDRECV, 8), 1.0);
    near(loom_collective_bus_factor(LOOM_COLL_ALLREDUCE, 1), 0.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_models),
        cmocka_unit_test(test_grids),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bus_factors),
        cmocka_unit_test(test_corun),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
