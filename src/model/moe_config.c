#include "model/moe_config.h"

#include <math.h>
#include <stddef.h>

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
    (void)pp, (void)tp; /* ep groups: in each stage's dp group, per tp rank */
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
    (void)zero; /* every stage: parallel/ep_zero.h */
    return LOOM_OK;
}

loom_status loom_moe_config_check_same(const loom_model_config *s, const loom_model_config *g,
                                       const char *origin, loom_error *err) {
    const char *tail = "(mixture-of-experts settings must match the saved model)";
    if (s->n_experts != g->n_experts)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-experts %d: %s was saved with --n-experts %d %s", g->n_experts,
                              origin, s->n_experts, tail);
    if (s->n_experts == 0) return LOOM_OK;
    const struct {
        const char *flag;
        int saved, given;
    } ints[] = {{"--top-k", s->top_k, g->top_k},
                {"--moe-every", s->moe_every, g->moe_every},
                {"--shared-expert", s->shared_expert, g->shared_expert}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].saved != ints[i].given)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s %d: %s was saved with %s %d %s",
                                  ints[i].flag, ints[i].given, origin, ints[i].flag, ints[i].saved,
                                  tail);
    const struct {
        const char *flag;
        float saved, given;
    } floats[] = {{"--capacity-factor", s->capacity_factor, g->capacity_factor},
                  {"--aux-loss-coef", s->aux_loss_coef, g->aux_loss_coef},
                  {"--z-loss-coef", s->z_loss_coef, g->z_loss_coef}};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (floats[i].saved != floats[i].given)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s %g: %s was saved with %s %g %s",
                                  floats[i].flag, (double)floats[i].given, origin, floats[i].flag,
                                  (double)floats[i].saved, tail);
    return LOOM_OK;
}
