/* The NCCL communication backend (CUDA builds only, -DLOOM_CUDA=ON): the collectives of
 * comm/comm.h on device buffers. A loom_nccl_comm is built from a loom_comm (rank 0's
 * NCCL unique id is broadcast over it) and shares its bookkeeping: every operation takes
 * the loom_comm's next sequence number, its bytes and timers, and its trace lanes.
 *
 * Streams: collectives run on the communicator's own stream. Each call first makes that
 * stream wait for the work already queued on `after` (the compute stream that produced
 * the buffer: an event, no host sync), then records a completion event in the handle.
 * loom_nccl_wait(h, consumer) makes the consumer stream wait for it (the host does not
 * block) or, with consumer == NULL, blocks the host, so the gradient-bucket overlap
 * designed for MPI carries over. Unequal counts (reduce-scatter, all-gatherv) are grouped
 * ncclReduce / ncclBroadcast calls, one per root; all-to-all-v is grouped send/recv.
 * At most LOOM_NCCL_EVENTS operations may be in flight at once per communicator.
 *
 * Status: compiled and linked; never run on a GPU yet (tests/cuda/test_nccl.c). */
#ifndef LOOM_COMM_COMM_NCCL_H
#define LOOM_COMM_COMM_NCCL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "comm/comm.h"
#include "core/error.h"

#define LOOM_NCCL_EVENTS 64

typedef struct {
    loom_comm *host;     /* rank, size, name, sequence numbers, timers, trace */
    void *nccl;          /* ncclComm_t */
    cudaStream_t stream; /* collectives run here */
    cudaEvent_t ready;   /* the producer stream's work, recorded before each operation */
    cudaEvent_t events[LOOM_NCCL_EVENTS];
} loom_nccl_comm;

typedef struct {
    loom_nccl_comm *comm;
    cudaEvent_t done;
    uint64_t seq;
    double start_ms;
    int active;
    const char *op;
} loom_nccl_handle;

/* Collective over host: every rank of host calls it with its own device. */
loom_status loom_nccl_init(loom_nccl_comm *n, loom_comm *host, int device, loom_error *err);
void loom_nccl_free(loom_nccl_comm *n);

loom_status loom_nccl_iallreduce_sum(loom_nccl_comm *n, float *buf, size_t count,
                                     cudaStream_t after, loom_nccl_handle *h, loom_error *err);
/* bf16 buffers (loom_bf16 bit patterns), summed by NCCL in bf16. */
loom_status loom_nccl_iallreduce_sum_bf16(loom_nccl_comm *n, void *buf, size_t count,
                                          cudaStream_t after, loom_nccl_handle *h, loom_error *err);
/* send holds sum(counts) floats laid out by rank; rank r receives counts[r] summed floats. */
loom_status loom_nccl_ireduce_scatter_sum(loom_nccl_comm *n, const float *send, float *recv,
                                          const int *counts, cudaStream_t after,
                                          loom_nccl_handle *h, loom_error *err);
/* In place: rank r's counts[r] floats at displs[r] of buf are gathered into everyone's buf. */
loom_status loom_nccl_iallgatherv(loom_nccl_comm *n, float *buf, const int *counts,
                                  const int *displs, cudaStream_t after, loom_nccl_handle *h,
                                  loom_error *err);
loom_status loom_nccl_ialltoallv(loom_nccl_comm *n, const float *send, const int *send_counts,
                                 const int *send_displs, float *recv, const int *recv_counts,
                                 const int *recv_displs, cudaStream_t after, loom_nccl_handle *h,
                                 loom_error *err);
loom_status loom_nccl_ibcast(loom_nccl_comm *n, void *buf, size_t bytes, int root,
                             cudaStream_t after, loom_nccl_handle *h, loom_error *err);
loom_status loom_nccl_isend(loom_nccl_comm *n, const float *buf, size_t count, int peer,
                            cudaStream_t after, loom_nccl_handle *h, loom_error *err);
loom_status loom_nccl_irecv(loom_nccl_comm *n, float *buf, size_t count, int peer,
                            cudaStream_t after, loom_nccl_handle *h, loom_error *err);

/* consumer != NULL: that stream waits for h (no host block); NULL: the host blocks (the
 * time counts as blocked on the loom_comm). Also reports NCCL's asynchronous errors. */
loom_status loom_nccl_wait(loom_nccl_handle *h, cudaStream_t consumer, loom_error *err);
/* *done = 1 once the operation finished on the device. */
loom_status loom_nccl_test(loom_nccl_handle *h, int *done, loom_error *err);

#endif
