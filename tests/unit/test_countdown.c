/* Countdown (rl/countdown.h): every drawn instance's worked answer is verified correct,
 * with a target in range and the prompt in its format; held-out instances are never
 * training ones; the verifier on hand-made cases (exact rationals, each number at most
 * once, a number not given, a wrong target, a missing newline, leading zeros, garbage);
 * the arithmetic prompts are not Countdown's; random strings as completions and prompts. Random
 * seeds per run; the seed is printed and LOOM_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <inttypes.h>
#include <time.h>
#include <unistd.h>

#include "rl/countdown.h"
#include "rl/reward.h"

static float verify(const char *prompt, const char *completion) {
    return loom_reward_countdown(prompt, strlen(prompt), completion, strlen(completion));
}

static void test_drawn_answers_verify(void **state) {
    (void)state;
    for (int trial = 0; trial < 6; trial++) {
        const uint64_t seed = rnd();
        const int count = 2 + (int)(rnd() % 4), max = 5 + (int)(rnd() % 60);
        for (int val = 0; val < 2; val++)
            for (uint64_t k = 0; k < 300; k++) {
                char p[96], a[96];
                loom_countdown_draw(seed, val, k, count, max, p, a);
                int spaces = 0;
                for (const char *c = p; *c; c++) spaces += *c == ' ';
                const char *gt = strchr(p, '>');
                assert_non_null(gt);
                const int target = atoi(gt + 1);
                assert_int_equal(spaces, count - 1);
                assert_true(target >= 1 && target <= LOOM_COUNTDOWN_MAX_TARGET);
                assert_int_equal(p[strlen(p) - 1], '=');
                if (verify(p, a) != 1.0f)
                    fail_msg("seed %" PRIu64 ": '%s' '%s' not verified", seed, p, a);
                assert_true(loom_reward_arith(p, strlen(p), a, strlen(a)) == 1.0f);
            }
    }
}

static void test_split_disjoint(void **state) {
    (void)state;
    const uint64_t seed = rnd();
    enum { N = 3000, V = 300 };
    static char train[N][96];
    char a[96];
    for (int k = 0; k < N; k++) loom_countdown_draw(seed, 0, (uint64_t)k, 2, 9, train[k], a);
    for (int k = 0; k < V; k++) {
        char p[96];
        loom_countdown_draw(seed, 1, (uint64_t)k, 2, 9, p, a);
        for (int t = 0; t < N; t++)
            if (strcmp(p, train[t]) == 0)
                fail_msg("seed %" PRIu64 ": held-out '%s' is a training instance", seed, p);
    }
}

static void test_verifier_cases(void **state) {
    (void)state;
    const char *p = "3 7 25>54=";
    assert_true(verify(p, "(25-7)*3\n") == 1.0f);
    assert_true(verify(p, "3*(25-7)\n") == 1.0f);
    assert_true(verify(p, "(25-7)*3") == 0.0f);     /* no newline */
    assert_true(verify(p, "(25-7)*3\n\n") == 0.0f); /* more after the newline */
    assert_true(verify(p, "25-7*3\n") == 0.0f);     /* 4: precedence counts */
    assert_true(verify(p, "(25-7)*3*3\n") == 0.0f); /* 3 used twice */
    assert_true(verify(p, "(25-8)*3\n") == 0.0f);   /* 8 not given */
    assert_true(verify(p, "(25-07)*3\n") == 0.0f);  /* leading zero */
    assert_true(verify(p, "((25-7)*3\n") == 0.0f);
    assert_true(verify(p, "\n") == 0.0f);
    assert_true(verify(p, "54\n") == 0.0f);
    assert_true(verify("2 7 4>14=", "7/2*4\n") == 1.0f); /* exact rationals in between */
    assert_true(verify("2 7>3=", "7/2\n") == 0.0f);      /* 3.5 */
    assert_true(verify("5 5>1=", "5/5\n") == 1.0f);      /* equal numbers: each once */
    assert_true(verify("5 6>0=", "5/(6-6)\n") == 0.0f);
    assert_true(verify("4 9>13=", "9+4\n") == 1.0f); /* a subset or all, any order */
    assert_true(verify("4 9 2>9=", "9\n") == 1.0f);
    /* not Countdown prompts */
    assert_true(verify("12+34=", "46\n") < 0.0f);
    assert_true(verify("3 7 25>54", "(25-7)*3\n") < 0.0f);
    assert_true(verify("3 7 25=", "1\n") < 0.0f);
    assert_true(loom_reward_arith("12+34=", 6, "46\n", 3) == 1.0f);
    /* random strings over the expression alphabet: 0 or 1, never more (ASan: no overrun) */
    const char alphabet[] = "0123456789+-*/() \n";
    for (int k = 0; k < 5000; k++) {
        char c[24];
        const size_t n = 1 + rnd() % sizeof c;
        for (size_t i = 0; i < n; i++) c[i] = alphabet[rnd() % (sizeof alphabet - 1)];
        const float r = loom_reward_countdown(p, strlen(p), c, n);
        assert_true(r == 0.0f || r == 1.0f);
        const float q = loom_reward_countdown(c, n, p, strlen(p)); /* as a prompt */
        assert_true(q == -1.0f || q == 0.0f || q == 1.0f);
    }
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
    printf("test_countdown seed: %" PRIu64 " (LOOM_TEST_SEED overrides)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drawn_answers_verify),
        cmocka_unit_test(test_split_disjoint),
        cmocka_unit_test(test_verifier_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
