#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fault.h"
#include "core/progress.h"
#include "core/timeline.h"
#include "core/fs.h"
#include "data/dataset.h"
#include "model/moe_config.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "parallel/ep.h"
#include "parallel/ep_zero.h"
#include "parallel/fsdp.h"
#include "parallel/param_gather.h"
#include "parallel/tp.h"
#include "comm/world.h"
#include "parallel/zero.h"
#include "pipeline/pipeline.h"
#include "train/batch_skip.h"
#include "train/checkpointing.h"
#include "train/dump.h"
#include "train/route_dump.h"
#include "train/metrics.h"
#include "train/schedule.h"
#include "train/tensorboard.h"

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
    tc->threads = 0; /* 0: all cores */
    tc->log_every = 1;
    tc->layout = (loom_layout){1, 1, 1, 1};
    tc->zero = 0;
    tc->bucket_mb = 25.0f;
    tc->moe_chunks = 1;
    tc->startup_timeout = 60.0f;
    tc->eval_every = 0;
    tc->eval_batches = 4;
    snprintf(tc->pp_schedule, sizeof tc->pp_schedule, "1f1b");
    tc->virtual_stages = 1;
}

loom_status loom_train_config_validate(const loom_train_config *tc, loom_error *err) {
    if (!tc->data[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--data: required (a file or glob of token shards, llm.c format)");
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
    if (dp >= 1 && tc->global_batch % (dp * tc->micro_batch) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--global-batch %d: must be a multiple of --dp %d x --micro-batch %d "
                              "(each data-parallel rank takes an equal slice)",
                              tc->global_batch, dp, tc->micro_batch);
    if (tc->zero < 0 || tc->zero > 3)
        return loom_error_set(err, LOOM_ERR_INPUT, "--zero %d: expected 0, 1, 2 or 3", tc->zero);
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
    loom_batch_skip skip;
    loom_status st = loom_batch_skip_parse(&skip, tc->skip_steps, err);
    return st ? st : loom_checkpointing_validate(tc, err);
}

/* Everything a run owns, so one function can free it on every path. */
typedef struct {
    loom_dataset data, val;
    loom_model model;
    loom_zero zero;
    loom_fsdp fsdp;       /* ZeRO-3 only: params is then fsdp.view */
    loom_param_gather pg; /* --overlap-param-gather (ZeRO 1, 2) */
    int sharded_params;
    float *params, *grads;
    int32_t *batch;         /* this rank's slice of the step: [G/dp, T+1] */
    int32_t *dump_batches;  /* [steps, G, T+1] on rank 0 when dumping */
    loom_route_dump routes; /* MoE router decisions when dumping (every rank) */
    loom_metrics metrics;
    loom_tb_writer *tb; /* rank 0, with --tensorboard */
    loom_trace *trace;
    loom_tp tp;                    /* the tensor-parallel group's layers (one rank: trivial) */
    loom_param_table global_table; /* tp > 1: the unsharded registry, for weights and dumps */
    float *global_flat;            /* tp > 1, rank 0: a gathered flat buffer */
    loom_checkpointing ckpt;
    loom_mesh *mesh;
    int start_step;     /* steps already done (resumed from a checkpoint) */
    loom_pipeline pipe; /* --pp > 1: the stage's schedule, slots and buffers */
    int pipelined;
} run_state;

static void run_free(run_state *r) {
    loom_checkpointing_close(&r->ckpt); /* first: its writer thread reads the buffers below */
    loom_param_gather_free(&r->pg);     /* and no gather into them stays in flight */
    if (r->pipelined) loom_pipeline_free(&r->pipe);
    loom_dataset_close(&r->data);
    loom_dataset_close(&r->val);
    loom_model_destroy(&r->model);
    if (r->sharded_params)
        loom_fsdp_free(&r->fsdp);
    else
        free(r->params);
    loom_zero_grads_free(&r->zero, r->grads);
    loom_zero_free(&r->zero);
    free(r->batch);
    free(r->dump_batches);
    loom_route_dump_free(&r->routes);
    loom_metrics_close(&r->metrics);
    loom_trace_close(r->trace);
    loom_tb_close(r->tb);
    loom_tp_free(&r->tp);
    loom_params_free(&r->global_table);
    free(r->global_flat);
}

/* A flat buffer as unsharded tensors: itself on one rank, else gathered over the
 * tensor-parallel group into r->global_flat on its rank 0 (every rank calls this). */
static loom_status export_flat(run_state *r, const float *flat, const loom_param_table **table,
                               const float **out, loom_error *err) {
    *table = &r->model.table;
    *out = flat;
    loom_status st = LOOM_OK;
    if (r->mesh->ep.size > 1 && r->tp.size > 1) { /* both: over tp, then over ep */
        *table = &r->global_table;
        *out = r->global_flat;
        st = loom_ep_tp_gather_flat(&r->tp, &r->mesh->ep, &r->model.table, flat, &r->global_table,
                                    r->global_flat, &r->model.cfg,
                                    r->pipelined ? &r->pipe.layers : NULL, err);
    } else if (r->mesh->ep.size > 1) { /* expert parallelism: gather the experts (model/moe.h) */
        *table = &r->global_table;
        *out = r->global_flat;
        st = loom_ep_gather_flat(&r->model.table, flat, &r->global_table, r->global_flat,
                                 &r->mesh->ep, err);
    } else if (r->tp.size > 1) {
        *table = &r->global_table;
        *out = r->global_flat;
        st = loom_tp_gather_flat(&r->tp, &r->model.table, flat, &r->global_table, r->global_flat,
                                 err);
    }
    /* pipeline stages: the whole model on world rank 0 */
    if (!st && r->pipelined) st = loom_pipeline_export(&r->pipe, *table, *out, table, out, err);
    return st;
}

/* Splits sequences [first, first+M) of the rank's slice into inputs and targets. */
static void load_micro_batch(loom_model *mod, const int32_t *batch, int first, int M, int T) {
    for (int b = 0; b < M; b++) {
        const int32_t *seq = batch + (size_t)(first + b) * (T + 1);
        memcpy(mod->inputs + (size_t)b * T, seq, (size_t)T * sizeof(int32_t));
        memcpy(mod->targets + (size_t)b * T, seq + 1, (size_t)T * sizeof(int32_t));
    }
}

/* Validation loss over a fixed set of eval_batches global batches (the same sequences at
 * every evaluation, whatever the layout), averaged over all their tokens. */
static loom_status evaluate(run_state *r, const loom_model_config *mc, const loom_train_config *tc,
                            loom_mesh *mesh, double *val_loss, loom_error *err) {
    loom_model *mod = &r->model;
    const int T = mc->seq_len, M = tc->micro_batch, G = tc->global_batch;
    const int per_rank = G / mesh->layout.dp, accum = per_rank / M;
    double sum = 0.0;
    loom_status st = loom_param_gather_wait_all(&r->pg, err);
    if (st) return st;
    loom_trace_begin(r->trace, "evaluate", "train");
    loom_progress_phase(LOOM_PHASE_EVAL);
    for (int b = 0; b < tc->eval_batches; b++) {
        /* Step index -1 - b: a stream of batches disjoint from any training step's. */
        loom_dataset_sample(&r->val, tc->seed, -1 - (int64_t)b, (int64_t)mesh->dp_rank * per_rank,
                            per_rank, r->batch);
        if (r->pipelined) {
            double s;
            if ((st = loom_pipeline_forward_loss(&r->pipe, r->params, r->batch,
                                                 r->sharded_params ? &r->fsdp : NULL, &s, err)))
                return st;
            sum += s;
        }
        for (int k = 0; k < accum && !r->pipelined; k++) {
            load_micro_batch(mod, r->batch, k * M, M, T);
            if (r->sharded_params && (st = loom_fsdp_begin_micro_batch(&r->fsdp, err))) return st;
            double s;
            if ((st = loom_model_forward(mod, r->params)) ||
                (st = loom_model_loss_sum(mod, 0.0f, 0, &s)))
                return st;
            sum += s;
        }
    }
    loom_trace_end(r->trace);
    if ((st = loom_comm_allreduce_sum_f64(&mesh->dp, &sum, 1, err))) return st;
    *val_loss = sum / ((double)tc->eval_batches * G * T);
    return LOOM_OK;
}

/* The step's scalars as TensorBoard summaries (train/..., val/loss). */
static loom_status write_tensorboard(loom_tb_writer *tb, const loom_step_metrics *sm,
                                     loom_error *err) {
    struct {
        const char *tag;
        double value;
    } scalars[] = {{"train/loss", sm->loss},
                   {"train/lr", sm->lr},
                   {"train/grad_norm", sm->grad_norm},
                   {"train/tokens_per_s", sm->tokens_per_s},
                   {"val/loss", sm->val_loss}};
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0] && !st; i++)
        if (isfinite(scalars[i].value))
            st = loom_tb_scalar(tb, scalars[i].tag, sm->step, scalars[i].value, err);
    return st ? st : loom_tb_flush(tb, err);
}

/* Progress: one line redrawn in place on a terminal, plain lines every log_every steps
 * otherwise (and always for the last step and evaluations). */
static void report(const loom_train_config *tc, const loom_step_metrics *sm, double elapsed_ms) {
    int step = sm->step, last = step == tc->steps;
    double eta_s = elapsed_ms / step * (tc->steps - step) * 1e-3;
    char val[48] = "";
    if (isfinite(sm->val_loss)) snprintf(val, sizeof val, " | val %.4f", sm->val_loss);
    char line[256];
    snprintf(line, sizeof line,
             "step %5d/%d | loss %.4f%s | lr %.3e | grad norm %.4f | %.0f ms | %.0f tok/s | "
             "ETA %dm%02ds",
             step, tc->steps, sm->loss, val, sm->lr, sm->grad_norm, sm->step_ms, sm->tokens_per_s,
             (int)eta_s / 60, (int)eta_s % 60);
    int keep = tc->log_every > 0 && (step % tc->log_every == 0 || last || val[0]);
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\r%s\033[K%s", line, keep ? "\n" : "");
    else if (keep)
        fprintf(stderr, "%s\n", line);
}

#define STEP_MARK(i, part) loom_timeline_mark((i) == 0 ? "step1_" part : "step2_" part)

static loom_status train_loop(run_state *r, const loom_model_config *mc,
                              const loom_train_config *tc, loom_mesh *mesh, loom_error *err) {
    loom_model *mod = &r->model;
    const loom_param_table *t = &mod->table;
    const int T = mc->seq_len, M = tc->micro_batch, G = tc->global_batch, V = mc->vocab_size;
    const int dp = mesh->layout.dp, per_rank = G / dp, accum = per_rank / M;
    const int lead = mesh->rank == 0;
    const int dumping = tc->dump_dir[0] != 0;
    const float dloss = 1.0f / (float)((size_t)G * T); /* loss = mean over the global batch */
    const int ep_on = mesh->ep.size > 1; /* expert parallelism: parallel/ep.h reduces (ZeRO-0) */
    loom_status st;
    long long tokens_seen = (long long)r->start_step * G * T;
    const double run_start = loom_now_ms();
    loom_batch_skip skip;
    if ((st = loom_batch_skip_parse(&skip, tc->skip_steps, err))) return st;
    int step = r->start_step, stop = 0;
    loom_progress_set_step(step);
    for (; step < tc->steps && !stop; step++) {
        double t0 = loom_now_ms();
        /* The first two steps' parts go into the start-up timeline (the second one as the
         * steady state to compare the first with). */
        const int early = step - r->start_step;
        loom_fault_on_step(step + 1);
        loom_progress_step_begin();
        loom_zero_step_begin(&r->zero);
        loom_trace_begin(r->trace, "step", "train");
        /* This rank's slice of the step's global batch (layout-independent order). */
        const int64_t batch = loom_batch_skip_batch_of(&skip, step + 1) - 1;
        loom_dataset_sample(&r->data, tc->seed, batch, (int64_t)mesh->dp_rank * per_rank, per_rank,
                            r->batch);
        if (dumping && lead)
            loom_dataset_sample(&r->data, tc->seed, batch, 0, G,
                                r->dump_batches + (size_t)step * G * (T + 1));
        loom_zero_grads_clear(&r->zero, r->grads);
        if (early < 2) STEP_MARK(early, "data_and_grad_clear");
        double loss_sum = 0.0;
        if (r->pipelined &&
            (st = loom_pipeline_step(&r->pipe, r->params, r->grads, r->batch, dloss, &r->zero,
                                     &r->tp, r->sharded_params ? &r->fsdp : NULL, &loss_sum, err)))
            return st;
        for (int k = 0; k < accum && !r->pipelined; k++) {
            load_micro_batch(mod, r->batch, k * M, M, T);
            loom_progress_phase(LOOM_PHASE_FORWARD);
            if (r->sharded_params && (st = loom_fsdp_begin_micro_batch(&r->fsdp, err))) return st;
            if ((st = loom_param_gather_begin_micro_batch(&r->pg, err)) ||
                (st = loom_model_forward(mod, r->params)))
                return st;
            if (early < 2 && k == 0) STEP_MARK(early, "forward");
            if (dumping && lead && step == 0 && k == 0 && r->tp.size == 1 && !r->pipelined) {
                int64_t dims[3] = {M, T, V};
                if ((st = loom_dump_tensor(tc->dump_dir, "logits_step1.safetensors", "logits", 0,
                                           mod->logits, 3, dims, err)))
                    return st;
            }
            double s;
            if ((st = loom_model_loss_sum(mod, dloss, 1, &s))) return st;
            loss_sum += s;
            loom_route_dump_record(&r->routes, mod->moe, step, accum, k);
            /* The last micro-batch's backward reduces gradients as they become final
             * (with sequence parallelism the norm gradients over tp first). */
            loom_zero_ready_ctx ready = {&r->zero, r->grads, err, mod->dres, mod->inputs};
            loom_tp_ready_ctx tp_ready = {&r->tp, t, r->grads, loom_zero_grads_ready, &ready};
            /* (with ep the buckets wait for parallel/ep.h after backward; sequence
             * parallelism's norm gradients still reduce over tp here) */
            const int sp = r->tp.sequence_parallel, final = k + 1 == accum, last = final && !ep_on;
            if (ep_on) tp_ready.next = NULL;
            if (last) loom_zero_begin_reduction(&r->zero);
            loom_progress_phase(LOOM_PHASE_BACKWARD);
            if ((st = loom_model_backward(mod, r->params, r->grads,
                                          !final ? NULL
                                          : sp   ? loom_tp_grads_ready
                                          : last ? loom_zero_grads_ready
                                                 : NULL,
                                          sp ? (void *)&tp_ready : (void *)&ready)))
                return st;
            if (early < 2 && k == 0) STEP_MARK(early, "backward");
        }
        loom_fault_after_compute(&loss_sum, loom_now_ms() - t0);    /* slow, nan */
        if (!isfinite(loss_sum)) loom_progress_nonfinite(step + 1); /* this rank's own loss */
        loom_progress_local_loss(loss_sum / ((double)per_rank * T));
        loom_trace_begin(r->trace, "gradient wait", "comm");
        st = loom_zero_finish_reduction(&r->zero, r->grads, err);
        if (!st && ep_on)
            st = r->zero.experts ? loom_ep_zero_reduce(&r->zero, r->grads, err)
                                 : loom_ep_reduce_grads(t, r->grads, &mesh->dp, &mesh->edp, err);
        loom_trace_end(r->trace);
        if (st || (st = loom_comm_allreduce_sum_f64(&mesh->dp, &loss_sum, 1, err))) return st;
        if (early < 2) STEP_MARK(early, "grad_reduce");
        double loss = loss_sum / ((double)G * T);
        if (!isfinite(loss))
            return loom_error_set(err, LOOM_ERR_STATE, "step %d: loss is %f (non-finite)", step + 1,
                                  loss);
        if (dumping && step == 0) {
            const loom_param_table *et;
            const float *eg;
            if ((st = loom_zero_gather_grads(&r->zero, r->grads, err)) ||
                (st = export_flat(r, r->grads, &et, &eg, err)))
                return st;
            if (lead && (st = loom_dump_flat(tc->dump_dir, "grads_step1.safetensors", et, eg, err)))
                return st;
        }
        double norm;
        if ((st = r->pipelined
                      ? loom_pipeline_grad_norm(&r->pipe, &r->tp, &r->zero, r->grads, &norm, err)
                  : r->zero.experts
                      ? loom_ep_zero_grad_norm(&r->zero, r->grads, &mesh->tp, &norm, err)
                  : ep_on ? loom_ep_grad_norm(t, r->grads, &mesh->ep, &mesh->tp, &norm, err)
                          : loom_tp_grad_norm(&r->tp, &r->zero, r->grads, &norm, err)))
            return st;
        float lr = loom_lr_at(step, tc->steps, tc->warmup_steps, tc->lr, tc->min_lr);
        loom_checkpointing_before_update(&r->ckpt); /* a save's copy of the weights is done */
        loom_trace_begin(r->trace, "optimizer", "train");
        loom_progress_phase(LOOM_PHASE_OPTIMIZER);
        if ((st = loom_zero_optimizer_step(&r->zero, r->params,
                                           r->sharded_params ? r->fsdp.shard : NULL, r->grads, norm,
                                           lr, &tc->adamw, step + 1, err)))
            return st;
        if (r->sharded_params) loom_fsdp_invalidate(&r->fsdp);
        if (early < 2) STEP_MARK(early, "optimizer");
        loom_trace_end(r->trace); /* optimizer */
        loom_trace_end(r->trace); /* step */
        loom_zero_step_end(&r->zero);
        double ms = loom_now_ms() - t0;
        loom_progress_step_done(step + 1, loss, ms);
        tokens_seen += (long long)G * T;
        loom_step_metrics sm = {step + 1,
                                loss,
                                lr,
                                norm,
                                (double)G * T / (ms * 1e-3),
                                ms,
                                r->zero.step_wait_ms,
                                NAN,
                                tokens_seen,
                                0,
                                {0, 0, 0, 0, 0, 0},
                                r->pipelined ? NULL : &r->zero.times}; /* pipelined: per action */
        /* MoE with --pp: every slot's and every stage's layers over the world, the tp
         * replicas of a block counted once */
        for (int i = 1; mod->moe && r->pipelined && i < r->pipe.n_slots; i++)
            loom_moe_stats_add(mod->moe, r->pipe.slots[i]->moe);
        if (r->pipelined && mesh->tp_rank != 0) loom_moe_stats_clear(mod->moe);
        if (mod->moe && (st = loom_moe_step_stats(mod->moe, r->pipelined ? &mesh->world : &mesh->dp,
                                                  &sm.moe, err)))
            return st;
        sm.has_moe = mod->moe != NULL;
        if (tc->eval_every > 0 && ((step + 1) % tc->eval_every == 0 || step + 1 == tc->steps) &&
            (st = evaluate(r, mc, tc, mesh, &sm.val_loss, err)))
            return st;
        if (lead && (st = loom_metrics_write(&r->metrics, &sm, err))) return st;
        if (r->tb && (st = write_tensorboard(r->tb, &sm, err))) return st;
        if (lead) report(tc, &sm, loom_now_ms() - run_start);
        if ((loom_checkpointing_saves_at(&r->ckpt, step + 1) &&
             (st = loom_param_gather_wait_all(&r->pg, err))) ||
            (st = loom_checkpointing_step(&r->ckpt, step + 1, &stop, err)))
            return st;
        if (early < 2) STEP_MARK(early, "rest");
        if ((lead || getenv("LOOM_FT_ADDR")) && /* every rank under loom run: own logs */
            (early == 1 || (early == 0 && step + 1 == tc->steps))) {
            char who[32];
            snprintf(who, sizeof who, "rank %d", mesh->rank);
            loom_timeline_print(stderr, who);
        }
    }
    if (lead && r->tp.size > 1)
        fprintf(stderr,
                "loom: tensor-parallel communication: %.2f MiB (%.0f bytes) per step per rank\n",
                (double)mesh->tp.bytes / tc->steps / (1 << 20), (double)mesh->tp.bytes / tc->steps);
    if (lead && mesh->ep.size > 1) /* the all-to-all time not hidden behind expert compute */
        fprintf(stderr,
                "loom: expert-parallel all-to-all: %.3f ms blocked per step (%.3f ms in flight), "
                "%d chunk(s)\n",
                mesh->ep.blocked_ms / (step - r->start_step),
                mesh->ep.inflight_ms / (step - r->start_step), tc->moe_chunks);
    if ((st = loom_param_gather_wait_all(&r->pg, err)) ||
        (st = loom_checkpointing_finish(&r->ckpt, step, err)) || stop)
        return st;
    const int saving = tc->save_weights[0] != 0;
    if ((dumping || saving) && r->sharded_params && (st = loom_fsdp_gather_all(&r->fsdp, err)))
        return st;
    const loom_param_table *et = t;
    const float *ep = r->params;
    if ((dumping || saving) && (st = export_flat(r, r->params, &et, &ep, err))) return st;
    if (saving && lead) {
        loom_mkdir_parent(tc->save_weights);
        if ((st = loom_weights_save(tc->save_weights, mc, et, ep, err))) return st;
        fprintf(stderr, "loom: weights written to %s\n", tc->save_weights);
    }
    if (dumping && lead) {
        int64_t dims[3] = {tc->steps, G, T + 1};
        if ((st = loom_dump_tensor(tc->dump_dir, "tokens.safetensors", "tokens", 1, r->dump_batches,
                                   3, dims, err)) ||
            (st = loom_dump_flat(tc->dump_dir, "params_final.safetensors", et, ep, err)))
            return st;
    }
    /* one file per dp rank: its tp ranks route alike (MoE blocks replicated over tp) */
    if (dumping && mesh->tp_rank == 0 &&
        (st = loom_route_dump_write(&r->routes, tc->dump_dir, mesh->dp_rank, err)))
        return st;
    return LOOM_OK;
}

loom_status loom_train_run(const loom_model_config *mc, const loom_train_config *tc,
                           loom_mesh *mesh, loom_error *err) {
    loom_status st;
    if ((st = loom_model_config_validate(mc, err)) || (st = loom_train_config_validate(tc, err)) ||
        (tc->overlap_param_gather &&
         (st = loom_param_gather_validate(tc->zero, mesh->layout, err))))
        return st;
    run_state r;
    memset(&r, 0, sizeof r);
    r.mesh = mesh;
    const int T = mc->seq_len, per_rank = tc->global_batch / mesh->layout.dp;
    const int lead = mesh->rank == 0;
    loom_timeline_mark("train_setup");
    if ((st = loom_dataset_open(&r.data, tc->data, mc->vocab_size, T, err)) ||
        (tc->val_data[0] &&
         (st = loom_dataset_open(&r.val, tc->val_data, mc->vocab_size, T, err))) ||
        (st = loom_tp_validate(mc, mesh->layout.tp, tc->sequence_parallel, tc->micro_batch * T,
                               err)) ||
        (st = loom_tp_create(&r.tp, &mesh->tp, tc->sequence_parallel, tc->micro_batch * T,
                             mc->d_model, err)) ||
        (st = loom_moe_validate_layout(mc, mesh->layout.ep, mesh->layout.dp, tc->zero,
                                       mesh->layout.tp, mesh->layout.pp, err)) ||
        (r.tp.err = err, r.pipelined = mesh->layout.pp > 1,
         st = r.pipelined
                  ? loom_pipeline_create(&r.pipe, mc, tc, mesh, &r.tp, &r.model, err)
                  : loom_model_create(
                        &r.model,
                        &(loom_model_options){
                            .cfg = mc, .B = tc->micro_batch, .T = T, .tp = &r.tp, .ep = &mesh->ep},
                        err)) ||
        (st = loom_model_set_recompute(&r.model, tc->recompute, err)) ||
        (st = loom_moe_set_chunks(r.model.moe, tc->moe_chunks, err)) ||
        (st = loom_zero_create(&r.zero, &mesh->dp, tc->zero, &r.model.table, tc->bucket_mb, err)) ||
        (mesh->ep.size > 1 && r.zero.stage > 0 &&
         (st = loom_ep_zero_attach(&r.zero, &mesh->edp, err)))) {
        run_free(&r);
        return st;
    }
    /* The embedding split needs the whole model's backward in one place (not pipelined)
     * and ZeRO's reduction (expert parallelism reduces after backward: parallel/ep.h). */
    if (!r.pipelined && mesh->ep.size == 1 &&
        (st = loom_zero_plan_embedding(&r.zero, tc->micro_batch * T, T, err))) {
        run_free(&r);
        return st;
    }
    loom_timeline_mark("data_model_zero_create");
    r.model.defer_embedding_grad = r.zero.embed.enabled;
    const size_t P = r.model.table.total;
    r.sharded_params = r.zero.stage == 3;
    if (r.sharded_params) {
        if ((st = loom_fsdp_create(&r.fsdp, &r.zero, tc->seed, err))) {
            r.sharded_params = 0;
            run_free(&r);
            return st;
        }
        r.params = r.fsdp.view;
        r.fsdp.err = err;
        r.fsdp.keep_blocks = r.pipelined; /* once per step, not per micro-batch */
        r.model.hooks = (loom_block_hooks){loom_fsdp_before_block, loom_fsdp_after_block, &r.fsdp};
    } else {
        r.params = calloc(P, sizeof(float));
        if (r.params && tc->overlap_param_gather) {
            if ((st = loom_param_gather_create(&r.pg, &r.zero, r.params, err))) {
                run_free(&r);
                return st;
            }
            r.pg.err = err;
            r.model.hooks = (loom_block_hooks){loom_param_gather_before_block,
                                               loom_param_gather_after_block, &r.pg};
        }
    }
    r.grads = loom_zero_grads_alloc(&r.zero);
    /* the unsharded registry of this stage (the whole model without pipelining) */
    const int gathered = r.tp.size > 1 || mesh->ep.size > 1;
    const int tp_lead = mesh->tp_rank == 0 && mesh->dp_rank == 0 && (r.pipelined || lead);
    if (gathered &&
        !(st = loom_params_build(
              &r.global_table, mc,
              &(loom_params_options){.layers = r.pipelined ? &r.pipe.layers : NULL}, err)) &&
        tp_lead)
        r.global_flat = malloc(r.global_table.total * sizeof(float));
    if (st || (gathered && tp_lead && !r.global_flat)) {
        run_free(&r);
        return st ? st : loom_error_set(err, LOOM_ERR_NOMEM, "cannot allocate the weights' gather");
    }
    r.batch = malloc((size_t)per_rank * (T + 1) * sizeof(int32_t));
    if (tc->dump_dir[0] && lead)
        r.dump_batches = malloc((size_t)tc->steps * tc->global_batch * (T + 1) * sizeof(int32_t));
    if (!r.params || !r.grads || !r.batch || (tc->dump_dir[0] && lead && !r.dump_batches)) {
        run_free(&r);
        return loom_error_set(err, LOOM_ERR_NOMEM, "cannot allocate %zu parameters", P);
    }
    loom_timeline_mark("params_grads_alloc");
    /* Resuming, a checkpoint overwrites every parameter: initialise them only if none is
     * loaded (seconds for a 124M model, on the path from a failure to the first step). */
    const int init_later = !r.sharded_params && tc->resume[0] && !tc->dump_dir[0];
    if (!r.sharded_params && !init_later) loom_params_init(&r.model.table, r.params, tc->seed);
    loom_timeline_mark("params_init");
    if (lead) {
        const double MiB = 1 << 20;
        fprintf(
            stderr,
            "loom: %s model, %zu parameters (%zu on this rank); layout dp %d (ZeRO-%d) x tp %d x "
            "pp %d\n",
            loom_family_name(mc->family), gathered ? r.global_table.total : P, P, mesh->layout.dp,
            r.zero.stage, mesh->layout.tp, mesh->layout.pp);
        if (r.pipelined) loom_pipeline_report(&r.pipe, stderr);
        if (mc->n_experts > 0)
            fprintf(stderr,
                    "loom: mixture of experts: %d experts, top-%d, every %d layer(s)%s, capacity "
                    "factor %g%s, expert parallel %d (%d experts per rank), buffers %.1f MiB\n",
                    mc->n_experts, mc->top_k, mc->moe_every, mc->shared_expert ? " + shared" : "",
                    (double)mc->capacity_factor, mc->capacity_factor > 0 ? "" : " (dropless)",
                    mesh->layout.ep, mc->n_experts / mesh->layout.ep,
                    loom_moe_bytes(r.model.moe) / MiB);
        if (mesh->layout.dp > 1 && !r.zero.engine.threaded) /* comm/engine.h */
            fprintf(stderr,
                    "loom: communication engine: no thread (MPI provides %s): collectives "
                    "progress from the training thread\n",
                    loom_world_thread_level_name(loom_world_thread_level()));
        if (tc->zero > 0 && mesh->layout.dp == 1)
            fprintf(stderr,
                    "loom: --zero %d with one data-parallel rank shards nothing (no-op)%s\n",
                    tc->zero, tc->overlap_param_gather ? ", --overlap-param-gather too" : "");
        loom_zero_memory zm;
        loom_zero_memory_of(&r.zero, &zm);
        char gathered[64] = "";
        if (r.sharded_params)
            snprintf(gathered, sizeof gathered, " + %.3f MiB gathered at most",
                     (loom_fsdp_resident_bytes(&r.fsdp) - zm.params) / MiB);
        fprintf(
            stderr,
            "loom: memory per rank: params %.3f MiB%s, grads %.3f MiB (local accumulation) "
            "of which %.3f MiB stay (reduced shard), optimizer %.3f MiB (AdamW m, v), activations "
            "%.3f MiB (micro-batch %d x %d)\n",
            zm.params / MiB, gathered, zm.grads_local / MiB, zm.grads_shard / MiB,
            zm.optimizer / MiB, loom_model_activation_bytes(&r.model) / MiB, tc->micro_batch, T);
        if (r.tp.size > 1)
            fprintf(stderr,
                    "loom: tensor parallel %d ranks%s: activations per rank %.1f MiB with sequence "
                    "parallelism, %.1f MiB without\n",
                    r.tp.size, r.tp.sequence_parallel ? " (sequence parallel)" : "",
                    loom_model_plan_bytes(&r.model, 1) / MiB,
                    loom_model_plan_bytes(&r.model, 0) / MiB);
        fprintf(stderr, "loom: data %s: %d file(s), %lld tokens\n", tc->data, r.data.n_shards,
                (long long)r.data.total_tokens);
    }
    /* Every rank takes part in gathering sharded parameters; rank 0 writes. */
    if (tc->dump_dir[0] && r.sharded_params && (st = loom_fsdp_gather_all(&r.fsdp, err))) {
        run_free(&r);
        return st;
    }
    if (tc->dump_dir[0] && lead) {
        if (loom_mkdir_p(tc->dump_dir) != 0) {
            run_free(&r);
            return loom_error_set(err, LOOM_ERR_INPUT, "--dump-dir '%s': cannot create: %s",
                                  tc->dump_dir, strerror(errno));
        }
    }
    const loom_param_table *it = &r.model.table;
    const float *ip = r.params;
    if (tc->dump_dir[0] && (st = export_flat(&r, r.params, &it, &ip, err))) {
        run_free(&r);
        return st;
    }
    /* Routes are recorded by the whole-model loop only (not with --pp). */
    if (tc->dump_dir[0] && !r.pipelined &&
        (st = loom_route_dump_open(&r.routes, mc, tc->micro_batch * T, tc->steps,
                                   per_rank / tc->micro_batch, err))) {
        run_free(&r);
        return st;
    }
    if (tc->dump_dir[0] && lead) {
        if ((st = loom_dump_flat(tc->dump_dir, "params_init.safetensors", it, ip, err))) {
            run_free(&r);
            return st;
        }
    }
    loom_timeline_mark("report_and_dumps");
    loom_progress_phase(LOOM_PHASE_CKPT); /* resume: loading */
    if ((st = loom_checkpointing_open(
             &r.ckpt, mc, tc, mesh, &r.zero, r.sharded_params ? NULL : r.params,
             r.sharded_params ? r.fsdp.shard : NULL, &r.start_step, err))) {
        run_free(&r);
        return st;
    }
    if (init_later && !r.ckpt.loaded && !r.ckpt.reset)
        loom_params_init(&r.model.table, r.params, tc->seed);
    if (r.sharded_params) loom_fsdp_invalidate(&r.fsdp);
    loom_timeline_mark("ckpt_open");
    if (tc->trace[0]) {
        /* Ranks open their traces together so their clocks start within a barrier. */
        const int accum = tc->global_batch / mesh->layout.dp / tc->micro_batch;
        size_t events = (size_t)tc->steps * (accum * (4 * mc->n_layer + 16) + 64) + 1024;
        if (!(st = loom_comm_barrier(&mesh->world, err)))
            st = loom_trace_open(&r.trace, mesh->rank, events, err);
        if (st) {
            run_free(&r);
            return st;
        }
        r.model.trace = mesh->dp.trace = mesh->tp.trace = mesh->world.trace = r.trace;
    }
    if (lead && tc->tensorboard[0]) {
        if ((st = loom_tb_open(&r.tb, tc->tensorboard, err))) {
            run_free(&r);
            return st;
        }
        fprintf(stderr, "loom: TensorBoard events in %s\n", loom_tb_path(r.tb));
    }
    if (!(st = loom_metrics_open(&r.metrics, lead ? tc->metrics : "", err))) {
        loom_timeline_mark("trace_tb_metrics");
        st = train_loop(&r, mc, tc, mesh, err);
    }
    if (!st) loom_param_gather_report(&r.pg, mesh->rank);
    if (!st && lead && r.zero.stage >= 2)
        fprintf(stderr,
                "loom: local gradients resident at the last micro-batch's layer boundaries: at "
                "most %.3f of %.3f MiB, %.3f MiB after the reduction (ZeRO-%d hands each "
                "bucket's pages outside its shard back once reduced)\n",
                r.zero.grads_peak / 1048576.0, P * 4 / 1048576.0, r.zero.grads_after / 1048576.0,
                r.zero.stage);
    if (!st && r.trace) {
        mesh->dp.trace = mesh->tp.trace = mesh->world.trace = NULL;
        st = loom_comm_write_trace(&mesh->world, r.trace, tc->trace, err);
        if (!st && lead) fprintf(stderr, "loom: trace written to %s\n", tc->trace);
    }
    run_free(&r);
    return st;
}
