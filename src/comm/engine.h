/* The communication engine: a background thread that starts and drives the
 * non-blocking collectives posted by the compute thread, on a communicator of its own.
 *
 * Why: MPI's non-blocking collectives only move when MPI is called, and OpenMPI 4.1 does
 * much of MPI_Iallreduce's / MPI_Ireduce_scatter's work inside the starting call. Issued
 * from the compute thread, both block backward. Here the compute thread only appends an
 * operation to a queue (no MPI call); the engine thread starts operations in the order
 * they were posted, while their bytes in flight stay within LOOM_COMM_ENGINE_INFLIGHT_BYTES
 * (every rank posts in the same program order, so the collectives match on every rank
 * whatever the timing) and polls them with MPI_Test, sleeping with
 * a short backoff between polls so it costs the compute threads little CPU.
 *
 * Determinism: the reduction of each operation is MPI's (fixed by count and
 * communicator size, not by timing); what the engine changes is only when it runs.
 *
 * Timers and trace: posting takes the next sequence number of the engine's
 * communicator (named after the parent, e.g. "dp.bg"); time the compute thread spends
 * in loom_comm_engine_wait is `blocked_ms` (exposed), post-to-completion is
 * `inflight_ms`; each completed operation becomes a trace span from its start on the
 * wire to its completion ("allreduce #12 dp.bg").
 *
 * Needs MPI_THREAD_MULTIPLE (the compute thread still makes other MPI calls on other
 * communicators). Without it (or on a size-1 communicator) the engine has no thread:
 * posting starts the operation at once and polling tests it, as a plain loop would.
 * LOOM_MPI_THREAD=funneled (comm/world.c) asks MPI for less, to run that path. */
#ifndef LOOM_COMM_ENGINE_H
#define LOOM_COMM_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm/comm.h"
#include "core/worker.h"

/* The engine starts operations while the bytes in flight stay within this; an operation
 * larger runs alone (comm/engine.c says why). So OpenMPI's temporaries of the all-reduces
 * in flight take at most the larger of this and the largest all-reduce's buffer. */
#define LOOM_COMM_ENGINE_INFLIGHT_BYTES ((size_t)4 << 20)

typedef enum {
    LOOM_OP_ALLREDUCE,      /* in place: buf[count] summed */
    LOOM_OP_REDUCE_SCATTER, /* send[sum(counts)] summed; rank r gets counts[r] into recv */
    LOOM_OP_ALLGATHERV,     /* in place: buf, counts, displs as loom_comm_iallgatherv */
    LOOM_OP_ALLTOALLV,      /* send, counts, displs -> recv, rcounts, rdispls (ialltoallv) */
    LOOM_OP_ALLTOALLV_BF16, /* as ALLTOALLV on send16 -> recv16 (bf16 bit patterns) */
    LOOM_OP_ALLGATHERV_BF16 /* as ALLGATHERV in place on buf16 */
} loom_comm_op_kind;

/* Where an operation is in its life (op->state). */
typedef enum { LOOM_OP_IDLE, LOOM_OP_QUEUED, LOOM_OP_RUNNING, LOOM_OP_DONE } loom_comm_op_state;

/* One operation, owned by the caller; its arrays must stay valid until it completes. */
typedef struct {
    loom_comm_op_kind kind;
    float *buf;
    const float *send;
    float *recv;
    size_t count;
    const int *counts, *displs;
    const int *rcounts, *rdispls; /* LOOM_OP_ALLTOALLV: what this rank receives */
    uint16_t *buf16, *recv16;     /* the _BF16 kinds' buffers */
    const uint16_t *send16;
    /* set by the engine */
    loom_comm_handle h; /* seq, post time, MPI request */
    double start_ms, end_ms;
    int rc;
    atomic_int state; /* a loom_comm_op_state (atomic: the engine thread sets it) */
} loom_comm_op;

typedef struct {
    loom_comm comm;            /* the engine's own duplicate of the parent */
    loom_comm *parent;         /* its trace pointer is followed */
    int threaded;              /* 0: no thread, operations run from the caller */
    loom_comm_op **queue;      /* posted, not yet started (FIFO) */
    int q_head, q_tail, q_cap; /* ring indices, under worker.mu */
    loom_comm_op **running;    /* engine thread only */
    size_t *running_bytes;     /* ... each one's bytes (op_bytes) */
    int n_running;
    size_t inflight_bytes; /* the running operations' bytes together */
    size_t inflight_peak;  /* the most of them at once so far */
    loom_error err;        /* the engine thread's failures */
    loom_worker worker;    /* the thread; its mu guards the queue, its cv signals work posted */
    pthread_cond_t done;   /* operations completed */
} loom_comm_engine;

/* Duplicates parent's communicator and, when MPI provides MPI_THREAD_MULTIPLE and the
 * size is > 1, starts the engine thread. queue_cap: most operations posted and not
 * completed at any time. */
loom_status loom_comm_engine_start(loom_comm_engine *e, loom_comm *parent, int queue_cap,
                                   loom_error *err);
/* Joins the thread; operations still in flight are waited for first. */
void loom_comm_engine_stop(loom_comm_engine *e);

/* Queues op (filled in by the caller: kind and buffers). */
loom_status loom_comm_engine_post(loom_comm_engine *e, loom_comm_op *op, loom_error *err);
/* Blocks until op is complete (the time counts as exposed). */
loom_status loom_comm_engine_wait(loom_comm_engine *e, loom_comm_op *op, loom_error *err);
/* CPU time the engine thread has used since it started, in ms (0 without a thread):
 * MPI's shared-memory copies and reductions run there, on the cores compute uses. */
double loom_comm_engine_cpu_ms(const loom_comm_engine *e);
/* *done = 1 once op is complete; without a thread this lets MPI progress it. */
loom_status loom_comm_engine_test(loom_comm_engine *e, loom_comm_op *op, int *done,
                                  loom_error *err);

#endif
