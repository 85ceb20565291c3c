/* How the mixture-of-experts settings of a model configuration combine with the parallel
 * layout, and whether they match a saved model's (the settings themselves are checked by
 * loom_model_config_validate); every message names the flag. */
#ifndef LOOM_MODEL_MOE_CONFIG_H
#define LOOM_MODEL_MOE_CONFIG_H

#include "core/error.h"
#include "model/config.h"

/* --ep N with this model, data-parallel size, ZeRO stage and tensor parallelism. */
loom_status loom_moe_validate_layout(const loom_model_config *cfg, int ep, int dp, int zero, int tp,
                                     int pp, loom_error *err);

/* The MoE settings a model was saved with (checkpoint manifest, weights file) against the
 * ones given: LOOM_ERR_INPUT naming the first differing flag with both values, after
 * `origin` (the file). Settings of a dense model (n_experts 0) are not compared. */
loom_status loom_moe_config_check_same(const loom_model_config *saved,
                                       const loom_model_config *given, const char *origin,
                                       loom_error *err);

#endif
