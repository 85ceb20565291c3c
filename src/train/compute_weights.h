/* The weights' bf16 compute copy (--precision bf16; --bf16-rounding, docs/precision.md).
 *
 * The linear layers' GEMMs read their weights in bf16. Rather than rounding a weight from
 * the fp32 master at every GEMM call (forward and input gradient, every micro-batch), the
 * run keeps one bf16 copy of the flat parameter buffer, held by the bf16 backend
 * (loom_backend_cpu_bf16_weight_copy), and rounds it from the master once per step: when
 * the run starts (after initialisation or resume) and after every optimizer update.
 *  - nearest (the default): round to nearest even, bitwise what rounding per call gives
 *    (the same master, the same rule), so the run's bits do not change, only its speed;
 *  - stochastic: element i of tensor t at step s rounds up with probability (distance to
 *    the lower bf16) / ulp, with the bits of Philox keyed by (a seed drawn from (--seed,
 *    s), the hash of t's name) at t's global element index (tensor-parallel shards draw
 *    what one process draws for the same element). A run is a function of (seed, step):
 *    bitwise reproducible, also across resume (the copy is rebuilt with the step's key).
 * With --outer diloco the copy is rounded again after an outer sync moved the weights
 * (trainer.c); with --overlap-param-gather and at ZeRO-3 range by range as the gathers land
 * (loom_compute_weights_by_range), so a copy is never read while stale. Without a copy (a
 * device backend) the backend rounds per call (nearest) and stochastic is refused. */
#ifndef LOOM_TRAIN_COMPUTE_WEIGHTS_H
#define LOOM_TRAIN_COMPUTE_WEIGHTS_H

#include <stdint.h>

#include "core/error.h"
#include "kernels/backend.h"
#include "model/params.h"

typedef enum { LOOM_BF16_ROUND_NEAREST, LOOM_BF16_ROUND_STOCHASTIC } loom_bf16_rounding;

/* "nearest" | "stochastic" -> *out; else LOOM_ERR_INPUT naming flag. */
loom_status loom_bf16_rounding_parse(const char *s, const char *flag, loom_bf16_rounding *out,
                                     loom_error *err);

typedef struct {
    const loom_backend *be;
    const loom_param_table *table;
    const float *params;
    loom_bf16 *copy; /* NULL: not kept (fp32, or a layout that rounds per call) */
    loom_bf16_rounding rounding;
    uint64_t seed;
    int by_range; /* loom_cw_ranges: whole, or range by range as gathers land */
    int step;     /* the key of the last update's rounding (by_range) */
} loom_compute_weights;

/* Keeps the copy of params [table->total] on be (a bf16 backend) when `why_not` is NULL;
 * else (a layout where the weights move between updates) nothing is kept, and stochastic
 * rounding is refused naming why_not (LOOM_ERR_INPUT). */
loom_status loom_compute_weights_open(loom_compute_weights *cw, const loom_backend *be,
                                      const loom_param_table *table, const float *params,
                                      loom_bf16_rounding rounding, uint64_t seed,
                                      const char *why_not, loom_error *err);
/* Rounds the copy from the master for the weights of step `step` (0-based: the step about
 * to run); a no-op without a copy. */
void loom_compute_weights_refresh(loom_compute_weights *cw, int step);
/* After an optimizer update (the weights of step `step`): the refresh, or with by_range
 * only the step's key, each range rounding when it lands. */
void loom_compute_weights_after_update(loom_compute_weights *cw, int step);
/* How the copy follows the weights, range by range (the gathers call
 * loom_compute_weights_land(cw, begin, end) as each range completes, which rounds [begin,
 * end) of the copy with the step's key: the same bits as the whole refresh, the stochastic
 * bits depending on the element's index only):
 *  - LOOM_CW_UPDATES: --overlap-param-gather (parallel/param_gather.h): complete at the
 *    start; after an update the weights arrive range by range during the next forward;
 *  - LOOM_CW_GATHERED: ZeRO-3 (parallel/fsdp.h): the weights exist only while gathered,
 *    so the copy is written at each gather and its pages handed back with the range's
 *    (loom_compute_weights_release); resident: the elements it holds at most (the report). */
typedef enum { LOOM_CW_WHOLE = 0, LOOM_CW_UPDATES, LOOM_CW_GATHERED } loom_cw_ranges;
void loom_compute_weights_by_range(loom_compute_weights *cw, loom_cw_ranges mode, size_t resident);
void loom_compute_weights_land(void *cw, size_t begin, size_t end);
void loom_compute_weights_release(void *cw, size_t begin, size_t end);

#endif
