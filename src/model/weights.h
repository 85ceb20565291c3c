/* A model's final weights as one safetensors file with Hugging Face names; the model
 * configuration travels in the file's metadata, so `loom generate` needs nothing else.
 * (Checkpoints with optimizer state and run state are ckpt/'s business.) */
#ifndef LOOM_MODEL_WEIGHTS_H
#define LOOM_MODEL_WEIGHTS_H

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"

/* Every parameter of the flat buffer (params, grads, ...) as one safetensors file under
 * its Hugging Face name, with optional metadata (n_meta may be 0). */
loom_status loom_params_write_safetensors(const char *path, const loom_param_table *table,
                                          const float *flat, const char *const *meta_keys,
                                          const char *const *meta_values, int n_meta,
                                          loom_error *err);

loom_status loom_weights_save(const char *path, const loom_model_config *cfg,
                              const loom_param_table *table, const float *params, loom_error *err);
/* The same with every parameter stored as dtype: LOOM_DTYPE_F32 (loom_weights_save) or
 * LOOM_DTYPE_BF16 (each value rounded to nearest even, kernels/bf16.h). */
loom_status loom_weights_save_as(const char *path, const loom_model_config *cfg,
                                 const loom_param_table *table, const float *params,
                                 loom_dtype dtype, loom_error *err);
/* Reads the configuration and every parameter (F32, or BF16 widened exactly to fp32);
 * *params is malloc'd (table->total floats)
 * and *table built for it. Errors name the file and the missing or malformed field. */
loom_status loom_weights_load(const char *path, loom_model_config *cfg, loom_param_table *table,
                              float **params, loom_error *err);

#endif
