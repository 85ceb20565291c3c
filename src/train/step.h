/* One call for a step's forward and backward, whatever the layout: the runner is picked
 * at setup (the whole model on this rank, micro-batch after micro-batch; or this rank's
 * pipeline stage running its schedule's action list, pipeline/pipeline.h), so the
 * training loop reads as the algorithm:
 *     forward_backward -> grad_sync finish -> norm -> step
 * Gradients reach the gradient-sync strategy (parallel/grad_sync.h) through its ready()
 * callback as they become final during the last micro-batch's backward. */
#ifndef LOOM_TRAIN_STEP_H
#define LOOM_TRAIN_STEP_H

#include <stdint.h>

#include "core/error.h"
#include "core/timeline.h"
#include "model/model.h"
#include "parallel/grad_sync.h"
#include "parallel/mesh.h"
#include "pipeline/pipeline.h"
#include "train/route_dump.h"

/* The first two steps' parts go into the start-up timeline (core/timeline.h): early is
 * the step's index in this run (0 or 1), part a string literal. */
#define LOOM_STEP_MARK(early, part) loom_timeline_mark((early) == 0 ? "step1_" part : "step2_" part)

typedef struct loom_step_runner loom_step_runner;

typedef struct {
    const char *name;
    /* The step's forward and backward over the rank's slice batch [G/dp, T+1]: gradients
     * accumulate, *loss_sum = the sum of the slice's token losses. early: the step's
     * index in this run when < 2 (its parts go into the start-up timeline), else -1. */
    loom_status (*forward_backward)(loom_step_runner *r, const int32_t *batch, float dloss,
                                    int step, int early, double *loss_sum, loom_error *err);
    /* Forward only (validation): *loss_sum as above. */
    loom_status (*forward_loss)(loom_step_runner *r, const int32_t *batch, double *loss_sum,
                                loom_error *err);
    /* The step's MoE counters, summed over the ranks that route distinct tokens. */
    loom_status (*moe_stats)(loom_step_runner *r, loom_moe_stats *out, loom_error *err);
} loom_step_runner_ops;

struct loom_step_runner {
    const loom_step_runner_ops *ops;
    loom_model *model;    /* the rank's model (a pipeline's slot 0) */
    loom_pipeline *pipe;  /* the pipelined runner's stage, else NULL */
    loom_grad_sync *sync; /* where final gradients go (and, before each forward, what gathers
                             the parameters: loom_grad_sync_begin_micro_batch) */
    loom_mesh *mesh;
    const float *params;
    float *grads;
    int micro_batch, seq_len, accum; /* accum: micro-batches per step on this rank */
    /* the whole-model runner's tensor dumps (reference tests; rank 0), else NULL/"" */
    loom_route_dump *routes;
    const char *dump_logits_dir; /* the first step's first logits go there */
};

typedef struct {
    loom_model *model;
    loom_pipeline *pipe; /* NULL: the whole model on this rank */
    loom_grad_sync *sync;
    loom_mesh *mesh;
    const float *params;
    float *grads;
    int micro_batch, seq_len, per_rank;
    loom_route_dump *routes;
    const char *dump_logits_dir;
} loom_step_runner_options;

void loom_step_runner_init(loom_step_runner *r, const loom_step_runner_options *o);

/* One micro-batch's backward on the whole model (its loss gradient set): the last one
 * (final) hands each range to the gradient sync as soon as it is final; with --grad-accum
 * sharded every one does, and the ranges are reduced into the shard's sum before the next
 * micro-batch (loom_grad_sync_finish_micro_batch). Used by the whole-model runner and by
 * loom rl's update. */
loom_status loom_step_backward(loom_model *m, const float *params, float *grads,
                               loom_grad_sync *sync, int final, loom_error *err);

static inline loom_status loom_step_forward_backward(loom_step_runner *r, const int32_t *batch,
                                                     float dloss, int step, int early,
                                                     double *loss_sum, loom_error *err) {
    return r->ops->forward_backward(r, batch, dloss, step, early, loss_sum, err);
}
static inline loom_status loom_step_forward_loss(loom_step_runner *r, const int32_t *batch,
                                                 double *loss_sum, loom_error *err) {
    return r->ops->forward_loss(r, batch, loss_sum, err);
}
static inline loom_status loom_step_moe_stats(loom_step_runner *r, loom_moe_stats *out,
                                              loom_error *err) {
    return r->ops->moe_stats(r, out, err);
}

#endif
