/* The training run's instrumentation, each piece an observer of the step
 * (train/step_observer.h), registered by loom_train_observers_init. */
#include "train/observers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fault.h"
#include "core/progress.h"
#include "core/timeline.h"
#include "train/dump.h"

/* --inject: a crash or hang at a step's start, a slow or NaN loss after its compute. */
static loom_status fault_observe(void *ctx, loom_step_point at, loom_step_state *s,
                                 loom_error *err) {
    (void)ctx, (void)err;
    if (at == LOOM_STEP_AT_BEGIN) loom_fault_on_step(s->step + 1);
    if (at == LOOM_STEP_AT_FORWARD_BACKWARD)
        loom_fault_after_compute(&s->loss_sum, loom_now_ms() - s->t0); /* slow, nan */
    return LOOM_OK;
}

/* What the heartbeats report: the step, its phase, this rank's own loss. */
static loom_status progress_observe(void *ctx, loom_step_point at, loom_step_state *s,
                                    loom_error *err) {
    const loom_run *r = ctx;
    (void)err;
    const int per_rank = r->tc->global_batch / r->mesh->layout.dp, T = r->mc->seq_len;
    switch (at) {
    case LOOM_STEP_AT_BEGIN:
        loom_progress_step_begin();
        break;
    case LOOM_STEP_AT_FORWARD_BACKWARD:
        if (!isfinite(s->loss_sum)) loom_progress_nonfinite(s->step + 1); /* this rank's own */
        loom_progress_local_loss(s->loss_sum / ((double)per_rank * T));
        break;
    case LOOM_STEP_AT_BEFORE_UPDATE:
        loom_progress_phase(LOOM_PHASE_OPTIMIZER);
        break;
    case LOOM_STEP_AT_UPDATE:
        if (!r->outer_on) loom_progress_step_done(s->step + 1, s->loss, s->ms);
        break;
    case LOOM_STEP_AT_METRICS:
        /* --outer diloco: a worker's own loss differs from another's; the supervisor judges
         * spikes on the step's loss, the workers' mean, which every rank reports alike */
        if (r->outer_on) loom_progress_step_done(s->step + 1, s->metrics->loss, s->ms);
        break;
    default:
        break;
    }
    return LOOM_OK;
}

/* --trace: the step's span, the gradient wait and the optimizer inside it. */
static loom_status trace_observe(void *ctx, loom_step_point at, loom_step_state *s,
                                 loom_error *err) {
    loom_trace *trace = ctx;
    (void)s, (void)err;
    switch (at) {
    case LOOM_STEP_AT_BEGIN:
        loom_trace_begin(trace, "step", "train");
        break;
    case LOOM_STEP_AT_FORWARD_BACKWARD:
        loom_trace_begin(trace, "gradient wait", "comm");
        break;
    case LOOM_STEP_AT_REDUCE:
        loom_trace_end(trace);
        break;
    case LOOM_STEP_AT_BEFORE_UPDATE:
        loom_trace_begin(trace, "optimizer", "train");
        break;
    case LOOM_STEP_AT_UPDATE:
        loom_trace_end(trace); /* optimizer */
        loom_trace_end(trace); /* step */
        break;
    default:
        break;
    }
    return LOOM_OK;
}

/* The first two steps' parts go into the start-up timeline (the second one as the steady
 * state to compare the first with); rank 0 prints it, and every rank under `loom run`
 * (its own logs). */
static loom_status timeline_observe(void *ctx, loom_step_point at, loom_step_state *s,
                                    loom_error *err) {
    const loom_run *r = ctx;
    (void)err;
    const int early = s->early;
    if (early < 0) return LOOM_OK;
    switch (at) {
    case LOOM_STEP_AT_BEGIN:
        LOOM_STEP_MARK(early, "data_and_grad_clear");
        break;
    case LOOM_STEP_AT_REDUCE:
        LOOM_STEP_MARK(early, "grad_reduce");
        break;
    case LOOM_STEP_AT_UPDATE:
        LOOM_STEP_MARK(early, "optimizer");
        break;
    case LOOM_STEP_AT_END:
        LOOM_STEP_MARK(early, "rest");
        if ((r->mesh->rank == 0 || getenv("LOOM_FT_ADDR")) &&
            (early == 1 || (early == 0 && s->step + 1 == r->tc->steps))) {
            char who[32];
            snprintf(who, sizeof who, "rank %d", r->mesh->rank);
            loom_timeline_print(stderr, who);
        }
        break;
    default:
        break;
    }
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

/* The step's metrics: --metrics (rank 0), --tensorboard, the progress line (rank 0). */
static loom_status report_observe(void *ctx, loom_step_point at, loom_step_state *s,
                                  loom_error *err) {
    loom_run *r = ctx;
    if (at != LOOM_STEP_AT_METRICS) return LOOM_OK;
    const int lead = r->mesh->rank == 0;
    loom_status st;
    if (lead && (st = loom_metrics_write(&r->metrics, s->metrics, err))) return st;
    if (r->tb && (st = write_tensorboard(r->tb, s->metrics, err))) return st;
    if (lead) report(r->tc, s->metrics, loom_now_ms() - s->run_start);
    return LOOM_OK;
}

void loom_train_observers_init(loom_step_observers *o, loom_run *r) {
    o->n = 0;
    loom_step_observers_add(o, fault_observe, NULL);
    loom_step_observers_add(o, progress_observe, r);
    if (r->trace) loom_step_observers_add(o, trace_observe, r->trace);
    loom_step_observers_add(o, timeline_observe, r);
    if (r->tc->dump_dir[0]) loom_step_observers_add(o, loom_dump_observe_step, r);
    loom_step_observers_add(o, report_observe, r);
}
