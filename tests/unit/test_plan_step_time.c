/* loom plan's step-time model (plan/plan.h, src/plan/step_time.c) on hand-built profiles
 * and random layouts (the seed is printed; LOOM_TEST_SEED repeats a run): the terms sum
 * to step_ms and name their metrics; tokens/s is the batch over the step; more
 * data-parallel ranks never increase a rank's compute; a GPU-like profile's forward is
 * the GEMMs' FLOP count over the rate, within the calls' latency; the pipeline bubble is
 * the schedule simulator's for the same action durations, and ZB-H1's is below 1F1B's;
 * ZeRO 1 shards the optimizer; overlapped buckets expose no more than one bucket after
 * backward; the CPU-sharing rule slows oversubscribed compute by R t / c; sharded
 * accumulation reduces every micro-batch (m times local's gradient bytes, from the
 * parameter count); a layout the profile cannot price is refused naming the file. No
 * timing. */
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
#include <time.h>

#include "pipeline/schedule.h"
#include "plan/plan.h"
#include "test_common.h"

/* ---- profiles ---- */

static json_t *line(double alpha, const char *unit, double r) {
    return json_pack("{s:f, s:f}", "alpha_us", alpha, unit, r);
}

/* One compute entry: GEMMs on the curve (peak, latency, half_dim 0), attention and the
 * memory-bound kernels on their model lines. */
static json_t *compute_entry(int threads, double gemm_gflops, double gemm_latency_us,
                             double att_gflops, double gbps) {
    json_t *gemm = json_object(), *att = json_object(), *ew = json_object();
    for (int i = 0; i < LOOM_GEMM_OPS; i++)
        json_object_set_new(gemm, loom_gemm_op_name((loom_gemm_op)i),
                            json_pack("{s:f, s:f, s:f, s:f}", "peak_gflops", gemm_gflops,
                                      "efficiency", 1.0, "latency_us", gemm_latency_us, "half_dim",
                                      0.0));
    for (int i = 0; i < LOOM_ATT_KINDS; i++)
        json_object_set_new(att, loom_attention_kind_name((loom_attention_kind)i),
                            json_pack("{s:f, s:f}", "gflops", att_gflops, "latency_us", 0.0));
    for (int i = 0; i < LOOM_EW_KINDS; i++)
        json_object_set_new(ew, loom_elementwise_kind_name((loom_elementwise_kind)i),
                            line(0.0, "gbps", gbps));
    return json_pack("{s:i, s:o, s:o, s:o, s:o}", "threads", threads, "gemm", gemm, "attention",
                     att, "elementwise", ew, "adamw", line(0.0, "ns_per_param", 1.0));
}

typedef struct {
    int published; /* "source": "published", every object citing "sources" */
    int shared;    /* a CPU node: memory shared, devices_per_node = cores */
    int devices;   /* per node */
    int inter;     /* also inter-node collectives */
    double gemm_gflops, gemm_latency_us, att_gflops, gbps;
    double busbw, alpha_us;
} profile_spec;

/* Every object below the root cites a source (a published profile's rule). */
static void cite(json_t *v, int root) {
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) cite(x, 0);
        if (!root) json_object_set_new(v, "sources", json_string("test_plan_step_time.c"));
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) cite(x, 0);
    }
}

static double g_refault_gbps; /* machine.refault_gbps of the next profile (0: none) */
static double g_corun[2];     /* machine.corun at 2 processes: gemm, memory (0: none) */

static loom_profile *make_profile(const profile_spec *s, const char *name) {
    json_t *coll = json_array();
    for (int k = 0; k < LOOM_COLL_KINDS; k++)
        for (int g = 2; g <= 8; g *= 2)
            for (int inter = 0; inter <= s->inter; inter++)
                json_array_append_new(
                    coll, json_pack("{s:s, s:i, s:s, s:f, s:f}", "kind",
                                    loom_collective_kind_name((loom_collective_kind)k), "group", g,
                                    "placement", inter ? "inter_node" : "intra_node", "alpha_us",
                                    s->alpha_us * (inter ? 4 : 1), "busbw_gbs",
                                    s->busbw / (inter ? 4 : 1)));
    json_t *compute = json_array();
    json_array_append_new(
        compute, compute_entry(1, s->gemm_gflops, s->gemm_latency_us, s->att_gflops, s->gbps));
    if (s->shared)
        json_array_append_new(compute, compute_entry(s->devices, s->gemm_gflops * s->devices,
                                                     s->gemm_latency_us, s->att_gflops * s->devices,
                                                     s->gbps * s->devices));
    json_t *root =
        json_pack("{s:s, s:i, s:s, s:s, s:{s:s, s:f, s:b, s:i}, s:o, s:o, s:{s:f, s:f, s:f}}",
                  "format", "loom-profile", "version", 1, "name", name, "source", "measured",
                  "machine", "description", "a test machine", "memory_gib", 64.0, "memory_shared",
                  s->shared, "devices_per_node", s->devices, "compute", compute, "collectives",
                  coll, "engine", "cpu_us_per_op", 20.0, "cpu_us_per_mib", 100.0, "post_us", 1.0);
    if (g_refault_gbps > 0)
        json_object_set_new(json_object_get(root, "machine"), "refault_gbps",
                            json_real(g_refault_gbps));
    if (g_corun[0] > 0)
        json_object_set_new(json_object_get(root, "machine"), "corun",
                            json_pack("[{s:i, s:f, s:f}]", "processes", 2, "gemm", g_corun[0],
                                      "memory", g_corun[1]));
    if (s->published) {
        json_object_set_new(root, "source", json_string("published"));
        cite(root, 1);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    loom_profile *p = NULL;
    loom_error err = {0};
    loom_status st = loom_profile_parse(&p, text, name, &err);
    free(text);
    if (st) fprintf(stderr, "profile: %s\n", err.msg);
    assert_int_equal(st, LOOM_OK);
    return p;
}

/* A GPU-like node (its own device per rank) and a 2-core CPU node. */
static const profile_spec GPU = {1, 0, 8, 1, 1000.0, 5.0, 1000.0, 1000.0, 100.0, 5.0};
static const profile_spec CPU = {0, 1, 2, 0, 50.0, 2.0, 20.0, 10.0, 2.0, 20.0};

/* ---- layouts ---- */

static void small_model(loom_model_config *mc, int family, int d_model, int layers, int seq) {
    memset(mc, 0, sizeof *mc);
    mc->family = family ? LOOM_FAMILY_LLAMA : LOOM_FAMILY_GPT2;
    mc->n_layer = layers;
    mc->n_head = 4;
    mc->n_kv_head = family ? 2 : 4;
    mc->d_model = d_model;
    mc->d_ff = 4 * d_model;
    mc->vocab_size = 256;
    mc->seq_len = seq;
    mc->norm_eps = 1e-5f;
    mc->rope_theta = 10000.0f;
}

static void layout(loom_train_config *tc, int dp, int tp, int pp, int zero, int micro, int m) {
    loom_train_config_defaults(tc);
    tc->layout = (loom_layout){dp, tp, pp, 1, 1};
    tc->zero = zero;
    tc->micro_batch = micro;
    tc->global_batch = micro * m * dp;
    tc->threads = 1;
    strcpy(tc->pp_schedule, "1f1b");
    tc->virtual_stages = 1;
}

static double g_moe_load_max; /* the router's balance of the next prediction (0: balanced) */

static loom_plan_time predict(const loom_model_config *mc, const loom_train_config *tc,
                              const loom_profile *p, int ranks_per_node) {
    loom_plan_time t;
    loom_error err = {0};
    const loom_plan_placement place = {ranks_per_node, tc->threads, g_moe_load_max};
    loom_status st = loom_plan_step_time(mc, tc, p, &place, &t, &err);
    if (st) fprintf(stderr, "step time: %s\n", err.msg);
    assert_int_equal(st, LOOM_OK);
    return t;
}

static double term_ms(const loom_plan_time *t, const char *name) {
    for (int i = 0; i < t->n_terms; i++)
        if (!strcmp(t->terms[i].name, name)) return t->terms[i].ms;
    return 0.0;
}

static int world_of(const loom_train_config *tc) {
    return tc->layout.dp * tc->layout.tp * tc->layout.pp;
}

/* A random valid layout of a random small model. */
static void random_layout(loom_model_config *mc, loom_train_config *tc) {
    small_model(mc, (int)(rnd() % 2), 64 << (rnd() % 2), 4, 64 << (rnd() % 2));
    const int dp = 1 << (rnd() % 3), tp = 1 << (rnd() % 2), pp = 1 << (rnd() % 2);
    const int zero = dp > 1 ? (int)(rnd() % 4) : 0;
    layout(tc, dp, tp, pp, zero, 1 + (int)(rnd() % 2), pp * (1 + (int)(rnd() % 2)));
    tc->sequence_parallel = tp > 1 && rnd() % 2;
    tc->recompute = rnd() % 4 == 0;
    if (pp > 1) {
        static const char *kinds[] = {"gpipe", "1f1b", "interleaved", "zb"};
        strcpy(tc->pp_schedule, kinds[rnd() % 4]);
        if (!strcmp(tc->pp_schedule, "interleaved")) tc->virtual_stages = 2;
    }
}

/* ---- the properties ---- */

static void test_terms_sum_to_step(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json"), *cpu = make_profile(&CPU, "cpu.json");
    for (int it = 0; it < 60; it++) {
        loom_model_config mc;
        loom_train_config tc;
        random_layout(&mc, &tc);
        const loom_profile *p = it % 2 ? gpu : cpu;
        const int world = world_of(&tc);
        const loom_plan_time t = predict(&mc, &tc, p, p == gpu && world > 8 ? 8 : world);
        double sum = 0;
        assert_true(t.n_terms >= 3 && t.n_terms <= LOOM_PLAN_MAX_TERMS);
        for (int i = 0; i < t.n_terms; i++) {
            assert_non_null(t.terms[i].name);
            assert_true(t.terms[i].ms > 0 && isfinite(t.terms[i].ms));
            assert_true(t.terms[t.dominant].ms >= t.terms[i].ms);
            sum += t.terms[i].ms;
        }
        assert_true(fabs(sum - t.step_ms) <= 1e-9 * t.step_ms);
        assert_true(term_ms(&t, "forward") > 0 && term_ms(&t, "backward") > 0);
        assert_true(fabs(t.tokens_per_s * t.step_ms * 1e-3 - (double)tc.global_batch * mc.seq_len) <
                    1e-6 * tc.global_batch * mc.seq_len);
        assert_true(t.model_flops > 0 && t.mfu > 0);
        /* the measured parts carry their --metrics keys */
        assert_string_equal(t.terms[0].metric, "dp.compute_ms");
        if (term_ms(&t, "optimizer") > 0)
            for (int i = 0; i < t.n_terms; i++)
                if (!strcmp(t.terms[i].name, "optimizer"))
                    assert_string_equal(t.terms[i].metric, "dp.optimizer_ms");
        /* a pipeline has a bubble; without one there is none */
        assert_true((term_ms(&t, "pp bubble") > 0) == (tc.layout.pp > 1));
        assert_true((term_ms(&t, "tp comm") > 0) == (tc.layout.tp > 1));
    }
    loom_profile_free(gpu);
    loom_profile_free(cpu);
}

/* The same global batch over more replicas: a rank's forward and backward never grow
 * (each holds fewer sequences), on a node where every rank has its own device. */
static void test_more_dp_less_compute(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json");
    for (int it = 0; it < 20; it++) {
        loom_model_config mc;
        loom_train_config tc;
        random_layout(&mc, &tc);
        tc.layout.pp = 1;
        tc.global_batch = 8 * tc.micro_batch;
        double last = INFINITY;
        for (int dp = 1; dp <= 8; dp *= 2) {
            tc.layout.dp = dp;
            tc.zero = dp > 1 ? tc.zero : 0;
            const loom_plan_time t = predict(&mc, &tc, gpu, 8);
            const double compute =
                term_ms(&t, "forward") + term_ms(&t, "backward") + term_ms(&t, "recompute");
            assert_true(compute <= last * (1 + 1e-12));
            last = compute;
        }
    }
    loom_profile_free(gpu);
}

/* GEMMs of one micro-batch's forward on one rank (tp 1): the blocks' four linears and
 * the head, 2 M N K each. */
static double forward_gemm_flops(const loom_model_config *mc, double tokens) {
    const double C = mc->d_model, hd = C / mc->n_head, F = mc->d_ff;
    const double QKV = (mc->n_head + 2.0 * mc->n_kv_head) * hd, A = mc->n_head * hd;
    const double FC = mc->family == LOOM_FAMILY_GPT2 ? F : 2 * F;
    const double block = C * QKV + A * C + C * FC + F * C;
    return 2 * tokens * (mc->n_layer * block + C * mc->vocab_size);
}

/* With memory-bound kernels and attention priced as nearly free, the forward term is the
 * GEMM FLOP count over the rate, plus at most every call's latency. */
static void test_forward_is_flops_over_rate(void **state) {
    (void)state;
    profile_spec s = GPU;
    s.att_gflops = 1e9;
    s.gbps = 1e9;
    loom_profile *p = make_profile(&s, "published.json");
    for (int it = 0; it < 20; it++) {
        loom_model_config mc;
        loom_train_config tc;
        random_layout(&mc, &tc);
        tc.layout = (loom_layout){1, 1, 1, 1, 1};
        tc.zero = 0;
        tc.recompute = 0;
        tc.sequence_parallel = 0;
        const loom_plan_time t = predict(&mc, &tc, p, 1);
        const int m = tc.global_batch / tc.micro_batch;
        const double flops = m * forward_gemm_flops(&mc, (double)tc.micro_batch * mc.seq_len);
        const double ideal = flops / (s.gemm_gflops * 1e6);
        const double latency = m * (4.0 * mc.n_layer + 1) * s.gemm_latency_us / 1e3;
        const double fwd = term_ms(&t, "forward");
        assert_true(fwd >= ideal * (1 - 1e-9));
        assert_true(fwd <= ideal + latency + 1e-3 * ideal);
    }
    loom_profile_free(p);
}

/* The bubble is what pipeline/schedule.h's simulator gives for every stage's own action
 * durations (the plan reports them): the makespan minus the slowest stage's own work; the
 * slowest stage's actions are the terms' per micro-batch; the stages are uneven (the
 * first holds the embedding, the last the head), and the even stages' bubble (every
 * stage priced as the slowest) is never below it. On the 2-core CPU node the pipeline's
 * ranks share the cores (slots: cores over the node's copies of the pipeline), and a
 * stage's terms are its actions slowed as the simulation slowed them. */
static void test_bubble_is_the_simulators(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json"), *cpu = make_profile(&CPU, "cpu.json");
    static const char *kinds[] = {"gpipe", "1f1b", "interleaved"};
    for (int it = 0; it < 36; it++) {
        loom_model_config mc;
        loom_train_config tc;
        small_model(&mc, it % 2, 64, 8, 64);
        mc.vocab_size = 256 << (rnd() % 6); /* the head: from lighter than a block to heavier */
        const int pp = 2 << (it % 2), m = pp * (1 + it % 3), on_cpu = it % 4 == 3;
        const int dp = on_cpu ? 1 + (int)(rnd() % 2) : 1;
        layout(&tc, dp, 1, pp, 0, 1, m);
        strcpy(tc.pp_schedule, kinds[it % 3]);
        const int v = it % 3 == 2 ? 2 : 1;
        tc.virtual_stages = v;
        const loom_plan_time t = predict(&mc, &tc, on_cpu ? cpu : gpu, dp * pp);
        const double acts = (double)m * v;
        const double send = term_ms(&t, "pp sends");
        const double F = term_ms(&t, "forward") / acts, B = term_ms(&t, "backward") / acts;
        /* pp sends: two per action pair, the loss all-reduce and (GPT-2) the tied
         * embedding's gradient swap; price the last two */
        double loss = 0, tied = 0;
        loom_error err = {0};
        assert_int_equal(loom_profile_collective_ms(gpu, LOOM_COLL_ALLREDUCE, pp, LOOM_PLACE_INTRA,
                                                    8, &loss, &err),
                         LOOM_OK);
        if (mc.family == LOOM_FAMILY_GPT2)
            assert_int_equal(
                loom_profile_collective_ms(gpu, LOOM_COLL_SENDRECV, 2, LOOM_PLACE_INTRA,
                                           4.0 * mc.vocab_size * mc.d_model, &tied, &err),
                LOOM_OK);
        loom_pp_kind kind;
        assert_int_equal(loom_pp_kind_parse(tc.pp_schedule, &kind, &err), LOOM_OK);
        loom_pp_schedule sched;
        assert_int_equal(loom_pp_schedule_build(&sched, kind, pp, m, v, &err), LOOM_OK);
        /* the slowest stage (most work) and how uneven they are */
        int slow = 0;
        double lo = 1e300, hi = 0;
        for (int r = 0; r < pp; r++) {
            const double *a = t.pp_action_ms[r], w = a[0] + a[1] + a[2];
            if (w > hi) hi = w, slow = r;
            if (w < lo) lo = w;
        }
        assert_true(hi > lo * (1 + 1e-6));
        const double *a = t.pp_action_ms[slow];
        const double slots = on_cpu ? 2.0 / dp : 0;
        double busy[LOOM_PP_MAX_STAGES];
        if (v == 1) { /* a rank's actions are its one chunk's: the simulation exactly */
            double each[LOOM_PP_MAX_STAGES][3];
            memcpy(each, t.pp_action_ms, sizeof(double[3]) * (size_t)pp);
            const double span = loom_pp_schedule_simulate_shared(&sched, (const double(*)[3])each,
                                                                 slots, NULL, busy, NULL);
            double s = busy[slow] / (acts * (a[0] + a[1] + a[2]));
            assert_true(s > 1 - 1e-12 && (on_cpu || s < 1 + 1e-12));
            if (s < 1) s = 1;
            const double hop = a[0] - F / s;
            if (!on_cpu) { /* the hops from the terms: two per action pair */
                const double hops = (send - loss - tied) / (2 * acts);
                assert_true(fabs(hop - hops) <= 1e-9 * (a[0] + a[1]));
                assert_true(fabs(a[1] - B - hop) <= 1e-9 * (a[0] + a[1]));
            }
            const double bubble = span - acts * (F + B + 2 * hop);
            if (fabs(term_ms(&t, "pp bubble") - bubble) > 1e-6 * span)
                fail_msg("it %d: bubble %g, simulated %g", it, term_ms(&t, "pp bubble"), bubble);
        }
        if (!on_cpu) { /* every stage priced as the slowest: never a smaller bubble */
            const double span = loom_pp_schedule_simulate(&sched, a, NULL, NULL);
            assert_true(term_ms(&t, "pp bubble") <= span - acts * (a[0] + a[1] + a[2]) + 1e-9);
        }
        loom_pp_schedule_free(&sched);
    }
    loom_profile_free(cpu);
    /* ZB-H1 fills 1F1B's bubble with the deferred weight gradients */
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, 0, 64, 8, 64);
    layout(&tc, 1, 1, 4, 0, 1, 8);
    const loom_plan_time t1 = predict(&mc, &tc, gpu, 4);
    strcpy(tc.pp_schedule, "zb");
    const loom_plan_time tz = predict(&mc, &tc, gpu, 4);
    assert_true(term_ms(&tz, "pp bubble") < term_ms(&t1, "pp bubble"));
    loom_profile_free(gpu);
}

static void test_zero_and_buckets(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json");
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, 0, 256, 8, 128);
    layout(&tc, 4, 1, 1, 0, 2, 2);
    const loom_plan_time z0 = predict(&mc, &tc, gpu, 4);
    tc.zero = 1;
    const loom_plan_time z1 = predict(&mc, &tc, gpu, 4);
    /* ZeRO-1: AdamW on a quarter, then the all-gather of the updated shards */
    assert_true(term_ms(&z1, "optimizer") < 0.3 * term_ms(&z0, "optimizer"));
    assert_true(term_ms(&z1, "param gather") > 0 && term_ms(&z0, "param gather") == 0);
    /* buckets during backward expose no more than one bucket after it */
    tc.zero = 0;
    tc.bucket_mb = 0.25f;
    const loom_plan_time small = predict(&mc, &tc, gpu, 4);
    tc.bucket_mb = 100000.0f;
    const loom_plan_time whole = predict(&mc, &tc, gpu, 4);
    assert_true(term_ms(&small, "dp exposed") < term_ms(&whole, "dp exposed"));
    assert_true(term_ms(&whole, "dp exposed") > 0);
    /* ZeRO-3 gathers parameters in forward and backward */
    tc.zero = 3;
    tc.bucket_mb = 25.0f;
    const loom_plan_time z3 = predict(&mc, &tc, gpu, 4);
    assert_true(term_ms(&z3, "param gather") == 0);
    assert_true(z3.step_ms >= z0.step_ms - term_ms(&z0, "optimizer"));
    loom_profile_free(gpu);
}

/* Recomputation runs each block's forward again inside backward; ZeRO-3 waits longer for
 * its gathers on a slower network. */
static void test_recompute_and_gathers(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json");
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, 1, 128, 6, 128);
    layout(&tc, 2, 1, 1, 0, 2, 2);
    const loom_plan_time plain = predict(&mc, &tc, gpu, 2);
    tc.recompute = 1;
    const loom_plan_time rc = predict(&mc, &tc, gpu, 2);
    assert_true(term_ms(&plain, "recompute") == 0);
    assert_true(term_ms(&rc, "recompute") > 0.5 * term_ms(&rc, "forward"));
    assert_true(term_ms(&rc, "recompute") < term_ms(&rc, "forward"));
    assert_true(fabs(term_ms(&rc, "backward") - term_ms(&plain, "backward")) <
                1e-9 * term_ms(&plain, "backward"));
    /* selective: attention and the activation again, between none and full */
    tc.recompute = LOOM_RECOMPUTE_SELECTIVE;
    const loom_plan_time sel = predict(&mc, &tc, gpu, 2);
    assert_true(term_ms(&sel, "recompute") > 0);
    assert_true(term_ms(&sel, "recompute") < term_ms(&rc, "recompute"));
    assert_true(sel.step_ms > plain.step_ms && sel.step_ms < rc.step_ms);
    assert_true(fabs(term_ms(&sel, "backward") - term_ms(&plain, "backward")) <
                1e-9 * term_ms(&plain, "backward"));
    tc.recompute = 0;
    tc.zero = 3;
    profile_spec slow = GPU;
    slow.busbw = 0.01;
    loom_profile *net = make_profile(&slow, "slow.json");
    const loom_plan_time fast3 = predict(&mc, &tc, gpu, 2), slow3 = predict(&mc, &tc, net, 2);
    assert_true(term_ms(&slow3, "zero-3 gather") > term_ms(&fast3, "zero-3 gather"));
    assert_true(term_ms(&slow3, "dp exposed") > term_ms(&fast3, "dp exposed"));
    loom_profile_free(net);
    loom_profile_free(gpu);
}

/* 8 ranks of 1 thread on 2 cores: each rank's compute takes 4x its kernels' time. */
static void test_cpu_sharing(void **state) {
    (void)state;
    loom_profile *cpu = make_profile(&CPU, "cpu.json");
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, 1, 128, 4, 64);
    layout(&tc, 1, 1, 1, 0, 2, 4);
    const loom_plan_time one = predict(&mc, &tc, cpu, 1);
    /* the same rank's work with 7 more ranks beside it on the node */
    tc.layout.dp = 8;
    tc.global_batch *= 8;
    const loom_plan_time eight = predict(&mc, &tc, cpu, 8);
    const double f1 = term_ms(&one, "forward"), f8 = term_ms(&eight, "forward");
    assert_true(fabs(f8 / f1 - 4.0) < 1e-9);
    assert_true(term_ms(&eight, "engine cpu") > 0);
    /* two ranks of one thread fit the two cores */
    tc.layout.dp = 2;
    tc.global_batch = tc.global_batch / 4;
    const loom_plan_time two = predict(&mc, &tc, cpu, 2);
    assert_true(fabs(term_ms(&two, "forward") / f1 - 1.0) < 1e-9);
    loom_profile_free(cpu);
}

/* machine.corun: with both cores busy the kernels take the measured slowdown (GEMMs and
 * attention by one factor, memory-bound kernels by the other), with one rank of one
 * thread nothing changes, and with one rank of two threads (the 2-thread timings include
 * it) nothing either. */
static void test_corun(void **state) {
    (void)state;
    loom_profile *plain = make_profile(&CPU, "cpu.json");
    g_corun[0] = g_corun[1] = 1.3;
    loom_profile *even = make_profile(&CPU, "cpu_corun.json");
    g_corun[0] = 1.1, g_corun[1] = 1.6;
    loom_profile *mixed = make_profile(&CPU, "cpu_corun2.json");
    g_corun[0] = g_corun[1] = 0;
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, 1, 128, 4, 64);
    const int dps[] = {1, 2, 8};
    for (int i = 0; i < 3; i++) {
        layout(&tc, dps[i], 1, 1, 0, 2, 2);
        const loom_plan_time tp = predict(&mc, &tc, plain, dps[i]);
        const double f = term_ms(&tp, "forward");
        const loom_plan_time te = predict(&mc, &tc, even, dps[i]);
        const loom_plan_time tm = predict(&mc, &tc, mixed, dps[i]);
        const double want = dps[i] == 1 ? 1.0 : 1.3;
        if (fabs(term_ms(&te, "forward") / f - want) > 1e-9)
            fail_msg("dp %d: forward %g against %g alone, want x%g", dps[i],
                     term_ms(&te, "forward"), f, want);
        const double r = term_ms(&tm, "forward") / f;
        if (dps[i] == 1 ? fabs(r - 1) > 1e-9 : !(r > 1.1 && r < 1.6))
            fail_msg("dp %d, gemm x1.1, memory x1.6: forward x%g", dps[i], r);
    }
    layout(&tc, 1, 1, 1, 0, 2, 2);
    tc.threads = 2; /* one rank on both cores */
    const loom_plan_time a = predict(&mc, &tc, plain, 1), b = predict(&mc, &tc, even, 1);
    assert_true(fabs(term_ms(&b, "forward") / term_ms(&a, "forward") - 1) < 1e-9);
    loom_profile_free(plain), loom_profile_free(even), loom_profile_free(mixed);
}

/* A layout over two nodes on a profile without inter-node collectives. */
/* A group is inside a node only when its ranks are: tensor parallelism is the mesh's
 * fastest dimension, so with tp filling a node the replicas (stride tp) and the pipeline's
 * neighbours (stride dp x tp) cross nodes even when there are only two of them. */
static void test_group_placement(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json");
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, (int)(rnd() % 2), 256, 4, 128);
    mc.n_kv_head = mc.n_head;        /* tp 4 splits the key/value heads too */
    const int tp = 2 << (rnd() % 2); /* 2 or 4 */
    layout(&tc, 2, tp, 1, 1, 2, 2);
    const loom_plan_time apart = predict(&mc, &tc, gpu, tp);        /* one tp group per node */
    const loom_plan_time together = predict(&mc, &tc, gpu, 2 * tp); /* the whole job */
    /* the replicas' all-gather: the profile's inter-node entry (alpha x 4, bandwidth / 4) */
    const double ratio = term_ms(&apart, "param gather") / term_ms(&together, "param gather");
    if (fabs(ratio - 4.0) > 1e-6) fprintf(stderr, "tp %d: param gather ratio %g\n", tp, ratio);
    assert_true(fabs(ratio - 4.0) < 1e-6);
    /* tensor parallelism stays inside the node either way */
    assert_true(term_ms(&apart, "tp comm") > 0);
    assert_true(fabs(term_ms(&apart, "tp comm") - term_ms(&together, "tp comm")) <=
                1e-9 * term_ms(&together, "tp comm"));
    /* two pipeline stages of tp ranks each: neighbours on two nodes when a node holds tp */
    layout(&tc, 1, tp, 2, 0, 2, 4);
    const loom_plan_time pp_apart = predict(&mc, &tc, gpu, tp);
    const loom_plan_time pp_together = predict(&mc, &tc, gpu, 2 * tp);
    assert_true(term_ms(&pp_apart, "pp sends") > 3.0 * term_ms(&pp_together, "pp sends"));
    assert_true(term_ms(&pp_together, "pp sends") > 0);
    loom_profile_free(gpu);
}

/* Pages handed back to the kernel cost their fault again: ZeRO-3's gathered blocks at
 * every gather (slower faults, a slower step), when the blocks hold whole huge pages
 * (only those are handed back: blocks of d_model 128 hold none and cost no faults);
 * ZeRO-1 and 2 are not priced with it (their gradients come back as whole huge pages,
 * priced as the memset). */
static void test_refault(void **state) {
    (void)state;
    const double gbps = 0.05 + (double)(rnd() % 100) / 200.0;
    loom_profile *none = make_profile(&GPU, "gpu.json");
    g_refault_gbps = gbps;
    loom_profile *slow = make_profile(&GPU, "gpu_refault.json");
    g_refault_gbps = 2 * gbps;
    loom_profile *fast = make_profile(&GPU, "gpu_refault2.json");
    g_refault_gbps = 0;
    loom_model_config mc;
    loom_train_config tc;
    const int family = (int)(rnd() % 2);
    small_model(&mc, family, 128, 4, 64); /* blocks of ~0.8 MB */
    layout(&tc, 4, 1, 1, 3, 2, 2);
    assert_true(fabs(predict(&mc, &tc, slow, 4).step_ms - predict(&mc, &tc, none, 4).step_ms) <
                1e-9);
    small_model(&mc, family, 512, 4, 64); /* blocks of ~12 MB */
    layout(&tc, 4, 1, 1, 1, 2, 2);
    for (int zero = 1; zero <= 2; zero++) {
        tc.zero = zero;
        assert_true(fabs(predict(&mc, &tc, slow, 4).step_ms - predict(&mc, &tc, none, 4).step_ms) <
                    1e-9);
    }
    tc.zero = 3;
    const double t_none = predict(&mc, &tc, none, 4).step_ms;
    const double t_fast = predict(&mc, &tc, fast, 4).step_ms;
    const double t_slow = predict(&mc, &tc, slow, 4).step_ms;
    if (!(t_none < t_fast && t_fast < t_slow))
        fprintf(stderr, "refault %g GB/s: %g / %g / %g ms\n", gbps, t_none, t_fast, t_slow);
    assert_true(t_none < t_fast && t_fast < t_slow);
    loom_profile_free(none), loom_profile_free(slow), loom_profile_free(fast);
}

/* An uneven router (--moe-load-max R): every ep rank waits for the one holding the busiest
 * expert. On a profile whose kernels cost a + b x rows, one process runs the same rows
 * whatever R (only their split between experts changes); with one expert per rank the
 * forward grows linearly in R; R is held to E / K, and a capacity caps the busiest. */
/* |a - b| <= tol, printing both when not (cmocka's float assert rounds to float) */
static void assert_close(double a, double b, double tol) {
    if (!(fabs(a - b) <= tol)) fprintf(stderr, "%.12g != %.12g (tolerance %g)\n", a, b, tol);
    assert_true(fabs(a - b) <= tol);
}

static double forward_of(const loom_model_config *mc, const loom_train_config *tc,
                         const loom_profile *p) {
    const loom_plan_time t = predict(mc, tc, p, 8);
    return term_ms(&t, "forward");
}

static void test_moe_routing(void **state) {
    (void)state;
    loom_profile *gpu = make_profile(&GPU, "gpu.json");
    for (int it = 0; it < 6; it++) {
        loom_model_config mc;
        loom_train_config tc;
        small_model(&mc, 1, 64 << (rnd() % 2), 4, 64 << (rnd() % 2));
        mc.n_experts = 4 << (rnd() % 2);
        mc.top_k = 1 + (int)(rnd() % 2);
        mc.moe_every = 1 + (int)(rnd() % 2);
        const int ep = mc.n_experts;
        layout(&tc, ep, 1, 1, (int)(rnd() % 2), 1 + (int)(rnd() % 2), 2);
        tc.layout.ep = ep;
        double fwd[3];
        const double R[3] = {1.0, 1.5, 2.0};
        for (int dp1 = 1; dp1 >= 0; dp1--) {
            loom_train_config t1 = tc;
            if (dp1) t1.layout.dp = t1.layout.ep = 1, t1.global_batch /= ep, t1.zero = 0;
            for (int r = 0; r < 3; r++) {
                g_moe_load_max = R[r];
                fwd[r] = forward_of(&mc, &t1, gpu);
            }
            g_moe_load_max = 0;
            const double balanced = forward_of(&mc, &t1, gpu);
            assert_close(balanced, fwd[0], 1e-9 * fwd[0]);
            if (dp1) { /* the same rows in the same number of GEMMs */
                assert_close(fwd[2], fwd[0], 1e-9 * fwd[0]);
            } else {
                assert_true(fwd[1] > fwd[0] * (1 + 1e-6));
                assert_close(fwd[2] - fwd[0], 2 * (fwd[1] - fwd[0]), 1e-9 * fwd[0]);
            }
        }
        /* R beyond E / K: every token's K rows on one expert at most */
        g_moe_load_max = (double)mc.n_experts / mc.top_k;
        const double most = forward_of(&mc, &tc, gpu);
        g_moe_load_max = 4.0 * mc.n_experts;
        assert_close(forward_of(&mc, &tc, gpu), most, 1e-9 * most);
        /* a capacity of the mean load: no expert takes more than the balanced share */
        mc.capacity_factor = 1.0f;
        g_moe_load_max = 0;
        const double capped = forward_of(&mc, &tc, gpu);
        g_moe_load_max = 2.0;
        assert_close(forward_of(&mc, &tc, gpu), capped, 1e-9 * capped);
        g_moe_load_max = 0;
    }
    loom_profile_free(gpu);
}

/* --grad-accum sharded (ZeRO-3's default, FSDP's): every micro-batch's gradient is
 * reduced as backward produces it, so a step of m micro-batches moves m times the bytes of
 * local accumulation's one reduction: 2 (P - c) x 4 on this rank's wire (P the parameters,
 * c its shard, P / dp within a row of the shard geometry's snapping), priced as the run
 * counts them (dp.grad_bytes). On a slow network that is a slower step, the extra waits in
 * the term 'dp sharded accum'; auto is sharded at ZeRO-3 and local at ZeRO-2; a pipeline
 * stage's reductions too (each backward action its chunk's; GPT-2's tied embedding once a
 * step). */
static size_t parameters_of(const loom_model_config *mc) {
    loom_param_table t;
    loom_error err = {0};
    assert_int_equal(loom_params_build(&t, mc, NULL, &err), LOOM_OK);
    const size_t n = t.total;
    loom_params_free(&t);
    return n;
}

static void test_sharded_accumulation(void **state) {
    (void)state;
    profile_spec slow_net = GPU;
    slow_net.busbw = 0.5;
    loom_profile *gpu = make_profile(&GPU, "gpu.json"),
                 *slow = make_profile(&slow_net, "slow.json");
    for (int it = 0; it < 12; it++) {
        loom_model_config mc;
        loom_train_config tc;
        small_model(&mc, (int)(rnd() % 2), 64 << (rnd() % 3), 2 + (int)(rnd() % 4),
                    32 << (rnd() % 2));
        const int dp = 2 << (rnd() % 3), m = 2 + (int)(rnd() % 3), zero = 2 + (int)(rnd() % 2);
        const int pp = it % 3 == 2 ? 2 : 1;
        layout(&tc, dp, 1, pp, zero, 1 + (int)(rnd() % 2), pp * m);
        const int micro = tc.global_batch / dp / tc.micro_batch; /* micro-batches a step */
        tc.bucket_mb = (float)(0.05 * (1 + rnd() % 40));
        const loom_profile *p = it % 2 ? slow : gpu;
        strcpy(tc.grad_accum, "local");
        const loom_plan_time local = predict(&mc, &tc, p, dp * pp);
        strcpy(tc.grad_accum, "sharded");
        const loom_plan_time sharded = predict(&mc, &tc, p, dp * pp);
        strcpy(tc.grad_accum, "auto");
        const loom_plan_time dflt = predict(&mc, &tc, p, dp * pp);
        if (sharded.grad_bytes != micro * local.grad_bytes || sharded.grad_reductions != micro)
            fprintf(stderr,
                    "dp %d pp %d zero %d, %d micro-batches: %.0f bytes sharded, %.0f local\n", dp,
                    pp, zero, micro, sharded.grad_bytes, local.grad_bytes);
        assert_int_equal(local.grad_reductions, 1);
        assert_int_equal(sharded.grad_reductions, micro);
        assert_true(!local.grad_sharded && sharded.grad_sharded);
        if (pp > 1 && mc.family == LOOM_FAMILY_GPT2) {
            /* GPT-2's tied embedding on a pipeline's first stage: reduced once a step
             * (LOOM_ZERO_ACCUM_KEEP_EMBED), the rest every micro-batch: sharded =
             * m (local - E) + E, E this rank's wire bytes of the wte and wpe: at most
             * 2 n x 4, none when its shard holds them whole */
            const double E = (micro * local.grad_bytes - sharded.grad_bytes) / (micro - 1);
            const double emb = (double)mc.d_model * (mc.vocab_size + mc.seq_len);
            const int ok = E >= -1e-9 * local.grad_bytes && E <= 8.0 * emb;
            if (!ok) fprintf(stderr, "tied embedding: %g bytes of %g\n", E, 8.0 * emb);
            assert_true(ok);
        } else {
            assert_close(sharded.grad_bytes, micro * local.grad_bytes, 1e-12 * sharded.grad_bytes);
        }
        if (pp == 1) { /* the whole model on this rank: 2 (P - c) x 4, c about P / dp */
            const double P = (double)parameters_of(&mc);
            const double row = (double)(mc.d_ff > mc.d_model ? mc.d_ff : mc.d_model);
            assert_close(local.grad_bytes, 8.0 * (P - P / dp), 8.0 * row);
        }
        assert_true(term_ms(&local, "dp sharded accum") == 0);
        assert_true(term_ms(&sharded, "dp sharded accum") > 0);
        if (p == slow) assert_true(sharded.step_ms > local.step_ms);
        /* auto: ZeRO-3's sharded, ZeRO-2's local, priced the same */
        const loom_plan_time *same = zero == 3 ? &sharded : &local;
        assert_int_equal(dflt.grad_reductions, same->grad_reductions);
        assert_close(dflt.step_ms, same->step_ms, 1e-12 * same->step_ms);
    }
    loom_profile_free(gpu);
    loom_profile_free(slow);
}

static void test_missing_term_refused(void **state) {
    (void)state;
    profile_spec s = GPU;
    s.inter = 0;
    loom_profile *p = make_profile(&s, "intra_only.json");
    loom_model_config mc;
    loom_train_config tc;
    small_model(&mc, 0, 64, 4, 64);
    layout(&tc, 2, 1, 1, 0, 1, 2);
    loom_plan_time t;
    loom_error err = {0};
    const loom_plan_placement one_per_node = {1, 1, 0};
    assert_int_equal(loom_plan_step_time(&mc, &tc, p, &one_per_node, &t, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "intra_only.json"));
    loom_profile_free(p);
}

int main(void) {
    const char *seed = getenv("LOOM_TEST_SEED");
    g_rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    printf("test_plan_step_time: seed %llu (LOOM_TEST_SEED repeats it)\n",
           (unsigned long long)g_rng);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_terms_sum_to_step),
        cmocka_unit_test(test_more_dp_less_compute),
        cmocka_unit_test(test_forward_is_flops_over_rate),
        cmocka_unit_test(test_bubble_is_the_simulators),
        cmocka_unit_test(test_zero_and_buckets),
        cmocka_unit_test(test_recompute_and_gathers),
        cmocka_unit_test(test_cpu_sharing),
        cmocka_unit_test(test_corun),
        cmocka_unit_test(test_group_placement),
        cmocka_unit_test(test_refault),
        cmocka_unit_test(test_moe_routing),
        cmocka_unit_test(test_sharded_accumulation),
        cmocka_unit_test(test_missing_term_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
