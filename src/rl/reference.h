/* The frozen reference model of loom rl's KL term, kept beside the run's checkpoints
 * (DIR/rl_reference.safetensors, whole tensors under Hugging Face names, written once when
 * the run starts fresh) so that a resumed run gets it back bit for bit whatever it loaded
 * its policy from, in any layout the checkpoints load into. */
#ifndef LOOM_RL_REFERENCE_H
#define LOOM_RL_REFERENCE_H

#include <stddef.h>

#include "core/error.h"
#include "train/run.h"

/* DIR/rl_reference.safetensors into path (n bytes). */
void loom_rl_reference_path(const char *ckpt_dir, char *path, size_t n);

/* Writes ref (this rank's flat buffer of r's parameter table) as whole tensors; every rank
 * calls it, rank 0 writes (to a temporary name, then renamed). */
loom_status loom_rl_reference_save(loom_run *r, const float *ref, const char *path,
                                   loom_error *err);

/* Fills ref (this rank's flat buffer of r's parameter table) from the file. */
loom_status loom_rl_reference_load(loom_run *r, float *ref, const char *path, loom_error *err);

#endif
