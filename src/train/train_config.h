/* The training configuration (every `loom train` flag): defaults, validation, and the
 * part the pipeline reads. */
#ifndef LOOM_TRAIN_TRAIN_CONFIG_H
#define LOOM_TRAIN_TRAIN_CONFIG_H

#include <stdint.h>

#include "core/error.h"
#include "core/fs.h"
#include "data/flow_batch.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "parallel/outer.h"
#include "pipeline/pipeline.h"

typedef struct {
    char data[LOOM_PATH_MAX]; /* glob of token shards */
    int micro_batch;          /* sequences per forward/backward */
    int global_batch;         /* sequences per optimizer step */
    int steps;
    int warmup_steps;
    float lr, min_lr;
    loom_adamw_config adamw;
    uint64_t seed;
    int threads;
    int log_every;
    char metrics[LOOM_PATH_MAX];      /* JSON lines, one per step; "" = none */
    char dump_dir[LOOM_PATH_MAX];     /* tensors for reference tests; "" = none */
    loom_layout layout;               /* --dp --tp --pp --ep --cp */
    char cp_mode[16];                 /* context parallelism: ring | ulysses (cp/cp.h) */
    int zero;                         /* ZeRO stage 0-2 over the data-parallel group */
    float bucket_mb;                  /* gradient bucket size for overlapped reduction */
    int overlap_param_gather;         /* ZeRO 1, 2: gather params during the next forward */
    int moe_chunks;                   /* MoE all-to-all chunks (model/moe.h) */
    float startup_timeout;            /* s: every rank must start within this */
    char trace[LOOM_PATH_MAX];        /* Chrome trace JSON of every rank; "" = none */
    char save_weights[LOOM_PATH_MAX]; /* final weights (safetensors) for generate; "" = none */
    char val_data[LOOM_PATH_MAX];     /* validation shards; "" = no evaluation */
    char tensorboard[LOOM_PATH_MAX];  /* TensorBoard event files go here; "" = none */
    int eval_every;                   /* evaluate every N steps (and after the last) */
    int eval_batches;                 /* global batches per evaluation (fixed set) */
    int sequence_parallel;            /* with --tp > 1: Megatron sequence parallelism */
    int balance_dp; /* vlm: the global batch's samples spread over dp by predicted compute */
    /* checkpoints (train/checkpointing.h) */
    char ckpt_dir[LOOM_PATH_MAX];      /* durable tier; "" = none */
    int ckpt_every;                    /* save every N steps (0: only at the end) */
    int ckpt_keep;                     /* complete checkpoints kept per tier (0 = all) */
    char ckpt_fast_dir[LOOM_PATH_MAX]; /* fast tier (node-local memory); "" = none */
    int ckpt_fast_every;               /* fast-tier save every M steps (0 = never) */
    int ckpt_peer;                     /* every save also in memory here + a peer host's */
    char ckpt_peer_dir[LOOM_PATH_MAX]; /* that memory (per host: DIR/HOSTNAME/...) */
    char resume[LOOM_PATH_MAX];        /* "auto", a checkpoint or a tier folder; "" = none */
    char init_from[LOOM_PATH_MAX];     /* start from these weights (safetensors); "" = none */
    /* pipeline parallelism (--pp > 1, src/pipeline/) */
    char pp_schedule[16];           /* gpipe | 1f1b | interleaved | zb */
    char vision_schedule[16];       /* vlm with pp: first | bubbles (pipeline/vision_plan.h) */
    int virtual_stages;             /* model chunks per pipeline rank (interleaved) */
    char pp_layers[256];            /* "" = even split, else layers per (virtual) stage */
    char pp_stats[LOOM_PATH_MAX];   /* per-rank pipeline timers (JSON lines); "" = none */
    int recompute;                  /* loom_recompute: 0 none, 1 full, 2 selective */
    int dry_run;                    /* set up and print the start-up report, no step */
    char device[16];                /* cpu | cuda (kernels/backend.h: loom_device_parse) */
    char precision[8];              /* fp32 | bf16: the linear layers' GEMMs (docs/precision.md) */
    char grad_reduce_dtype[8];      /* fp32 | bf16: the dp gradient reduction on the wire */
    char bf16_rounding[16];         /* nearest | stochastic: the weights' bf16 compute copy */
    char skip_steps[LOOM_PATH_MAX]; /* batches never trained on (train/batch_skip.h) */
    char inject[LOOM_PATH_MAX];     /* faults to inject (core/fault.h); cli arms them */
    int resume_ignore_seed;         /* resume a checkpoint saved with another --seed */
    char grad_accum[16];            /* local | sharded | auto (ZeRO-3: sharded; else local) */
    float memory_per_rank;          /* GiB a rank may hold (0: no limit; cli/memory_budget.h) */
    /* diffusion transformers (family dit) */
    loom_flow_options flow;       /* --t-sampling, --class-dropout */
    float ema_decay;              /* --ema-decay: moving average of the weights (0 = off) */
    char save_ema[LOOM_PATH_MAX]; /* the average's final weights (safetensors); "" = none */
    loom_outer_config outer;      /* --outer diloco: worker groups, outer optimizer */
} loom_train_config;

/* Defaults (nanoGPT/llm.c-like). */
void loom_train_config_defaults(loom_train_config *tc);
/* Checks values (including the split of the batch over data-parallel ranks); messages
 * name the flag. */
loom_status loom_train_config_validate(const loom_train_config *tc, loom_error *err);
/* Context parallelism against the model: the sequence split (zigzag needs 2 x --cp),
 * Ulysses' heads, a dropless MoE (the router's capacity is counted over a whole
 * micro-batch); messages name the flag. Nothing to check without --cp. */
loom_status loom_train_config_validate_cp(const loom_train_config *tc, const loom_model_config *mc,
                                          loom_error *err);
/* --device: the kind asked for (cpu | cuda), and LOOM_ERR_INPUT for what the device path
 * does not run yet (more than one process, dit, MoE, checkpoints, ...). */
loom_status loom_train_config_validate_device(const loom_train_config *tc,
                                              const loom_model_config *mc, int world_size,
                                              loom_device_kind *kind, loom_error *err);
/* Everything `loom train` checks before it starts MPI: the model, these flags, and the
 * layout against the model (tensor, context, expert and pipeline parallelism, the
 * overlapped gather); messages name the flag. loom plan proposes only what passes. */
loom_status loom_train_config_validate_all(const loom_train_config *tc, const loom_model_config *mc,
                                           loom_error *err);
/* --outer diloco: worker `worker`'s own configuration: --global-batch becomes its 1/W
 * share (outer.total_batch keeps the whole), and workers other than 0 write no files and
 * print no progress (worker 0 reports for all). Without --outer: a copy. */
void loom_train_config_for_worker(const loom_train_config *tc, int worker,
                                  loom_train_config *group);
/* The pipeline's part of the configuration (--pp, --pp-schedule, ...). */
void loom_train_config_pipeline(const loom_train_config *tc, loom_pp_config *pc);
/* --grad-accum: whether a run reduces every micro-batch's gradient into the rank's shard
 * (sharded accumulation, FSDP's), given its ZeRO stage as run (0 over one replica): asked
 * for (stages 2, 3), or auto at stage 3 (every family and layout, pipelines included);
 * else local (one reduction a step). The run (train/setup.c) and loom plan's step time
 * (plan/step_comm.c) both decide by it. */
int loom_train_config_sharded_accum(const loom_train_config *tc, int stage);
#endif
