/* The process mesh: pp x dp x tp ranks (tp fastest-varying, so a tensor-parallel group
 * sits on one node), one communicator per dimension, built once. Expert-parallel groups
 * are carved out of the data-parallel group (consecutive blocks of ep ranks), as in
 * Megatron. World rank = (pp_rank * dp + dp_rank) * tp + tp_rank. */
#ifndef LOOM_PARALLEL_MESH_H
#define LOOM_PARALLEL_MESH_H

#include "comm/comm.h"
#include "comm/world.h"
#include "core/error.h"

typedef struct {
    int dp, tp, pp, ep;
} loom_layout;

typedef struct {
    loom_layout layout;
    int rank, size;
    int dp_rank, tp_rank, pp_rank, ep_rank;
    loom_comm world, dp, tp, pp, ep;
    loom_comm edp; /* the dp ranks with this rank's ep rank: replicas of the same experts */
} loom_mesh;

/* Checks the layout against the world (messages name the flags) and builds the
 * communicators. */
loom_status loom_mesh_create(loom_mesh *m, const loom_world *w, loom_layout layout,
                             loom_error *err);
void loom_mesh_free(loom_mesh *m);
/* Only the layout arithmetic (no MPI): used before launching and by tests. */
loom_status loom_layout_validate(loom_layout layout, int world_size, loom_error *err);

#endif
