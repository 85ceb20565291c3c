/* Skipped batches (`loom train --skip-steps LIST`): the data order without some of its
 * global batches. Batch k is the k-th global batch of the (seed, step) order (1-based,
 * like step numbers); without skips step s trains on batch s. With a skip list L, step s
 * trains on the s-th batch not in L, so the skipped data is never seen, the number of
 * steps and the LR schedule are unchanged, and any resume that is given the same list
 * continues exactly where it stopped. The supervisor (loom run --skip-bad-batches) adds
 * the step of a loss spike to the list when it rolls back. */
#ifndef LOOM_TRAIN_BATCH_SKIP_H
#define LOOM_TRAIN_BATCH_SKIP_H

#include <stdint.h>

#include "core/error.h"

#define LOOM_SKIP_MAX 256

typedef struct {
    int64_t batches[LOOM_SKIP_MAX]; /* sorted, distinct */
    int n;
} loom_batch_skip;

/* Parses "5,9,12" (any order, duplicates allowed); "" = nothing skipped. */
loom_status loom_batch_skip_parse(loom_batch_skip *s, const char *list, loom_error *err);
/* The 1-based batch that 1-based step `step` trains on. */
int64_t loom_batch_skip_batch_of(const loom_batch_skip *s, int64_t step);

#endif
