/* Gradient synchronisation: one object, chosen at setup, that turns each rank's local
 * gradients into what the optimizer needs, whatever the layout:
 *   ready(range)  during the last micro-batch's backward, a flat range is final:
 *                 sequence parallelism's partial norm gradients are summed over tp, then
 *                 the range goes to data parallelism's buckets (dense) or waits (experts);
 *   finish()      after backward: every bucket reduced; expert tensors summed over their
 *                 replicas (edp) by the expert strategy;
 *   norm()        the global gradient norm, one function for every layout (below);
 *   step()        clipping, AdamW on this rank's part, the parameters made whole again.
 *
 * The strategies (the first field of loom_grad_sync's table decides):
 *   dense       ZeRO 0-3 over dp (parallel/zero.h, parallel/fsdp.h), buckets overlapped
 *               with backward;
 *   experts     --ep > 1: dense tensors over dp and expert tensors over edp after backward
 *               (ZeRO-0: parallel/ep.h; ZeRO 1-3: parallel/ep_zero.h).
 *
 * The norm. Every element of the model is counted exactly once over the world: the
 * registry says which tensors count on this rank (loom_param.counted_in_norm: tp shards,
 * tp replicas on tp rank 0, no pipeline tied copy), and the strategy which part of the
 * flat buffer this rank holds reduced (its ZeRO shard, its expert-sharded ranges, or, where
 * every data-parallel rank holds the whole reduced gradient, everything on the first
 * replica only). At setup these become a list of flat runs (maximal contiguous ranges);
 * norm() sums the squares of each run and all-reduces one double over the world. */
#ifndef LOOM_PARALLEL_GRAD_SYNC_H
#define LOOM_PARALLEL_GRAD_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/param_gather.h"
#include "parallel/zero.h"
#include "tp/tp.h"

typedef enum { LOOM_GRAD_SYNC_DENSE, LOOM_GRAD_SYNC_EXPERTS } loom_grad_sync_kind;

typedef struct {
    size_t lo, hi;
} loom_flat_run;

typedef struct loom_grad_sync loom_grad_sync;

/* What differs between the strategies; the rest is shared code in grad_sync.c. */
typedef struct {
    loom_grad_sync_kind kind;
    const char *name;
    /* a final range after the norm gradients' tp reduction */
    loom_status (*range_ready)(loom_grad_sync *s, size_t begin, size_t end);
    /* after backward, once the buckets are done */
    loom_status (*reduce_after_backward)(loom_grad_sync *s);
} loom_grad_sync_ops;

struct loom_grad_sync {
    const loom_grad_sync_ops *ops;
    const loom_param_table *table;
    loom_mesh *mesh;
    loom_zero *zero;
    loom_fsdp *fsdp;       /* ZeRO-3: the parameter shards (params is then fsdp->view), or NULL */
    loom_param_gather *pg; /* --overlap-param-gather, attached to zero (zero->overlap) */
    loom_tp *tp;           /* the tensor-parallel group (size 1: none) */
    float *params, *grads;
    /* the optimizer update (chosen at setup: ZeRO's, the experts' segments', or ranges with
     * their gathers overlapped) and the gather of a whole gradient (dumps) */
    loom_status (*update)(loom_grad_sync *s, double norm, float lr, const loom_adamw_config *cfg,
                          int step, loom_error *err);
    loom_status (*gather)(loom_grad_sync *s, loom_error *err);
    loom_zero_ready_ctx bucket_ctx; /* the dense buckets' context (zero.h) */
    loom_flat_run *norm_runs;       /* this rank's counted, reduced runs, in flat order */
    int n_norm_runs;
    loom_error *err; /* where failures inside backward's callbacks are described */
};

typedef struct {
    const loom_param_table *table;
    loom_mesh *mesh;
    loom_zero *zero; /* created over mesh->dp (ep_zero attached with --ep and ZeRO > 0) */
    loom_fsdp *fsdp; /* ZeRO-3, or NULL */
    loom_param_gather *pg;
    loom_tp *tp;
    float *params, *grads;
    /* the embedding split of the dense buckets (zero->embed.enabled): d(embedding
     * output) and the micro-batch's tokens, the model's buffers; else NULL */
    const float *d_embed;
    const int32_t *tokens;
    loom_error *err;
} loom_grad_sync_options;

/* Picks the strategy for the layout (experts with mesh->ep.size > 1) and plans the norm's
 * runs. */
loom_status loom_grad_sync_create(loom_grad_sync *s, const loom_grad_sync_options *o,
                                  loom_error *err);
void loom_grad_sync_free(loom_grad_sync *s);

/* A step's start: timers, and the local gradients cleared for accumulation. */
void loom_grad_sync_step_begin(loom_grad_sync *s);
/* Before the last micro-batch's backward: buckets empty, ready for ranges. */
void loom_grad_sync_begin(loom_grad_sync *s);
/* The loom_grads_ready_fn of the last micro-batch's backward (ctx: the loom_grad_sync). */
loom_status loom_grad_sync_ready(void *ctx, size_t begin, size_t end);
/* After backward: every gradient this rank needs is reduced. */
loom_status loom_grad_sync_finish(loom_grad_sync *s, loom_error *err);
/* --grad-accum sharded (loom_zero_accum_enable): 1 when every micro-batch's backward
 * hands its ranges to ready (after loom_grad_sync_begin) and each one but the step's last
 * ends with loom_grad_sync_finish_micro_batch (its reduced shard summed, the local
 * gradients cleared); loom_grad_sync_finish then adds the sum to the last one's. */
int loom_grad_sync_sharded_accum(const loom_grad_sync *s);
loom_status loom_grad_sync_finish_micro_batch(loom_grad_sync *s, loom_error *err);
/* ... and in a pipeline stage, around each backward action that completes a micro-batch
 * of a chunk: its ranges [bottom, top) handed to ready from the top down, reduced into the
 * sum (first: copied) and cleared (loom_zero_begin_ranges, loom_zero_finish_ranges). */
void loom_grad_sync_begin_ranges(loom_grad_sync *s, size_t top, int first);
loom_status loom_grad_sync_finish_ranges(loom_grad_sync *s, size_t bottom, size_t top,
                                         loom_error *err);
/* Where this rank's reduced gradients are that its norm and AdamW read, as *n pieces in
 * flat order (malloc'd; the caller frees): the whole buffer at ZeRO 0-1 (every replica
 * holds it all), the rank's shard at ZeRO 2-3 (grads + lo, or --grad-accum sharded's sum),
 * and with --ep at ZeRO 1-3 the rank's dense and expert segments (in grads, or in the
 * sharded sum). The replicas of this rank's place in another group of the same layout
 * hold the same pieces. */
loom_status loom_grad_sync_reduced_pieces(const loom_grad_sync *s, loom_flat_piece **out, int *n,
                                          loom_error *err);
/* The global gradient norm, the same on every rank. */
loom_status loom_grad_sync_norm(loom_grad_sync *s, double *norm, loom_error *err);
/* Clipping to cfg->grad_clip with that norm, AdamW (step: 1-based) on this rank's part,
 * and the parameters whole again (all-gathered, or, with ZeRO-3, gathered before the next
 * use). */
loom_status loom_grad_sync_step(loom_grad_sync *s, double norm, float lr,
                                const loom_adamw_config *cfg, int step, loom_error *err);
/* Step end: the timers of zero->times complete. */
void loom_grad_sync_step_end(loom_grad_sync *s);
/* Makes grads hold the whole reduced gradient on every rank (dumps). */
loom_status loom_grad_sync_gather_grads(loom_grad_sync *s, loom_error *err);

/* The parameters' side, so that the loop and the runners name no ZeRO stage
 * (grad_sync_params.c):
 *   begin_micro_batch  before a forward (each micro-batch's, or a pipeline schedule's
 *                      first): ZeRO-3's shards ready to be gathered per block (fsdp.h),
 *                      --overlap-param-gather's first ranges complete (param_gather.h);
 *   params_complete    every parameter gather in flight complete (before an evaluation,
 *                      a checkpoint's copy, the run's end);
 *   params_whole       params holds every parameter (ZeRO-3: all gathered; exports);
 *   step_wait_ms       the step's exposed wait for parameters (--metrics);
 *   ema_on             --ema-decay is on;
 *   report_end         the run's closing lines (rank 0 prints; the gather's report each
 *                      rank), total_floats the model's parameters. */
loom_status loom_grad_sync_begin_micro_batch(loom_grad_sync *s, loom_error *err);
loom_status loom_grad_sync_params_complete(loom_grad_sync *s, loom_error *err);
loom_status loom_grad_sync_params_whole(loom_grad_sync *s, loom_error *err);
double loom_grad_sync_step_wait_ms(const loom_grad_sync *s);
int loom_grad_sync_ema_on(const loom_grad_sync *s);
void loom_grad_sync_report_end(const loom_grad_sync *s, int rank, size_t total_floats);

/* The runs the norm sums on this rank (for tests and the memory/plan tools). */
const loom_flat_run *loom_grad_sync_norm_runs(const loom_grad_sync *s, int *n);

/* The moving average of the weights (--ema-decay): held by ZeRO like AdamW's moments
 * (parallel/zero.h; with expert segments parallel/ep_zero.h), started at the current
 * parameters by reset, updated by loom_grad_sync_step after each optimizer step, and made
 * whole in full [total] by gather (collective over the data-parallel group). */
loom_status loom_grad_sync_ema_enable(loom_grad_sync *s, float decay, loom_error *err);
loom_status loom_grad_sync_ema_reset(loom_grad_sync *s, loom_error *err);
loom_status loom_grad_sync_ema_gather(loom_grad_sync *s, float *full, loom_error *err);

#endif
