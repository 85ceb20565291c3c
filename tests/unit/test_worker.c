/* The background worker (core/worker.h) the checkpoint writer, the peer copy and the
 * communication engine share: posted jobs run on the thread one at a time and their results
 * (sums of random numbers, against the same sums made here) and failures (the job's own
 * message) reach the owner; while a job runs the owner can neither claim the worker nor
 * see it idle (the job is held at a gate, so this does not depend on timing); stop waits for
 * a running job, runs a job posted just before it, and joins; stop of a worker never
 * started does nothing; a sleeping thread (the start-up watchdog's) wakes after its time
 * when not stopped, and at once, before its time, when stopped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>

#include <cmocka.h>

#include "core/worker.h"
#include "test_common.h"

#define MAX_N 4096

typedef struct {
    loom_worker w;
    /* the job: sum v[0..n), fail when asked */
    uint64_t v[MAX_N];
    int n, fail, jobs_run;
    uint64_t sum;
    /* a gate the job waits at when `gated` (opened by the test) */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gated, gate_open, at_gate;
} job_ctx;

static void *thread_main(void *arg) {
    job_ctx *c = arg;
    while (loom_worker_next(&c->w)) {
        pthread_mutex_lock(&c->gate_mu);
        c->at_gate = 1;
        pthread_cond_broadcast(&c->gate_cv);
        while (c->gated && !c->gate_open) pthread_cond_wait(&c->gate_cv, &c->gate_mu);
        pthread_mutex_unlock(&c->gate_mu);
        uint64_t s = 0;
        for (int i = 0; i < c->n; i++) s += c->v[i];
        c->sum = s;
        c->jobs_run++;
        loom_error e = {0};
        loom_status st =
            c->fail ? loom_error_set(&e, LOOM_ERR_IO, "job %d failed on purpose", c->jobs_run)
                    : LOOM_OK;
        loom_worker_done(&c->w, st, &e);
    }
    return NULL;
}

static job_ctx *ctx_new(void) {
    job_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    pthread_mutex_init(&c->gate_mu, NULL);
    pthread_cond_init(&c->gate_cv, NULL);
    assert_int_equal(loom_worker_start(&c->w, thread_main, c), 0);
    return c;
}

static void ctx_free(job_ctx *c) {
    loom_worker_stop(&c->w);
    assert_int_equal(c->w.started, 0);
    pthread_mutex_destroy(&c->gate_mu);
    pthread_cond_destroy(&c->gate_cv);
    free(c);
}

/* Fills a random job (claim held) and posts it; returns the expected sum. */
static uint64_t post_random(job_ctx *c, int fail) {
    assert_int_equal(loom_worker_claim(&c->w), 1);
    c->n = 1 + (int)(rnd() % MAX_N);
    uint64_t want = 0;
    for (int i = 0; i < c->n; i++) want += c->v[i] = rnd() >> 8;
    c->fail = fail;
    loom_worker_post(&c->w);
    return want;
}

static void test_jobs_and_failures(void **state) {
    (void)state;
    job_ctx *c = ctx_new();
    for (int k = 0; k < 200; k++) {
        const int fail = rnd() % 4 == 0;
        const uint64_t want = post_random(c, fail);
        loom_error err = {0};
        loom_status st = loom_worker_wait(&c->w, &err);
        assert_int_equal(c->jobs_run, k + 1);
        assert_true(c->sum == want);
        assert_true(loom_worker_idle(&c->w));
        if (fail) {
            assert_int_equal(st, LOOM_ERR_IO);
            char expect[64];
            snprintf(expect, sizeof expect, "job %d failed on purpose", k + 1);
            assert_non_null(strstr(err.msg, expect));
        } else {
            assert_int_equal(st, LOOM_OK); /* a failure does not outlive its job */
        }
    }
    ctx_free(c);
}

static void wait_at_gate(job_ctx *c) {
    pthread_mutex_lock(&c->gate_mu);
    while (!c->at_gate) pthread_cond_wait(&c->gate_cv, &c->gate_mu);
    pthread_mutex_unlock(&c->gate_mu);
}

static void open_gate(job_ctx *c) {
    pthread_mutex_lock(&c->gate_mu);
    c->gate_open = 1;
    pthread_cond_broadcast(&c->gate_cv);
    pthread_mutex_unlock(&c->gate_mu);
}

static void test_busy_while_running(void **state) {
    (void)state;
    job_ctx *c = ctx_new();
    c->gated = 1;
    const uint64_t want = post_random(c, 0);
    wait_at_gate(c);
    assert_false(loom_worker_idle(&c->w));
    assert_int_equal(loom_worker_claim(&c->w), 0); /* mu released: the job can finish */
    open_gate(c);
    assert_int_equal(loom_worker_wait(&c->w, NULL), LOOM_OK);
    assert_true(c->sum == want);
    assert_int_equal(loom_worker_claim(&c->w), 1);
    loom_worker_post(&c->w); /* an ungated second job on the same data */
    assert_int_equal(loom_worker_wait(&c->w, NULL), LOOM_OK);
    assert_int_equal(c->jobs_run, 2);
    ctx_free(c);
}

/* Stop while a job is held at the gate: stop must wait for it, so the gate is opened from
 * another thread only once stop is already waiting. */
static void *open_later(void *arg) {
    job_ctx *c = arg;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    open_gate(c);
    return NULL;
}

static void test_stop_waits_for_the_job(void **state) {
    (void)state;
    job_ctx *c = ctx_new();
    c->gated = 1;
    const uint64_t want = post_random(c, 0);
    wait_at_gate(c);
    pthread_t opener;
    assert_int_equal(pthread_create(&opener, NULL, open_later, c), 0);
    loom_worker_stop(&c->w);
    pthread_join(opener, NULL);
    assert_int_equal(c->jobs_run, 1);
    assert_true(c->sum == want);
    loom_worker_stop(&c->w); /* stopped already: nothing */
    ctx_free(c);
}

/* A job posted and stopped at once still runs: the thread may not have taken it yet, and
 * stop must not let it see the stop flag first. */
static void test_stop_right_after_post(void **state) {
    (void)state;
    for (int k = 0; k < 50; k++) {
        job_ctx *c = ctx_new();
        const uint64_t want = post_random(c, 0);
        loom_worker_stop(&c->w);
        assert_int_equal(c->jobs_run, 1);
        assert_true(c->sum == want);
        ctx_free(c);
    }
}

static void test_stop_never_started(void **state) {
    (void)state;
    loom_worker w;
    memset(&w, 0, sizeof w);
    loom_worker_stop(&w);
    assert_int_equal(w.started, 0);
}

/* The watchdog's use: the thread sleeps until its time or the stop. */
typedef struct {
    loom_worker w;
    double seconds;
    int slept, done;
    double took_s;
} sleep_ctx;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *sleeper(void *arg) {
    sleep_ctx *c = arg;
    const double t0 = now_s();
    c->slept = loom_worker_sleep(&c->w, c->seconds);
    c->took_s = now_s() - t0;
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_sleep_until_time_or_stop(void **state) {
    (void)state;
    sleep_ctx c = {.seconds = 0.02 + 0.03 * (double)(rnd() % 1000) / 1000.0};
    assert_int_equal(loom_worker_start(&c.w, sleeper, &c), 0);
    struct timespec ts = {0, 5 * 1000 * 1000};
    while (!__atomic_load_n(&c.done, __ATOMIC_ACQUIRE)) nanosleep(&ts, NULL); /* no stop yet */
    loom_worker_stop(&c.w);
    assert_int_equal(c.slept, 1);
    assert_true(c.took_s >= c.seconds - 1e-6); /* the deadline rounds to ns */
    sleep_ctx d = {.seconds = 600};
    assert_int_equal(loom_worker_start(&d.w, sleeper, &d), 0);
    loom_worker_stop(&d.w); /* joins: the sleep ended with the stop, not its 600 s */
    assert_int_equal(d.slept, 0);
    assert_true(d.took_s < 60);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_worker: seed %u (LOOM_TEST_SEED to repeat)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_and_failures),
        cmocka_unit_test(test_busy_while_running),
        cmocka_unit_test(test_stop_waits_for_the_job),
        cmocka_unit_test(test_stop_right_after_post),
        cmocka_unit_test(test_stop_never_started),
        cmocka_unit_test(test_sleep_until_time_or_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
