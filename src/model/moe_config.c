#include "model/moe_config.h"

#include <math.h>

loom_status loom_model_config_validate_moe(const loom_model_config *c, loom_error *err) {
    if (c->n_experts < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--n-experts %d: expected >= 0 (0 = dense MLP)",
                              c->n_experts);
    if (c->n_experts == 0) return LOOM_OK;
    if (c->n_experts > 1024)
        return loom_error_set(err, LOOM_ERR_INPUT, "--n-experts %d: at most 1024", c->n_experts);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--top-k %d: expected 1 <= top-k <= --n-experts %d", c->top_k,
                              c->n_experts);
    if (c->moe_every < 1 || c->moe_every > c->n_layer)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--moe-every %d: expected 1 <= moe-every <= --n-layer %d",
                              c->moe_every, c->n_layer);
    if (!(c->capacity_factor >= 0.0f) || !isfinite(c->capacity_factor))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--capacity-factor %g: expected >= 0 (0 = dropless)",
                              (double)c->capacity_factor);
    if (!(c->aux_loss_coef >= 0.0f) || !isfinite(c->aux_loss_coef))
        return loom_error_set(err, LOOM_ERR_INPUT, "--aux-loss-coef %g: expected >= 0",
                              (double)c->aux_loss_coef);
    if (!(c->z_loss_coef >= 0.0f) || !isfinite(c->z_loss_coef))
        return loom_error_set(err, LOOM_ERR_INPUT, "--z-loss-coef %g: expected >= 0",
                              (double)c->z_loss_coef);
    return LOOM_OK;
}

loom_status loom_moe_validate_layout(const loom_model_config *c, int ep, int dp, int zero, int tp,
                                     int pp, loom_error *err) {
    if (ep < 1) return loom_error_set(err, LOOM_ERR_INPUT, "--ep %d: expected >= 1", ep);
    if (c->n_experts > 0 && tp > 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--tp %d with --n-experts %d: mixture-of-experts layers do not run "
                              "tensor-parallel yet (use --ep and --dp)",
                              tp, c->n_experts);
    if (c->n_experts > 0 && pp > 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp %d with --n-experts %d: mixture-of-experts layers do not run "
                              "pipeline-parallel yet",
                              pp, c->n_experts);
    if (ep == 1) return LOOM_OK;
    if (dp % ep != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ep %d: must divide --dp %d (expert-parallel groups are carved "
                              "out of the data-parallel group)",
                              ep, dp);
    if (c->n_experts == 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ep %d: needs a mixture-of-experts model (--n-experts E)", ep);
    if (c->n_experts % ep != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ep %d: must divide --n-experts %d (each rank holds n_experts/ep "
                              "experts)",
                              ep, c->n_experts);
    if (zero > 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--zero %d with --ep %d: expert parallelism supports ZeRO-0 only "
                              "(expert and dense parameters are reduced over different groups)",
                              zero, ep);
    return LOOM_OK;
}
