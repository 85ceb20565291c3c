/* ZeRO-1/2 parameter all-gather overlapped with the next step's forward
 * (--overlap-param-gather, after Megatron-LM's distributed optimizer option).
 *
 * Without it, loom_zero_optimizer_step gathers every rank's updated shard with one
 * blocking all-gather of the whole buffer. With it, the buffer is cut at the model's
 * hook points, in forward order: the embedding range (wte, wpe: GPT-2's tied head reads
 * wte too), each block, the tail (final norm, an untied lm_head). Each range is one
 * in-place all-gatherv on the ZeRO communication engine (comm/engine.h, the engine the
 * gradient buckets use). The optimizer step runs AdamW range by range in that order and
 * posts each range's gather as soon as this rank's part of it is updated, so the
 * embedding (needed first, 31% of GPT-2 124M) travels while the optimizer works on the
 * rest, and the gathers are spread over the optimizer's time rather than started all at
 * once. The forward waits for a range just before the first code that reads it (the
 * embedding, a block's before_block hook, the last block's after_block for the tail).
 *
 * The values gathered are the same as the blocking gather's (copies only), so runs are
 * bitwise identical with and without the flag. Anything else that reads parameters
 * between steps (evaluation, checkpoint saves, dumps, --save-weights, the end of the
 * run) first calls loom_param_gather_wait_all. Collectives are posted in range order on
 * every rank, and all of them are complete before the next gradient bucket is posted
 * (the forward has waited for every range), so every rank issues the same sequence. */
#ifndef LOOM_PARALLEL_PARAM_GATHER_H
#define LOOM_PARALLEL_PARAM_GATHER_H

#include "parallel/mesh.h"
#include "parallel/zero.h"

typedef struct {
    size_t begin, end;
    loom_comm_op op;
    int *counts, *displs; /* per rank: its part of [begin, end), relative to begin */
    int in_flight;        /* 1: posted, not yet waited for */
} loom_param_gather_range;

typedef struct loom_param_gather {
    loom_zero *zero;
    float *params;
    loom_param_gather_range *ranges; /* 0: embedding, 1..L: blocks, L+1: tail */
    int n_ranges;
    loom_error *err; /* where hook failures are described */
    double wait_ms;  /* the forwards' waits so far (every rank: rank 0's are in --metrics) */
    double wait_max_ms;
    int steps; /* optimizer steps that posted the ranges */
    /* NULL, or called with a range's flat bounds once its gather is complete (the weights'
     * bf16 copy rounds it then: train/compute_weights.h) */
    void (*landed)(void *ctx, size_t begin, size_t end);
    void *landed_ctx;
} loom_param_gather;

/* Refuses --overlap-param-gather where it does not apply (messages name the flags):
 * only --zero 1 or 2, without --pp or --ep (those gather elsewhere). With dp 1 it is a
 * no-op (nothing is gathered). */
loom_status loom_param_gather_validate(int zero, loom_layout layout, loom_error *err);

/* Attaches to z (the gradient sync then steps with loom_param_gather_optimizer_step) for the
 * flat buffer `params`; nothing is attached when z gathers nothing (stage 0, dp 1). */
loom_status loom_param_gather_create(loom_param_gather *g, loom_zero *z, float *params,
                                     loom_error *err);
/* Waits for everything in flight (errors ignored: for exit paths) and detaches. */
void loom_param_gather_free(loom_param_gather *g);

/* Range i's part of this rank's shard is updated: starts its all-gather (the optimizer
 * step calls it for every range, in range order: the same order on every rank). */
loom_status loom_param_gather_post(loom_param_gather *g, int i, loom_error *err);
/* Before a micro-batch's forward: the embedding range. */
loom_status loom_param_gather_begin_micro_batch(loom_param_gather *g, loom_error *err);
/* Hooks for loom_model (ctx = the loom_param_gather). */
loom_status loom_param_gather_before_block(void *ctx, int layer, int backward);
loom_status loom_param_gather_after_block(void *ctx, int layer, int backward);
/* One stderr line per rank (attached only): the mean and worst per-step wait. */
void loom_param_gather_report(const loom_param_gather *g, int rank);
/* Every range complete (before anything else reads the parameters). NULL g: no-op. */
loom_status loom_param_gather_wait_all(loom_param_gather *g, loom_error *err);

/* The optimizer step with the overlap: clipping, then AdamW on this rank's part range by
 * range in forward order, each range's all-gather posted as soon as its part is updated
 * (instead of loom_zero_optimizer_step's blocking gather). */
loom_status loom_param_gather_optimizer_step(loom_param_gather *g, float *grads, double norm,
                                             float lr, const loom_adamw_config *cfg, int step,
                                             loom_error *err);

#endif
