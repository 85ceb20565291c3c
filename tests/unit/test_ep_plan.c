/* Checkpoints with expert parallelism (parallel/ep.c loom_ep_plan_written): for random dp
 * and ep, every dp rank plans its dp shard of the dense tensors and its edp share of its
 * own experts; across the ranks every element of every tensor of the unsharded model must
 * be planned exactly once, and each piece must read, from the rank's local buffer, the
 * values of the global tensor at its box (initialisation is by name and element, so the
 * same values in every layout). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "model/params.h"
#include "parallel/ep.h"
#include "test_common.h"
#include "train/ckpt_tensors.h"

static void check_layout(loom_family family, int dp, int ep) {
    loom_model_config cfg;
    assert_int_equal(
        loom_model_preset(&cfg, family == LOOM_FAMILY_GPT2 ? "gpt2-tiny" : "llama-tiny", NULL),
        LOOM_OK);
    cfg.n_layer = 2 + (int)(rnd() % 2), cfg.d_model = 8, cfg.n_head = 2, cfg.n_kv_head = 2;
    cfg.d_ff = 4 + 2 * (int)(rnd() % 3), cfg.vocab_size = 16, cfg.seq_len = 8;
    cfg.n_experts = 8, cfg.top_k = 2, cfg.moe_every = 1 + (int)(rnd() % 2);
    cfg.shared_expert = (int)(rnd() % 2);
    loom_param_table global;
    assert_int_equal(loom_params_build(&global, &cfg, NULL, NULL), LOOM_OK);
    const uint64_t seed = rnd();
    float *gflat = malloc(global.total * sizeof(float));
    loom_params_init(&global, gflat, seed);
    int **hits = calloc((size_t)global.n_params, sizeof *hits);
    for (int i = 0; i < global.n_params; i++) hits[i] = calloc(global.params[i].numel, sizeof(int));
    for (int r = 0; r < dp; r++) {
        loom_param_table t; /* ep groups are consecutive dp ranks (parallel/mesh.c) */
        assert_int_equal(loom_params_build(&t, &cfg,
                                           &(loom_params_options){.ep_rank = r % ep, .ep_size = ep},
                                           NULL),
                         LOOM_OK);
        float *flat = malloc(t.total * sizeof(float));
        loom_params_init(&t, flat, seed);
        /* any dense partition over dp works: an uneven one */
        const size_t lo = t.total * (size_t)r / (size_t)dp, hi = t.total * (size_t)(r + 1) / dp;
        loom_ckpt_descs ct;
        assert_int_equal(loom_ckpt_tensors_describe(&ct, &t, NULL), LOOM_OK);
        loom_ckpt_plan plan = {0};
        assert_int_equal(
            loom_ep_plan_written(&plan, &t, &ct, LOOM_CKPT_PARAMS, lo, hi, r / ep, dp / ep, NULL),
            LOOM_OK);
        for (int i = 0; i < plan.n; i++) {
            const loom_ckpt_piece *q = &plan.items[i];
            const loom_param *p = &t.params[q->tensor];
            const int gi = loom_params_find(&global, p->name);
            assert_true(gi >= 0);
            const loom_param *g = &global.params[gi];
            const int64_t cols = g->ndim == 2 ? g->global_shape[1] : 1;
            for (int64_t a = 0; a < q->box.len[0]; a++)
                for (int64_t b = 0; b < q->box.len[1]; b++) {
                    const int64_t e = (q->box.off[0] + a) * cols + q->box.off[1] + b;
                    hits[gi][e]++;
                    assert_float_equal(flat[q->local + (size_t)(a * q->stride + b)],
                                       gflat[g->offset + (size_t)e], 0);
                }
        }
        loom_ckpt_plan_free(&plan);
        loom_ckpt_descs_free(&ct);
        free(flat);
        loom_params_free(&t);
    }
    for (int i = 0; i < global.n_params; i++) {
        for (size_t e = 0; e < global.params[i].numel; e++) {
            if (hits[i][e] != 1)
                fail_msg("%s element %zu written %d times (dp %d, ep %d)", global.params[i].name, e,
                         hits[i][e], dp, ep);
        }
        free(hits[i]);
    }
    free(hits);
    free(gflat);
    loom_params_free(&global);
}

static void test_written_once(void **state) {
    (void)state;
    const int layouts[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 4}, {8, 2}, {8, 4}, {8, 8}};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
            check_layout(f ? LOOM_FAMILY_LLAMA : LOOM_FAMILY_GPT2, layouts[i][0], layouts[i][1]);
}

int main(void) {
    const char *s = getenv("LOOM_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("LOOM_TEST_SEED=%llu\n", (unsigned long long)seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_written_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
