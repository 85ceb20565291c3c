/* Moving a flat buffer of tensors between two layouts in memory, over MPI: the weights
 * of a training layout (tensor-parallel shards, data-parallel replicas) into a generation
 * layout (whole replicas, or tensor-parallel shards of its own), and back. What each rank holds is
 * described as checkpoints describe it (ckpt/ckpt_plan.h: one descriptor per tensor, its local box
 * in the global tensor and where it sits in the flat buffer), so any layout the checkpoints can
 * load into can be resharded into, and the plan is theirs: a rank's source pieces are what it would
 * write (written_only: one copy of each element per replica), its destination pieces what it would
 * read back; each destination piece is intersected with the source pieces of the same tensor held
 * by one replica, chosen by the receiving rank: its own replica index when it holds source pieces
 * itself (what it holds is copied locally), else rank % n_replicas (data-parallel replicas share
 * the sending). The transfers are computed once (every rank knows every rank's pieces). A move is
 * point-to-point messages, all posted at once, planned per pair of ranks from the pair's rows in
 * the planned order (both ends find the same messages): rows that lie one after the other in the
 * sender's source and the receiver's destination form a run; a run of at least
 * LOOM_RESHARD_MIN_MESSAGE floats is its own message, from the source straight into the
 * destination (no copy on either side: a tensor-parallel shard of rows, a pipeline
 * stage's tensors); consecutive shorter runs (the half rows of a row-parallel matrix)
 * whose rows lie in order in the source with few gaps (at most an eighth of their
 * floats) form a span, sent from the source in place into the receiver's staging buffer
 * and unpacked there when it holds at least that many floats; what is left (norms,
 * biases: short runs among others) is packed into one last message of the pair. What the
 * rank keeps is copied once, a span of rows contiguous on both sides in one memcpy, while
 * the messages are in flight. MPI moves a contiguous message between processes of one
 * machine with a single copy done by the receiver (CMA); a derived datatype of the rows
 * instead (tried: MPI_Type_create_hindexed + MPI_Alltoallw) goes through 32 KB
 * shared-memory fragments, and measured 1.6-2.2x slower here (docs/rl.md). A rank holds
 * its source and destination buffers plus the floats it packs and receives staged. Every
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

/* A copy of n floats: from index `from` of one buffer to index `to` of another. */
typedef struct {
    size_t to, from, n;
} loom_reshard_seg;

/* One message with one peer: n floats at index `at` of the source (a send) or the
 * destination (a receive), or where `staged`, of this end's staging buffer; `packed`: the
 * sender sends it from its staging buffer (both ends know: it picks the message's tag). */
typedef struct {
    size_t at, n;
    int peer, staged, packed;
} loom_reshard_msg;

/* Runs of at least this many floats that lie in order in the sender's source and the
 * receiver's destination travel as their own message, with no copy on either side (16K
 * floats, 64 KiB: a message costs about as much as copying that). */
#define LOOM_RESHARD_MIN_MESSAGE ((size_t)16384)
#define LOOM_RESHARD_MSG_MAX ((size_t)1 << 28) /* floats a message at most (MPI's int count) */

typedef struct {
    loom_comm *comm;
    loom_reshard_msg *sends, *recvs; /* in the order they are posted; a pair's match */
    int n_sends, n_recvs;
    loom_reshard_seg *pack, *unpack, *local; /* source -> send_buf, recv_buf -> destination,
                                                 source -> destination (what the rank keeps) */
    int n_pack, n_unpack, n_local;
    loom_comm_handle *handles; /* [n_recvs + n_sends] */
    float *send_buf, *recv_buf;
    /* floats this rank sends and receives (a span's gaps included), of those received
     * straight into the destination, packed, unpacked, and copied within the rank */
    size_t send_floats, recv_floats, direct_floats, packed_floats, unpacked_floats, local_floats;
    double bytes_moved; /* over all ranks: floats sent between different ranks x 4 */
    double pack_ms, local_ms, wait_ms, unpack_ms; /* the last run: packing, the rank's own
                                                     copies, posting and waiting for the
                                                     messages, unpacking */
} loom_reshard;

/* Plans the move from side `src` to side `dst` over comm (every rank of comm calls it).
 * Fails (LOOM_ERR_INPUT) when the two sides do not describe the same tensors, or when a
 * destination element has no source; on a device communicator (LOOM_ERR_STATE: the
 * buffers are host memory, and the messages are matched by tag). */
loom_status loom_reshard_plan(loom_reshard *r, loom_comm *comm, const loom_reshard_side *src,
                              const loom_reshard_side *dst, loom_error *err);
/* The same with another threshold for a run's own message (LOOM_RESHARD_MIN_MESSAGE above;
 * 1: every run on its own, SIZE_MAX: everything packed). The result is the same. */
loom_status loom_reshard_plan_with(loom_reshard *r, loom_comm *comm, const loom_reshard_side *src,
                                   const loom_reshard_side *dst, size_t min_message_floats,
                                   loom_error *err);
/* dst (the destination side's flat buffer) = the source elements of src. */
loom_status loom_reshard_run(loom_reshard *r, const float *src, float *dst, loom_error *err);
void loom_reshard_free(loom_reshard *r);

#endif
