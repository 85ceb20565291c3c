/* The parameter registry's side of tensor parallelism: what --tp needs of the model,
 * and gathering the tp shards of a flat buffer into whole tensors (exports, dumps).
 * The collectives the model's layers call are tp/tp.h. */
#ifndef LOOM_PARALLEL_TP_SHARDS_H
#define LOOM_PARALLEL_TP_SHARDS_H

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "tp/tp.h"

/* Checks what --tp N (and --sequence-parallel) need of the model and the micro-batch of
 * `rows` = micro_batch * seq_len tokens; the message names the flag. */
loom_status loom_tp_validate(const loom_model_config *cfg, int tp, int sequence_parallel, int rows,
                             loom_error *err);
/* Gathers the TP shards of a flat buffer laid out by `local` into the unsharded flat
 * buffer laid out by `global` (a tp_size 1 registry of the same model), on rank 0 of
 * the group, where global_flat is not NULL (NULL: take part only). Collective. */
loom_status loom_tp_gather_flat(loom_tp *tp, const loom_param_table *local, const float *flat,
                                const loom_param_table *global, float *global_flat,
                                loom_error *err);

#endif
