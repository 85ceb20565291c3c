/* A background worker thread: the thread, its mutex and condition variable, start and
 * stop, and the one-job-at-a-time hand-over the checkpoint writer and the peer copy share
 * (the owner posts a job, the thread runs it, the owner waits for its result). The
 * communication engine drives a queue of its own with the same thread, mutex and stop; the
 * start-up watchdog only sleeps on it until a deadline or the stop. */
#ifndef LOOM_CORE_WORKER_H
#define LOOM_CORE_WORKER_H

#include <pthread.h>

#include "core/error.h"

typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every change of the state below (under mu); its clock
                          is CLOCK_MONOTONIC (loom_worker_sleep) */
    int started;
    int stop;         /* asked to exit */
    int busy, failed; /* a job is posted and not finished; the last one failed */
    loom_error job_err;
} loom_worker;

/* Initialises w and starts a thread running fn(arg); 0, or pthread_create's error (then
 * nothing is left to stop). */
int loom_worker_start(loom_worker *w, void *(*fn)(void *), void *arg);

/* Waits for the job running, asks the thread to exit (stop), joins it and frees the mutex
 * and condition variable. Nothing when not started. */
void loom_worker_stop(loom_worker *w);

/* Owner: 1 with mu held when no job is running (fill the job, then loom_worker_post); 0
 * (mu released) when one is. */
int loom_worker_claim(loom_worker *w);

/* Owner, after loom_worker_claim: the job is posted (busy, not failed) and mu released. */
void loom_worker_post(loom_worker *w);

/* Owner, non-blocking: 1 when no job is running. */
int loom_worker_idle(loom_worker *w);

/* Owner: blocks until no job is running; the last job's result (its error in err). */
loom_status loom_worker_wait(loom_worker *w, loom_error *err);

/* Thread: blocks until a job is posted (1) or the thread is asked to exit (0). */
int loom_worker_next(loom_worker *w);

/* Thread: blocks until the thread is asked to exit (0) or seconds have passed since the call
 * (1), on the monotonic clock. */
int loom_worker_sleep(loom_worker *w, double seconds);

/* Thread: the job ended with st (its error e): no longer busy. */
void loom_worker_done(loom_worker *w, loom_status st, const loom_error *e);

#endif
