/* Per-step metrics as JSON lines (one object per step), flushed every line so a crash
 * loses nothing already reported. */
#ifndef LOOM_TRAIN_METRICS_H
#define LOOM_TRAIN_METRICS_H

#include <stdio.h>

#include "core/error.h"
#include "model/moe.h"
#include "parallel/outer.h"
#include "parallel/zero.h"

/* vlm at dp > 1: how even the data-parallel ranks' compute was this step. */
typedef struct {
    int balanced;            /* --balance-dp */
    double predicted;        /* the cost model's slowest rank over the mean */
    double predicted_slices; /* ... for the usual slices (without --balance-dp) */
    double compute_max_ms;   /* measured forward + backward, slowest rank */
    double compute_mean_ms;  /* ... and the mean over the ranks */
    double compute_cpu_max_ms, compute_cpu_mean_ms; /* the same in the thread's CPU time */
} loom_dp_balance_stats;

typedef struct {
    int step;
    double loss, lr, grad_norm, tokens_per_s, step_ms;
    double grad_wait_ms; /* data parallel: time inside gradient-communication calls (start,
                            progress, wait), i.e. the reduction time not hidden by compute */
    double val_loss;     /* NaN when this step did not evaluate */
    long long tokens_seen;
    int has_moe; /* 1: the router statistics below are reported */
    loom_moe_stats moe;
    const loom_zero_step_times *dp;     /* data parallel: where the step's time went, or NULL */
    const loom_outer_step_stats *outer; /* --outer diloco: the step's outer sync, or NULL */
    double tokens_total; /* --outer diloco: tokens_seen over every worker (for per token) */
    const loom_dp_balance_stats *balance; /* vlm at dp > 1, or NULL */
} loom_step_metrics;

typedef struct {
    FILE *file;
} loom_metrics;

/* path "" -> a sink that writes nothing. */
loom_status loom_metrics_open(loom_metrics *mx, const char *path, loom_error *err);
loom_status loom_metrics_write(loom_metrics *mx, const loom_step_metrics *s, loom_error *err);
void loom_metrics_close(loom_metrics *mx);

#endif
