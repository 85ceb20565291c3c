/* The step's observers: what watches a training step without changing what it computes
 * (the start-up timeline, the trace, the progress record the heartbeats read, fault
 * injection, the reference dumps, the metrics and the progress line) registers here, and
 * train/trainer.c's loop calls every observer, in registration order, at each point of
 * every step. The loop itself then reads as the algorithm (train/observers.c registers
 * the instrumentation; train/dump.c the reference dumps). */
#ifndef LOOM_TRAIN_STEP_OBSERVER_H
#define LOOM_TRAIN_STEP_OBSERVER_H

#include <stdint.h>

#include "core/error.h"
#include "train/metrics.h"

typedef enum {
    LOOM_STEP_AT_BEGIN,            /* the step's data sampled, its gradients cleared */
    LOOM_STEP_AT_FORWARD_BACKWARD, /* this rank's forward and backward done, nothing reduced */
    LOOM_STEP_AT_REDUCE,           /* gradients reduced, the global loss known (finite) */
    LOOM_STEP_AT_BEFORE_UPDATE,    /* the norm known, the optimizer about to run */
    LOOM_STEP_AT_UPDATE,           /* parameters updated, the device synchronised */
    LOOM_STEP_AT_METRICS,          /* the step's metrics complete (with any evaluation) */
    LOOM_STEP_AT_END,              /* after the step's checkpoint: its last point */
    LOOM_STEP_AT_COUNT
} loom_step_point;

/* What the loop knows at each point (fields are valid from the point named). */
typedef struct {
    int step;         /* 0-based index of the step */
    int early;        /* the step's index in this run when < 2 (start-up timeline), else -1 */
    int64_t batch;    /* the global batch the step sampled */
    double t0;        /* loom_now_ms() at the step's start */
    double run_start; /* loom_now_ms() at the loop's start */
    double loss_sum;  /* FORWARD_BACKWARD: this rank's own sum of token losses, before any
                         reduction (an observer may change it: fault injection) */
    double loss;      /* REDUCE: the global mean loss */
    double ms;        /* UPDATE: the step's wall time */
    const loom_step_metrics *metrics; /* METRICS */
} loom_step_state;

typedef loom_status (*loom_step_observer_fn)(void *ctx, loom_step_point at, loom_step_state *s,
                                             loom_error *err);

#define LOOM_STEP_OBSERVERS_MAX 8

typedef struct {
    struct {
        loom_step_observer_fn fn;
        void *ctx;
    } list[LOOM_STEP_OBSERVERS_MAX];
    int n;
} loom_step_observers;

/* Adds an observer (at most LOOM_STEP_OBSERVERS_MAX; more is a programming error). */
static inline void loom_step_observers_add(loom_step_observers *o, loom_step_observer_fn fn,
                                           void *ctx) {
    if (o->n < LOOM_STEP_OBSERVERS_MAX) {
        o->list[o->n].fn = fn;
        o->list[o->n].ctx = ctx;
        o->n++;
    }
}

/* Every observer at point `at`, in registration order; the first failure stops it. */
static inline loom_status loom_step_observers_notify(const loom_step_observers *o,
                                                     loom_step_point at, loom_step_state *s,
                                                     loom_error *err) {
    loom_status st = LOOM_OK;
    for (int i = 0; i < o->n && !st; i++) st = o->list[i].fn(o->list[i].ctx, at, s, err);
    return st;
}

#endif
