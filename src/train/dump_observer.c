/* --dump-dir's step observer (train/dump.h): the reference tests' batches and first
 * gradients, taken from the run (in its own file: dump.c stays below train/run.h, which
 * the step's runner includes). */
#include <stdio.h>

#include "train/dump.h"
#include "train/run.h"

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

loom_status loom_dump_observe_step(void *ctx, loom_step_point at, loom_step_state *s,
                                   loom_error *err) {
    loom_run *r = ctx;
    const int G = r->tc->global_batch;
    if (at == LOOM_STEP_AT_BEGIN && r->mesh->rank == 0)
        loom_batch_source_sample(&r->data, r->tc->seed, s->batch, 0, G,
                                 r->dump_batches + (size_t)s->step * G * r->data.record_words);
    if (at == LOOM_STEP_AT_REDUCE && s->step == 0) return dump_grads(r, err);
    return LOOM_OK;
}
