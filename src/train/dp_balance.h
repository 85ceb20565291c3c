/* The step's samples of a vlm run with several data-parallel ranks (--balance-dp,
 * data/vlm_balance.h), and how even the ranks' compute was (--metrics "dp_balance"). */
#ifndef LOOM_TRAIN_DP_BALANCE_H
#define LOOM_TRAIN_DP_BALANCE_H

#include <stdint.h>

#include "core/error.h"
#include "train/run.h"

/* Builds r->balance for a vlm over several data ranks (else nothing): the cost model's
 * costs (model/vlm.h), balanced with --balance-dp, the usual slices without. */
loom_status loom_dp_balance_setup(loom_run *r, loom_error *err);
void loom_dp_balance_free(loom_run *r);
/* This rank's per_rank records of global batch `batch` into r->batch: the balanced
 * assignment's with --balance-dp, else the usual slice (the plan's prediction is made
 * either way). */
void loom_dp_balance_sample(loom_run *r, int64_t batch, int per_rank);
/* The step's figures: compute_ms and compute_cpu_ms (this rank's forward and backward, wall
 * and thread CPU time) gathered over the dp group (a collective: every rank of it calls
 * this). Nothing without r->balance. */
loom_status loom_dp_balance_measure(loom_run *r, double compute_ms, double compute_cpu_ms,
                                    loom_error *err);

#endif
