#include "comm/comm.h"

#include "core/clock.h"
#include "core/fault.h"
#include "core/progress.h"

#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

double loom_comm_now_ms(void) {
    return loom_now_ms();
}

static loom_status mpi_fail(loom_comm *c, int rc, const char *op, loom_error *err) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return loom_error_set(err, LOOM_ERR_IO, "%s #%llu on %s (rank %d of %d): %s", op,
                          (unsigned long long)c->seq, c->name, c->rank, c->size, text);
}

static int too_big(size_t count) {
    return count > (size_t)INT_MAX;
}

loom_status loom_comm_from_mpi(loom_comm *c, MPI_Comm mpi, const char *name, loom_error *err) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    int rc = MPI_Comm_dup(mpi, &c->mpi);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Comm_dup", err);
    /* Errors come back as codes, so loom reports them instead of MPI aborting the job. */
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    /* The world rank of its rank 0: the same on every member, different for each group. */
    MPI_Group g, world;
    int zero = 0;
    c->first_world = -1;
    if (MPI_Comm_group(c->mpi, &g) == MPI_SUCCESS) {
        if (MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS) {
            MPI_Group_translate_ranks(g, 1, &zero, world, &c->first_world);
            MPI_Group_free(&world);
        }
        MPI_Group_free(&g);
    }
    return LOOM_OK;
}

void loom_comm_self(loom_comm *c, const char *name) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->mpi = MPI_COMM_NULL;
    c->size = 1;
}

void loom_comm_shape(loom_comm *c, const char *name, int rank, int size) {
    loom_comm_self(c, name);
    c->rank = rank;
    c->size = size;
    c->first_world = -1;
}

void loom_comm_free(loom_comm *c) {
    if (c->device == LOOM_COMM_CUDA) c->ops->free(c);
    c->device = LOOM_COMM_HOST, c->ops = NULL, c->impl = NULL;
    if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
    c->mpi = MPI_COMM_NULL;
}

/* A finished operation on the trace's communication lanes: "allreduce #12 dp". */
/* label: NULL, or the name the caller gave the operation (loom_comm.label). */
static void trace_op(loom_comm *c, const char *label, const char *op, uint64_t seq, double start_ms,
                     double end_ms) {
    if (!c->trace) return;
    char name[64];
    snprintf(name, sizeof name, "%s%s%s #%llu %s", label ? label : "", label ? " " : "", op,
             (unsigned long long)seq, c->name);
    loom_trace_comm(c->trace, name, start_ms * 1e3, end_ms * 1e3);
}

/* Starts the bookkeeping of one operation; returns 1 when there is nothing to send. */
static int begin(loom_comm *c, loom_comm_handle *h, size_t bytes) {
    c->seq++;
    c->bytes += bytes;
    if (h) {
        memset(h, 0, sizeof *h);
        h->comm = c;
        h->seq = c->seq;
        h->req = MPI_REQUEST_NULL;
        h->start_ms = loom_comm_now_ms();
        h->active = c->size > 1;
    }
    return c->size == 1;
}

/* h == NULL: a blocking operation (the caller waits in it at once). */
static int begin_op(loom_comm *c, loom_comm_handle *h, const char *op, size_t bytes) {
    loom_fault_at_collective(); /* an injected hang stops before entering */
    int local = begin(c, h, bytes);
    if (h) h->op = op, h->label = c->label;
    if (!local && !c->group_shown) {
        c->group_shown = 1;
        loom_progress_comm_group(c->name, c->first_world, c->size);
    }
    if (!local) loom_progress_comm_start(c->name, c->seq, c->label ? c->label : op, h == NULL);
    return local;
}

static void blocked(loom_comm *c, const char *op, double t0) {
    double t1 = loom_comm_now_ms(), dt = t1 - t0;
    c->blocked_ms += dt;
    c->inflight_ms += dt;
    trace_op(c, c->label, op, c->seq, t0, t1);
    loom_progress_comm_done(c->name);
}

loom_status loom_comm_allreduce_sum(loom_comm *c, float *buf, size_t count, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->allreduce_sum(c, buf, count, LOOM_COMM_F32, NULL, err);
    if (too_big(count)) return loom_comm_allreduce_sum_large(c, buf, count, 0, err);
    if (begin_op(c, NULL, "allreduce", count * 4) || count == 0) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->mpi);
    blocked(c, "allreduce", t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "allreduce", err);
}

loom_status loom_comm_allreduce_sum_f64(loom_comm *c, double *buf, int count, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->allreduce_sum(c, buf, (size_t)count, LOOM_COMM_F64, NULL, err);
    if (begin_op(c, NULL, "allreduce", (size_t)count * 8) || count == 0) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_DOUBLE, MPI_SUM, c->mpi);
    blocked(c, "allreduce", t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "allreduce", err);
}

loom_status loom_comm_iallreduce_sum(loom_comm *c, float *buf, size_t count, loom_comm_handle *h,
                                     loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->allreduce_sum(c, buf, count, LOOM_COMM_F32, h, err);
    if (begin_op(c, h, "allreduce", count * 4)) return LOOM_OK;
    if (too_big(count)) return loom_error_set(err, LOOM_ERR_STATE, "iallreduce: count too large");
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "iallreduce", err);
}

loom_status loom_comm_ireduce_scatter_sum(loom_comm *c, const float *send, float *recv,
                                          const int *counts, loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->reduce_scatter_sum(c, send, recv, counts, h, err);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)counts[r];
    if (begin_op(c, h, "reduce_scatter", total * 4)) {
        if (recv != send) memmove(recv, send, (size_t)counts[0] * sizeof(float));
        return LOOM_OK;
    }
    int rc = MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "ireduce_scatter", err);
}

loom_status loom_comm_iallgatherv(loom_comm *c, float *buf, const int *counts, const int *displs,
                                  loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA) return c->ops->allgatherv(c, buf, counts, displs, h, err);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)counts[r];
    if (begin_op(c, h, "allgatherv", total * 4)) return LOOM_OK;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT,
                             c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "iallgatherv", err);
}

loom_status loom_comm_allgatherv(loom_comm *c, float *buf, const int *counts, const int *displs,
                                 loom_error *err) {
    loom_comm_handle h;
    loom_status st = loom_comm_iallgatherv(c, buf, counts, displs, &h, err);
    return st ? st : loom_comm_wait(&h, err);
}

loom_status loom_comm_alltoallv(loom_comm *c, const float *send, const int *send_counts,
                                const int *send_displs, float *recv, const int *recv_counts,
                                const int *recv_displs, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                 NULL, err);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)send_counts[r];
    if (begin_op(c, NULL, "alltoallv", total * 4)) {
        memmove(recv + recv_displs[0], send + send_displs[0],
                (size_t)send_counts[0] * sizeof(float));
        return LOOM_OK;
    }
    double t0 = loom_comm_now_ms();
    int rc = MPI_Alltoallv(send, send_counts, send_displs, MPI_FLOAT, recv, recv_counts,
                           recv_displs, MPI_FLOAT, c->mpi);
    blocked(c, "alltoallv", t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "alltoallv", err);
}

loom_status loom_comm_ialltoallv(loom_comm *c, const float *send, const int *send_counts,
                                 const int *send_displs, float *recv, const int *recv_counts,
                                 const int *recv_displs, loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                 h, err);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)send_counts[r];
    if (begin_op(c, h, "alltoallv", total * 4)) {
        memmove(recv + recv_displs[0], send + send_displs[0],
                (size_t)send_counts[0] * sizeof(float));
        return LOOM_OK;
    }
    int rc = MPI_Ialltoallv(send, send_counts, send_displs, MPI_FLOAT, recv, recv_counts,
                            recv_displs, MPI_FLOAT, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "ialltoallv", err);
}

loom_status loom_comm_ialltoallv_bf16(loom_comm *c, const uint16_t *send, const int *send_counts,
                                      const int *send_displs, uint16_t *recv,
                                      const int *recv_counts, const int *recv_displs,
                                      loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return loom_error_set(err, LOOM_ERR_STATE, "bf16 all-to-all on %s: host only", c->name);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)send_counts[r];
    if (begin_op(c, h, "alltoallv_bf16", total * 2)) {
        memmove(recv + recv_displs[0], send + send_displs[0],
                (size_t)send_counts[0] * sizeof(uint16_t));
        return LOOM_OK;
    }
    int rc = MPI_Ialltoallv(send, send_counts, send_displs, MPI_UINT16_T, recv, recv_counts,
                            recv_displs, MPI_UINT16_T, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "ialltoallv_bf16", err);
}

loom_status loom_comm_iallgatherv_bf16(loom_comm *c, uint16_t *buf, const int *counts,
                                       const int *displs, loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return loom_error_set(err, LOOM_ERR_STATE, "bf16 all-gather on %s: host only", c->name);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)counts[r];
    if (begin_op(c, h, "allgatherv_bf16", total * 2)) return LOOM_OK;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_UINT16_T,
                             c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "iallgatherv_bf16", err);
}

loom_status loom_comm_bcast(loom_comm *c, void *buf, size_t bytes, int root, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA) return c->ops->bcast(c, buf, bytes, root, NULL, err);
    if (too_big(bytes)) return loom_comm_bcast_large(c, buf, bytes, root, 0, err);
    if (begin_op(c, NULL, "bcast", bytes)) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->mpi);
    blocked(c, "bcast", t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "bcast", err);
}

loom_status loom_comm_isend(loom_comm *c, const float *buf, size_t count, int peer, int tag,
                            loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->send(c, buf, count, peer, h, err); /* NCCL: no tags (matched in order) */
    if (begin_op(c, h, "send", count * 4))
        return loom_error_set(err, LOOM_ERR_STATE, "isend on a communicator of size 1");
    int rc = MPI_Isend(buf, (int)count, MPI_FLOAT, peer, tag, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "isend", err);
}

loom_status loom_comm_irecv(loom_comm *c, float *buf, size_t count, int peer, int tag,
                            loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA) return c->ops->recv(c, buf, count, peer, h, err);
    if (begin_op(c, h, "recv", count * 4))
        return loom_error_set(err, LOOM_ERR_STATE, "irecv on a communicator of size 1");
    int rc = MPI_Irecv(buf, (int)count, MPI_FLOAT, peer, tag, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "irecv", err);
}

loom_status loom_comm_isend_bf16(loom_comm *c, const uint16_t *buf, size_t count, int peer, int tag,
                                 loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return loom_error_set(err, LOOM_ERR_STATE, "bf16 send on %s: host only", c->name);
    if (begin_op(c, h, "send_bf16", count * 2))
        return loom_error_set(err, LOOM_ERR_STATE, "isend on a communicator of size 1");
    int rc = MPI_Isend(buf, (int)count, MPI_UINT16_T, peer, tag, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "isend_bf16", err);
}

loom_status loom_comm_irecv_bf16(loom_comm *c, uint16_t *buf, size_t count, int peer, int tag,
                                 loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return loom_error_set(err, LOOM_ERR_STATE, "bf16 receive on %s: host only", c->name);
    if (begin_op(c, h, "recv_bf16", count * 2))
        return loom_error_set(err, LOOM_ERR_STATE, "irecv on a communicator of size 1");
    int rc = MPI_Irecv(buf, (int)count, MPI_UINT16_T, peer, tag, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "irecv_bf16", err);
}

loom_status loom_comm_iallreduce_sum_bf16(loom_comm *c, void *buf, size_t count,
                                          loom_comm_handle *h, loom_error *err) {
    if (c->device == LOOM_COMM_CUDA)
        return c->ops->allreduce_sum(c, buf, count, LOOM_COMM_BF16, h, err);
    return loom_error_set(err, LOOM_ERR_STATE, "bf16 all-reduce on %s: device communicators only",
                          c->name);
}

/* A host barrier (also on a device communicator: over its bootstrap MPI communicator). */
loom_status loom_comm_barrier(loom_comm *c, loom_error *err) {
    if (begin_op(c, NULL, "barrier", 0)) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Barrier(c->mpi);
    blocked(c, "barrier", t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "barrier", err);
}

loom_status loom_comm_wait(loom_comm_handle *h, loom_error *err) {
    if (!h->active) return LOOM_OK;
    if (h->comm->device == LOOM_COMM_CUDA) return h->comm->ops->wait(h, err);
    double t0 = loom_comm_now_ms();
    loom_progress_comm_wait(h->comm->name, h->seq, h->label ? h->label : h->op);
    int rc = MPI_Wait(&h->req, MPI_STATUS_IGNORE);
    loom_progress_comm_done(h->comm->name);
    double t1 = loom_comm_now_ms();
    h->comm->blocked_ms += t1 - t0;
    h->comm->inflight_ms += t1 - h->start_ms;
    h->active = 0;
    trace_op(h->comm, h->label, h->op, h->seq, h->start_ms, t1);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(h->comm, rc, "wait", err);
}

loom_status loom_comm_test(loom_comm_handle *h, int *done, loom_error *err) {
    *done = 1;
    if (!h->active) return LOOM_OK;
    if (h->comm->device == LOOM_COMM_CUDA) return h->comm->ops->test(h, done, err);
    int rc = MPI_Test(&h->req, done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(h->comm, rc, "test", err);
    if (*done) {
        double t1 = loom_comm_now_ms();
        h->comm->inflight_ms += t1 - h->start_ms;
        h->active = 0;
        trace_op(h->comm, h->label, h->op, h->seq, h->start_ms, t1);
    }
    return LOOM_OK;
}

loom_status loom_comm_write_trace(loom_comm *c, const loom_trace *t, const char *path,
                                  loom_error *err) {
    char *mine = NULL;
    size_t len = 0;
    loom_status st = loom_trace_serialize(t, &mine, &len, err);
    if (st) return st;
    if (c->size == 1) {
        st = loom_trace_write_file(path, &mine, &len, 1, err);
        free(mine);
        return st;
    }
    int n = (int)len, *lens = NULL, *displs = NULL;
    char *all = NULL;
    if (c->rank == 0) {
        lens = calloc((size_t)c->size, sizeof(int));
        displs = calloc((size_t)c->size, sizeof(int));
    }
    int rc = MPI_Gather(&n, 1, MPI_INT, lens, 1, MPI_INT, 0, c->mpi);
    size_t total = 0;
    if (rc == MPI_SUCCESS && c->rank == 0) {
        for (int r = 0; r < c->size; r++) {
            displs[r] = (int)total;
            total += (size_t)lens[r];
        }
        all = malloc(total ? total : 1);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Gatherv(mine, n, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, c->mpi);
    free(mine);
    if (rc != MPI_SUCCESS) st = mpi_fail(c, rc, "trace gather", err);
    if (!st && c->rank == 0) {
        char **frags = malloc((size_t)c->size * sizeof *frags);
        size_t *flens = malloc((size_t)c->size * sizeof *flens);
        if (frags && flens && all) {
            for (int r = 0; r < c->size; r++) {
                frags[r] = all + displs[r];
                flens[r] = (size_t)lens[r];
            }
            st = loom_trace_write_file(path, frags, flens, c->size, err);
        } else {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "trace: out of memory");
        }
        free(frags);
        free(flens);
    }
    free(all);
    free(lens);
    free(displs);
    return st;
}
