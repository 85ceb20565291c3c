#include "model/moe_config.h"

#include <stddef.h>

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
