/* The communication API: collectives and point-to-point over one communicator, blocking
 * and non-blocking (handles), for both transports: MPI on host buffers (here) and NCCL
 * on CUDA device buffers (comm/comm_nccl.h, CUDA builds), chosen by where the buffers
 * live (loom_comm_device) when the communicator is set up; callers make the same calls
 * either way. Every operation gets the communicator's next sequence number and its
 * time is recorded, so a hang can be located ("rank 3 never entered collective #812 on
 * dp") and stragglers measured. A communicator of size 1 needs no MPI at all: every
 * operation is then a local no-op (or a copy), so one process runs without mpirun. */
#ifndef LOOM_COMM_COMM_H
#define LOOM_COMM_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/trace.h"

/* Where a communicator's buffers live, and so which transport carries them. */
typedef enum {
    LOOM_COMM_HOST, /* host memory: MPI (nothing at all for size 1) */
    LOOM_COMM_CUDA  /* CUDA device memory: NCCL (loom_comm_use_nccl) */
} loom_comm_device;

typedef struct loom_comm_ops loom_comm_ops;

typedef struct loom_comm {
    loom_comm_device device;
    const loom_comm_ops *ops; /* device CUDA: the transport (NULL: MPI, below) */
    void *impl;               /* the transport's state (NCCL communicator, stream, events) */
    MPI_Comm mpi; /* MPI_COMM_NULL when size == 1 without MPI; bootstraps a device one */
    int rank, size;
    char name[16];   /* "world", "dp", "tp", "pp", "ep" */
    int first_world; /* world rank of its rank 0 (names the group in heartbeats), -1: ? */
    int group_shown; /* first_world was passed to the progress record */
    uint64_t seq;    /* operations started so far */
    /* timers: total time inside blocking calls and waits (communication that was NOT
     * hidden), and total lifetime of non-blocking operations (start to completion) */
    double blocked_ms, inflight_ms;
    uint64_t bytes;
    loom_trace *trace; /* NULL: no trace; else each completed operation becomes a span */
    /* NULL, or what the operations started from now on are called in heartbeats and hang
     * diagnoses instead of their kind, and before it in the trace (a ring's step: "ring kv
     * 2/4", traced as "ring kv 2/4 send #17 cp"); the string must outlive them. */
    const char *label;
} loom_comm;

typedef struct loom_comm_handle {
    loom_comm *comm;
    MPI_Request req; /* host */
    void *event;     /* device: the completion event (cudaEvent_t) */
    uint64_t seq;
    double start_ms;
    int active;
    const char *op;    /* its kind: "send", "allreduce", ... */
    const char *label; /* NULL, or the communicator's label when it started */
} loom_comm_handle;

/* The element types of a transport's sums. */
typedef enum { LOOM_COMM_F32, LOOM_COMM_F64, LOOM_COMM_BF16 } loom_comm_dtype;

/* What a device transport implements (comm_nccl.c). h NULL: a blocking call (complete on
 * return); otherwise h is filled and completed by wait/test. Counts as in the calls below. */
struct loom_comm_ops {
    loom_status (*allreduce_sum)(loom_comm *c, void *buf, size_t count, loom_comm_dtype type,
                                 loom_comm_handle *h, loom_error *err);
    loom_status (*reduce_scatter_sum)(loom_comm *c, const float *send, float *recv,
                                      const int *counts, loom_comm_handle *h, loom_error *err);
    loom_status (*allgatherv)(loom_comm *c, float *buf, const int *counts, const int *displs,
                              loom_comm_handle *h, loom_error *err);
    loom_status (*alltoallv)(loom_comm *c, const float *send, const int *send_counts,
                             const int *send_displs, float *recv, const int *recv_counts,
                             const int *recv_displs, loom_comm_handle *h, loom_error *err);
    loom_status (*bcast)(loom_comm *c, void *buf, size_t bytes, int root, loom_comm_handle *h,
                         loom_error *err);
    loom_status (*send)(loom_comm *c, const float *buf, size_t count, int peer, loom_comm_handle *h,
                        loom_error *err);
    loom_status (*recv)(loom_comm *c, float *buf, size_t count, int peer, loom_comm_handle *h,
                        loom_error *err);
    loom_status (*wait)(loom_comm_handle *h, loom_error *err);
    loom_status (*test)(loom_comm_handle *h, int *done, loom_error *err);
    void (*free)(loom_comm *c);
};

/* Wraps an MPI communicator (duplicated, so loom's traffic is its own). */
loom_status loom_comm_from_mpi(loom_comm *c, MPI_Comm mpi, const char *name, loom_error *err);
/* A size-1 communicator that needs no MPI. */
/* A group's shape only: rank `rank` of `size`, no transport (mpi is MPI_COMM_NULL). What
 * sizes a layout's buffers without running it (loom plan: train/run_memory.c) reads of a
 * group; nothing may communicate on it. */
void loom_comm_shape(loom_comm *c, const char *name, int rank, int size);
void loom_comm_self(loom_comm *c, const char *name);
void loom_comm_free(loom_comm *c);

/* In-place float sums. */
loom_status loom_comm_allreduce_sum(loom_comm *c, float *buf, size_t count, loom_error *err);
loom_status loom_comm_allreduce_sum_f64(loom_comm *c, double *buf, int count, loom_error *err);
loom_status loom_comm_iallreduce_sum(loom_comm *c, float *buf, size_t count, loom_comm_handle *h,
                                     loom_error *err);
/* bf16 buffers (loom_bf16 bit patterns) summed in bf16: device communicators only
 * (LOOM_ERR_STATE on the host). */
loom_status loom_comm_iallreduce_sum_bf16(loom_comm *c, void *buf, size_t count,
                                          loom_comm_handle *h, loom_error *err);
/* send holds sum(counts) floats laid out by rank; rank r receives counts[r] summed floats. */
loom_status loom_comm_ireduce_scatter_sum(loom_comm *c, const float *send, float *recv,
                                          const int *counts, loom_comm_handle *h, loom_error *err);
/* In place: rank r's counts[r] floats at displs[r] of buf are gathered into everyone's buf. */
loom_status loom_comm_allgatherv(loom_comm *c, float *buf, const int *counts, const int *displs,
                                 loom_error *err);
loom_status loom_comm_iallgatherv(loom_comm *c, float *buf, const int *counts, const int *displs,
                                  loom_comm_handle *h, loom_error *err);
loom_status loom_comm_alltoallv(loom_comm *c, const float *send, const int *send_counts,
                                const int *send_displs, float *recv, const int *recv_counts,
                                const int *recv_displs, loom_error *err);
/* Non-blocking all-to-all-v: the count and displacement arrays and both buffers must stay
 * untouched until h completes (MPI reads them while the operation is in flight). */
loom_status loom_comm_ialltoallv(loom_comm *c, const float *send, const int *send_counts,
                                 const int *send_displs, float *recv, const int *recv_counts,
                                 const int *recv_displs, loom_comm_handle *h, loom_error *err);
loom_status loom_comm_bcast(loom_comm *c, void *buf, size_t bytes, int root, loom_error *err);
/* The same two, moving bf16 bit patterns (uint16_t, 2 bytes an element) without arithmetic:
 * what the gradient reduction with --grad-reduce-dtype bf16 sends (parallel/zero_bf16.c
 * sums on receipt). Host communicators only (LOOM_ERR_STATE on a device one). */
loom_status loom_comm_ialltoallv_bf16(loom_comm *c, const uint16_t *send, const int *send_counts,
                                      const int *send_displs, uint16_t *recv,
                                      const int *recv_counts, const int *recv_displs,
                                      loom_comm_handle *h, loom_error *err);
loom_status loom_comm_iallgatherv_bf16(loom_comm *c, uint16_t *buf, const int *counts,
                                       const int *displs, loom_comm_handle *h, loom_error *err);

/* Large counts (comm_large.c): more than 2^31 elements or bytes in one call, split into
 * ordinary collectives of at most `chunk` elements (bytes for bcast; 0: LOOM_COMM_CHUNK),
 * as OpenMPI 4.1 has no large-count (_c) functions. The blocking allreduce_sum and bcast
 * above take this path themselves past 2^31. allgatherv_large: 64-bit counts and
 * displacements (a ZeRO shard of a model past 2^31 elements); within int it is one
 * allgatherv, past it each rank's part is broadcast from it. */
#define LOOM_COMM_CHUNK (1u << 30)
loom_status loom_comm_allreduce_sum_large(loom_comm *c, float *buf, size_t count, size_t chunk,
                                          loom_error *err);
loom_status loom_comm_bcast_large(loom_comm *c, void *buf, size_t bytes, int root, size_t chunk,
                                  loom_error *err);
loom_status loom_comm_allgatherv_large(loom_comm *c, float *buf, const size_t *counts,
                                       const size_t *displs, size_t chunk, loom_error *err);
loom_status loom_comm_isend(loom_comm *c, const float *buf, size_t count, int peer, int tag,
                            loom_comm_handle *h, loom_error *err);
loom_status loom_comm_irecv(loom_comm *c, float *buf, size_t count, int peer, int tag,
                            loom_comm_handle *h, loom_error *err);
/* The same two moving bf16 bit patterns (2 bytes an element): the pipeline's messages under
 * --precision bf16 (pipeline/executor.c). Host communicators only (LOOM_ERR_STATE). */
loom_status loom_comm_isend_bf16(loom_comm *c, const uint16_t *buf, size_t count, int peer, int tag,
                                 loom_comm_handle *h, loom_error *err);
loom_status loom_comm_irecv_bf16(loom_comm *c, uint16_t *buf, size_t count, int peer, int tag,
                                 loom_comm_handle *h, loom_error *err);
loom_status loom_comm_barrier(loom_comm *c, loom_error *err);

/* Completes h (blocking; the time spent here counts as blocked). On a device communicator
 * with a stream (loom_comm_use_nccl) the stream waits instead and the host goes on. */
loom_status loom_comm_wait(loom_comm_handle *h, loom_error *err);
/* Lets MPI progress h; *done = 1 once complete. Cheap; call it between compute. */
loom_status loom_comm_test(loom_comm_handle *h, int *done, loom_error *err);

double loom_comm_now_ms(void);

/* Gathers every rank's trace to rank 0, which writes the merged Chrome trace to path
 * (collective: every rank calls it). */
loom_status loom_comm_write_trace(loom_comm *c, const loom_trace *t, const char *path,
                                  loom_error *err);

#endif
