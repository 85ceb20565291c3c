/* The process mesh: pp x dp x cp x tp ranks (tp fastest-varying, so a tensor-parallel
 * group sits on one node, then the context-parallel group), one communicator per
 * dimension, built once. World rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i.
 *
 * Context-parallel ranks hold the same parameters and different tokens of the same
 * sequences, so the parameters' replicas are the dp x cp ranks of one (pp, tp) cell, as
 * in Megatron-Core's "data parallel with context parallel" group: the `dp` communicator
 * below is that group (gradients reduce over it, ZeRO shards over it, its rank is
 * dp_rank = dp_i * cp + cp_i), while the data each rank reads is chosen by data_rank =
 * dp_i alone (cp ranks read the same samples and keep their part of each sequence).
 * Expert-parallel groups are carved out of the replica group (consecutive blocks of ep
 * ranks), as in Megatron. Without --cp (cp 1) dp_rank == data_rank. */
#ifndef LOOM_PARALLEL_MESH_H
#define LOOM_PARALLEL_MESH_H

#include "comm/comm.h"
#include "comm/world.h"
#include "core/error.h"

typedef struct {
    int dp, tp, pp, ep, cp;
} loom_layout;

/* The parameters' replicas of one (pp, tp) cell: dp x cp (cp 0 counts as 1). */
static inline int loom_layout_replicas(loom_layout l) {
    return l.dp * (l.cp > 0 ? l.cp : 1);
}

typedef struct {
    loom_layout layout;
    int rank, size;
    int dp_rank, tp_rank, pp_rank, ep_rank;
    int data_rank, cp_rank; /* the batch slice this rank reads; its place in its cp group */
    loom_comm world, dp, tp, pp, ep;
    loom_comm cp;  /* the context-parallel group (the same samples, other tokens) */
    loom_comm edp; /* the dp ranks with this rank's ep rank: replicas of the same experts */
    /* --outer diloco --workers W (parallel/outer.h): the world is W worker groups of
     * consecutive ranks (the outermost dimension), and everything above (world, rank,
     * size, every group) is this rank's worker group, laid out as if it were the whole
     * job; outer: the ranks of the same place in every group (rank = worker). data_rank
     * counts over all the workers (worker * dp + dp_i). Without workers: 0, 1, trivial. */
    int worker, workers;
    loom_comm outer;
} loom_mesh;

/* Checks the layout against the world (messages name the flags) and builds the
 * communicators. */
loom_status loom_mesh_create(loom_mesh *m, const loom_world *w, loom_layout layout,
                             loom_error *err);
/* The same with the world cut into `workers` groups of world size / workers ranks, each
 * laid out by `layout` (workers 1: loom_mesh_create). */
loom_status loom_mesh_create_workers(loom_mesh *m, const loom_world *w, loom_layout layout,
                                     int workers, loom_error *err);
void loom_mesh_free(loom_mesh *m);
/* World rank `rank`'s place in layout over world_size ranks, with every communicator a
 * shape (loom_comm_shape: its rank and size, no transport): what sizing a layout's
 * buffers without MPI reads (loom plan). Checks as loom_mesh_create. */
loom_status loom_mesh_shape(loom_mesh *m, loom_layout layout, int world_size, int rank,
                            loom_error *err);
/* Only the layout arithmetic (no MPI): used before launching and by tests. */
loom_status loom_layout_validate(loom_layout layout, int world_size, loom_error *err);

#endif
