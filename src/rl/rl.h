/* loom rl: post-training by reinforcement learning with GRPO (docs/rl.md). Each
 * iteration: (1) rollout: G sampled completions of each of P prompts, batched over the
 * rank's sequences with the KV cache (rl/rollout.h); (2) rewards (rl/reward.h); (3) the
 * completions' log-probabilities under the actor before the update and, with a KL
 * coefficient, under the frozen initial model; (4) GRPO updates (rl/grpo.h) through the
 * trainer's own run: its model (or pipeline stage), gradient sync and AdamW step
 * (train/run.h); (5) the weights resharded into the generation layout (every rank whole)
 * when the training layout shards them (tp, pp, ZeRO-3, ep). Each rank generates its slice of
 * the iteration's sequences; each data rank of the training layout trains its slice. */
#ifndef LOOM_RL_RL_H
#define LOOM_RL_RL_H

#include "core/error.h"
#include "model/config.h"
#include "model/generate.h"
#include "parallel/mesh.h"
#include "rl/grpo.h"
#include "rl/rl_config.h"
#include "train/train_config.h"

/* Runs the loop on the mesh (every rank calls it). tc is loom train's configuration of
 * the run: the model's initial weights (--init-from), the optimizer, the seed, --metrics
 * (one JSON line an iteration), --save-weights, the training layout (dp with ZeRO 0-3,
 * tp, pp).
 * Bad input (a prompt file, a reward command): LOOM_ERR_INPUT naming it. */
loom_status loom_rl_run(const loom_model_config *mc, const loom_train_config *tc,
                        const loom_rl_config *rc, loom_mesh *mesh, loom_error *err);

#endif
