/* Expert parallelism's data-parallel side. With --ep N a data-parallel group of dp ranks
 * is cut into dp/N expert-parallel groups of N consecutive ranks; rank i of each holds
 * the same experts, so an expert tensor's gradient is summed over the dp/N ranks with
 * the same ep rank (the mesh's edp group) and a dense tensor's over all dp ranks. The
 * flat buffers have the same layout on every rank (expert tensors at the same offsets
 * hold different experts), so AdamW runs unchanged over the whole local buffer
 * (ZeRO-0). */
#ifndef LOOM_PARALLEL_EP_H
#define LOOM_PARALLEL_EP_H

#include "ckpt/ckpt_plan.h"
#include "comm/comm.h"
#include "core/error.h"
#include "model/params.h"
#include "parallel/tp_shards.h"

/* Sums the gradients over their replicas: dense tensors over dp, expert tensors over
 * edp (runs of neighbouring tensors of one kind go as one all-reduce). */
loom_status loom_ep_reduce_grads(const loom_param_table *t, float *grads, loom_comm *dp,
                                 loom_comm *edp, loom_error *err);
/* Gathers a flat buffer laid out by `local` (this rank's experts) into `global_flat`
 * laid out by `global` (ep_size 1: every expert) where global_flat is not NULL; every
 * rank of the ep group takes part. */
loom_status loom_ep_gather_flat(const loom_param_table *local, const float *flat,
                                const loom_param_table *global, float *global_flat, loom_comm *ep,
                                loom_error *err);
/* The checkpoint pieces of buffer `kind` this rank writes so that every element of the
 * model is written exactly once: dense tensors within [dense_lo, dense_hi) (its dp shard:
 * every dp rank holds them) and its share q of edp_size (its edp rank) of the expert
 * tensors, counted in flat order (the ranks of one edp group hold the same experts); ct:
 * t's checkpoint descriptors. */
loom_status loom_ep_plan_written(loom_ckpt_plan *plan, const loom_param_table *t,
                                 const loom_ckpt_descs *ct, loom_ckpt_kind kind, size_t dense_lo,
                                 size_t dense_hi, int q, int edp_size, loom_error *err);

/* export_flat with both tp and ep: shards gathered over tp (on tp rank 0: this ep
 * rank's experts, tensors whole), then experts over ep among tp ranks 0, into
 * global_flat (tp 1, ep 1; layers NULL: the whole model) where not NULL. Every rank of
 * the tp group takes part. */
loom_status loom_ep_tp_gather_flat(loom_tp *tp, loom_comm *ep, const loom_param_table *local,
                                   const float *flat, const loom_param_table *global,
                                   float *global_flat, const loom_model_config *mc,
                                   const loom_layer_set *layers, loom_error *err);

#endif
