/* --balance-dp's assignment (data/vlm_balance.h) on random vlm shards (samples with 0 to
 * K images) and random steps, parts and costs: every part gets exactly per_part positions
 * and each position one part; the loads are the costs' sums; the plan is a function of
 * (seed, step); balanced 0 is the usual slices; balanced 1 is never slower than the
 * slices; a part's records are
 * its positions' records in position order. Random inputs per run; the seed is printed and
 * LOOM_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/vlm_balance.h"
#include "data/vlm_shard.h"

enum { IMG = 2, P = 1, T = 16 }; /* 2 x 2 gray images of one 2 x 2 patch */

static int rnd_in(int lo, int hi) {
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

/* A shard of n samples with 0..K images each into dir/train_000000.bin, opened. */
static void open_random(const char *dir, int n, int K, loom_vlm_dataset *ds) {
    loom_vlm_writer w;
    loom_error err = {0};
    loom_vlm_writer_init(&w, 1, IMG, IMG, LOOM_VLM_BYTE_IMAGE, LOOM_VLM_BYTE_EOT);
    for (int s = 0; s < n; s++) {
        const int k = rnd_in(0, K);
        int32_t tok[T];
        uint8_t mask[T], px[8 * IMG * IMG];
        int m = 0;
        for (int i = 0; i < k; i++) {
            tok[m] = LOOM_VLM_BYTE_IMAGE, mask[m++] = 0;
            tok[m] = 'a' + i, mask[m++] = 1;
        }
        tok[m] = 'z', mask[m++] = 1;
        for (int i = 0; i < k * IMG * IMG; i++) px[i] = (uint8_t)rnd();
        assert_int_equal(loom_vlm_writer_put(&w, tok, mask, m, px, k, &err), LOOM_OK);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    assert_int_equal(loom_vlm_writer_finish(&w, path, &err), LOOM_OK);
    const loom_vlm_record_shape shape = {T, P, K, 1, IMG, IMG};
    if (loom_vlm_dataset_open(ds, path, &shape, 258, &err) != LOOM_OK)
        fail_msg("open: %s", err.msg);
}

static void test_balance(void **state) {
    for (int round = 0; round < 40; round++) {
        const int K = rnd_in(1, 4);
        loom_vlm_dataset ds;
        open_random(*state, rnd_in(4, 60), K, &ds);
        const int parts = rnd_in(2, 5), per = rnd_in(1, 9);
        const double image = 0.1 + (double)(rnd() % 1000) / 100.0;
        const double sample = 0.1 + (double)(rnd() % 1000) / 100.0;
        loom_vlm_balance plain, bal;
        loom_error err = {0};
        assert_int_equal(loom_vlm_balance_init(&plain, parts, per, K, image, sample, 0, &err),
                         LOOM_OK);
        assert_int_equal(loom_vlm_balance_init(&bal, parts, per, K, image, sample, 1, &err),
                         LOOM_OK);
        const int words = loom_vlm_record_size(&ds.rec), total = parts * per;
        int32_t *got = malloc((size_t)per * words * sizeof(int32_t));
        int32_t *want = malloc((size_t)words * sizeof(int32_t));
        int *owners = malloc((size_t)total * sizeof(int));
        assert_non_null(got);
        assert_non_null(want);
        assert_non_null(owners);
        for (int step = 0; step < 6; step++) {
            const uint64_t seed = rnd();
            loom_vlm_balance_plan(&plain, &ds, seed, step);
            loom_vlm_balance_plan(&bal, &ds, seed, step);
            for (int i = 0; i < total; i++) {
                assert_int_equal(plain.owner[i], i / per);
                assert_true(bal.owner[i] >= 0 && bal.owner[i] < parts);
                assert_true(bal.idx[i] == loom_vlm_dataset_index(&ds, seed, step, i));
            }
            double sum = 0.0, max = 0.0;
            for (int d = 0; d < parts; d++) {
                int count = 0;
                double load = 0.0;
                for (int i = 0; i < total; i++)
                    if (bal.owner[i] == d) count++, load += sample + bal.images[i] * image;
                assert_int_equal(count, per);
                assert_true(fabs(load - bal.load[d]) <= 1e-9 * (1.0 + load));
                sum += load;
                if (load > max) max = load;
            }
            assert_true(fabs(bal.max_over_mean - max * parts / sum) <= 1e-12);
            assert_true(bal.max_over_mean <= plain.max_over_mean + 1e-12);
            assert_true(fabs(bal.slices_max_over_mean - plain.max_over_mean) <= 1e-12);
            /* the same plan again */
            memcpy(owners, bal.owner, (size_t)total * sizeof(int));
            loom_vlm_balance_plan(&bal, &ds, seed, step);
            assert_memory_equal(owners, bal.owner, (size_t)total * sizeof(int));
            /* a part's records: its positions in order */
            const int d = rnd_in(0, parts - 1);
            loom_vlm_balance_records(&bal, &ds, d, got);
            int k = 0;
            for (int i = 0; i < total; i++) {
                if (bal.owner[i] != d) continue;
                loom_vlm_dataset_record(&ds, bal.idx[i], want);
                assert_memory_equal(got + (size_t)k++ * words, want, (size_t)words * 4);
            }
        }
        free(got);
        free(want);
        free(owners);
        loom_vlm_balance_free(&plain);
        loom_vlm_balance_free(&bal);
        loom_vlm_dataset_close(&ds);
    }
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed =
        env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    g_rng = seed;
    printf("test_vlm_balance: LOOM_TEST_SEED=%" PRIu64 "\n", seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_balance, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
