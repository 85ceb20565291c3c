/* The model configuration as a JSON object (the "model" entry of a checkpoint manifest):
 * written by loom_model_config_to_json, read back with every field checked. Keys: family,
 * n_layer, n_head, n_kv_head, d_model, d_ff, vocab_size, seq_len, norm_eps, rope_theta,
 * and for a mixture-of-experts model a "moe" object (absent: a dense model). */
#ifndef LOOM_MODEL_CONFIG_JSON_H
#define LOOM_MODEL_CONFIG_JSON_H

#include <jansson.h>

#include "core/error.h"
#include "model/config.h"

/* A new object (the caller owns the reference), or NULL when out of memory. */
json_t *loom_model_config_to_json(const loom_model_config *cfg);
/* Fills cfg from j; LOOM_ERR_INPUT naming origin (the file) and the key otherwise. */
loom_status loom_model_config_from_json(loom_model_config *cfg, const json_t *j, const char *origin,
                                        loom_error *err);

#endif
