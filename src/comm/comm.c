#include "comm/comm.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

double loom_comm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
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
    return LOOM_OK;
}

void loom_comm_self(loom_comm *c, const char *name) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->mpi = MPI_COMM_NULL;
    c->size = 1;
}

void loom_comm_free(loom_comm *c) {
    if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
    c->mpi = MPI_COMM_NULL;
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

static void blocked(loom_comm *c, double t0) {
    double dt = loom_comm_now_ms() - t0;
    c->blocked_ms += dt;
    c->inflight_ms += dt;
}

loom_status loom_comm_allreduce_sum(loom_comm *c, float *buf, size_t count, loom_error *err) {
    if (begin(c, NULL, count * 4) || count == 0) return LOOM_OK;
    if (too_big(count)) return loom_error_set(err, LOOM_ERR_STATE, "allreduce: count too large");
    double t0 = loom_comm_now_ms();
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->mpi);
    blocked(c, t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "allreduce", err);
}

loom_status loom_comm_allreduce_sum_f64(loom_comm *c, double *buf, int count, loom_error *err) {
    if (begin(c, NULL, (size_t)count * 8) || count == 0) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_DOUBLE, MPI_SUM, c->mpi);
    blocked(c, t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "allreduce", err);
}

loom_status loom_comm_iallreduce_sum(loom_comm *c, float *buf, size_t count, loom_comm_handle *h,
                                     loom_error *err) {
    if (begin(c, h, count * 4)) return LOOM_OK;
    if (too_big(count)) return loom_error_set(err, LOOM_ERR_STATE, "iallreduce: count too large");
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "iallreduce", err);
}

loom_status loom_comm_ireduce_scatter_sum(loom_comm *c, const float *send, float *recv,
                                          const int *counts, loom_comm_handle *h, loom_error *err) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)counts[r];
    if (begin(c, h, total * 4)) {
        if (recv != send) memmove(recv, send, (size_t)counts[0] * sizeof(float));
        return LOOM_OK;
    }
    int rc = MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "ireduce_scatter", err);
}

loom_status loom_comm_iallgatherv(loom_comm *c, float *buf, const int *counts, const int *displs,
                                  loom_comm_handle *h, loom_error *err) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)counts[r];
    if (begin(c, h, total * 4)) return LOOM_OK;
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
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)send_counts[r];
    if (begin(c, NULL, total * 4)) {
        memmove(recv + recv_displs[0], send + send_displs[0],
                (size_t)send_counts[0] * sizeof(float));
        return LOOM_OK;
    }
    double t0 = loom_comm_now_ms();
    int rc = MPI_Alltoallv(send, send_counts, send_displs, MPI_FLOAT, recv, recv_counts,
                           recv_displs, MPI_FLOAT, c->mpi);
    blocked(c, t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "alltoallv", err);
}

loom_status loom_comm_bcast(loom_comm *c, void *buf, size_t bytes, int root, loom_error *err) {
    if (begin(c, NULL, bytes)) return LOOM_OK;
    if (too_big(bytes)) return loom_error_set(err, LOOM_ERR_STATE, "bcast: too large");
    double t0 = loom_comm_now_ms();
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->mpi);
    blocked(c, t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "bcast", err);
}

loom_status loom_comm_isend(loom_comm *c, const float *buf, size_t count, int peer, int tag,
                            loom_comm_handle *h, loom_error *err) {
    if (begin(c, h, count * 4))
        return loom_error_set(err, LOOM_ERR_STATE, "isend on a communicator of size 1");
    int rc = MPI_Isend(buf, (int)count, MPI_FLOAT, peer, tag, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "isend", err);
}

loom_status loom_comm_irecv(loom_comm *c, float *buf, size_t count, int peer, int tag,
                            loom_comm_handle *h, loom_error *err) {
    if (begin(c, h, count * 4))
        return loom_error_set(err, LOOM_ERR_STATE, "irecv on a communicator of size 1");
    int rc = MPI_Irecv(buf, (int)count, MPI_FLOAT, peer, tag, c->mpi, &h->req);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "irecv", err);
}

loom_status loom_comm_barrier(loom_comm *c, loom_error *err) {
    if (begin(c, NULL, 0)) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Barrier(c->mpi);
    blocked(c, t0);
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(c, rc, "barrier", err);
}

loom_status loom_comm_wait(loom_comm_handle *h, loom_error *err) {
    if (!h->active) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    int rc = MPI_Wait(&h->req, MPI_STATUS_IGNORE);
    double t1 = loom_comm_now_ms();
    h->comm->blocked_ms += t1 - t0;
    h->comm->inflight_ms += t1 - h->start_ms;
    h->active = 0;
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_fail(h->comm, rc, "wait", err);
}

loom_status loom_comm_test(loom_comm_handle *h, int *done, loom_error *err) {
    *done = 1;
    if (!h->active) return LOOM_OK;
    int rc = MPI_Test(&h->req, done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(h->comm, rc, "test", err);
    if (*done) {
        h->comm->inflight_ms += loom_comm_now_ms() - h->start_ms;
        h->active = 0;
    }
    return LOOM_OK;
}
