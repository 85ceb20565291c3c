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
 * move. A message is a span of the sender's source buffer when its rows lie there in
 * order with few gaps (at most an eighth of its floats: a tp rank's replicated tensors,
 * which tp rank 0 supplies, between its shards; the gaps travel unused), else the rows
 * packed back to back. What a rank sends is read in place when every message it sends
 * is a span, else staged in a send buffer (a span in one copy); what it receives is
 * written in place when every message is one gapless run of the destination buffer,
 * else received and unpacked. The rank's own copies (what it keeps) run while the
 * all-to-all is in flight, so the peers read from it meanwhile. MPI moves a contiguous
 * message between processes of one machine with a single copy (CMA); a derived datatype
 * of the rows instead (tried: MPI_Type_create_hindexed + MPI_Alltoallw) goes through 32 KB
 * shared-memory fragments, and measured 1.6-2.2x slower here (docs/rl.md). A rank holds
 * its source and destination buffers plus the bytes it packs and receives staged. Every
 * buffer is F32; the copies are exact (the round trip is bitwise). */
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
    int *send_counts, *send_displs, *recv_counts, *recv_displs; /* [comm size] */
    float *send_buf, *recv_buf; /* NULL where that side moves in place */
    /* [comm size] or NULL: each peer's message as a flat index of the source /
     * destination buffer, where every peer's is in place (the all-to-all reads / writes
     * the buffers themselves) */
    int *src_displs, *dst_displs;
    /* [comm size]: where the message to / from each peer starts in the sender's source
     * buffer when it is a span of it (rows with small gaps, sent whole: the gaps unused);
     * SIZE_MAX: the rows packed back to back */
    size_t *span_to, *span_from;
    size_t send_floats, recv_floats, local_floats; /* local: copied within the rank */
    double bytes_moved; /* over all ranks: floats sent between different ranks x 4 */
    double pack_ms, move_ms, unpack_ms; /* the last run: packing, the all-to-all (the
                                           rank's local copies run while it is in
                                           flight), unpacking */
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
