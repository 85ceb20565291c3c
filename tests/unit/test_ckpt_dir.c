/* Checkpoint folders (ckpt/ckpt_dir.h): loom_ckpt_list finds exactly the step_NNNNNNNN
 * folders, newest first, appended after what the list held; an empty or missing folder
 * adds nothing and leaves a NULL list NULL (under the sanitizers: no NULL into qsort).
 * Random steps and decoy names per run; the seed is printed and LOOM_TEST_SEED overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <inttypes.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_dir.h"

static void make_dir(const char *root, const char *name) {
    char path[LOOM_CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, name);
    assert_int_equal(mkdir(path, 0755), 0);
}

static void test_empty_and_missing(void **state) {
    const char *root = *state;
    char empty[LOOM_CKPT_PATH_MAX], missing[LOOM_CKPT_PATH_MAX];
    snprintf(empty, sizeof empty, "%s/empty", root);
    snprintf(missing, sizeof missing, "%s/missing", root);
    assert_int_equal(mkdir(empty, 0755), 0);
    loom_ckpt_entry *list = NULL;
    assert_int_equal(loom_ckpt_list(empty, &list, 0), 0);
    assert_null(list);
    assert_int_equal(loom_ckpt_list(missing, &list, 0), 0);
    assert_null(list);
    make_dir(empty, "step_0000001"); /* seven digits: not a step folder */
    make_dir(empty, "latest.tmp");
    assert_int_equal(loom_ckpt_list(empty, &list, 0), 0);
    assert_null(list);
}

static int descending(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

static void test_newest_first_appended(void **state) {
    const char *root = *state;
    const uint64_t seed = rnd();
    enum { MAX = 40 };
    char a[LOOM_CKPT_PATH_MAX], b[LOOM_CKPT_PATH_MAX];
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    assert_int_equal(mkdir(a, 0755), 0);
    assert_int_equal(mkdir(b, 0755), 0);
    int64_t steps[2][MAX];
    int n[2] = {1 + (int)(rnd() % MAX), 1 + (int)(rnd() % MAX)};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < n[d]; i++) {
            int64_t s;
            int dup;
            do { /* distinct steps, up to the eight digits' 99999999 */
                s = (int64_t)(rnd() % 100000000ull);
                dup = 0;
                for (int j = 0; j < i; j++) dup |= steps[d][j] == s;
            } while (dup);
            steps[d][i] = s;
            char name[32];
            snprintf(name, sizeof name, "step_%08" PRId64, s);
            make_dir(d ? b : a, name);
        }
    make_dir(a, "step_1234567x"); /* decoys: a letter, a suffix, another prefix */
    make_dir(a, "step_000000010");
    make_dir(b, "stage_00000001");
    loom_ckpt_entry *list = NULL;
    const int na = loom_ckpt_list(a, &list, 0);
    const int nb = loom_ckpt_list(b, &list, na);
    if (na != n[0] || nb != n[0] + n[1])
        fail_msg("seed %" PRIu64 ": listed %d then %d, expected %d then %d", seed, na, nb, n[0],
                 n[0] + n[1]);
    for (int d = 0, at = 0; d < 2; at += n[d], d++) {
        qsort(steps[d], (size_t)n[d], sizeof steps[d][0], descending);
        for (int i = 0; i < n[d]; i++) {
            char want[LOOM_CKPT_PATH_MAX];
            loom_ckpt_step_dir(want, sizeof want, d ? b : a, steps[d][i]);
            if (list[at + i].step != steps[d][i] || strcmp(list[at + i].path, want) != 0)
                fail_msg("seed %" PRIu64 ": entry %d is %s (%" PRId64 "), expected %s", seed,
                         at + i, list[at + i].path, list[at + i].step, want);
        }
    }
    free(list);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
    printf("test_ckpt_dir seed: %" PRIu64 " (LOOM_TEST_SEED overrides)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_empty_and_missing, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_newest_first_appended, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
