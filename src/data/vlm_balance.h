/* --balance-dp: the step's global batch of image-text samples assigned to the
 * data-parallel ranks so that each rank's predicted compute is even (MegaScale-Omni's
 * workload balance).
 *
 * A sample's predicted cost is sample_cost + images x image_cost (the caller's cost model:
 * the decoder's work on one record of T positions, and the encoder's and projector's on
 * one image). The step's `total` = parts x per_part samples are the positions 0..total-1
 * of data/vlm_shard.h's order (a function of (seed, step)); each part (a data-parallel
 * rank) gets exactly per_part of them, so its micro-batches keep their shapes:
 *  - balanced 0: part d takes positions [d per_part, (d+1) per_part) (the usual slices);
 *  - balanced 1: longest processing time first with a cardinality limit: positions in
 *    decreasing cost (equal costs in position order) each go to the part with the least
 *    load so far that still has room (equal loads: the lowest part); then, while it lowers
 *    the larger of the two loads, a sample of the most loaded part is swapped with one
 *    holding fewer images on the least loaded part (the best such swap, first positions);
 *    if the slices of balanced 0 were still more even, they are kept. So the predicted
 *    slowest part is never slower than the usual slices'.
 * Either way the assignment is a function of (seed, step, parts, per_part, the costs), the
 * same on every rank, and a part's records are its positions in increasing order. The
 * loss is a sum over samples normalised by the global batch, so it does not depend on
 * which rank computes which sample. Planning does not allocate. */
#ifndef LOOM_DATA_VLM_BALANCE_H
#define LOOM_DATA_VLM_BALANCE_H

#include <stdint.h>

#include "core/error.h"
#include "data/vlm_shard.h"

typedef struct {
    int parts, per_part, total, balanced, max_images;
    double image_cost, sample_cost;
    int64_t *idx;                /* [total] the dataset sample at each position */
    int *images;                 /* [total] its images */
    int *owner;                  /* [total] the part each position goes to */
    double *load;                /* [parts] predicted compute of each part */
    int *count;                  /* [parts] */
    int *kcount;                 /* [2 (max_images + 1)] scratch: image counts of two parts */
    double max_over_mean;        /* the plan's slowest part's load over the mean (1: even) */
    double slices_max_over_mean; /* the same for the usual slices */
} loom_vlm_balance;

loom_status loom_vlm_balance_init(loom_vlm_balance *b, int parts, int per_part, int max_images,
                                  double image_cost, double sample_cost, int balanced,
                                  loom_error *err);
void loom_vlm_balance_free(loom_vlm_balance *b);
/* Plans step `step` of the dataset's order: each position's sample and part. */
void loom_vlm_balance_plan(loom_vlm_balance *b, const loom_vlm_dataset *ds, uint64_t seed,
                           int64_t step);
/* Part `part`'s per_part records (in position order) into out. */
void loom_vlm_balance_records(const loom_vlm_balance *b, const loom_vlm_dataset *ds, int part,
                              int32_t *out);

#endif
