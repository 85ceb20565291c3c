/* The training configuration: defaults, validation (messages name the flag), and the
 * part of it the pipeline reads. */
#include <stdio.h>
#include <string.h>

#include "cp/cp.h"
#include "model/moe_config.h"
#include "parallel/param_gather.h"
#include "parallel/tp_shards.h"
#include "train/batch_skip.h"
#include "train/compute_weights.h"
#include "train/train_config.h"

/* The checkpoint and resume flags. */
static loom_status validate_checkpointing(const loom_train_config *tc, loom_error *err) {
    if (tc->ckpt_every < 0 || tc->ckpt_fast_every < 0 || tc->ckpt_keep < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ckpt-every %d / --ckpt-fast-every %d / --ckpt-keep %d: expected "
                              ">= 0",
                              tc->ckpt_every, tc->ckpt_fast_every, tc->ckpt_keep);
    if (tc->ckpt_every > 0 && !tc->ckpt_dir[0])
        return loom_error_set(err, LOOM_ERR_INPUT, "--ckpt-every %d: needs --ckpt-dir",
                              tc->ckpt_every);
    if (tc->ckpt_fast_every > 0 && !tc->ckpt_fast_dir[0])
        return loom_error_set(err, LOOM_ERR_INPUT, "--ckpt-fast-every %d: needs --ckpt-fast-dir",
                              tc->ckpt_fast_every);
    if (tc->ckpt_peer && !tc->ckpt_dir[0] && !tc->ckpt_fast_dir[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ckpt-peer: needs --ckpt-dir (the disk tier it falls back to)");
    if (tc->ckpt_peer && !tc->ckpt_peer_dir[0])
        return loom_error_set(err, LOOM_ERR_INPUT, "--ckpt-peer-dir: expected a folder");
    if (strcmp(tc->resume, "auto") == 0 && !tc->ckpt_dir[0] && !tc->ckpt_fast_dir[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume auto: needs --ckpt-dir or --ckpt-fast-dir to search");
    if (tc->resume[0] && tc->init_from[0])
        return loom_error_set(err, LOOM_ERR_INPUT, "--resume and --init-from: give only one");
    return LOOM_OK;
}

void loom_train_config_defaults(loom_train_config *tc) {
    memset(tc, 0, sizeof *tc);
    tc->micro_batch = 4;
    tc->global_batch = 4;
    tc->steps = 100;
    tc->warmup_steps = 10;
    tc->lr = 6e-4f;
    tc->min_lr = 6e-5f;
    tc->adamw = (loom_adamw_config){0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    tc->seed = 1337;
    snprintf(tc->ckpt_peer_dir, sizeof tc->ckpt_peer_dir, "/dev/shm/loom-peer");
    tc->threads = 0; /* 0: all cores */
    tc->log_every = 1;
    tc->layout = (loom_layout){1, 1, 1, 1, 1};
    snprintf(tc->cp_mode, sizeof tc->cp_mode, "ring");
    snprintf(tc->device, sizeof tc->device, "cpu");
    snprintf(tc->precision, sizeof tc->precision, "fp32");
    snprintf(tc->grad_reduce_dtype, sizeof tc->grad_reduce_dtype, "fp32");
    snprintf(tc->bf16_rounding, sizeof tc->bf16_rounding, "nearest");
    tc->zero = 0;
    tc->bucket_mb = 25.0f;
    tc->moe_chunks = 1;
    tc->startup_timeout = 60.0f;
    tc->eval_every = 0;
    tc->eval_batches = 4;
    snprintf(tc->pp_schedule, sizeof tc->pp_schedule, "1f1b");
    snprintf(tc->vision_schedule, sizeof tc->vision_schedule, "first");
    snprintf(tc->grad_accum, sizeof tc->grad_accum, "auto"); /* sharded at --zero 3 */
    tc->virtual_stages = 1;
    tc->flow = (loom_flow_options){LOOM_T_LOGIT_NORMAL, 0.1f, 0}; /* n_classes: the model's */
    loom_outer_config_defaults(&tc->outer);
}

/* --outer diloco against the other flags (the flags themselves: parallel/outer.c). */
static loom_status validate_outer(const loom_train_config *tc, loom_error *err) {
    const loom_outer_config *o = &tc->outer;
    loom_status st = loom_outer_config_validate(o, 0, err);
    if (st || !loom_outer_enabled(o)) return st;
    const int dp = tc->layout.dp, W = o->workers;
    if (o->total_batch == 0 && dp >= 1 && tc->global_batch % (W * dp * tc->micro_batch) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--global-batch %d: must be a multiple of --workers %d x --dp %d x "
                              "--micro-batch %d (each worker takes an equal slice of every step)",
                              tc->global_batch, W, dp, tc->micro_batch);
    /* The checkpoint tiers keep the outer state beside each step (trainer.c, setup.c's
     * resume_outer and reload_at); --ckpt-peer's copies live in the worker job's own hosts
     * (docs/diloco.md). */
    const int elastic = o->elastic_worker >= 0;
    const char *not_yet = elastic && tc->ckpt_peer         ? "--elastic-worker and --ckpt-peer"
                          : strcmp(tc->device, "cpu") != 0 ? "--device other than cpu"
                                                           : NULL;
    if (not_yet)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--outer diloco: not with %s yet (docs/diloco.md: limits)", not_yet);
    return LOOM_OK;
}

void loom_train_config_for_worker(const loom_train_config *tc, int worker,
                                  loom_train_config *group) {
    *group = *tc;
    loom_outer_config *o = &group->outer;
    if (!loom_outer_enabled(o) || o->total_batch != 0) return;
    o->total_batch = tc->global_batch;
    group->global_batch = tc->global_batch / o->workers;
    /* each worker's inner state in its own checkpoint folder: DIR/worker_W */
    if (tc->ckpt_dir[0])
        snprintf(group->ckpt_dir, sizeof group->ckpt_dir, "%.900s/worker_%d", tc->ckpt_dir, worker);
    if (tc->ckpt_fast_dir[0])
        snprintf(group->ckpt_fast_dir, sizeof group->ckpt_fast_dir, "%.900s/worker_%d",
                 tc->ckpt_fast_dir, worker);
    if (tc->resume[0] && strcmp(tc->resume, "auto") != 0) { /* DIR/step_N, or DIR */
        const char *slash = strrchr(tc->resume, '/');
        const char *leaf = slash ? slash + 1 : tc->resume;
        if (strncmp(leaf, "step_", 5) == 0)
            snprintf(group->resume, sizeof group->resume, "%.*s%sworker_%d/%.100s",
                     (int)(leaf - tc->resume), tc->resume, slash ? "" : "./", worker, leaf);
        else
            snprintf(group->resume, sizeof group->resume, "%.900s/worker_%d", tc->resume, worker);
    }
    if (worker == 0) return;
    group->metrics[0] = group->tensorboard[0] = group->save_weights[0] = 0;
    group->save_ema[0] = group->dump_dir[0] = group->trace[0] = group->pp_stats[0] = 0;
    group->log_every = 0;
}

loom_status loom_train_config_validate(const loom_train_config *tc, loom_error *err) {
    loom_precision precision;
    loom_status pst = loom_precision_parse(tc->precision, "--precision", &precision, err);
    if (pst) return pst;
    const int reduce_bf16 = strcmp(tc->grad_reduce_dtype, "bf16") == 0;
    if (!reduce_bf16 && strcmp(tc->grad_reduce_dtype, "fp32") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--grad-reduce-dtype '%s': expected fp32 or bf16",
                              tc->grad_reduce_dtype);
    if (reduce_bf16 && precision != LOOM_PRECISION_BF16)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--grad-reduce-dtype bf16: needs --precision bf16 (an fp32 run "
                              "reduces its gradients in fp32; docs/precision.md)");
    loom_bf16_rounding rounding;
    if ((pst = loom_bf16_rounding_parse(tc->bf16_rounding, "--bf16-rounding", &rounding, err)))
        return pst;
    if (rounding == LOOM_BF16_ROUND_STOCHASTIC && precision != LOOM_PRECISION_BF16)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--bf16-rounding stochastic: needs --precision bf16 (fp32 runs "
                              "round nothing; docs/precision.md)");
    if (reduce_bf16 && tc->layout.ep > 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--grad-reduce-dtype bf16: not with --ep %d yet (expert gradients "
                              "reduce in fp32; docs/precision.md)",
                              tc->layout.ep);
    if (!tc->data[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--data: required (a file or glob of token shards, llm.c format, or "
                              "of image shards for a dit)");
    if (tc->micro_batch <= 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--micro-batch %d: expected > 0",
                              tc->micro_batch);
    if (tc->global_batch <= 0 || tc->global_batch % tc->micro_batch != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--global-batch %d: expected a positive multiple of --micro-batch %d",
                              tc->global_batch, tc->micro_batch);
    if (tc->steps <= 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--steps %d: expected > 0", tc->steps);
    if (tc->warmup_steps < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--warmup-steps %d: expected >= 0",
                              tc->warmup_steps);
    if (!(tc->lr >= 0.0f) || !(tc->min_lr >= 0.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--lr/--min-lr: expected >= 0");
    if (!(tc->adamw.beta1 >= 0 && tc->adamw.beta1 < 1) ||
        !(tc->adamw.beta2 >= 0 && tc->adamw.beta2 < 1))
        return loom_error_set(err, LOOM_ERR_INPUT, "--beta1/--beta2: expected in [0, 1)");
    if (!(tc->adamw.eps > 0))
        return loom_error_set(err, LOOM_ERR_INPUT, "--adam-eps %g: expected > 0", tc->adamw.eps);
    if (!(tc->adamw.weight_decay >= 0))
        return loom_error_set(err, LOOM_ERR_INPUT, "--weight-decay %g: expected >= 0",
                              tc->adamw.weight_decay);
    if (!(tc->adamw.grad_clip >= 0))
        return loom_error_set(err, LOOM_ERR_INPUT, "--grad-clip %g: expected >= 0 (0 = off)",
                              tc->adamw.grad_clip);
    const int dp = tc->layout.dp;
    if (tc->layout.cp < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--cp %d: expected >= 1 (context-parallel ranks per sequence)",
                              tc->layout.cp);
    if (dp >= 1 && tc->global_batch % (dp * tc->micro_batch) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--global-batch %d: must be a multiple of --dp %d x --micro-batch %d "
                              "(each data-parallel rank takes an equal slice)",
                              tc->global_batch, dp, tc->micro_batch);
    if (tc->zero < 0 || tc->zero > 3)
        return loom_error_set(err, LOOM_ERR_INPUT, "--zero %d: expected 0, 1, 2 or 3", tc->zero);
    const int sharded = strcmp(tc->grad_accum, "sharded") == 0;
    if (!sharded && strcmp(tc->grad_accum, "local") != 0 && strcmp(tc->grad_accum, "auto") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--grad-accum '%s': expected local, sharded or auto", tc->grad_accum);
    if (sharded && tc->zero < 2)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--grad-accum sharded: needs --zero 2 or 3 (got --zero %d)",
                              tc->zero);
    if (!(tc->memory_per_rank >= 0))
        return loom_error_set(err, LOOM_ERR_INPUT, "--memory-per-rank %g: expected GiB >= 0",
                              (double)tc->memory_per_rank);
    if (!(tc->bucket_mb > 0))
        return loom_error_set(err, LOOM_ERR_INPUT, "--bucket-mb %g: expected > 0", tc->bucket_mb);
    if (!(tc->startup_timeout > 0 && tc->startup_timeout <= 86400))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--startup-timeout %g: expected seconds in (0, 86400]",
                              tc->startup_timeout);
    if (tc->eval_every < 0 || tc->eval_batches < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--eval-every %d / --eval-batches %d: expected >= 0 and >= 1",
                              tc->eval_every, tc->eval_batches);
    if (tc->eval_every > 0 && !tc->val_data[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--eval-every %d: needs --val-data (validation shards)",
                              tc->eval_every);
    if (tc->threads < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--threads %d: expected >= 0", tc->threads);
    if (!(tc->flow.class_dropout >= 0.0f && tc->flow.class_dropout < 1.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--class-dropout %g: expected in [0, 1)",
                              (double)tc->flow.class_dropout);
    if (!(tc->ema_decay >= 0.0f && tc->ema_decay < 1.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--ema-decay %g: expected in [0, 1) (0 = off)",
                              (double)tc->ema_decay);
    if (tc->save_ema[0] && tc->ema_decay == 0.0f)
        return loom_error_set(err, LOOM_ERR_INPUT, "--save-ema %s: needs --ema-decay > 0",
                              tc->save_ema);
    loom_batch_skip skip;
    loom_status st = loom_batch_skip_parse(&skip, tc->skip_steps, err);
    if (!st) st = validate_checkpointing(tc, err);
    return st ? st : validate_outer(tc, err);
}

loom_status loom_train_config_validate_cp(const loom_train_config *tc, const loom_model_config *mc,
                                          loom_error *err) {
    loom_cp_mode mode;
    loom_status st = loom_cp_mode_parse(tc->cp_mode, &mode, err);
    const int cp = tc->layout.cp, tp = tc->layout.tp;
    if (st || cp <= 1) return st;
    if (mc->n_experts > 0 && mc->capacity_factor > 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--cp %d with --capacity-factor %g: context parallelism needs a "
                              "dropless MoE (--capacity-factor 0), since an expert's capacity "
                              "counts the tokens of a whole micro-batch",
                              cp, (double)mc->capacity_factor);
    const int causal = mc->family != LOOM_FAMILY_DIT;
    if (tp > 1 && (mc->n_head % tp || mc->n_kv_head % tp)) return LOOM_OK; /* tp's own check */
    return loom_cp_validate(cp, mode, causal, mc->seq_len, mc->n_head / tp, mc->n_kv_head / tp,
                            err);
}

void loom_train_config_pipeline(const loom_train_config *tc, loom_pp_config *pc) {
    memset(pc, 0, sizeof *pc);
    pc->pp = tc->layout.pp;
    pc->virtual_stages = tc->virtual_stages;
    snprintf(pc->schedule, sizeof pc->schedule, "%s", tc->pp_schedule);
    snprintf(pc->layers, sizeof pc->layers, "%s", tc->pp_layers);
    snprintf(pc->stats, sizeof pc->stats, "%s", tc->pp_stats);
    pc->recompute = tc->recompute;
    pc->micro_batch = tc->micro_batch;
    pc->global_batch = tc->global_batch;
    pc->vision_bubbles = strcmp(tc->vision_schedule, "bubbles") == 0;
    pc->bf16_messages = strcmp(tc->precision, "bf16") == 0;
}

/* --vision-schedule: first (the encoder on the first pipeline stage) or bubbles (its
 * pieces on every stage, pipeline/vision_plan.h), in the layouts bubbles covers. */
static loom_status validate_vision_schedule(const loom_train_config *tc,
                                            const loom_model_config *mc, loom_error *err) {
    const char *v = tc->vision_schedule;
    if (strcmp(v, "first") == 0) return LOOM_OK;
    if (strcmp(v, "bubbles") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--vision-schedule '%s': expected first or bubbles", v);
    const char *why = mc->family != LOOM_FAMILY_VLM ? "needs --family vlm (a vision encoder)"
                      : tc->layout.pp < 2           ? "needs --pp >= 2 (pipeline stages to fill)"
                                                    : NULL;
    if (why)
        return loom_error_set(err, LOOM_ERR_INPUT, "--vision-schedule bubbles: %s (docs/vlm.md)",
                              why);
    return LOOM_OK;
}

loom_status loom_train_config_validate_all(const loom_train_config *tc, const loom_model_config *mc,
                                           loom_error *err) {
    const loom_layout l = tc->layout;
    loom_pp_config pc;
    loom_status st;
    if ((st = loom_model_config_validate(mc, err)) || (st = loom_train_config_validate(tc, err)) ||
        (st = loom_train_config_validate_cp(tc, mc, err)) ||
        (st = loom_tp_validate(mc, l.tp, tc->sequence_parallel,
                               tc->micro_batch * mc->seq_len / (l.cp > 0 ? l.cp : 1), err)) ||
        (st = loom_moe_validate_layout(mc, l.ep, loom_layout_replicas(l), tc->zero, l.tp, l.pp,
                                       err)))
        return st;
    if (tc->balance_dp && mc->family != LOOM_FAMILY_VLM)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--balance-dp: balances image-text samples by their images "
                              "(expected --family vlm, not %s)",
                              loom_family_name(mc->family));
    if ((st = validate_vision_schedule(tc, mc, err))) return st;
    loom_train_config_pipeline(tc, &pc);
    if ((st = loom_pipeline_validate(mc, &pc, l.dp, err))) return st;
    if (tc->overlap_param_gather && (st = loom_param_gather_validate(tc->zero, l, err))) return st;
    if ((st = loom_outer_config_validate(&tc->outer, mc->n_layer, err))) return st;
    loom_device_kind kind;
    const int world = (l.dp > 0 ? l.dp : 1) * l.tp * l.pp * (l.cp > 0 ? l.cp : 1);
    return loom_train_config_validate_device(tc, mc, world, &kind, err);
}

loom_status loom_train_config_validate_device(const loom_train_config *tc,
                                              const loom_model_config *mc, int world_size,
                                              loom_device_kind *kind, loom_error *err) {
    loom_status st = loom_device_parse(tc->device, "--device", kind, err);
    if (st || *kind == LOOM_DEVICE_CPU) return st;
    if (strcmp(tc->precision, "bf16") == 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--precision bf16: not with --device %s yet (bf16 GEMMs run on the "
                              "CPU through oneDNN; docs/precision.md)",
                              loom_device_name(*kind));
    /* What the device path does not cover yet (docs/gpu.md), one clear line each. */
    const char *not_yet = world_size > 1                  ? "more than one process (dp/tp/pp/cp/ep)"
                          : mc->family == LOOM_FAMILY_DIT ? "--family dit"
                          : mc->n_experts > 0             ? "--n-experts (mixture of experts)"
                          : tc->ckpt_dir[0] || tc->ckpt_fast_dir[0] || tc->ckpt_peer
                              ? "checkpoints (--ckpt-dir, --ckpt-fast-dir, --ckpt-peer)"
                          : tc->resume[0]            ? "--resume"
                          : tc->init_from[0]         ? "--init-from"
                          : tc->ema_decay > 0.0f     ? "--ema-decay"
                          : tc->overlap_param_gather ? "--overlap-param-gather"
                                                     : NULL;
    if (!not_yet) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "--device %s: not with %s yet (today: one GPU, one process, dense "
                          "gpt2/llama models, no checkpoints; docs/gpu.md)",
                          loom_device_name(*kind), not_yet);
}

int loom_train_config_sharded_accum(const loom_train_config *tc, int stage) {
    if (stage < 2) return 0; /* ZeRO 0-1, or one replica (stage 0): local */
    if (strcmp(tc->grad_accum, "auto") == 0) return stage == 3;
    return strcmp(tc->grad_accum, "sharded") == 0;
}
