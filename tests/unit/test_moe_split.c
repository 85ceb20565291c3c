/* Split backward (zero-bubble pipelines) of MoE blocks: B (input gradients, keeping what
 * W needs) followed by W (weight gradients) gives bitwise the gradients of the ordinary
 * backward, for both families, MoE in every layer or every second, with and without the
 * shared expert and with the dispatch cut into chunks (model/moe.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/model.h"

static unsigned seed_value;

static void check(loom_family family, int variant) {
    loom_model_config c = {family,
                           3,
                           4,
                           family == LOOM_FAMILY_GPT2 ? 4 : 2,
                           24,
                           40,
                           53,
                           9,
                           1e-5f,
                           10000.0f,
                           4,
                           1 + variant % 2,
                           1 + variant / 2 % 2,
                           (variant / 4) % 2,
                           variant % 3 ? 1.0f : 0.0f,
                           0.01f,
                           0.001f,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0};
    const int B = 2, chunks = 1 + (int)(seed_value % 3);
    loom_model whole, split;
    loom_error err = {0};
    assert_int_equal(
        loom_model_create(&whole, &(loom_model_options){.cfg = &c, .B = B, .T = c.seq_len}, &err),
        LOOM_OK);
    assert_int_equal(loom_model_create(
                         &split,
                         &(loom_model_options){
                             .cfg = &c, .B = B, .T = c.seq_len, .flags = LOOM_MODEL_SPLIT_BACKWARD},
                         &err),
                     LOOM_OK);
    assert_int_equal(loom_moe_set_chunks(whole.moe, chunks, &err), LOOM_OK);
    assert_int_equal(loom_moe_set_chunks(split.moe, chunks, &err), LOOM_OK);
    const size_t P = whole.table.total;
    assert_int_equal(split.table.total, P);
    float *params = malloc(P * sizeof(float));
    float *g1 = calloc(P, sizeof(float)), *g2 = calloc(P, sizeof(float));
    loom_params_init(&whole.table, params, seed_value);
    for (size_t i = 0; i < P; i++) params[i] *= 4.0f; /* routes that differ by token */
    srand(seed_value + (unsigned)variant);
    for (int t = 0; t < B * c.seq_len; t++) {
        whole.inputs[t] = split.inputs[t] = rand() % c.vocab_size;
        whole.targets[t] = split.targets[t] = rand() % c.vocab_size;
    }
    const float dloss = 1.0f / (float)(B * c.seq_len);
    assert_int_equal(loom_model_forward(&whole, params), LOOM_OK);
    double l1 = loom_model_loss_and_dlogits(&whole, dloss);
    assert_int_equal(loom_model_backward(&whole, params, g1, NULL, NULL), LOOM_OK);
    const int L = c.n_layer;
    const float *out = NULL;
    assert_int_equal(loom_model_embed_forward(&split, params), LOOM_OK);
    assert_int_equal(loom_model_blocks_forward(&split, params, 0, L, split.embed, &out), LOOM_OK);
    assert_int_equal(loom_model_head_forward(&split, params, out), LOOM_OK);
    double l2 = loom_model_loss_and_dlogits(&split, dloss);
    assert_int_equal(loom_model_head_backward(&split, params, g2, out), LOOM_OK);
    assert_int_equal(loom_model_blocks_backward(&split, params, g2, 0, L, split.embed, NULL, NULL),
                     LOOM_OK);
    assert_int_equal(
        loom_model_blocks_backward_weight(&split, params, g2, 0, L, split.embed, NULL, NULL),
        LOOM_OK);
    assert_int_equal(loom_model_head_backward_weight(&split, g2), LOOM_OK);
    assert_int_equal(loom_model_embed_backward(&split, params, g2), LOOM_OK);
    size_t nonzero = 0, differ = 0;
    for (size_t i = 0; i < P; i++) {
        nonzero += g1[i] != 0.0f;
        differ += memcmp(&g1[i], &g2[i], sizeof(float)) != 0;
    }
    if (differ || l1 != l2)
        printf("seed %u: %s variant %d, %d chunks: %zu of %zu gradients differ, loss %.9g vs "
               "%.9g\n",
               seed_value, loom_family_name(family), variant, chunks, differ, P, l1, l2);
    assert_true(l1 == l2);
    assert_int_equal(differ, 0);
    assert_true(nonzero > P / 2); /* a real gradient, not zeros */
    free(params), free(g1), free(g2);
    loom_model_destroy(&whole);
    loom_model_destroy(&split);
}

static void test_split_equals_whole(void **state) {
    (void)state;
    for (int variant = 0; variant < 8; variant++) {
        check(LOOM_FAMILY_GPT2, variant);
        check(LOOM_FAMILY_LLAMA, variant);
    }
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    seed_value = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_moe_split: seed %u (LOOM_TEST_SEED to repeat)\n", seed_value);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_split_equals_whole)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
