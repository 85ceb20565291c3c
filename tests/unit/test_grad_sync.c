/* The gradient-sync strategies (parallel/grad_sync.h) on one process, no mpirun:
 *  - counted flags and norm runs: for random dp x tp (x pp stages, x ep) layouts, the
 *    ranks' norm runs, mapped to the unsharded model's elements, count every element of
 *    the model exactly once (ZeRO 0-3, the experts' ZeRO-0 replicas, tp replicas on tp
 *    rank 0, GPT-2's tied copy on the last stage never);
 *  - one process: the norm equals a float64 sum of squares of every gradient, ranges
 *    arriving out of order are refused, and step() equals clipping + AdamW over the whole
 *    buffer, bitwise. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/grad_sync.h"
#include "parallel/shard_geometry.h"
#include "test_common.h"

static void random_config(loom_model_config *cfg, loom_family family, int moe) {
    assert_int_equal(
        loom_model_preset(cfg, family == LOOM_FAMILY_GPT2 ? "gpt2-tiny" : "llama-tiny", NULL),
        LOOM_OK);
    cfg->n_layer = 2 + 2 * (int)(rnd() % 2), cfg->d_model = 8, cfg->n_head = 2;
    cfg->n_kv_head = 2, cfg->d_ff = 4 + 4 * (int)(rnd() % 2), cfg->vocab_size = 16;
    cfg->seq_len = 8;
    if (moe) cfg->n_experts = 4, cfg->top_k = 2, cfg->moe_every = 1;
}

/* One simulated rank: its registry, ZeRO's shard and its place in the mesh; only what the
 * norm plan reads is filled in. */
typedef struct {
    loom_param_table table;
    loom_zero zero;
    loom_mesh mesh;
    loom_tp tp;
    loom_grad_sync sync;
    size_t counts[16], displs[16];
} sim_rank;

static void sim_create(sim_rank *s, const loom_model_config *cfg, int dp_rank, int dp, int tp_rank,
                       int tp, int ep, const loom_layer_set *layers, int stage) {
    memset(s, 0, sizeof *s);
    const int ep_rank = dp_rank % ep; /* ep groups: consecutive dp ranks (parallel/mesh.c) */
    assert_int_equal(loom_params_build(&s->table, cfg,
                                       &(loom_params_options){.tp_rank = tp_rank,
                                                              .tp_size = tp,
                                                              .ep_rank = ep_rank,
                                                              .ep_size = ep,
                                                              .layers = layers},
                                       NULL),
                     LOOM_OK);
    s->mesh.layout = (loom_layout){dp, tp, 1, ep, 1};
    s->mesh.dp.rank = dp_rank, s->mesh.dp.size = dp;
    s->mesh.ep.rank = ep_rank, s->mesh.ep.size = ep;
    s->mesh.edp.rank = dp_rank / ep, s->mesh.edp.size = dp / ep;
    s->mesh.tp.rank = tp_rank, s->mesh.tp.size = tp;
    s->zero.stage = dp > 1 ? stage : 0;
    s->zero.table = &s->table;
    s->zero.total = s->table.total;
    s->zero.span_lo = 0, s->zero.span_hi = s->table.total; /* no --freeze: the whole buffer */
    loom_shard_split_rows(&s->table, NULL, LOOM_SHARD_ALL, s->table.total, dp, s->counts,
                          s->displs);
    s->zero.lo = s->zero.stage ? s->displs[dp_rank] : 0;
    s->zero.hi = s->zero.stage ? s->zero.lo + s->counts[dp_rank] : s->table.total;
    s->tp.size = tp, s->tp.rank = tp_rank;
    loom_grad_sync_options o = {&s->table, &s->mesh, &s->zero, NULL, NULL, &s->tp,
                                NULL,      NULL,     NULL,     NULL, NULL};
    assert_int_equal(loom_grad_sync_create(&s->sync, &o, NULL), LOOM_OK);
}

static void sim_free(sim_rank *s) {
    loom_grad_sync_free(&s->sync);
    loom_params_free(&s->table);
}

/* Adds one hit to every global element of the model that rank s's norm runs cover. */
static void count_hits(const sim_rank *s, const loom_param_table *global, int **hits) {
    int n;
    const loom_flat_run *runs = loom_grad_sync_norm_runs(&s->sync, &n);
    for (int k = 0; k < n; k++) {
        if (k > 0) assert_true(runs[k - 1].hi < runs[k].lo); /* flat order, coalesced */
        for (size_t x = runs[k].lo; x < runs[k].hi; x++) {
            int i = 0;
            while (!(s->table.params[i].offset <= x &&
                     x < s->table.params[i].offset + s->table.params[i].numel))
                i++;
            const loom_param *p = &s->table.params[i];
            assert_true(p->counted_in_norm);
            const int g = loom_params_find(global, p->name);
            assert_true(g >= 0);
            hits[g][loom_param_global_index(p, (int64_t)(x - p->offset))]++;
        }
    }
}

static void check_layout(loom_family family, int moe, int dp, int tp, int pp, int ep, int stage) {
    loom_model_config cfg;
    random_config(&cfg, family, moe);
    loom_param_table global;
    assert_int_equal(loom_params_build(&global, &cfg, NULL, NULL), LOOM_OK);
    int **hits = calloc((size_t)global.n_params, sizeof *hits);
    for (int i = 0; i < global.n_params; i++) hits[i] = calloc(global.params[i].numel, sizeof(int));
    const int per = cfg.n_layer / pp;
    for (int s = 0; s < pp; s++) {
        loom_layer_set set = {1, {s * per}, {(s + 1) * per}, s == 0, s == pp - 1};
        for (int d = 0; d < dp; d++)
            for (int t = 0; t < tp; t++) {
                sim_rank r;
                sim_create(&r, &cfg, d, dp, t, tp, ep, &set, stage);
                count_hits(&r, &global, hits);
                sim_free(&r);
            }
    }
    for (int i = 0; i < global.n_params; i++)
        for (size_t e = 0; e < global.params[i].numel; e++)
            if (hits[i][e] != 1)
                fail_msg("%s dp %d tp %d pp %d ep %d ZeRO-%d: %s[%zu] counted %d times",
                         family == LOOM_FAMILY_GPT2 ? "gpt2" : "llama", dp, tp, pp, ep, stage,
                         global.params[i].name, e, hits[i][e]);
    for (int i = 0; i < global.n_params; i++) free(hits[i]);
    free(hits);
    loom_params_free(&global);
}

static void test_norm_counts_every_element_once(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        const loom_family fam = f ? LOOM_FAMILY_LLAMA : LOOM_FAMILY_GPT2;
        for (int stage = 0; stage <= 3; stage++) {
            check_layout(fam, 0, 1, 1, 1, 1, stage);
            check_layout(fam, 0, 2 + (int)(rnd() % 3), 1, 1, 1, stage);
            check_layout(fam, 0, 2, 2, 1, 1, stage);
            check_layout(fam, 0, 2, 1, 2, 1, stage); /* GPT-2: the tied copy */
            check_layout(fam, 0, 1, 2, 2, 1, stage);
        }
        check_layout(fam, 1, 2, 1, 1, 2, 0); /* experts: ZeRO-0 replicas over edp */
        check_layout(fam, 1, 4, 1, 1, 2, 0);
        check_layout(fam, 1, 4, 2, 1, 2, 0);
        check_layout(fam, 1, 2, 1, 2, 2, 0);
    }
}

/* One process, the whole strategy: ranges, norm, step. */
static void test_one_process(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        loom_model_config cfg;
        random_config(&cfg, f ? LOOM_FAMILY_LLAMA : LOOM_FAMILY_GPT2, 0);
        loom_param_table t;
        assert_int_equal(loom_params_build(&t, &cfg, NULL, NULL), LOOM_OK);
        loom_mesh mesh;
        memset(&mesh, 0, sizeof mesh);
        mesh.layout = (loom_layout){1, 1, 1, 1, 1};
        loom_comm_self(&mesh.world, "world");
        loom_comm_self(&mesh.dp, "dp");
        loom_comm_self(&mesh.tp, "tp");
        loom_comm_self(&mesh.ep, "ep");
        loom_comm_self(&mesh.edp, "edp");
        loom_error err;
        loom_zero z;
        assert_int_equal(loom_zero_create(&z, &mesh.dp, 0, &t, 25.0, &err), LOOM_OK);
        loom_tp tp;
        assert_int_equal(loom_tp_create(&tp, &mesh.tp, 0, 8, cfg.d_model, &err), LOOM_OK);
        const size_t P = t.total;
        float *params = malloc(P * sizeof(float)), *grads = loom_zero_grads_alloc(&z);
        float *ref_p = malloc(P * sizeof(float)), *ref_g = malloc(P * sizeof(float));
        float *m = calloc(P, sizeof(float)), *v = calloc(P, sizeof(float));
        loom_params_init(&t, params, rnd());
        memcpy(ref_p, params, P * sizeof(float));
        loom_grad_sync s;
        loom_grad_sync_options o = {&t,     &mesh, &z,   NULL, NULL, &tp,
                                    params, grads, NULL, NULL, &err};
        assert_int_equal(loom_grad_sync_create(&s, &o, &err), LOOM_OK);
        loom_grad_sync_step_begin(&s);
        for (size_t i = 0; i < P; i++)
            grads[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5);
        memcpy(ref_g, grads, P * sizeof(float));
        /* ranges must arrive in decreasing order, tiling [0, P) */
        loom_grad_sync_begin(&s);
        assert_int_equal(loom_grad_sync_ready(&s, 0, P / 2), LOOM_ERR_STATE);
        loom_grad_sync_begin(&s);
        assert_int_equal(loom_grad_sync_ready(&s, P / 2, P), LOOM_OK);
        assert_int_equal(loom_grad_sync_ready(&s, 0, P / 2), LOOM_OK);
        assert_int_equal(loom_grad_sync_finish(&s, &err), LOOM_OK);
        double norm, sq = 0.0;
        assert_int_equal(loom_grad_sync_norm(&s, &norm, &err), LOOM_OK);
        for (size_t i = 0; i < P; i++) sq += (double)ref_g[i] * ref_g[i];
        assert_true(fabs(norm - sqrt(sq)) <= 1e-12 * sqrt(sq));
        const loom_adamw_config cfg_a = {0.9f, 0.95f, 1e-8f, 0.1f, 0.05f}; /* clipping on */
        assert_true(norm > cfg_a.grad_clip);
        assert_int_equal(loom_grad_sync_step(&s, norm, 1e-3f, &cfg_a, 1, &err), LOOM_OK);
        loom_grad_sync_step_end(&s);
        loom_grad_clip(loom_backend_cpu(), ref_g, P, norm, cfg_a.grad_clip);
        loom_adamw_step(loom_backend_cpu(), &t, ref_p, ref_g, m, v, 0, P, 1e-3f, &cfg_a, 1);
        assert_memory_equal(params, ref_p, P * sizeof(float));
        loom_grad_sync_free(&s);
        loom_zero_grads_free(&z, grads);
        loom_zero_free(&z);
        loom_tp_free(&tp);
        free(params), free(ref_p), free(ref_g), free(m), free(v);
        loom_params_free(&t);
    }
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL);
    if (getenv("LOOM_TEST_SEED")) seed = strtoull(getenv("LOOM_TEST_SEED"), NULL, 10);
    g_rng = seed;
    printf("test_grad_sync seed %llu (LOOM_TEST_SEED to repeat)\n", (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norm_counts_every_element_once),
        cmocka_unit_test(test_one_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
