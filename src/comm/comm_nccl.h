/* The NCCL transport of loom_comm (CUDA builds only, -DLOOM_CUDA=ON): after
 * loom_comm_use_nccl, the loom_comm_* calls of comm/comm.h take CUDA device buffers and
 * run on NCCL, with the communicator's bookkeeping unchanged (every operation takes its
 * next sequence number, its bytes and timers, and its trace lanes).
 *
 * Streams: collectives run on the communicator's own stream. Each operation first makes
 * that stream wait for the work already queued on the compute stream given here (an
 * event, no host sync), then records a completion event in the handle. loom_comm_wait
 * then makes the compute stream wait for it (the host does not block) or, without a
 * compute stream (NULL), blocks the host; a blocking call is an operation and its wait.
 * So the gradient-bucket overlap designed for MPI carries over. Unequal counts
 * (reduce-scatter, all-gatherv) are grouped ncclReduce / ncclBroadcast calls, one per
 * root; all-to-all-v is grouped send/recv; send/recv have no tags (matched in order).
 * At most LOOM_NCCL_EVENTS operations may be in flight at once per communicator. The
 * barrier and the trace gather stay on the host (the bootstrap MPI communicator).
 *
 * Status: compiled and linked; never run on a GPU yet (tests/cuda/test_nccl.c). */
#ifndef LOOM_COMM_COMM_NCCL_H
#define LOOM_COMM_COMM_NCCL_H

#include "comm/comm.h"
#include "core/error.h"

#define LOOM_NCCL_EVENTS 64

/* Moves host communicator c onto CUDA device `device` (collective: every rank calls it
 * with its own device; rank 0's NCCL id goes over c first). stream: the compute stream
 * (cudaStream_t) operations are ordered after and that waits complete into, or NULL. */
loom_status loom_comm_use_nccl(loom_comm *c, int device, void *stream, loom_error *err);
/* Changes the compute stream of a device communicator (NULL: waits block the host). */
void loom_comm_nccl_set_stream(loom_comm *c, void *stream);

#endif
