/* Tensor dumps for the reference tests (tests/reference/): parameters, gradients,
 * logits and the token batches, as safetensors files with Hugging Face names. */
#ifndef LOOM_TRAIN_DUMP_H
#define LOOM_TRAIN_DUMP_H

#include <stdint.h>

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "train/step_observer.h"

/* Every parameter's tensor of `flat` (params or grads) to DIR/FILE. */
loom_status loom_dump_flat(const char *dir, const char *file, const loom_param_table *t,
                           const float *flat, loom_error *err);
/* One tensor of dims[0..ndim) to DIR/FILE under `name`. */
loom_status loom_dump_tensor(const char *dir, const char *file, const char *name, int is_int,
                             const void *data, int ndim, const int64_t *dims, loom_error *err);

/* A dit's flow-matching records of every step (data/flow_batch.h) as DIR/flow_batch.safetensors:
 * "x0" and "noise" [steps, G, F, C, H, W], "t" [steps, G], "labels" [steps, G] (int32,
 * after class dropout). */
loom_status loom_dump_flow_batches(const char *dir, const loom_model_config *mc,
                                   const int32_t *records, int steps, int global_batch,
                                   loom_error *err);

/* --dump-dir as an observer of the step (ctx: the loom_run): rank 0 keeps every step's
 * whole global batch (BEGIN), and the first step's reduced gradients go out as whole
 * tensors, grads_step1.safetensors (REDUCE). */
loom_status loom_dump_observe_step(void *ctx, loom_step_point at, loom_step_state *s,
                                   loom_error *err);

#endif
