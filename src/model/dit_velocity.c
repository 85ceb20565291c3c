/* The dit's velocity for the flow sampler (model/dit.h): its inputs (dit.c), the model's
 * forward (model.c) and the prediction (dit.c). Here, not in dit.c, so that dit.c calls
 * nothing of model.c, which attaches the dit at creation. */
#include "model/dit.h"

loom_status loom_dit_velocity(loom_model *m, const float *params, const float *x, const float *t,
                              const int32_t *labels, float *v, loom_error *err) {
    loom_status st = loom_dit_velocity_inputs(m, x, t, labels, err);
    if (st) return st;
    if ((st = loom_model_forward(m, params)))
        return loom_error_set(err, st, "dit velocity: forward failed");
    loom_dit_prediction(m, v);
    return loom_backend_status(m->be, err);
}
