/* The NCCL backend of the communication API (see comm_nccl.h). */
#include "comm/comm_nccl.h"

#include <nccl.h>
#include <stdio.h>
#include <string.h>

static loom_status nccl_fail(loom_nccl_comm *n, ncclResult_t r, const char *op, loom_error *err) {
    loom_comm *c = n->host;
    return loom_error_set(err, LOOM_ERR_IO, "NCCL %s #%llu on %s (rank %d of %d): %s", op,
                          (unsigned long long)c->seq, c->name, c->rank, c->size,
                          ncclGetErrorString(r));
}

static loom_status cuda_fail(loom_nccl_comm *n, cudaError_t e, const char *op, loom_error *err) {
    loom_comm *c = n->host;
    return loom_error_set(err, LOOM_ERR_STATE, "CUDA during %s on %s (rank %d of %d): %s", op,
                          c->name, c->rank, c->size, cudaGetErrorString(e));
}

loom_status loom_nccl_init(loom_nccl_comm *n, loom_comm *host, int device, loom_error *err) {
    memset(n, 0, sizeof *n);
    n->host = host;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(n, e, "cudaSetDevice", err);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (host->rank == 0) r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(n, r, "ncclGetUniqueId", err);
    /* Every rank must reach the broadcast, so rank 0's failure above is local only. */
    loom_status st = loom_comm_bcast(host, &id, sizeof id, 0, err);
    if (st != LOOM_OK) return st;
    ncclComm_t comm = NULL;
    r = ncclCommInitRank(&comm, host->size, id, host->rank);
    if (r != ncclSuccess) return nccl_fail(n, r, "ncclCommInitRank", err);
    n->nccl = comm;
    e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    for (int i = 0; i < LOOM_NCCL_EVENTS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&n->events[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        st = cuda_fail(n, e, "NCCL stream/events", err);
        loom_nccl_free(n);
        return st;
    }
    return LOOM_OK;
}

void loom_nccl_free(loom_nccl_comm *n) {
    for (int i = 0; i < LOOM_NCCL_EVENTS; i++)
        if (n->events[i]) cudaEventDestroy(n->events[i]);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->nccl) ncclCommDestroy((ncclComm_t)n->nccl);
    memset(n, 0, sizeof *n);
}

/* Sequence number, bytes, handle; the NCCL stream waits for the producer's work. */
static loom_status begin(loom_nccl_comm *n, loom_nccl_handle *h, const char *op, size_t bytes,
                         cudaStream_t after, loom_error *err) {
    loom_comm *c = n->host;
    c->seq++;
    c->bytes += bytes;
    memset(h, 0, sizeof *h);
    h->comm = n;
    h->seq = c->seq;
    h->op = op;
    h->start_ms = loom_comm_now_ms();
    h->done = n->events[c->seq % LOOM_NCCL_EVENTS];
    cudaError_t e = cudaEventRecord(n->ready, after);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, n->ready, 0);
    return e == cudaSuccess ? LOOM_OK : cuda_fail(n, e, op, err);
}

static loom_status finish(loom_nccl_comm *n, loom_nccl_handle *h, ncclResult_t r, loom_error *err) {
    if (r != ncclSuccess) return nccl_fail(n, r, h->op, err);
    cudaError_t e = cudaEventRecord(h->done, n->stream);
    if (e != cudaSuccess) return cuda_fail(n, e, h->op, err);
    h->active = 1;
    return LOOM_OK;
}

static int all_equal(const int *counts, int size) {
    for (int r = 1; r < size; r++)
        if (counts[r] != counts[0]) return 0;
    return 1;
}

loom_status loom_nccl_iallreduce_sum(loom_nccl_comm *n, float *buf, size_t count,
                                     cudaStream_t after, loom_nccl_handle *h, loom_error *err) {
    loom_status st = begin(n, h, "allreduce", count * 4, after, err);
    if (st != LOOM_OK) return st;
    return finish(
        n, h, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, (ncclComm_t)n->nccl, n->stream),
        err);
}

loom_status loom_nccl_iallreduce_sum_bf16(loom_nccl_comm *n, void *buf, size_t count,
                                          cudaStream_t after, loom_nccl_handle *h,
                                          loom_error *err) {
    loom_status st = begin(n, h, "allreduce", count * 2, after, err);
    if (st != LOOM_OK) return st;
    return finish(
        n, h, ncclAllReduce(buf, buf, count, ncclBfloat16, ncclSum, (ncclComm_t)n->nccl, n->stream),
        err);
}

loom_status loom_nccl_ireduce_scatter_sum(loom_nccl_comm *n, const float *send, float *recv,
                                          const int *counts, cudaStream_t after,
                                          loom_nccl_handle *h, loom_error *err) {
    int size = n->host->size, rank = n->host->rank;
    size_t total = 0;
    for (int r = 0; r < size; r++) total += (size_t)counts[r];
    loom_status st = begin(n, h, "reduce_scatter", total * 4, after, err);
    if (st != LOOM_OK) return st;
    ncclComm_t comm = (ncclComm_t)n->nccl;
    if (all_equal(counts, size))
        return finish(
            n, h,
            ncclReduceScatter(send, recv, (size_t)counts[0], ncclFloat32, ncclSum, comm, n->stream),
            err);
    /* Unequal shards: one reduce per root, grouped so NCCL schedules them together. */
    ncclResult_t r = ncclGroupStart();
    size_t off = 0;
    for (int root = 0; root < size && r == ncclSuccess; root++) {
        r = ncclReduce(send + off, root == rank ? recv : NULL, (size_t)counts[root], ncclFloat32,
                       ncclSum, root, comm, n->stream);
        off += (size_t)counts[root];
    }
    ncclResult_t r2 = ncclGroupEnd();
    return finish(n, h, r != ncclSuccess ? r : r2, err);
}

loom_status loom_nccl_iallgatherv(loom_nccl_comm *n, float *buf, const int *counts,
                                  const int *displs, cudaStream_t after, loom_nccl_handle *h,
                                  loom_error *err) {
    int size = n->host->size, rank = n->host->rank;
    size_t total = 0;
    int packed = 1; /* equal counts at consecutive displacements: one in-place all-gather */
    for (int r = 0; r < size; r++) {
        total += (size_t)counts[r];
        if (counts[r] != counts[0] || displs[r] != r * counts[0]) packed = 0;
    }
    loom_status st = begin(n, h, "allgather", total * 4, after, err);
    if (st != LOOM_OK) return st;
    ncclComm_t comm = (ncclComm_t)n->nccl;
    if (packed)
        return finish(
            n, h,
            ncclAllGather(buf + displs[rank], buf, (size_t)counts[0], ncclFloat32, comm, n->stream),
            err);
    ncclResult_t r = ncclGroupStart();
    for (int root = 0; root < size && r == ncclSuccess; root++)
        r = ncclBroadcast(buf + displs[root], buf + displs[root], (size_t)counts[root], ncclFloat32,
                          root, comm, n->stream);
    ncclResult_t r2 = ncclGroupEnd();
    return finish(n, h, r != ncclSuccess ? r : r2, err);
}

loom_status loom_nccl_ialltoallv(loom_nccl_comm *n, const float *send, const int *send_counts,
                                 const int *send_displs, float *recv, const int *recv_counts,
                                 const int *recv_displs, cudaStream_t after, loom_nccl_handle *h,
                                 loom_error *err) {
    int size = n->host->size;
    size_t total = 0;
    for (int r = 0; r < size; r++) total += (size_t)send_counts[r];
    loom_status st = begin(n, h, "alltoall", total * 4, after, err);
    if (st != LOOM_OK) return st;
    ncclComm_t comm = (ncclComm_t)n->nccl;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < size && r == ncclSuccess; p++) {
        if (send_counts[p] > 0)
            r = ncclSend(send + send_displs[p], (size_t)send_counts[p], ncclFloat32, p, comm,
                         n->stream);
        if (r == ncclSuccess && recv_counts[p] > 0)
            r = ncclRecv(recv + recv_displs[p], (size_t)recv_counts[p], ncclFloat32, p, comm,
                         n->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    return finish(n, h, r != ncclSuccess ? r : r2, err);
}

loom_status loom_nccl_ibcast(loom_nccl_comm *n, void *buf, size_t bytes, int root,
                             cudaStream_t after, loom_nccl_handle *h, loom_error *err) {
    loom_status st = begin(n, h, "bcast", bytes, after, err);
    if (st != LOOM_OK) return st;
    return finish(
        n, h, ncclBroadcast(buf, buf, bytes, ncclUint8, root, (ncclComm_t)n->nccl, n->stream), err);
}

loom_status loom_nccl_isend(loom_nccl_comm *n, const float *buf, size_t count, int peer,
                            cudaStream_t after, loom_nccl_handle *h, loom_error *err) {
    loom_status st = begin(n, h, "send", count * 4, after, err);
    if (st != LOOM_OK) return st;
    return finish(n, h, ncclSend(buf, count, ncclFloat32, peer, (ncclComm_t)n->nccl, n->stream),
                  err);
}

loom_status loom_nccl_irecv(loom_nccl_comm *n, float *buf, size_t count, int peer,
                            cudaStream_t after, loom_nccl_handle *h, loom_error *err) {
    loom_status st = begin(n, h, "recv", 0, after, err);
    if (st != LOOM_OK) return st;
    return finish(n, h, ncclRecv(buf, count, ncclFloat32, peer, (ncclComm_t)n->nccl, n->stream),
                  err);
}

static loom_status async_error(loom_nccl_handle *h, loom_error *err) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError((ncclComm_t)h->comm->nccl, &async);
    if (r == ncclSuccess) r = async;
    return r == ncclSuccess ? LOOM_OK : nccl_fail(h->comm, r, h->op, err);
}

static void completed(loom_nccl_handle *h, double blocked_from) {
    loom_comm *c = h->comm->host;
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

loom_status loom_nccl_wait(loom_nccl_handle *h, cudaStream_t consumer, loom_error *err) {
    if (!h->active) return LOOM_OK;
    if (consumer) {
        cudaError_t e = cudaStreamWaitEvent(consumer, h->done, 0);
        if (e != cudaSuccess) return cuda_fail(h->comm, e, h->op, err);
        completed(h, -1.0); /* device-side ordering: nothing blocked on the host */
        return async_error(h, err);
    }
    double t0 = loom_comm_now_ms();
    cudaError_t e = cudaEventSynchronize(h->done);
    if (e != cudaSuccess) return cuda_fail(h->comm, e, h->op, err);
    completed(h, t0);
    return async_error(h, err);
}

loom_status loom_nccl_test(loom_nccl_handle *h, int *done, loom_error *err) {
    *done = 1;
    if (!h->active) return LOOM_OK;
    cudaError_t e = cudaEventQuery(h->done);
    if (e == cudaErrorNotReady) {
        *done = 0;
        return async_error(h, err);
    }
    if (e != cudaSuccess) return cuda_fail(h->comm, e, h->op, err);
    completed(h, -1.0);
    return async_error(h, err);
}
