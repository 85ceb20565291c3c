/* loom plan's price of --vision-schedule bubbles (pipeline/vision_plan.h): the placement
 * the run builds (loom_pp_vision_build over the model's multiply-adds, the same call) is
 * replayed on the schedule's timeline with the plan's own per-stage costs, once with
 * every micro-batch encoded on the first stage and once with the pieces; the plan's
 * pipeline span with the encoder on the first stage is scaled by their ratio. */
#ifndef LOOM_PLAN_VISION_TIME_H
#define LOOM_PLAN_VISION_TIME_H

#include "core/error.h"
#include "model/config.h"
#include "pipeline/schedule.h"

typedef struct {
    double stage_ms[LOOM_PP_MAX_STAGES]; /* one micro-batch's F + B (+ W) of one model chunk
                                            on stage r (interleaved: the mean of its chunks),
                                            its sends included, the encoder not counted */
    double enc_ms; /* one micro-batch's encoder and projector, forward and backward */
} loom_plan_vision_costs;

typedef struct {
    int pieces[LOOM_PP_MAX_STAGES]; /* micro-batches each stage encodes (stage 0: its own) */
    double span_first, span;        /* the timeline (plan's costs): all on stage 0 / pieces */
    double idle_first[LOOM_PP_MAX_STAGES], idle[LOOM_PP_MAX_STAGES];
} loom_plan_vision;

/* The run's placement for schedule s (virtual stage k holding counts[k] layers) priced
 * with c. */
loom_status loom_plan_vision_price(const loom_model_config *mc, const loom_pp_schedule *s,
                                   const int *counts, int micro_batch,
                                   const loom_plan_vision_costs *c, loom_plan_vision *out,
                                   loom_error *err);

#endif
