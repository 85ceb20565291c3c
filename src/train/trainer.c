/* The training loop: the step as the algorithm (data, forward/backward, gradient sync,
 * norm, optimizer), with the layout and the device decided at setup (train/setup.c). */
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fault.h"
#include "core/fs.h"
#include "core/progress.h"
#include "core/timeline.h"
#include "model/weights.h"
#include "train/batch_skip.h"
#include "train/dump.h"
#include "train/run.h"
#include "train/schedule.h"

/* Validation loss over a fixed set of eval_batches global batches (the same sequences at
 * every evaluation, whatever the layout), averaged over all their tokens. */
static loom_status evaluate(loom_run *r, double *val_loss, loom_error *err) {
    const loom_train_config *tc = r->tc;
    const int T = r->mc->seq_len, G = tc->global_batch;
    const int per_rank = G / r->mesh->layout.dp;
    double sum = 0.0;
    loom_status st = loom_param_gather_wait_all(&r->pg, err);
    if (st) return st;
    loom_trace_begin(r->trace, "evaluate", "train");
    loom_progress_phase(LOOM_PHASE_EVAL);
    for (int b = 0; b < tc->eval_batches; b++) {
        /* Step index -1 - b: a stream of batches disjoint from any training step's. */
        loom_batch_source_sample(&r->val, tc->seed, -1 - (int64_t)b,
                                 (int64_t)r->mesh->data_rank * per_rank, per_rank, r->batch);
        double s;
        if ((st = loom_step_forward_loss(&r->runner, r->batch, &s, err))) return st;
        sum += s;
    }
    loom_trace_end(r->trace);
    if ((st = loom_comm_allreduce_sum_f64(&r->mesh->dp, &sum, 1, err))) return st;
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

/* The first step's reduced gradients as whole tensors (reference tests). */
static loom_status dump_grads(loom_run *r, loom_error *err) {
    const loom_param_table *et;
    const float *eg;
    loom_status st;
    if ((st = loom_grad_sync_gather_grads(&r->sync, err)) ||
        (st = loom_run_export_flat(r, r->grads, &et, &eg, err)))
        return st;
    if (r->mesh->rank == 0)
        st = loom_dump_flat(r->tc->dump_dir, "grads_step1.safetensors", et, eg, err);
    return st;
}

static loom_status train_loop(loom_run *r, int *stopped, loom_error *err) {
    const loom_train_config *tc = r->tc;
    loom_mesh *mesh = r->mesh;
    loom_model *mod = &r->model;
    const int T = r->mc->seq_len, G = tc->global_batch;
    const int per_rank = G / mesh->layout.dp;
    const int lead = mesh->rank == 0;
    const long long W = mesh->workers; /* --outer diloco: G is one worker's share */
    const int dumping = tc->dump_dir[0] != 0;
    const float dloss = 1.0f / (float)((size_t)G * T); /* loss = mean over the global batch */
    loom_status st;
    long long tokens_seen = (long long)r->start_step * G * T * W;
    const double run_start = loom_now_ms();
    loom_batch_skip skip;
    if ((st = loom_batch_skip_parse(&skip, tc->skip_steps, err))) return st;
    int step = r->start_step, stop = 0;
    loom_progress_set_step(step);
    loom_compute_weights_refresh(&r->cw, step); /* --precision bf16: the weights' copy */
    for (; step < tc->steps && !stop; step++) {
        double t0 = loom_now_ms();
        /* The first two steps' parts go into the start-up timeline (the second one as the
         * steady state to compare the first with). */
        const int early = step - r->start_step < 2 ? step - r->start_step : -1;
        loom_fault_on_step(step + 1);
        loom_progress_step_begin();
        loom_grad_sync_step_begin(&r->sync);
        loom_trace_begin(r->trace, "step", "train");
        /* This rank's slice of the step's global batch (layout-independent order). */
        const int64_t batch = loom_batch_skip_batch_of(&skip, step + 1) - 1;
        loom_batch_source_sample(&r->data, tc->seed, batch, (int64_t)mesh->data_rank * per_rank,
                                 per_rank, r->batch);
        if (dumping && lead)
            loom_batch_source_sample(&r->data, tc->seed, batch, 0, G,
                                     r->dump_batches + (size_t)step * G * r->data.record_words);
        if (early >= 0) LOOM_STEP_MARK(early, "data_and_grad_clear");
        double loss_sum;
        if ((st = loom_step_forward_backward(&r->runner, r->batch, dloss, step, early, &loss_sum,
                                             err)))
            return st;
        loom_fault_after_compute(&loss_sum, loom_now_ms() - t0);    /* slow, nan */
        if (!isfinite(loss_sum)) loom_progress_nonfinite(step + 1); /* this rank's own loss */
        loom_progress_local_loss(loss_sum / ((double)per_rank * T));
        loom_trace_begin(r->trace, "gradient wait", "comm");
        st = loom_grad_sync_finish(&r->sync, err);
        loom_trace_end(r->trace);
        if (st || (st = loom_comm_allreduce_sum_f64(&mesh->dp, &loss_sum, 1, err))) return st;
        if (early >= 0) LOOM_STEP_MARK(early, "grad_reduce");
        double loss = loss_sum / ((double)G * T);
        if (!isfinite(loss))
            return loom_error_set(err, LOOM_ERR_STATE, "step %d: loss is %f (non-finite)", step + 1,
                                  loss);
        if (dumping && step == 0 && (st = dump_grads(r, err))) return st;
        double norm;
        if ((st = loom_grad_sync_norm(&r->sync, &norm, err))) return st;
        float lr = loom_lr_at(step, tc->steps, tc->warmup_steps, tc->lr, tc->min_lr);
        loom_checkpointing_before_update(&r->ckpt); /* a save's copy of the weights is done */
        loom_trace_begin(r->trace, "optimizer", "train");
        loom_progress_phase(LOOM_PHASE_OPTIMIZER);
        if ((st = loom_grad_sync_step(&r->sync, norm, lr, &tc->adamw, step + 1, err))) return st;
        loom_compute_weights_refresh(&r->cw, step + 1);
        /* A device works asynchronously: the step's time includes its work, and its first
         * failure (kernels/backend.h: sticky) stops the run here. */
        loom_backend_synchronize(r->be);
        if ((st = loom_backend_status(r->be, err))) return st;
        if (early >= 0) LOOM_STEP_MARK(early, "optimizer");
        loom_trace_end(r->trace); /* optimizer */
        loom_trace_end(r->trace); /* step */
        loom_grad_sync_step_end(&r->sync);
        /* --outer diloco: this step's share of the outer sync (parallel/outer.h) */
        if (r->outer_on && (st = loom_outer_after_step(&r->outer, step + 1, err))) return st;
        double ms = loom_now_ms() - t0;
        loom_progress_step_done(step + 1, loss, ms);
        tokens_seen += (long long)G * T * W;
        loom_step_metrics sm = {step + 1,
                                loss,
                                lr,
                                norm,
                                (double)G * T * W / (ms * 1e-3),
                                ms,
                                r->zero.step_wait_ms,
                                NAN,
                                tokens_seen,
                                mod->moe != NULL,
                                {0, 0, 0, 0, 0, 0},
                                r->dp_times,
                                NULL,
                                0.0};
        if ((st = loom_step_moe_stats(&r->runner, &sm.moe, err))) return st;
        if (tc->eval_every > 0 && ((step + 1) % tc->eval_every == 0 || step + 1 == tc->steps) &&
            (st = evaluate(r, &sm.val_loss, err)))
            return st;
        if (r->outer_on) { /* the losses as the workers' mean, and the outer sync's figures */
            double v[2] = {sm.loss, sm.val_loss};
            if ((st = loom_outer_mean(&r->outer, v, 2, err))) return st;
            sm.loss = v[0], sm.val_loss = v[1];
            sm.outer = &r->outer.stats;
            sm.tokens_total = (double)tokens_seen;
        }
        if (lead && (st = loom_metrics_write(&r->metrics, &sm, err))) return st;
        if (r->tb && (st = write_tensorboard(r->tb, &sm, err))) return st;
        if (lead) report(tc, &sm, loom_now_ms() - run_start);
        /* --outer diloco: the outer state beside each checkpoint (parallel/outer.h) */
        if (r->outer_on && loom_checkpointing_saves_at(&r->ckpt, step + 1) &&
            (st = loom_outer_save(&r->outer, tc->ckpt_dir, step + 1, mesh->rank, err)))
            return st;
        if ((loom_checkpointing_saves_at(&r->ckpt, step + 1) &&
             (st = loom_param_gather_wait_all(&r->pg, err))) ||
            (st = loom_checkpointing_step(&r->ckpt, step + 1, &stop, err)))
            return st;
        if (early >= 0) LOOM_STEP_MARK(early, "rest");
        if ((lead || getenv("LOOM_FT_ADDR")) && /* every rank under loom run: own logs */
            (early == 1 || (early == 0 && step + 1 == tc->steps))) {
            char who[32];
            snprintf(who, sizeof who, "rank %d", mesh->rank);
            loom_timeline_print(stderr, who);
        }
    }
    loom_run_report_end(r, step - r->start_step);
    *stopped = stop; /* asked to stop (checkpointing.h): no final outputs */
    if ((st = loom_param_gather_wait_all(&r->pg, err))) return st;
    if (r->outer_on && r->ckpt.enabled && r->ckpt.last_saved != step &&
        (st = loom_outer_save(&r->outer, tc->ckpt_dir, step, mesh->rank, err)))
        return st;
    return loom_checkpointing_finish(&r->ckpt, step, err);
}

/* The moving average of the weights, whole: --save-ema and the reference dump. */
static loom_status write_ema(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    const int lead = r->mesh->rank == 0;
    float *full = malloc(r->model.table.total * sizeof(float));
    if (!full) return loom_error_set(err, LOOM_ERR_NOMEM, "--save-ema: out of memory");
    const loom_param_table *et;
    const float *ep;
    loom_status st = loom_grad_sync_ema_gather(&r->sync, full, err);
    if (!st) st = loom_run_export_flat(r, full, &et, &ep, err);
    if (!st && lead && tc->save_ema[0]) {
        loom_mkdir_parent(tc->save_ema);
        if (!(st = loom_weights_save(tc->save_ema, r->mc, et, ep, err)))
            fprintf(stderr, "loom: moving-average weights written to %s\n", tc->save_ema);
    }
    if (!st && lead && tc->dump_dir[0])
        st = loom_dump_flat(tc->dump_dir, "ema_final.safetensors", et, ep, err);
    free(full);
    return st;
}

/* After the last step: the weights file (--save-weights) and the reference dumps. */
static loom_status write_outputs(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    const int lead = r->mesh->rank == 0, dumping = tc->dump_dir[0] != 0;
    const int saving = tc->save_weights[0] != 0, averaging = r->zero.ema != NULL;
    loom_status st;
    if (averaging && (dumping || tc->save_ema[0]) && (st = write_ema(r, err))) return st;
    if (!dumping && !saving) return LOOM_OK;
    if (r->sharded && (st = loom_fsdp_gather_all(r->sharded, err))) return st;
    const loom_param_table *et;
    const float *ep;
    if ((st = loom_run_export_flat(r, r->params, &et, &ep, err))) return st;
    if (saving && lead) {
        loom_mkdir_parent(tc->save_weights);
        if ((st = loom_weights_save(tc->save_weights, r->mc, et, ep, err))) return st;
        fprintf(stderr, "loom: weights written to %s\n", tc->save_weights);
    }
    if (dumping && lead) {
        int64_t dims[3] = {tc->steps, tc->global_batch, r->data.record_words};
        if ((st = r->mc->family == LOOM_FAMILY_DIT
                      ? loom_dump_flow_batches(tc->dump_dir, r->mc, r->dump_batches, tc->steps,
                                               tc->global_batch, err)
                      : loom_dump_tensor(tc->dump_dir, "tokens.safetensors", "tokens", 1,
                                         r->dump_batches, 3, dims, err)) ||
            (st = loom_dump_flat(tc->dump_dir, "params_final.safetensors", et, ep, err)))
            return st;
    }
    /* one file per dp rank: its tp ranks route alike (MoE blocks replicated over tp) */
    if (dumping && r->mesh->tp_rank == 0 &&
        (st = loom_route_dump_write(&r->routes, tc->dump_dir, r->mesh->dp_rank, err)))
        return st;
    return LOOM_OK;
}

/* --dry-run of a layout whose state does not fit this host: the start-up report from the
 * sized objects only (loom plan's path: 64-bit sizes, nothing allocated), *done = 1.
 * The layout fits (every rank of the world on this host, MemAvailable): *done = 0, and
 * the real set-up runs as without --dry-run. */
static loom_status dry_run_sized(const loom_model_config *mc, const loom_train_config *tc,
                                 loom_mesh *mesh, int *done, loom_error *err) {
    loom_run sized;
    loom_status st = loom_run_size(&sized, mc, tc, mesh, err);
    if (st) return st;
    loom_run_memory rm;
    loom_run_memory_collect(&sized, &rm);
    const double avail = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    const double need = (double)rm.total * mesh->world.size, GiB = 1 << 30;
    if (need <= avail) {
        loom_run_free(&sized);
        return LOOM_OK;
    }
    if (mesh->rank == 0) {
        loom_run_report_startup(&sized);
        fprintf(stderr,
                "loom: --dry-run: %.1f GiB per rank x %d rank(s) exceeds this host's %.1f GiB "
                "available: sized only (nothing allocated), no step taken\n",
                rm.total / GiB, mesh->world.size, avail / GiB);
    }
    loom_run_free(&sized);
    *done = 1;
    return LOOM_OK;
}

loom_status loom_train_run(const loom_model_config *mc, const loom_train_config *tc,
                           loom_mesh *mesh, loom_error *err) {
    loom_status st;
    if ((st = loom_model_config_validate(mc, err)) || (st = loom_train_config_validate(tc, err)) ||
        (tc->overlap_param_gather &&
         (st = loom_param_gather_validate(tc->zero, mesh->layout, err))))
        return st;
    loom_run r;
    int sized_only = 0;
    if (tc->dry_run && ((st = dry_run_sized(mc, tc, mesh, &sized_only, err)) || sized_only))
        return st;
    if ((st = loom_run_setup(&r, mc, tc, mesh, err))) return st;
    if (tc->dry_run) { /* the start-up report only: what the layout needs, no step */
        if (mesh->rank == 0) fprintf(stderr, "loom: --dry-run: set up, no step taken\n");
        loom_run_free(&r);
        return LOOM_OK;
    }
    int stopped = 0;
    st = train_loop(&r, &stopped, err);
    if (!st && !stopped) st = write_outputs(&r, err);
    if (!st) loom_param_gather_report(&r.pg, mesh->rank);
    if (!st && mesh->rank == 0 && r.zero.stage >= 2)
        fprintf(stderr,
                "loom: local gradients resident at the last micro-batch's layer boundaries: at "
                "most %.3f of %.3f MiB, %.3f MiB after the reduction (ZeRO-%d hands each "
                "bucket's pages outside its shard back once reduced)\n",
                r.zero.grads_peak / 1048576.0, r.model.table.total * 4 / 1048576.0,
                r.zero.grads_after / 1048576.0, r.zero.stage);
    if (!st && r.trace) {
        mesh->dp.trace = mesh->tp.trace = mesh->world.trace = mesh->cp.trace = NULL;
        st = loom_comm_write_trace(&mesh->world, r.trace, tc->trace, err);
        if (!st && mesh->rank == 0) fprintf(stderr, "loom: trace written to %s\n", tc->trace);
    }
    loom_run_free(&r);
    return st;
}
