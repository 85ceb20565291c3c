#include "core/worker.h"

#include <string.h>
#include <time.h>

int loom_worker_start(loom_worker *w, void *(*fn)(void *), void *arg) {
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    int rc = pthread_create(&w->thread, NULL, fn, arg);
    if (rc != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        return rc;
    }
    w->started = 1;
    return 0;
}

void loom_worker_stop(loom_worker *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    while (w->busy) pthread_cond_wait(&w->cv, &w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    w->started = 0;
}

int loom_worker_claim(loom_worker *w) {
    pthread_mutex_lock(&w->mu);
    if (!w->busy) return 1;
    pthread_mutex_unlock(&w->mu);
    return 0;
}

void loom_worker_post(loom_worker *w) {
    w->busy = 1;
    w->failed = 0;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int loom_worker_idle(loom_worker *w) {
    pthread_mutex_lock(&w->mu);
    int idle = !w->busy;
    pthread_mutex_unlock(&w->mu);
    return idle;
}

loom_status loom_worker_wait(loom_worker *w, loom_error *err) {
    pthread_mutex_lock(&w->mu);
    while (w->busy) pthread_cond_wait(&w->cv, &w->mu);
    int failed = w->failed;
    pthread_mutex_unlock(&w->mu);
    if (failed && err) *err = w->job_err;
    return failed ? w->job_err.code : LOOM_OK;
}

int loom_worker_next(loom_worker *w) {
    pthread_mutex_lock(&w->mu);
    while (!w->busy && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    int go = !w->stop;
    pthread_mutex_unlock(&w->mu);
    return go;
}

int loom_worker_sleep(loom_worker *w, double seconds) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)seconds;
    deadline.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!w->stop)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &deadline) != 0) break;
    int slept = !w->stop;
    pthread_mutex_unlock(&w->mu);
    return slept;
}

void loom_worker_done(loom_worker *w, loom_status st, const loom_error *e) {
    pthread_mutex_lock(&w->mu);
    w->failed = st != LOOM_OK;
    w->job_err = *e;
    w->busy = 0;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
