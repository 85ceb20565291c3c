/* loom rl's generation layout: the generator's own copy of the weights where the training
 * layout does not hold them whole (docs/rl.md, "Two layouts in one job"). */
#ifndef LOOM_RL_GEN_LAYOUT_H
#define LOOM_RL_GEN_LAYOUT_H

#include "core/error.h"
#include "rl/state.h"

/* With --tp > 1, --pp > 1, --ep > 1 or ZeRO-3 in training, or --tp in generation: the
 * generator's own copy of the weights (whole, or its generation tp shard) and the plan
 * that fills it, then the first fill; else nothing (generation reads the training buffer). */
loom_status loom_rl_gen_layout_open(rl_state *s, loom_error *err);
/* Training layout -> the generator's copy (nothing without one), timed (s->reshard_ms). */
loom_status loom_rl_reshard(rl_state *s, loom_error *err);

#endif
