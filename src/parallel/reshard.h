/* Moving a flat buffer of tensors between two layouts in memory, over MPI: the weights
 * of a training layout (tensor-parallel shards, data-parallel replicas) into a generation
 * layout (whole replicas), and back. What each rank holds is described as checkpoints
 * describe it (ckpt/ckpt_plan.h: one descriptor per tensor, its local box in the global
 * tensor and where it sits in the flat buffer), so any layout the checkpoints can load
 * into can be resharded into, and the plan is theirs: a rank's source pieces are what it
 * would write (written_only: one copy of each element per replica), its destination
 * pieces what it would read back; each destination piece is intersected with the source
 * pieces of the same tensor held by one replica, chosen by the receiving rank: its own
 * replica index when it holds source pieces itself (what it holds is copied locally),
 * else rank % n_replicas (data-parallel replicas share the sending). The transfers are
 * computed once (every rank knows every rank's pieces) and run as one all-to-all per
 * move with MPI derived datatypes built with the plan (one per peer and direction: the
 * box rows this rank sends to / receives from that peer, in the planned order, as byte
 * offsets into the flat buffers), so MPI reads the source tensors and writes the
 * destination tensors in place: no staging buffers, no packing or unpacking; a rank holds
 * its source and destination buffers only. What a rank keeps is copied locally, row by
 * row. Every buffer is F32; the copies are exact (the round trip is bitwise). */
#ifndef LOOM_PARALLEL_RESHARD_H
#define LOOM_PARALLEL_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt_plan.h"
#include "comm/comm.h"
#include "core/error.h"

/* One side of a move on this rank: its tensors (the same names, in the same order, on
 * both sides and on every rank), the flat buffer's length, and its replica index among
 * n_replicas ranks holding the same pieces (data parallelism: dp rank, dp). */
typedef struct {
    const loom_ckpt_descs *descs;
    size_t floats;
    int replica, n_replicas;
} loom_reshard_side;

typedef struct {
    int64_t tensor, src_rank, dst_rank;
    loom_ckpt_box box;
    size_t src_local, dst_local; /* flat indices of the box's first element */
    int64_t src_stride, dst_stride;
} loom_reshard_copy;

typedef struct {
    loom_comm *comm;
    loom_reshard_copy *copies; /* those this rank sends or receives, in a fixed order */
    int n_copies;
    /* [comm size]: floats to / from each rank (the all-to-all's volumes, contiguous
     * displacements: what a packed all-to-all of the same data would use) */
    int *send_counts, *send_displs, *recv_counts, *recv_displs;
    size_t send_floats, recv_floats, local_floats; /* local: copied within this rank */
    /* [comm size]: the derived datatypes (MPI_FLOAT where nothing moves) and their counts
     * (0 or 1), committed by the plan, freed by loom_reshard_free */
    MPI_Datatype *send_types, *recv_types;
    int *send_one, *recv_one, *zero_displs;
    int n_send_blocks, n_recv_blocks; /* contiguous runs in this rank's datatypes */
    double bytes_moved;               /* over all ranks: floats sent between different ranks x 4 */
    double copy_ms, move_ms;          /* the last run: the local copies, the all-to-all */
} loom_reshard;

/* Plans the move from side `src` to side `dst` over comm (every rank of comm calls it).
 * Fails (LOOM_ERR_INPUT) when the two sides do not describe the same tensors, or when a
 * destination element has no source. */
loom_status loom_reshard_plan(loom_reshard *r, loom_comm *comm, const loom_reshard_side *src,
                              const loom_reshard_side *dst, loom_error *err);
/* dst (the destination side's flat buffer) = the source elements of src. */
loom_status loom_reshard_run(loom_reshard *r, const float *src, float *dst, loom_error *err);
void loom_reshard_free(loom_reshard *r);

#endif
