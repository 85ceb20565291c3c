#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fs.h"
#include "data/dataset.h"
#include "model/transformer.h"
#include "train/dump.h"
#include "train/metrics.h"
#include "train/schedule.h"

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
    if (tc->threads < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--threads %d: expected >= 0", tc->threads);
    return LOOM_OK;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Everything a run owns, so one function can free it on every path. */
typedef struct {
    loom_dataset data;
    loom_model model;
    float *params, *grads, *m, *v;
    int32_t *batch;        /* [global_batch, T+1] */
    int32_t *dump_batches; /* [steps, global_batch, T+1] when dumping */
    loom_metrics metrics;
} run_state;

static void run_free(run_state *r) {
    loom_dataset_close(&r->data);
    loom_model_destroy(&r->model);
    free(r->params);
    free(r->grads);
    free(r->m);
    free(r->v);
    free(r->batch);
    free(r->dump_batches);
    loom_metrics_close(&r->metrics);
}

/* Splits sequences [first, first+M) of the step's batch into inputs and targets. */
static void load_micro_batch(loom_model *mod, const int32_t *batch, int first, int M, int T) {
    for (int b = 0; b < M; b++) {
        const int32_t *seq = batch + (size_t)(first + b) * (T + 1);
        memcpy(mod->inputs + (size_t)b * T, seq, (size_t)T * sizeof(int32_t));
        memcpy(mod->targets + (size_t)b * T, seq + 1, (size_t)T * sizeof(int32_t));
    }
}

static loom_status train_loop(run_state *r, const loom_model_config *mc,
                              const loom_train_config *tc, loom_error *err) {
    loom_model *mod = &r->model;
    const loom_param_table *t = &mod->table;
    const int T = mc->seq_len, M = tc->micro_batch, G = tc->global_batch, V = mc->vocab_size;
    const int accum = G / M;
    const int dumping = tc->dump_dir[0] != 0;
    const float dloss = 1.0f / (float)((size_t)G * T); /* loss = mean over the global batch */
    loom_status st;
    long long tokens_seen = 0;
    for (int step = 0; step < tc->steps; step++) {
        double t0 = now_ms();
        loom_dataset_sample(&r->data, tc->seed, step, 0, G, r->batch);
        if (dumping)
            memcpy(r->dump_batches + (size_t)step * G * (T + 1), r->batch,
                   (size_t)G * (T + 1) * sizeof(int32_t));
        memset(r->grads, 0, t->total * sizeof(float));
        double loss_sum = 0.0;
        for (int k = 0; k < accum; k++) {
            load_micro_batch(mod, r->batch, k * M, M, T);
            loom_model_forward(mod, r->params);
            if (dumping && step == 0 && k == 0) {
                int64_t dims[3] = {M, T, V};
                if ((st = loom_dump_tensor(tc->dump_dir, "logits_step1.safetensors", "logits", 0,
                                           mod->logits, 3, dims, err)))
                    return st;
            }
            loss_sum += loom_model_loss_and_dlogits(mod, dloss);
            loom_model_backward(mod, r->params, r->grads);
        }
        double loss = loss_sum / ((double)G * T);
        if (!isfinite(loss))
            return loom_error_set(err, LOOM_ERR_STATE, "step %d: loss is %f (non-finite)", step + 1,
                                  loss);
        if (dumping && step == 0 &&
            (st = loom_dump_flat(tc->dump_dir, "grads_step1.safetensors", t, r->grads, err)))
            return st;
        double norm = loom_grad_norm(t, r->grads);
        loom_grad_clip(t, r->grads, norm, tc->adamw.grad_clip);
        float lr = loom_lr_at(step, tc->steps, tc->warmup_steps, tc->lr, tc->min_lr);
        loom_adamw_step(t, r->params, r->grads, r->m, r->v, lr, &tc->adamw, step + 1);
        double ms = now_ms() - t0;
        tokens_seen += (long long)G * T;
        loom_step_metrics sm = {step + 1, loss,       lr, norm, (double)G * T / (ms * 1e-3),
                                ms,       tokens_seen};
        if ((st = loom_metrics_write(&r->metrics, &sm, err))) return st;
        if (tc->log_every > 0 && ((step + 1) % tc->log_every == 0 || step + 1 == tc->steps))
            fprintf(stderr,
                    "step %5d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f ms | %.0f tok/s\n",
                    step + 1, tc->steps, loss, lr, norm, ms, sm.tokens_per_s);
    }
    if (dumping) {
        int64_t dims[3] = {tc->steps, G, T + 1};
        if ((st = loom_dump_tensor(tc->dump_dir, "tokens.safetensors", "tokens", 1, r->dump_batches,
                                   3, dims, err)) ||
            (st = loom_dump_flat(tc->dump_dir, "params_final.safetensors", t, r->params, err)))
            return st;
    }
    return LOOM_OK;
}

loom_status loom_train_run(const loom_model_config *mc, const loom_train_config *tc,
                           loom_error *err) {
    loom_status st;
    if ((st = loom_model_config_validate(mc, err)) || (st = loom_train_config_validate(tc, err)))
        return st;
    run_state r;
    memset(&r, 0, sizeof r);
    const int T = mc->seq_len;
    if ((st = loom_dataset_open(&r.data, tc->data, mc->vocab_size, T, err)) ||
        (st = loom_model_create(&r.model, mc, tc->micro_batch, T, err))) {
        run_free(&r);
        return st;
    }
    const size_t P = r.model.table.total;
    r.params = calloc(P, sizeof(float));
    r.grads = calloc(P, sizeof(float));
    r.m = calloc(P, sizeof(float));
    r.v = calloc(P, sizeof(float));
    r.batch = malloc((size_t)tc->global_batch * (T + 1) * sizeof(int32_t));
    if (tc->dump_dir[0])
        r.dump_batches = malloc((size_t)tc->steps * tc->global_batch * (T + 1) * sizeof(int32_t));
    if (!r.params || !r.grads || !r.m || !r.v || !r.batch || (tc->dump_dir[0] && !r.dump_batches)) {
        run_free(&r);
        return loom_error_set(err, LOOM_ERR_NOMEM, "cannot allocate %zu parameters (x4 buffers)",
                              P);
    }
    loom_params_init(&r.model.table, r.params, tc->seed);
    fprintf(stderr,
            "loom: %s model, %zu parameters (%.1f MiB x4 for params, grads, AdamW m, v); "
            "activations %.1f MiB for micro-batch %d x %d\n",
            loom_family_name(mc->family), P, P * 4.0 / (1 << 20),
            loom_model_activation_bytes(&r.model) / (double)(1 << 20), tc->micro_batch, T);
    fprintf(stderr, "loom: data %s: %d file(s), %lld tokens\n", tc->data, r.data.n_shards,
            (long long)r.data.total_tokens);
    if (tc->dump_dir[0]) {
        if (loom_mkdir_p(tc->dump_dir) != 0) {
            run_free(&r);
            return loom_error_set(err, LOOM_ERR_INPUT, "--dump-dir '%s': cannot create: %s",
                                  tc->dump_dir, strerror(errno));
        }
        if ((st = loom_dump_flat(tc->dump_dir, "params_init.safetensors", &r.model.table, r.params,
                                 err))) {
            run_free(&r);
            return st;
        }
    }
    if (!(st = loom_metrics_open(&r.metrics, tc->metrics, err))) st = train_loop(&r, mc, tc, err);
    run_free(&r);
    return st;
}
