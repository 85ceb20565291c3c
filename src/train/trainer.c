/* The training loop: the step as the algorithm (data, forward/backward, gradient sync,
 * norm, optimizer), with the layout and the device decided at setup (train/setup.c). */
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/malloc_policy.h"
#include "core/fs.h"
#include "core/progress.h"
#include "model/weights.h"
#include "train/batch_skip.h"
#include "train/dp_balance.h"
#include "train/dump.h"
#include "train/observers.h"
#include "train/run.h"
#include "train/schedule.h"

/* Validation loss over a fixed set of eval_batches global batches (the same sequences at
 * every evaluation, whatever the layout), averaged over all their tokens. */
static loom_status evaluate(loom_run *r, double *val_loss, loom_error *err) {
    const loom_train_config *tc = r->tc;
    const int T = r->mc->seq_len, G = tc->global_batch;
    const int per_rank = G / r->mesh->layout.dp;
    double sum = 0.0;
    loom_status st = loom_grad_sync_params_complete(&r->sync, err);
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

static loom_status train_loop(loom_run *r, int *stopped, loom_error *err) {
    const loom_train_config *tc = r->tc;
    loom_mesh *mesh = r->mesh;
    loom_model *mod = &r->model;
    const int T = r->mc->seq_len, G = tc->global_batch;
    const int per_rank = G / mesh->layout.dp;
    const long long W = mesh->workers;                 /* --outer diloco: G is one worker's share */
    const float dloss = 1.0f / (float)((size_t)G * T); /* loss = mean over the global batch */
    loom_status st;
    long long tokens_seen = (long long)r->start_step * G * T * W;
    loom_step_observers obs; /* timeline, trace, progress, faults, dumps, metrics */
    loom_train_observers_init(&obs, r);
    loom_step_state s = {.run_start = loom_now_ms()};
    loom_batch_skip skip;
    if ((st = loom_batch_skip_parse(&skip, tc->skip_steps, err))) return st;
    int step = r->start_step, stop = 0;
    loom_progress_set_step(step);
    /* --precision bf16: the weights' copy (ZeRO-3: each gather rounds its range from here
     * on with this step's key, so none stays gathered from before) */
    if (r->sharded) loom_fsdp_invalidate(r->sharded);
    loom_compute_weights_refresh(&r->cw, step);
    for (; step < tc->steps && !stop; step++) {
        s.step = step;
        s.t0 = loom_now_ms();
        s.early = step - r->start_step < 2 ? step - r->start_step : -1;
        loom_grad_sync_step_begin(&r->sync);
        /* This rank's slice of the step's global batch (layout-independent order). */
        s.batch = loom_batch_skip_batch_of(&skip, step + 1) - 1;
        loom_dp_balance_sample(r, s.batch, per_rank); /* the usual slice, or --balance-dp's */
        if ((st = loom_step_observers_notify(&obs, LOOM_STEP_AT_BEGIN, &s, err))) return st;
        const double t_compute = loom_now_ms(), cpu_compute = loom_thread_cpu_ms();
        if ((st = loom_step_forward_backward(&r->runner, r->batch, dloss, step, s.early,
                                             &s.loss_sum, err)))
            return st;
        const double compute_ms = loom_now_ms() - t_compute;
        const double compute_cpu_ms = loom_thread_cpu_ms() - cpu_compute;
        if ((st = loom_step_observers_notify(&obs, LOOM_STEP_AT_FORWARD_BACKWARD, &s, err)) ||
            (st = loom_grad_sync_finish(&r->sync, err)) ||
            /* --outer-start-step: synchronous dp over the workers until DiLoCo starts */
            (r->outer_on && (st = loom_outer_sync_grads(&r->outer, step + 1, err))) ||
            (st = loom_comm_allreduce_sum_f64(&mesh->dp, &s.loss_sum, 1, err)) ||
            (st = loom_dp_balance_measure(r, compute_ms, compute_cpu_ms, err)))
            return st;
        s.loss = s.loss_sum / ((double)G * T);
        if (!isfinite(s.loss))
            return loom_error_set(err, LOOM_ERR_STATE, "step %d: loss is %f (non-finite)", step + 1,
                                  s.loss);
        double norm;
        if ((st = loom_step_observers_notify(&obs, LOOM_STEP_AT_REDUCE, &s, err)) ||
            (st = loom_grad_sync_norm(&r->sync, &norm, err)))
            return st;
        float lr = loom_lr_at(step, tc->steps, tc->warmup_steps, tc->lr, tc->min_lr);
        /* --inner-lr-scale: DiLoCo's inner steps (after the warm start's synchronous ones) */
        if (r->outer_on && step >= tc->outer.start_step) lr *= tc->outer.inner_lr_scale;
        loom_checkpointing_before_update(&r->ckpt); /* a save's copy of the weights is done */
        if ((st = loom_step_observers_notify(&obs, LOOM_STEP_AT_BEFORE_UPDATE, &s, err)) ||
            (st = loom_grad_sync_step(&r->sync, norm, lr, &tc->adamw, step + 1, err)))
            return st;
        loom_compute_weights_after_update(&r->cw, step + 1);
        /* A device works asynchronously: the step's time includes its work, and its first
         * failure (kernels/backend.h: sticky) stops the run here. */
        loom_backend_synchronize(r->be);
        if ((st = loom_backend_status(r->be, err))) return st;
        loom_grad_sync_step_end(&r->sync);
        /* --outer diloco: this step's share of the outer sync (parallel/outer.h) */
        if (r->outer_on && loom_outer_touches_params(&r->outer, step + 1) &&
            (st = loom_grad_sync_params_complete(&r->sync, err))) /* --overlap-param-gather */
            return st;
        if (r->outer_on && (st = loom_outer_after_step(&r->outer, step + 1, err))) return st;
        /* the outer step moved the parameters: ZeRO-3's gathered copies are stale, and the
         * weights' bf16 copy is rounded again (with the step's key: --bf16-rounding) */
        if (r->outer_on && r->outer.moved && r->sharded) loom_fsdp_invalidate(r->sharded);
        if (r->outer_on && r->outer.moved) loom_compute_weights_refresh(&r->cw, step + 1);
        s.ms = loom_now_ms() - s.t0;
        if ((st = loom_step_observers_notify(&obs, LOOM_STEP_AT_UPDATE, &s, err))) return st;
        tokens_seen += (long long)G * T * W;
        loom_step_metrics sm = {step + 1,
                                s.loss,
                                lr,
                                norm,
                                (double)G * T * W / (s.ms * 1e-3),
                                s.ms,
                                loom_grad_sync_step_wait_ms(&r->sync),
                                NAN,
                                tokens_seen,
                                mod->moe != NULL,
                                {0, 0, 0, 0, 0, 0},
                                r->dp_times,
                                NULL,
                                0.0,
                                r->balance_on ? &r->dp_bal : NULL};
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
        s.metrics = &sm;
        if ((st = loom_step_observers_notify(&obs, LOOM_STEP_AT_METRICS, &s, err))) return st;
        /* --outer diloco: the outer state beside each checkpoint (parallel/outer.h) */
        const char *tier = r->outer_on ? loom_checkpointing_tier(&r->ckpt, step + 1, 0) : NULL;
        if (tier && (st = loom_outer_save(&r->outer, tier, step + 1, mesh->rank, err))) return st;
        if ((loom_checkpointing_saves_at(&r->ckpt, step + 1) &&
             (st = loom_grad_sync_params_complete(&r->sync, err))) ||
            (st = loom_checkpointing_step(&r->ckpt, step + 1, &stop, err)) ||
            (st = loom_step_observers_notify(&obs, LOOM_STEP_AT_END, &s, err)))
            return st;
    }
    loom_run_report_end(r, step - r->start_step);
    *stopped = stop; /* asked to stop (checkpointing.h): no final outputs */
    if ((st = loom_grad_sync_params_complete(&r->sync, err))) return st;
    if (r->outer_on && r->ckpt.enabled && r->ckpt.last_saved != step &&
        (st = loom_outer_save(&r->outer, loom_checkpointing_tier(&r->ckpt, step, 1), step,
                              mesh->rank, err)))
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
    const int saving = tc->save_weights[0] != 0, averaging = loom_grad_sync_ema_on(&r->sync);
    loom_status st;
    if (averaging && (dumping || tc->save_ema[0]) && (st = write_ema(r, err))) return st;
    if (!dumping && !saving) return LOOM_OK;
    if ((st = loom_grad_sync_params_whole(&r->sync, err))) return st;
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
    /* one file per dp rank: its tp ranks route alike (MoE blocks replicated over tp);
     * --pp: the stages' layers summed over the pipeline group, written by the first stage */
    if (dumping && r->pipelined && (st = loom_route_dump_sum(&r->routes, r->pipelined->comm, err)))
        return st;
    if (dumping && r->mesh->tp_rank == 0 && r->mesh->pp_rank == 0 &&
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
    loom_malloc_reserve_small(); /* small blocks away from MPI's large temporaries */
    st = train_loop(&r, &stopped, err);
    if (!st && !stopped) st = write_outputs(&r, err);
    if (!st) loom_grad_sync_report_end(&r.sync, mesh->rank, r.model.table.total);
    if (!st) st = loom_run_report_peak_memory(&r, err);
    if (!st && r.trace) {
        mesh->dp.trace = mesh->tp.trace = mesh->world.trace = mesh->cp.trace = NULL;
        st = loom_comm_write_trace(&mesh->world, r.trace, tc->trace, err);
        if (!st && mesh->rank == 0) fprintf(stderr, "loom: trace written to %s\n", tc->trace);
    }
    loom_run_free(&r);
    return st;
}
