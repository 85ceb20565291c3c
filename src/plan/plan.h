/* loom plan's model of a training step: for one layout (a loom_train_config with its
 * --dp --tp --pp --ep --cp, --zero, --sequence-parallel, --pp-schedule, --micro-batch,
 * --recompute ...) the memory every rank holds and the time its step takes on a machine
 * profile (plan/profile.h). docs/PLAN.md explains each term and where it comes from.
 *
 * Memory is computed with the functions the training run itself sizes its buffers with
 * (the registry, the arena's plan, ZeRO's shards, the pipeline's slots, context
 * parallelism's buffers), so the planner's numbers are the start-up report's.
 * Step time is predicted from the profile: every GEMM, attention and memory-bound kernel
 * of forward and backward, the collectives under loom's overlap rules, the pipeline
 * bubble from the schedule simulator (pipeline/schedule.h) and the optimizer. */
#ifndef LOOM_PLAN_PLAN_H
#define LOOM_PLAN_PLAN_H

#include <stddef.h>

#include "core/error.h"
#include "model/config.h"
#include "plan/profile.h"
#include "train/run.h"
#include "train/train_config.h"

/* ---- memory (plan/memory.c) ---- */

/* What one rank holds, bytes: the start-up report's figures, the run's own struct
 * (train/run.h: loom_run_memory) for the rank at pipeline stage `stage` (tensor,
 * context, expert and data rank 0). */
typedef loom_run_memory loom_plan_memory;

/* The rank's memory for layout tc of model mc. Fails (LOOM_ERR_INPUT) only for a layout
 * the training run would refuse; call loom_plan_validate first for the message. */
loom_status loom_plan_memory_of(const loom_model_config *mc, const loom_train_config *tc, int stage,
                                loom_plan_memory *out, loom_error *err);
/* The largest total over the pipeline stages (the rank the budget must fit). */
loom_status loom_plan_memory_max(const loom_model_config *mc, const loom_train_config *tc,
                                 loom_plan_memory *out, int *stage, loom_error *err);

/* ---- validation (plan/memory.c): exactly what `loom train` checks before MPI ---- */
loom_status loom_plan_validate(const loom_model_config *mc, const loom_train_config *tc,
                               loom_error *err);

/* ---- step time (plan/step_time.c) ---- */

#define LOOM_PLAN_MAX_TERMS 24

/* One part of the step's predicted time: its exposed (critical-path) milliseconds. */
typedef struct {
    const char *name;   /* as the trace / start-up report names the part ("forward",
                           "backward", "tp comm", "dp exposed", "optimizer", "pp bubble" ...) */
    const char *metric; /* the --metrics key it is measured by ("dp.compute_ms",
                           "grad_wait_ms", "dp.optimizer_ms", ...); several terms may share
                           one; NULL: not measured separately (only in step_ms) */
    double ms;
} loom_plan_term;

/* Where the ranks run: how many share a node (its cores or GPUs, and the placement of
 * each group: intra-node when the group fits in one node, tp innermost), threads each;
 * and, for an MoE, how unevenly its router loads the experts, which the ranks wait for. */
typedef struct {
    int ranks_per_node;  /* >= 1; the world when it fits one node */
    int threads;         /* per rank (loom train's --threads; 0: cores / ranks per node) */
    double moe_load_max; /* the busiest expert's load over the mean (a run's metrics
                            moe.load_max / moe.load_mean); <= 1: balanced routing */
} loom_plan_placement;

typedef struct {
    loom_plan_term terms[LOOM_PLAN_MAX_TERMS];
    int n_terms;
    double step_ms;      /* the sum of the terms */
    double tokens_per_s; /* global batch x seq_len / step */
    double model_flops;  /* per step, whole world: 6 N tokens + attention (PaLM's MFU) */
    double mfu;          /* model_flops / (step x world x the profile's peak) */
    int dominant;        /* index of the largest term */
    /* the gradients' reduction over the replicas: the bytes this rank moves per step, as
     * the run's metrics count them (dp.grad_bytes: 2 (n - c) x 4 an fp32 bucket of n
     * elements of which it owns c; --grad-reduce-dtype bf16: parallel/zero_bf16.h), and
     * how many times a step the whole gradient is reduced: 1 (local accumulation), the
     * micro-batches (sharded accumulation, grad_sharded: --grad-accum sharded, the default
     * at ZeRO-3), 0 (one replica) */
    double grad_bytes;
    int grad_reductions, grad_sharded;
    /* vlm with --vision-schedule bubbles (plan/vision_time.h): micro-batches each stage
     * encodes, the simulated pipeline with the pieces over with the encoder on the first
     * stage, the replicas' messages (weights, gradients, image rows; the term "vision
     * messages"); zeros otherwise */
    int vision_pieces[LOOM_PP_MAX_STAGES];
    double vision_ratio, vision_messages_ms;
    /* pp > 1: each pipeline rank's actions, one of each kind (F, B, W: the mean of its
     * chunks; the stage's sends included), unslowed by the cores' sharing: the stages are
     * uneven (the first holds the embedding, the last the head and the loss), and the
     * pipeline's span is simulated from each one's own; zeros otherwise */
    double pp_action_ms[LOOM_PP_MAX_STAGES][3];
} loom_plan_time;

/* Predicted step of layout tc (valid: loom_plan_validate) on profile p. LOOM_ERR_INPUT
 * naming the profile's file and field when it lacks a term this layout needs. */
loom_status loom_plan_step_time(const loom_model_config *mc, const loom_train_config *tc,
                                const loom_profile *p, const loom_plan_placement *place,
                                loom_plan_time *out, loom_error *err);

/* Context parallelism's messages per training step (plan/cp_messages.c): the bytes rank 0
 * sends (the ring's K/V blocks and dK/dV shares, Ulysses' all-to-alls' shares for the other
 * ranks), as the run's end line counts them, by wire type: the K/V blocks, qkv and the
 * attention output in bf16 under --precision bf16 (not the DiT; gpu: a GPU backend, which
 * sends fp32), the rest fp32. Zeros without --cp. Evaluation passes (the run's line counts
 * them too) are not included. */
loom_status loom_plan_cp_messages(const loom_model_config *mc, const loom_train_config *tc, int gpu,
                                  double *bf16, double *fp32, loom_error *err);

/* ---- the search (plan/search.c) ---- */

/* One layout and what the planner says of it. */
typedef struct {
    loom_train_config tc; /* the layout, as loom train's flags (base's other flags) */
    loom_plan_memory mem; /* the pipeline stage holding the most */
    int mem_stage;
    loom_plan_time time; /* with a profile */
} loom_plan_candidate;

/* Every layout of `world` ranks that `loom train` accepts for model mc (loom_plan_validate
 * and the run's own sizing both pass), varying from base: --dp --tp --pp --cp (--tp at most
 * tp_max: a tensor-parallel group inside one node), --ep (MoE), --zero 0-3,
 * --sequence-parallel, --pp-schedule (interleaved with 2 chunks; a vlm: each with
 * --vision-schedule first and bubbles where the run takes it), --recompute,
 * --cp-mode and --micro-batch (powers of two dividing the per-replica batch); base's
 * --global-batch, --seq-len, --threads and the rest stay. *out: malloc'd, *n entries, the
 * memory filled in; *refused (may be NULL): why the last refused layout was refused. */
loom_status loom_plan_enumerate(const loom_model_config *mc, const loom_train_config *base,
                                int world, int tp_max, loom_plan_candidate **out, int *n,
                                loom_error *refused, loom_error *err);
/* The layout as loom train's flags: "--dp 2 --tp 2 --zero 1 --micro-batch 4" (only those
 * that differ from one process's defaults, always --dp and --micro-batch). */
void loom_plan_layout_flags(const loom_train_config *tc, char *buf, size_t n);

#endif
