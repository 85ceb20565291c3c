/* The training loop (every rank): data -> forward/backward (accumulated over
 * micro-batches) -> gradient sync -> norm -> clipping, the LR schedule and AdamW. */
#ifndef LOOM_TRAIN_TRAINER_H
#define LOOM_TRAIN_TRAINER_H

#include "core/error.h"
#include "model/config.h"
#include "parallel/mesh.h"
#include "train/train_config.h"

/* Trains on the mesh (every rank calls it); progress, metrics and dumps from rank 0.
 * Returns LOOM_ERR_INPUT for bad data, LOOM_ERR_STATE if the loss becomes non-finite. */
loom_status loom_train_run(const loom_model_config *mc, const loom_train_config *tc,
                           loom_mesh *mesh, loom_error *err);

#endif
