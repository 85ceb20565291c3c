/* loom plan: --vision-schedule bubbles on the plan's costs (plan/vision_time.h). */
#include "plan/vision_time.h"

#include <stdlib.h>
#include <string.h>

#include "pipeline/vision_plan.h"

loom_status loom_plan_vision_price(const loom_model_config *mc, const loom_pp_schedule *s,
                                   const int *counts, int micro_batch,
                                   const loom_plan_vision_costs *c, loom_plan_vision *out,
                                   loom_error *err) {
    memset(out, 0, sizeof *out);
    /* the placement the run makes (pipeline/vision_exec.c): the same durations, the same call */
    double fwd[LOOM_PP_MAX_STAGES], enc;
    loom_pp_vision_durations(mc, counts, s->pp, s->v, micro_batch, fwd, &enc);
    loom_pp_vision vp;
    loom_status st = loom_pp_vision_build(&vp, s, fwd, enc, err);
    if (st) return st;
    /* replayed with the plan's costs: the simulator takes a forward and backward = 2 x
     * forward (split: B = W = forward), so a third of each piece's whole cost */
    for (int r = 0; r < s->pp; r++) vp.fwd[r] = c->stage_ms[r] / 3.0;
    vp.enc = c->enc_ms / 3.0;
    out->span = loom_pp_vision_simulate(s, &vp, out->idle);
    /* the same lists with every micro-batch encoded on the first stage */
    loom_pp_vision first = vp;
    first.owner = calloc((size_t)s->m, sizeof(int));
    if (!first.owner) {
        loom_pp_vision_free(&vp);
        return loom_error_set(err, LOOM_ERR_NOMEM, "plan: out of memory");
    }
    memset(first.pieces, 0, sizeof first.pieces);
    first.pieces[0] = s->m;
    out->span_first = loom_pp_vision_simulate(s, &first, out->idle_first);
    free(first.owner);
    memcpy(out->pieces, vp.pieces, sizeof out->pieces);
    loom_pp_vision_free(&vp);
    if (out->span < 0 || out->span_first <= 0)
        return loom_error_set(err, LOOM_ERR_STATE, "plan: --vision-schedule bubbles deadlocks");
    return LOOM_OK;
}
