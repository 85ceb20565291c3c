#include "train/step.h"

#include <stdlib.h>
#include <string.h>

#include "model/dit.h"

#include "core/progress.h"
#include "core/timeline.h"
#include "train/dump.h"

/* ---- the whole model on this rank ---- */

/* The first micro-batch's output for the reference tests: a language model's logits, a
 * dit's prediction as samples. */
static loom_status dump_output(loom_step_runner *r, loom_error *err) {
    loom_model *mod = r->model;
    const loom_model_config *c = &mod->cfg;
    const int M = r->micro_batch, T = r->seq_len;
    if (!mod->dit) {
        int64_t dims[3] = {M, T, c->vocab_size};
        const size_t n = (size_t)M * T * c->vocab_size;
        float *host = NULL; /* a device's logits are copied to the host first */
        if (mod->be->device != LOOM_DEVICE_CPU || mod->logits_bf16) {
            if (!(host = malloc(n * sizeof *host)))
                return loom_error_set(err, LOOM_ERR_NOMEM, "--dump-dir: out of memory");
            if (mod->logits_bf16) /* kept in bf16 (CPU): widened exactly */
                loom_bf16_to_f32_n(host, mod->logits_bf16, n);
            else
                loom_backend_copy_to_host(mod->be, host, mod->logits, n * sizeof *host);
        }
        loom_status st = loom_dump_tensor(r->dump_logits_dir, "logits_step1.safetensors", "logits",
                                          0, host ? host : mod->logits, 3, dims, err);
        free(host);
        return st;
    }
    const size_t n = (size_t)M * loom_model_dit_sample_floats(c);
    float *pred = malloc(n * sizeof *pred);
    if (!pred) return loom_error_set(err, LOOM_ERR_NOMEM, "--dump-dir: out of memory");
    loom_dit_prediction(mod, pred);
    int64_t dims[5] = {M, c->frames, c->channels, c->height, c->width};
    loom_status st = loom_dump_tensor(r->dump_logits_dir, "pred_step1.safetensors", "pred", 0, pred,
                                      5, dims, err);
    free(pred);
    return st;
}

loom_status loom_step_backward(loom_model *m, const float *params, float *grads,
                               loom_grad_sync *sync, int final, loom_error *err) {
    /* --grad-accum sharded: every micro-batch's, reduced into the shard's sum */
    const int sharded = sync && loom_grad_sync_sharded_accum(sync);
    if (final || sharded) loom_grad_sync_begin(sync);
    loom_status st =
        loom_model_backward(m, params, grads, final || sharded ? loom_grad_sync_ready : NULL, sync);
    if (!st && sharded && !final) st = loom_grad_sync_finish_micro_batch(sync, err);
    return st;
}

static loom_status whole_forward_backward(loom_step_runner *r, const int32_t *batch, float dloss,
                                          int step, int early, double *loss_sum, loom_error *err) {
    loom_model *mod = r->model;
    const int M = r->micro_batch;
    loom_status st;
    *loss_sum = 0.0;
    for (int k = 0; k < r->accum; k++) {
        loom_model_load_batch(mod, batch, k * M);
        loom_progress_phase(LOOM_PHASE_FORWARD);
        if ((st = loom_grad_sync_begin_micro_batch(r->sync, err)) ||
            (st = loom_model_forward(mod, r->params)))
            return st;
        if (early >= 0 && k == 0) LOOM_STEP_MARK(early, "forward");
        if (r->dump_logits_dir && step == 0 && k == 0 && (st = dump_output(r, err))) return st;
        double s;
        if ((st = loom_model_loss_sum(mod, dloss, 1, &s))) return st;
        *loss_sum += s;
        loom_route_dump_record(r->routes, mod->moe, step, r->accum, k);
        loom_progress_phase(LOOM_PHASE_BACKWARD);
        if ((st = loom_step_backward(mod, r->params, r->grads, r->sync, k + 1 == r->accum, err)))
            return st;
        if (early >= 0 && k == 0) LOOM_STEP_MARK(early, "backward");
    }
    return LOOM_OK;
}

static loom_status whole_forward_loss(loom_step_runner *r, const int32_t *batch, double *loss_sum,
                                      loom_error *err) {
    loom_model *mod = r->model;
    loom_status st;
    *loss_sum = 0.0;
    for (int k = 0; k < r->accum; k++) {
        loom_model_load_batch(mod, batch, k * r->micro_batch);
        if ((st = loom_grad_sync_begin_micro_batch(r->sync, err))) return st;
        double s;
        if ((st = loom_model_forward(mod, r->params)) ||
            (st = loom_model_loss_sum(mod, 0.0f, 0, &s)))
            return st;
        *loss_sum += s;
    }
    return LOOM_OK;
}

/* The dp ranks route distinct tokens; tp ranks of one dp rank route the same ones. */
static loom_status whole_moe_stats(loom_step_runner *r, loom_moe_stats *out, loom_error *err) {
    if (!r->model->moe) return LOOM_OK;
    return loom_moe_step_stats(r->model->moe, &r->mesh->dp, out, err);
}

static const loom_step_runner_ops whole_ops = {"whole model", whole_forward_backward,
                                               whole_forward_loss, whole_moe_stats};

/* ---- a pipeline stage ---- */

/* --dump-dir (MoE): after each forward action, the stage's router decisions of micro-batch
 * mb (its layers at their places among the whole model's; summed over the stages at the
 * end, train/route_dump.h). */
typedef struct {
    loom_step_runner *r;
    int step;
} stage_routes_ctx;

static void stage_routes(void *ctx, loom_model *m, int mb) {
    const stage_routes_ctx *x = ctx;
    loom_route_dump_record(x->r->routes, m->moe, x->step, x->r->accum, mb);
}

static loom_status stage_forward_backward(loom_step_runner *r, const int32_t *batch, float dloss,
                                          int step, int early, double *loss_sum, loom_error *err) {
    (void)early; /* a stage's parts are timed per action (--pp-stats) */
    if (!r->routes || !r->routes->idx)
        return loom_pipeline_step(r->pipe, r->params, r->grads, batch, dloss, r->sync, loss_sum,
                                  err);
    /* the model's own loss (loss NULL, aux_dloss as dloss): loom_pipeline_step's step */
    stage_routes_ctx x = {r, step};
    const loom_pp_custom c = {.ctx = &x, .aux_dloss = dloss, .forwarded = stage_routes};
    return loom_pipeline_step_custom(r->pipe, r->params, r->grads, batch, r->sync, &c, loss_sum,
                                     err);
}

static loom_status stage_forward_loss(loom_step_runner *r, const int32_t *batch, double *loss_sum,
                                      loom_error *err) {
    return loom_pipeline_forward_loss(r->pipe, r->params, batch, r->sync, loss_sum, err);
}

/* Every slot's and every stage's layers over the world, the tp replicas of a block
 * counted once. */
static loom_status stage_moe_stats(loom_step_runner *r, loom_moe_stats *out, loom_error *err) {
    loom_moe *moe = r->model->moe;
    if (!moe) return LOOM_OK;
    for (int i = 1; i < r->pipe->n_slots; i++) loom_moe_stats_add(moe, r->pipe->slots[i]->moe);
    if (r->mesh->tp_rank != 0) loom_moe_stats_clear(moe);
    return loom_moe_step_stats(moe, &r->mesh->world, out, err);
}

static const loom_step_runner_ops stage_ops = {"pipeline stage", stage_forward_backward,
                                               stage_forward_loss, stage_moe_stats};

void loom_step_runner_init(loom_step_runner *r, const loom_step_runner_options *o) {
    memset(r, 0, sizeof *r);
    r->ops = o->pipe ? &stage_ops : &whole_ops;
    r->model = o->model;
    r->pipe = o->pipe;
    r->sync = o->sync;
    r->mesh = o->mesh;
    r->params = o->params;
    r->grads = o->grads;
    r->micro_batch = o->micro_batch;
    r->seq_len = o->seq_len;
    r->accum = o->per_rank / o->micro_batch;
    r->routes = o->routes;
    r->dump_logits_dir = o->dump_logits_dir;
}
