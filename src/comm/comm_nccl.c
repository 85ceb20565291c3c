/* The NCCL transport of the communication API (see comm_nccl.h). */
#include "comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A device communicator's state (loom_comm.impl). */
typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;  /* collectives run here */
    cudaStream_t compute; /* the producer/consumer stream; NULL: waits block the host */
    cudaEvent_t ready;    /* the compute stream's work, recorded before each operation */
    cudaEvent_t events[LOOM_NCCL_EVENTS];
} nccl_state;

static nccl_state *state(loom_comm *c) {
    return (nccl_state *)c->impl;
}

static loom_status nccl_fail(loom_comm *c, ncclResult_t r, const char *op, loom_error *err) {
    return loom_error_set(err, LOOM_ERR_IO, "NCCL %s #%llu on %s (rank %d of %d): %s", op,
                          (unsigned long long)c->seq, c->name, c->rank, c->size,
                          ncclGetErrorString(r));
}

static loom_status cuda_fail(loom_comm *c, cudaError_t e, const char *op, loom_error *err) {
    return loom_error_set(err, LOOM_ERR_STATE, "CUDA during %s on %s (rank %d of %d): %s", op,
                          c->name, c->rank, c->size, cudaGetErrorString(e));
}

static void state_free(nccl_state *n) {
    for (int i = 0; i < LOOM_NCCL_EVENTS; i++)
        if (n->events[i]) cudaEventDestroy(n->events[i]);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->nccl) ncclCommDestroy(n->nccl);
    free(n);
}

static void ops_free(loom_comm *c) {
    state_free(state(c));
}

/* Sequence number, bytes, handle; the NCCL stream waits for the compute stream's work. */
static loom_status begin(loom_comm *c, loom_comm_handle *h, const char *op, size_t bytes,
                         loom_error *err) {
    nccl_state *n = state(c);
    c->seq++;
    c->bytes += bytes;
    memset(h, 0, sizeof *h);
    h->comm = c;
    h->seq = c->seq;
    h->op = op;
    h->start_ms = loom_comm_now_ms();
    h->event = n->events[c->seq % LOOM_NCCL_EVENTS];
    cudaError_t e = cudaEventRecord(n->ready, n->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, n->ready, 0);
    return e == cudaSuccess ? LOOM_OK : cuda_fail(c, e, op, err);
}

static loom_status ops_wait(loom_comm_handle *h, loom_error *err);

/* Records the completion event; a blocking call (user handle NULL) waits at once. */
static loom_status finish(loom_comm *c, loom_comm_handle *h, loom_comm_handle *user, ncclResult_t r,
                          loom_error *err) {
    if (r != ncclSuccess) return nccl_fail(c, r, h->op, err);
    cudaError_t e = cudaEventRecord((cudaEvent_t)h->event, state(c)->stream);
    if (e != cudaSuccess) return cuda_fail(c, e, h->op, err);
    h->active = 1;
    return user ? LOOM_OK : ops_wait(h, err);
}

static int all_equal(const int *counts, int size) {
    for (int r = 1; r < size; r++)
        if (counts[r] != counts[0]) return 0;
    return 1;
}

static loom_status ops_allreduce_sum(loom_comm *c, void *buf, size_t count, loom_comm_dtype type,
                                     loom_comm_handle *user, loom_error *err) {
    static const ncclDataType_t TYPES[] = {ncclFloat32, ncclFloat64, ncclBfloat16};
    static const size_t SIZES[] = {4, 8, 2};
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "allreduce", count * SIZES[type], err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    return finish(c, h, user,
                  ncclAllReduce(buf, buf, count, TYPES[type], ncclSum, n->nccl, n->stream), err);
}

static loom_status ops_reduce_scatter_sum(loom_comm *c, const float *send, float *recv,
                                          const int *counts, loom_comm_handle *user,
                                          loom_error *err) {
    const int size = c->size, rank = c->rank;
    size_t total = 0;
    for (int r = 0; r < size; r++) total += (size_t)counts[r];
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "reduce_scatter", total * 4, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    if (all_equal(counts, size))
        return finish(c, h, user,
                      ncclReduceScatter(send, recv, (size_t)counts[0], ncclFloat32, ncclSum,
                                        n->nccl, n->stream),
                      err);
    /* Unequal shards: one reduce per root, grouped so NCCL schedules them together. */
    ncclResult_t r = ncclGroupStart();
    size_t off = 0;
    for (int root = 0; root < size && r == ncclSuccess; root++) {
        r = ncclReduce(send + off, root == rank ? recv : NULL, (size_t)counts[root], ncclFloat32,
                       ncclSum, root, n->nccl, n->stream);
        off += (size_t)counts[root];
    }
    ncclResult_t r2 = ncclGroupEnd();
    return finish(c, h, user, r != ncclSuccess ? r : r2, err);
}

static loom_status ops_allgatherv(loom_comm *c, float *buf, const int *counts, const int *displs,
                                  loom_comm_handle *user, loom_error *err) {
    const int size = c->size, rank = c->rank;
    size_t total = 0;
    int packed = 1; /* equal counts at consecutive displacements: one in-place all-gather */
    for (int r = 0; r < size; r++) {
        total += (size_t)counts[r];
        if (counts[r] != counts[0] || displs[r] != r * counts[0]) packed = 0;
    }
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "allgather", total * 4, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    if (packed)
        return finish(c, h, user,
                      ncclAllGather(buf + displs[rank], buf, (size_t)counts[0], ncclFloat32,
                                    n->nccl, n->stream),
                      err);
    ncclResult_t r = ncclGroupStart();
    for (int root = 0; root < size && r == ncclSuccess; root++)
        r = ncclBroadcast(buf + displs[root], buf + displs[root], (size_t)counts[root], ncclFloat32,
                          root, n->nccl, n->stream);
    ncclResult_t r2 = ncclGroupEnd();
    return finish(c, h, user, r != ncclSuccess ? r : r2, err);
}

static loom_status ops_alltoallv(loom_comm *c, const float *send, const int *send_counts,
                                 const int *send_displs, float *recv, const int *recv_counts,
                                 const int *recv_displs, loom_comm_handle *user, loom_error *err) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)send_counts[r];
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "alltoall", total * 4, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (send_counts[p] > 0)
            r = ncclSend(send + send_displs[p], (size_t)send_counts[p], ncclFloat32, p, n->nccl,
                         n->stream);
        if (r == ncclSuccess && recv_counts[p] > 0)
            r = ncclRecv(recv + recv_displs[p], (size_t)recv_counts[p], ncclFloat32, p, n->nccl,
                         n->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    return finish(c, h, user, r != ncclSuccess ? r : r2, err);
}

static loom_status ops_bcast(loom_comm *c, void *buf, size_t bytes, int root,
                             loom_comm_handle *user, loom_error *err) {
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "bcast", bytes, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    return finish(c, h, user, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->nccl, n->stream),
                  err);
}

static loom_status ops_send(loom_comm *c, const float *buf, size_t count, int peer,
                            loom_comm_handle *user, loom_error *err) {
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "send", count * 4, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    return finish(c, h, user, ncclSend(buf, count, ncclFloat32, peer, n->nccl, n->stream), err);
}

static loom_status ops_recv(loom_comm *c, float *buf, size_t count, int peer,
                            loom_comm_handle *user, loom_error *err) {
    loom_comm_handle local, *h = user ? user : &local;
    loom_status st = begin(c, h, "recv", 0, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = state(c);
    return finish(c, h, user, ncclRecv(buf, count, ncclFloat32, peer, n->nccl, n->stream), err);
}

static loom_status async_error(loom_comm_handle *h, loom_error *err) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(state(h->comm)->nccl, &async);
    if (r == ncclSuccess) r = async;
    return r == ncclSuccess ? LOOM_OK : nccl_fail(h->comm, r, h->op, err);
}

static void completed(loom_comm_handle *h, double blocked_from) {
    loom_comm *c = h->comm;
    double now = loom_comm_now_ms();
    if (blocked_from >= 0) c->blocked_ms += now - blocked_from;
    c->inflight_ms += now - h->start_ms;
    if (c->trace) {
        char name[64];
        snprintf(name, sizeof name, "%s #%llu %s", h->op, (unsigned long long)h->seq, c->name);
        loom_trace_comm(c->trace, name, h->start_ms * 1e3, now * 1e3);
    }
    h->active = 0;
}

static loom_status ops_wait(loom_comm_handle *h, loom_error *err) {
    if (!h->active) return LOOM_OK;
    cudaStream_t consumer = state(h->comm)->compute;
    cudaEvent_t done = (cudaEvent_t)h->event;
    if (consumer) {
        cudaError_t e = cudaStreamWaitEvent(consumer, done, 0);
        if (e != cudaSuccess) return cuda_fail(h->comm, e, h->op, err);
        completed(h, -1.0); /* device-side ordering: nothing blocked on the host */
        return async_error(h, err);
    }
    double t0 = loom_comm_now_ms();
    cudaError_t e = cudaEventSynchronize(done);
    if (e != cudaSuccess) return cuda_fail(h->comm, e, h->op, err);
    completed(h, t0);
    return async_error(h, err);
}

static loom_status ops_test(loom_comm_handle *h, int *done, loom_error *err) {
    *done = 1;
    if (!h->active) return LOOM_OK;
    cudaError_t e = cudaEventQuery((cudaEvent_t)h->event);
    if (e == cudaErrorNotReady) {
        *done = 0;
        return async_error(h, err);
    }
    if (e != cudaSuccess) return cuda_fail(h->comm, e, h->op, err);
    completed(h, -1.0);
    return async_error(h, err);
}

static const loom_comm_ops NCCL_OPS = {
    ops_allreduce_sum, ops_reduce_scatter_sum,
    ops_allgatherv,    ops_alltoallv,
    ops_bcast,         ops_send,
    ops_recv,          ops_wait,
    ops_test,          ops_free,
};

loom_status loom_comm_use_nccl(loom_comm *c, int device, void *stream, loom_error *err) {
    if (c->device != LOOM_COMM_HOST)
        return loom_error_set(err, LOOM_ERR_STATE, "%s: already a device communicator", c->name);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(c, e, "cudaSetDevice", err);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0) r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(c, r, "ncclGetUniqueId", err);
    /* Every rank must reach the broadcast (over MPI), so rank 0's failure above is local. */
    loom_status st = loom_comm_bcast(c, &id, sizeof id, 0, err);
    if (st != LOOM_OK) return st;
    nccl_state *n = calloc(1, sizeof *n);
    if (!n) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", c->name);
    n->compute = (cudaStream_t)stream;
    r = ncclCommInitRank(&n->nccl, c->size, id, c->rank);
    if (r != ncclSuccess) {
        free(n);
        return nccl_fail(c, r, "ncclCommInitRank", err);
    }
    e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    for (int i = 0; i < LOOM_NCCL_EVENTS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&n->events[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        st = cuda_fail(c, e, "NCCL stream/events", err);
        state_free(n);
        return st;
    }
    c->device = LOOM_COMM_CUDA;
    c->ops = &NCCL_OPS;
    c->impl = n;
    return LOOM_OK;
}

void loom_comm_nccl_set_stream(loom_comm *c, void *stream) {
    if (c->device == LOOM_COMM_CUDA) state(c)->compute = (cudaStream_t)stream;
}
