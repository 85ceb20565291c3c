/* Everything one training run owns (train/trainer.c's loop reads it), built once at setup
 * by train/setup.c: the layout and the device are decided there, so the loop does not
 * branch on them. */
#ifndef LOOM_TRAIN_RUN_H
#define LOOM_TRAIN_RUN_H

#include <stdint.h>

#include "core/error.h"
#include "core/trace.h"
#include "data/batch_source.h"
#include "data/vlm_balance.h"
#include "model/model.h"
#include "parallel/fsdp.h"
#include "parallel/grad_sync.h"
#include "parallel/mesh.h"
#include "parallel/outer.h"
#include "parallel/param_gather.h"
#include "parallel/zero.h"
#include "pipeline/pipeline.h"
#include "train/checkpointing.h"
#include "train/compute_weights.h"
#include "train/metrics.h"
#include "train/route_dump.h"
#include "train/step.h"
#include "train/tensorboard.h"
#include "train/train_config.h"

/* How a flat buffer becomes whole tensors for exports and dumps (chosen at setup). */
typedef enum {
    LOOM_EXPORT_LOCAL, /* one rank holds every tensor whole */
    LOOM_EXPORT_TP,    /* tensor-parallel shards gathered over tp */
    LOOM_EXPORT_EP,    /* experts gathered over ep */
    LOOM_EXPORT_EP_TP  /* both: over tp, then over ep */
} loom_export_kind;

typedef struct {
    const loom_model_config *mc;
    const loom_train_config *tc;
    loom_mesh *mesh;
    loom_batch_source data, val; /* training and validation batches */
    const loom_backend *be;      /* --device: where the model, parameters, gradients and optimizer
                                    state live (the CPU's, or a device's opened at setup) */
    loom_model model;
    loom_zero zero;
    loom_fsdp fsdp;       /* ZeRO-3 only: params is then fsdp.view */
    loom_param_gather pg; /* --overlap-param-gather (ZeRO 1, 2) */
    loom_fsdp *sharded;   /* &fsdp with ZeRO-3, else NULL */
    float *params, *grads;
    loom_compute_weights cw; /* --precision bf16: the weights' bf16 copy (or none) */
    loom_grad_sync sync;
    loom_step_runner runner;
    int32_t *batch;         /* this rank's slice of the step: [G/dp, record words] */
    int32_t *dump_batches;  /* [steps, G, record words] on rank 0 when dumping */
    loom_route_dump routes; /* MoE router decisions when dumping (every rank) */
    loom_metrics metrics;
    loom_tb_writer *tb; /* rank 0, with --tensorboard */
    loom_trace *trace;
    loom_tp tp;    /* the tensor-parallel group's layers (one rank: trivial) */
    loom_cp cp;    /* context-parallel attention (built with --cp > 1 only) */
    loom_cp *cped; /* &cp with --cp > 1, else NULL (what the model is given) */
    loom_export_kind export_kind;
    loom_param_table global_table; /* tp or ep > 1: the unsharded registry, for exports */
    float *global_flat;            /* ... and on its gathering rank a flat buffer for it */
    float *host_flat;              /* --device cuda: a host copy of a flat buffer, for exports */
    loom_checkpointing ckpt;
    int start_step;                       /* steps already done (resumed from a checkpoint) */
    loom_pipeline pipe;                   /* --pp > 1: the stage's schedule, slots and buffers */
    loom_pipeline *pipelined;             /* &pipe with --pp > 1, else NULL */
    const loom_zero_step_times *dp_times; /* per-step data-parallel breakdown for --metrics
                                             (NULL when pipelined: timed per action) */
    int size_only;    /* loom_run_size: the layout's objects sized, nothing to run */
    loom_outer outer; /* --outer diloco: the outer optimizer over the workers */
    int outer_on;     /* outer is built */
    /* vlm with several data-parallel ranks: each step's predicted compute per rank, and
     * with --balance-dp the assignment the rank reads its samples by */
    loom_vlm_balance balance;
    int balance_on;               /* balance is built */
    loom_dp_balance_stats dp_bal; /* the step's figures for --metrics */
    double *balance_ms;           /* [2][dp group size] each rank's compute (wall, CPU) */
} loom_run;

/* Builds the run (data, model, layout, buffers, checkpoint resume, trace, metrics); on
 * failure everything built so far is freed. */
loom_status loom_run_setup(loom_run *r, const loom_model_config *mc, const loom_train_config *tc,
                           loom_mesh *mesh, loom_error *err);
void loom_run_free(loom_run *r);
/* The run's buffers are in a device's memory (--device cuda), not the host's. */
int loom_run_on_device(const loom_run *r);
/* Only what sizes the rank's memory: the tensor/context-parallel groups, the model (or
 * the pipeline stage's slots) with arenas sized but not allocated, MoE and ZeRO, on a
 * mesh that may be a shape (loom_mesh_shape); no data, no parameters, no step. Free with
 * loom_run_free. */
loom_status loom_run_size(loom_run *r, const loom_model_config *mc, const loom_train_config *tc,
                          loom_mesh *mesh, loom_error *err);

/* ZeRO-3 with --grad-accum sharded and a language model's untied head: the embedding and
 * the tail are handed back between their uses in a step too (parallel/fsdp.h release_ends). */
int loom_run_fsdp_release_ends(const loom_run *r);
/* 1 when the run's language model keeps its logits in bf16 (--precision bf16, one
 * tensor-parallel rank, not a vlm or dit, not loom rl: model/tp_linear.c's
 * loom_model_keep_bf16_logits from the run's side). */
int loom_run_bf16_logits(const loom_run *r);

/* What one rank holds, bytes: the start-up report's memory figures (train/run_memory.c). */
typedef struct {
    size_t params;           /* persistent parameters (ZeRO-3: the shard) */
    size_t gathered;         /* ZeRO-3: parameters gathered at most at once beyond the shard */
    size_t grads_local;      /* the local accumulation buffer (sharded: the shard's sum and
                              * the ranges in flight) */
    int grads_sharded;       /* --grad-accum sharded (ZeRO-3's default) */
    size_t grads_shard;      /* ZeRO-2/3: the part of it that stays (inside grads_local) */
    size_t optimizer;        /* AdamW m and v */
    size_t ema;              /* --ema-decay: the weights' moving average, laid out as m */
    size_t activations;      /* one micro-batch's arena (a pipeline stage: one slot) */
    size_t act_sp, act_nosp; /* --tp > 1: the arena with / without sequence parallelism */
    size_t act_whole;        /* --cp > 1: the arena holding whole sequences */
    size_t cp_buffers;       /* --cp > 1: the ring's / Ulysses' buffers */
    size_t moe_buffers;      /* MoE: one model's routing, dispatch and expert buffers */
    int pp_slots;            /* --pp > 1: micro-batches in flight, one arena (+ MoE) each */
    size_t pp_messages;      /* --pp > 1: the stage's message buffers */
    size_t vision;           /* --vision-schedule bubbles: loom_pp_vision_bytes */
    size_t mpi_temp;         /* dp > 1: OpenMPI's temporary of the largest gradient all-reduce */
    size_t tp_messages;      /* --precision bf16, tp > 1: tp/tp.h's bf16 message buffers */
    size_t dp_buffers;       /* dp > 1: the embedding split's gathered rows, --ep ZeRO's
                              * pack and receive buffers */
    size_t total;            /* all of the above that is allocated */
} loom_run_memory;
void loom_run_memory_collect(const loom_run *r, loom_run_memory *m);
/* The memory of world rank `rank` of layout tc->layout over world ranks, without MPI
 * (a shape mesh and loom_run_size). */
loom_status loom_run_memory_of(const loom_model_config *mc, const loom_train_config *tc, int world,
                               int rank, loom_run_memory *m, loom_error *err);
/* The start-up report's "memory per rank: ..." line (no prefix, no newline). */
void loom_run_memory_line(const loom_run_memory *m, int micro_batch, int seq_len, char *buf,
                          size_t n);

/* Start-up report (rank 0): model, layout, memory per rank, data. */
void loom_run_report_startup(const loom_run *r);
/* End of run: what the layout's communication cost (rank 0), steps run. */
void loom_run_report_end(const loom_run *r, int steps_run);
/* Collective over the world: rank 0 prints the peak resident memory (getrusage's maximum
 * resident set, the kernel's VmHWM) of the largest and the smallest rank so far. */
loom_status loom_run_report_peak_memory(const loom_run *r, loom_error *err);

/* A flat buffer as unsharded tensors: itself on one rank, else gathered into
 * r->global_flat (every rank calls this; *out is valid on the gathering rank); pipeline
 * stages: the whole model on world rank 0. */
loom_status loom_run_export_flat(loom_run *r, const float *flat, const loom_param_table **table,
                                 const float **out, loom_error *err);

#endif
