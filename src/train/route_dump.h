/* Router decisions of every training micro-batch, kept when dumping (--dump-dir) so the
 * layout tests can tell a routing flip caused by rounding (a near tie) from a bug: each
 * data-parallel rank writes DIR/routes_dp<R>.safetensors with
 *   idx [steps * accum, n_moe, N, K] int32, the chosen experts (model/moe.h), and
 *   gap [steps * accum, n_moe, N] f32, each token's margin,
 * where row step * accum + k is micro-batch k of the step on this rank, i.e. micro-batch
 * dp_rank * accum + k of the step's global batch. */
#ifndef LOOM_TRAIN_ROUTE_DUMP_H
#define LOOM_TRAIN_ROUTE_DUMP_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/error.h"
#include "model/moe.h"

typedef struct {
    int32_t *idx;
    float *gap;
    int rows, n_moe, N, K;
} loom_route_dump;

/* Nothing is kept (and nothing written) without MoE. */
loom_status loom_route_dump_open(loom_route_dump *d, const loom_model_config *cfg, int N, int steps,
                                 int accum, loom_error *err);
/* Records the last forward of moe as micro-batch k of step (a pipeline stage's moe: its
 * layers at their places among the whole model's MoE layers, the others untouched). */
void loom_route_dump_record(loom_route_dump *d, const loom_moe *moe, int step, int accum, int k);
/* Sums the dump over c (collective): the pipeline group, whose stages each recorded their
 * own layers (zeros elsewhere), so every stage then holds the whole model's. */
loom_status loom_route_dump_sum(loom_route_dump *d, loom_comm *c, loom_error *err);
loom_status loom_route_dump_write(const loom_route_dump *d, const char *dir, int dp_rank,
                                  loom_error *err);
void loom_route_dump_free(loom_route_dump *d);

#endif
