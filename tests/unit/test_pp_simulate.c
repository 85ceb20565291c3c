/* The pipeline schedule simulator (pipeline/schedule.h) with each virtual stage's own
 * durations and ranks that share processors, on random durations (the seed is printed;
 * LOOM_TEST_SEED repeats a run), every schedule: with a processor each and even stages it
 * is loom_pp_schedule_simulate, and 1F1B/GPipe take (m + p - 1)(F + B); with one
 * processor for all the step is the sum of all the work (something always runs); with as
 * many processors as ranks it is the unshared step; fewer processors never shorten it; a
 * rank's busy time is its work when unshared; with the last stage the slowest, 1F1B takes
 * the first micro-batch's way there, the last stage's work and the way back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pipeline/schedule.h"
#include "test_common.h"

static double uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(rnd() >> 11) / 9007199254740992.0;
}

static void close_to(double got, double want, const char *what) {
    if (fabs(got - want) > 1e-9 * (fabs(want) + 1))
        fail_msg("%s: simulated %.12g, expected %.12g", what, got, want);
}

/* A random schedule: kind, pp, micro-batches, chunks. */
static void build(loom_pp_schedule *s, loom_pp_kind kind) {
    loom_error err = {0};
    const int pp = 2 + (int)(rnd() % 4), v = kind == LOOM_PP_INTERLEAVED ? 2 : 1;
    const int m = kind == LOOM_PP_INTERLEAVED ? pp * (1 + (int)(rnd() % 3)) : pp + (int)(rnd() % 7);
    if (loom_pp_schedule_build(s, kind, pp, m, v, &err) != LOOM_OK) fail_msg("%s", err.msg);
}

static double work_of(const loom_pp_schedule *s, const double (*dur)[3], int r) {
    double w = 0;
    for (int c = 0; c < s->v; c++) {
        const double *d = dur[c * s->pp + r];
        w += s->m * (d[LOOM_PP_F] + d[LOOM_PP_B] + d[LOOM_PP_W]);
    }
    return w;
}

static void test_even_stages(void **state) {
    (void)state;
    for (int it = 0; it < 40; it++) {
        const loom_pp_kind kind = (loom_pp_kind)(it % 4);
        loom_pp_schedule s;
        build(&s, kind);
        const double F = uniform(0.5, 2), B = uniform(1, 3), W = s.split ? uniform(0.2, 1) : 0;
        const double one[3] = {F, B, W};
        double each[LOOM_PP_MAX_STAGES * 2][3], idle[LOOM_PP_MAX_STAGES], idle2[LOOM_PP_MAX_STAGES],
            busy[LOOM_PP_MAX_STAGES];
        for (int k = 0; k < s.pp * s.v; k++)
            for (int o = 0; o < 3; o++) each[k][o] = one[o];
        const double a = loom_pp_schedule_simulate(&s, one, idle, NULL);
        const double b =
            loom_pp_schedule_simulate_shared(&s, (const double(*)[3])each, 0, idle2, busy, NULL);
        close_to(b, a, "even stages against loom_pp_schedule_simulate");
        for (int r = 0; r < s.pp; r++) {
            close_to(idle2[r], idle[r], "idle");
            close_to(busy[r], work_of(&s, (const double(*)[3])each, r), "busy is the work");
        }
        if (kind == LOOM_PP_GPIPE || kind == LOOM_PP_1F1B)
            close_to(a, (s.m + s.pp - 1) * (F + B), "(m + p - 1)(F + B)");
        loom_pp_schedule_free(&s);
    }
}

static void test_shared_processors(void **state) {
    (void)state;
    for (int it = 0; it < 60; it++) {
        const loom_pp_kind kind = (loom_pp_kind)(it % 4);
        loom_pp_schedule s;
        build(&s, kind);
        double each[LOOM_PP_MAX_STAGES * 2][3];
        double all = 0;
        for (int k = 0; k < s.pp * s.v; k++) {
            each[k][LOOM_PP_F] = uniform(0.2, 3), each[k][LOOM_PP_B] = uniform(0.2, 5);
            each[k][LOOM_PP_W] = s.split ? uniform(0.1, 2) : uniform(0, 1);
        }
        const double(*dur)[3] = (const double(*)[3])each;
        for (int r = 0; r < s.pp; r++) all += work_of(&s, dur, r);
        const double alone = loom_pp_schedule_simulate_shared(&s, dur, 0, NULL, NULL, NULL);
        const double one = loom_pp_schedule_simulate_shared(&s, dur, 1, NULL, NULL, NULL);
        close_to(one, all, "one processor: the sum of the work");
        close_to(loom_pp_schedule_simulate_shared(&s, dur, s.pp, NULL, NULL, NULL), alone,
                 "a processor per rank");
        double last = one;
        for (double slots = 1.25; slots < s.pp; slots += 0.5) {
            const double t = loom_pp_schedule_simulate_shared(&s, dur, slots, NULL, NULL, NULL);
            if (t > last * (1 + 1e-12) || t < alone * (1 - 1e-12))
                fail_msg("slots %.2f: %.6g outside [%.6g, %.6g]", slots, t, alone, last);
            last = t;
        }
        /* never below the busiest rank's work, nor the work over the processors */
        double busiest = 0;
        for (int r = 0; r < s.pp; r++)
            if (work_of(&s, dur, r) > busiest) busiest = work_of(&s, dur, r);
        const double two = loom_pp_schedule_simulate_shared(&s, dur, 2, NULL, NULL, NULL);
        assert_true(two >= busiest * (1 - 1e-12) && two >= all / 2 * (1 - 1e-12));
        loom_pp_schedule_free(&s);
    }
}

/* 1F1B with a slow last stage (a language model's head): it never waits once the first
 * micro-batch has arrived, so the step is that way in, its m F + B, and the way back. */
static void test_slow_last_stage(void **state) {
    (void)state;
    for (int it = 0; it < 30; it++) {
        loom_pp_schedule s;
        build(&s, LOOM_PP_1F1B);
        double each[LOOM_PP_MAX_STAGES][3], in = 0, back = 0;
        const int L = s.pp - 1;
        each[L][LOOM_PP_F] = uniform(2, 4), each[L][LOOM_PP_B] = uniform(4, 8);
        each[L][LOOM_PP_W] = 0;
        for (int r = 0; r < L; r++) {
            each[r][LOOM_PP_F] = uniform(0.2, 1), each[r][LOOM_PP_B] = uniform(0.4, 2);
            each[r][LOOM_PP_W] = 0;
            in += each[r][LOOM_PP_F], back += each[r][LOOM_PP_B];
        }
        const double want = in + s.m * (each[L][LOOM_PP_F] + each[L][LOOM_PP_B]) + back;
        close_to(
            loom_pp_schedule_simulate_shared(&s, (const double(*)[3])each, 0, NULL, NULL, NULL),
            want, "slow last stage");
        loom_pp_schedule_free(&s);
    }
}

int main(void) {
    const char *seed = getenv("LOOM_TEST_SEED");
    g_rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    printf("test_pp_simulate: seed %llu (LOOM_TEST_SEED repeats it)\n", (unsigned long long)g_rng);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_even_stages),
        cmocka_unit_test(test_shared_processors),
        cmocka_unit_test(test_slow_last_stage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
