/* ZeRO stages 1 and 2 with expert parallelism (--ep N > 1, --zero 1|2).
 *
 * Dense and expert tensors alternate in the flat buffers (layer by layer), a dense
 * tensor has dp replicas and an expert tensor only edp = dp / ep (the ranks with the same
 * ep rank; the others hold other experts at the same offsets). So the optimizer state
 * is sharded per kind: the dense elements, taken in flat order as one sequence, are cut
 * into dp row-aligned segments (dp rank r owns segment r), and the expert elements of
 * this ep rank into edp segments (edp rank q owns segment q). A rank's shard is the union
 * of the flat ranges of its two segments.
 *   AdamW state (m, v): full-layout anonymous mappings of which only the shard's ranges
 *     are ever touched, so only they become resident (the flat offsets stay those of
 *     every other buffer: checkpoints plan flat ranges as usual).
 *   stage 1: gradients all-reduced (dense over dp, experts over edp), as with ZeRO-0.
 *   stage 2: gradients reduce-scattered per kind: each kind's gradients are packed in
 *     flat order (a rank's segment is then one contiguous piece), reduce-scattered over
 *     the kind's group, and the rank's reduced segment written back in place into the
 *     local gradient buffer (no separate shard buffer). With --grad-accum sharded (stages
 *     2, 3) every micro-batch's ranges are reduce-scattered per kind as backward finishes
 *     them and summed into z->accum (loom_ep_zero_reduce_range), so that the local buffer
 *     holds one range at a time instead of a whole gradient across micro-batches.
 *   step: clipping and AdamW on the shard's ranges, then each kind's updated segments
 *     all-gathered over its group (packed, then unpacked into the flat parameters).
 *   norm: squares of the rank's segments, summed over dp (every element once).
 * The function equals one process's: AdamW is elementwise, only summation orders of the
 * reductions differ. ZeRO-3 with ep > 1 keeps this shard layout; parallel/fsdp.c gathers
 * each block per kind (dense over dp, experts over edp), without prefetch. */
#ifndef LOOM_PARALLEL_EP_ZERO_H
#define LOOM_PARALLEL_EP_ZERO_H

#include "ckpt/ckpt_loader.h"
#include "ckpt/ckpt_plan.h"
#include "comm/comm.h"
#include "core/error.h"
#include "model/params.h"
#include "parallel/shard_geometry.h"
#include "parallel/zero.h"
#include "optim/optimizer.h"

typedef loom_flat_range loom_ep_range;

typedef struct loom_ep_zero {
    const loom_param_table *table;
    loom_shard_layout seg[2]; /* the two sharded sequences: 0 dense over dp, 1 experts over edp */
    int stage;
    loom_ep_range *own; /* this rank's shard as flat ranges, in flat order */
    int n_own;
    size_t own_floats;
    float *pack, *recv;     /* a kind's whole sequence; the rank's segment (stage 2) */
    int *gcounts, *gdispls; /* ZeRO-3 gathers: each group rank's part of a range */
    size_t map_bytes;       /* of z->m and z->v */
} loom_ep_zero;

/* Turns z (created by loom_zero_create over dp with stage 1 or 2) into the sharding
 * above; z->m, z->v become full-layout mappings, z->lo, z->hi = [0, total). */
loom_status loom_ep_zero_attach(loom_zero *z, loom_comm *edp, loom_error *err);
/* Only the shape loom_ep_zero_attach gives z (the segments, shard_floats), no buffers:
 * for a z of loom_zero_size (sizing a layout: loom plan). */
loom_status loom_ep_zero_size(loom_zero *z, loom_comm *edp, loom_error *err);
/* The bytes loom_ep_zero_attach mallocs for z (0 without --ep): the pack buffer of the
 * larger segment, stages >= 2 the receive buffer of the larger shard, the dp counts and
 * displacements; the same for a z of loom_ep_zero_size. */
size_t loom_ep_zero_buffer_bytes(const loom_zero *z);
/* Called by loom_zero_free: unmaps z->m and z->v. */
void loom_ep_zero_detach(loom_zero *z);

/* --grad-accum sharded: the flat range [begin, end) that backward just finished, of every
 * micro-batch: each kind's piece of it reduce-scattered over the kind's group (dense over
 * dp, experts over edp; blocking, before backward goes on) and this rank's part copied
 * (the step's first micro-batch, z->accum_n 0) or added into z->accum; the range's whole
 * pages of grads are then handed back. Every rank of a group reduces the same pieces in
 * the same order (backward's), so the collectives match. In a pipeline stage the action
 * completing a chunk's micro-batch reduces the chunk's ranges after loom_zero_begin_ranges
 * (pages from its top's page down only: the ranges above may hold a later micro-batch). */
loom_status loom_ep_zero_reduce_range(loom_zero *z, float *grads, size_t begin, size_t end,
                                      loom_error *err);
/* After backward (all micro-batches): the shard's gradients summed over their replicas
 * (stage 1: every gradient). */
loom_status loom_ep_zero_reduce(loom_zero *z, float *grads, loom_error *err);
/* Clipping and AdamW on the shard's ranges of params (stages 1-2: then all-gathered) or,
 * with ZeRO-3, of shard (full layout, only the shard's ranges valid; nothing gathered). */
loom_status loom_ep_zero_step(loom_zero *z, float *params, float *shard, float *grads, double norm,
                              float lr, const loom_adamw_config *cfg, int step, loom_error *err);
/* ZeRO-3 (parallel/fsdp.c): initialises the shard's ranges of a full-layout shard. */
void loom_ep_zero_init_shard(const loom_zero *z, float *shard, uint64_t seed);
/* ZeRO-3: flat range [begin, end) of the parameters into view, each kind's part
 * all-gathered over its group from the owners' shards (blocking). */
loom_status loom_ep_zero_gather_range(loom_zero *z, float *shard, float *view, size_t begin,
                                      size_t end, loom_error *err);
/* Every element of flat (laid out as the parameters) from the rank that owns it: makes a
 * stage-2 gradient buffer whole (dumps). */
loom_status loom_ep_zero_gather(loom_zero *z, float *flat, loom_error *err);
/* Zero moments (a fresh start), touching only the shard. */
void loom_ep_zero_clear_state(loom_zero *z);

/* The checkpoint pieces of buffer `kind` this rank writes: its shard (every element of
 * the model once over all ranks); ct: the table's checkpoint descriptors. */
loom_status loom_ep_zero_plan_written(const loom_zero *z, const loom_ckpt_descs *ct,
                                      loom_ckpt_plan *plan, loom_ckpt_kind kind, loom_error *err);
/* Loads the parameters (params: every element this rank holds) and the shard's moments
 * (a read per range of the shard, so untouched state stays unmapped); with_ema: the
 * shard's moving average of the weights too. */
loom_status loom_ep_zero_load(const loom_zero *z, const loom_ckpt_descs *ct, const char *dir,
                              const loom_ckpt_manifest *m, float *params, int with_ema,
                              loom_ckpt_load_stats *stats, loom_error *err);

/* The moving average of the weights (--ema-decay) over the shard's ranges, laid out as
 * the moments (full layout, only the shard's ranges touched): enable, start it at the
 * parameters (params whole, or the ZeRO-3 full-layout shard), update it after a step,
 * and make it whole in full [total] on every rank (collective). */
loom_status loom_ep_zero_ema_enable(loom_zero *z, float decay, loom_error *err);
void loom_ep_zero_ema_reset(loom_zero *z, const float *params, const float *shard);
void loom_ep_zero_ema_update(loom_zero *z, const float *params, const float *shard);
loom_status loom_ep_zero_ema_gather(loom_zero *z, float *full, loom_error *err);

#endif
