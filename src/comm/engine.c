#include "comm/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/world.h"
#include "core/progress.h"

/* Polling backoff of the engine thread while operations are in flight: short right
 * after something happened (the next round of a collective is usually ready soon),
 * growing while nothing does, so a wait on a slower rank costs almost no CPU. */
#define POLL_MIN_US 20
#define POLL_MAX_US 400

/* Operations start in posting order while the bytes in flight stay within
 * LOOM_COMM_ENGINE_INFLIGHT_BYTES; one larger than that runs alone. Why: OpenMPI's libnbc
 * mallocs a temporary of the whole buffer for each MPI_Iallreduce until it completes
 * (nbc_iallreduce.c), so with every posted bucket started at once a rank that ran ahead
 * held several (docs/memory.md: up to 8, 118 MiB, llama 512x8 at dp 2) where the memory
 * report counts one. Why bytes and not a count: a count of 1 or 2 in flight was tried;
 * with hosts_faults' 10 KB buckets (latency-bound: each waits several polls for its
 * rounds) one in flight made the 4-rank run across two test hosts 3x slower (1.7 -> 5.0
 * s), and with either count its capped link no longer showed in the supervisor's round
 * trips (the slow-link rule sees the link's queue, and two 10 KB buckets never fill its
 * tbf bucket of 128 KB). Small operations still go many at once; a large one alone still
 * fills a slow link's queue. The decision depends only on the sizes posted, the same on
 * every rank, and never reorders: the collectives match whatever the timing. */

/* The bytes an operation hands MPI: its (send) buffer. */
static size_t op_bytes(const loom_comm_engine *e, const loom_comm_op *op) {
    size_t n = 0;
    switch (op->kind) {
    case LOOM_OP_ALLREDUCE:
        return op->count * sizeof(float);
    case LOOM_OP_REDUCE_SCATTER:
    case LOOM_OP_ALLGATHERV:
    case LOOM_OP_ALLGATHERV_BF16:
        for (int r = 0; r < e->comm.size; r++) n += (size_t)op->counts[r];
        break;
    case LOOM_OP_ALLTOALLV:
    case LOOM_OP_ALLTOALLV_BF16: {
        size_t in = 0;
        for (int r = 0; r < e->comm.size; r++) {
            n += (size_t)op->counts[r];
            in += (size_t)op->rcounts[r];
        }
        if (in > n) n = in;
        break;
    }
    }
    const int half = op->kind == LOOM_OP_ALLGATHERV_BF16 || op->kind == LOOM_OP_ALLTOALLV_BF16;
    return n * (half ? sizeof(uint16_t) : sizeof(float));
}

static loom_status start_op(loom_comm_engine *e, loom_comm_op *op, loom_error *err) {
    op->start_ms = loom_comm_now_ms();
    switch (op->kind) {
    case LOOM_OP_ALLREDUCE:
        return loom_comm_iallreduce_sum(&e->comm, op->buf, op->count, &op->h, err);
    case LOOM_OP_REDUCE_SCATTER:
        return loom_comm_ireduce_scatter_sum(&e->comm, op->send, op->recv, op->counts, &op->h, err);
    case LOOM_OP_ALLGATHERV:
        return loom_comm_iallgatherv(&e->comm, op->buf, op->counts, op->displs, &op->h, err);
    case LOOM_OP_ALLTOALLV:
        return loom_comm_ialltoallv(&e->comm, op->send, op->counts, op->displs, op->recv,
                                    op->rcounts, op->rdispls, &op->h, err);
    case LOOM_OP_ALLTOALLV_BF16:
        return loom_comm_ialltoallv_bf16(&e->comm, op->send16, op->counts, op->displs, op->recv16,
                                         op->rcounts, op->rdispls, &op->h, err);
    case LOOM_OP_ALLGATHERV_BF16:
        return loom_comm_iallgatherv_bf16(&e->comm, op->buf16, op->counts, op->displs, &op->h, err);
    }
    return loom_error_set(err, LOOM_ERR_STATE, "engine: unknown operation %d", (int)op->kind);
}

static void finish_op(loom_comm_op *op, loom_status rc) {
    op->end_ms = loom_comm_now_ms();
    op->rc = rc;
    atomic_store_explicit(&op->state, LOOM_OP_DONE, memory_order_release);
}

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* For hang diagnosis (core/progress.h): the engine is waiting for its oldest operation in
 * flight; `shown` is the sequence number recorded so far (0: none). */
static uint64_t show_oldest(loom_comm_engine *e, uint64_t shown) {
    const loom_comm_op *oldest = NULL;
    for (int i = 0; i < e->n_running; i++)
        if (!oldest || e->running[i]->h.seq < oldest->h.seq) oldest = e->running[i];
    if (!oldest) {
        if (shown) loom_progress_comm_done(e->comm.name);
        return 0;
    }
    if (oldest->h.seq != shown)
        loom_progress_comm_inflight(e->comm.name, oldest->h.seq, oldest->h.op);
    return oldest->h.seq;
}

static void *engine_main(void *arg) {
    loom_comm_engine *e = arg;
    long poll_us = POLL_MIN_US;
    uint64_t shown = 0;
    pthread_mutex_lock(&e->worker.mu);
    for (;;) {
        int progressed = 0;
        /* Start what was posted, in posting order (the same order on every rank), while
         * the bytes in flight stay within that (or nothing is in flight). */
        while (e->q_head != e->q_tail) {
            loom_comm_op *op = e->queue[e->q_head];
            const size_t bytes = op_bytes(e, op);
            if (e->n_running > 0 && e->inflight_bytes + bytes > LOOM_COMM_ENGINE_INFLIGHT_BYTES)
                break;
            e->q_head = (e->q_head + 1) % e->q_cap;
            /* The compute thread sets the parent's trace before posting (under mu). */
            e->comm.trace = e->parent->trace;
            pthread_mutex_unlock(&e->worker.mu);
            atomic_store_explicit(&op->state, LOOM_OP_RUNNING, memory_order_relaxed);
            loom_status st = start_op(e, op, &e->err);
            if (st || !op->h.active) {
                finish_op(op, st);
            } else {
                e->running_bytes[e->n_running] = bytes;
                e->running[e->n_running++] = op;
                e->inflight_bytes += bytes;
                if (e->inflight_bytes > e->inflight_peak) e->inflight_peak = e->inflight_bytes;
            }
            progressed = 1;
            shown = 0; /* starting an operation clears what was shown */
            pthread_mutex_lock(&e->worker.mu);
        }
        if (e->n_running == 0) {
            if (progressed) pthread_cond_broadcast(&e->done);
            if (e->worker.stop) break;
            pthread_cond_wait(&e->worker.cv, &e->worker.mu);
            poll_us = POLL_MIN_US;
            continue;
        }
        pthread_mutex_unlock(&e->worker.mu);
        for (int i = 0; i < e->n_running;) {
            loom_comm_op *op = e->running[i];
            int done = 0;
            loom_status st = loom_comm_test(&op->h, &done, &e->err);
            if (st || done) {
                finish_op(op, st);
                e->inflight_bytes -= e->running_bytes[i];
                e->running_bytes[i] = e->running_bytes[--e->n_running];
                e->running[i] = e->running[e->n_running];
                progressed = 1;
            } else {
                i++;
            }
        }
        shown = show_oldest(e, shown);
        if (progressed) {
            pthread_mutex_lock(&e->worker.mu);
            pthread_cond_broadcast(&e->done);
            poll_us = POLL_MIN_US;
            continue;
        }
        sleep_us(poll_us);
        if (poll_us < POLL_MAX_US) poll_us *= 2;
        pthread_mutex_lock(&e->worker.mu);
    }
    pthread_mutex_unlock(&e->worker.mu);
    return NULL;
}

loom_status loom_comm_engine_start(loom_comm_engine *e, loom_comm *parent, int queue_cap,
                                   loom_error *err) {
    memset(e, 0, sizeof *e);
    e->parent = parent;
    if (parent->size == 1 || parent->mpi == MPI_COMM_NULL) {
        loom_comm_self(&e->comm, parent->name);
        return LOOM_OK;
    }
    char name[sizeof e->comm.name];
    snprintf(name, sizeof name, "%.12s.bg", parent->name);
    loom_status st = loom_comm_from_mpi(&e->comm, parent->mpi, name, err);
    if (st) return st;
    if (loom_world_thread_level() < MPI_THREAD_MULTIPLE) return LOOM_OK; /* caller-driven */
    e->q_cap = queue_cap + 1;
    e->queue = calloc((size_t)e->q_cap, sizeof *e->queue);
    e->running = calloc((size_t)e->q_cap, sizeof *e->running);
    e->running_bytes = calloc((size_t)e->q_cap, sizeof *e->running_bytes);
    if (!e->queue || !e->running || !e->running_bytes) {
        loom_comm_engine_stop(e);
        return loom_error_set(err, LOOM_ERR_NOMEM, "communication engine: out of memory");
    }
    pthread_cond_init(&e->done, NULL);
    if (loom_worker_start(&e->worker, engine_main, e) != 0) {
        pthread_cond_destroy(&e->done);
        loom_comm_engine_stop(e);
        return loom_error_set(err, LOOM_ERR_STATE, "communication engine: cannot start thread");
    }
    e->threaded = 1;
    return LOOM_OK;
}

void loom_comm_engine_stop(loom_comm_engine *e) {
    if (!e->parent) return; /* never started */
    if (e->threaded) {
        loom_worker_stop(&e->worker);
        pthread_cond_destroy(&e->done);
    }
    free(e->queue);
    free(e->running);
    free(e->running_bytes);
    loom_comm_free(&e->comm);
    memset(e, 0, sizeof *e);
}

loom_status loom_comm_engine_post(loom_comm_engine *e, loom_comm_op *op, loom_error *err) {
    op->rc = LOOM_OK;
    op->start_ms = op->end_ms = 0.0;
    if (!e->threaded) {
        /* Caller-driven: start now (e->comm follows the parent's trace). */
        e->comm.trace = e->parent->trace;
        atomic_store_explicit(&op->state, LOOM_OP_RUNNING, memory_order_relaxed);
        loom_status st = start_op(e, op, err);
        if (st || !op->h.active) finish_op(op, st);
        return st;
    }
    memset(&op->h, 0, sizeof op->h);
    atomic_store_explicit(&op->state, LOOM_OP_QUEUED, memory_order_relaxed);
    pthread_mutex_lock(&e->worker.mu);
    int next = (e->q_tail + 1) % e->q_cap;
    if (next == e->q_head) {
        pthread_mutex_unlock(&e->worker.mu);
        return loom_error_set(err, LOOM_ERR_STATE, "communication engine: queue full (%d)",
                              e->q_cap - 1);
    }
    e->queue[e->q_tail] = op;
    e->q_tail = next;
    pthread_cond_signal(&e->worker.cv);
    pthread_mutex_unlock(&e->worker.mu);
    return LOOM_OK;
}

double loom_comm_engine_cpu_ms(const loom_comm_engine *e) {
    clockid_t id;
    struct timespec ts;
    if (!e->threaded || pthread_getcpuclockid(e->worker.thread, &id) != 0 ||
        clock_gettime(id, &ts) != 0)
        return 0.0;
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static loom_status op_result(loom_comm_engine *e, loom_comm_op *op, loom_error *err) {
    if (op->rc == LOOM_OK) return LOOM_OK;
    /* The engine thread's description of its first failure (written before DONE). */
    if (!e->threaded) return op->rc; /* err was filled by the failing call */
    return loom_error_set(err, op->rc, "%s", e->err.msg);
}

loom_status loom_comm_engine_wait(loom_comm_engine *e, loom_comm_op *op, loom_error *err) {
    int state = atomic_load_explicit(&op->state, memory_order_acquire);
    if (state == LOOM_OP_IDLE) return LOOM_OK;
    double t0 = loom_comm_now_ms();
    if (!e->threaded) {
        if (state != LOOM_OP_DONE) {
            loom_status st = loom_comm_wait(&op->h, err); /* counts blocked itself */
            finish_op(op, st);
        }
    } else if (state != LOOM_OP_DONE) {
        pthread_mutex_lock(&e->worker.mu);
        while (atomic_load_explicit(&op->state, memory_order_acquire) != LOOM_OP_DONE)
            pthread_cond_wait(&e->done, &e->worker.mu);
        pthread_mutex_unlock(&e->worker.mu);
        const double waited_ms = loom_comm_now_ms() - t0;
        e->comm.blocked_ms += waited_ms;
        loom_progress_blocked_us((int64_t)(waited_ms * 1e3)); /* not compute (stragglers) */
    }
    atomic_store_explicit(&op->state, LOOM_OP_IDLE, memory_order_relaxed);
    return op_result(e, op, err);
}

loom_status loom_comm_engine_test(loom_comm_engine *e, loom_comm_op *op, int *done,
                                  loom_error *err) {
    int state = atomic_load_explicit(&op->state, memory_order_acquire);
    *done = state == LOOM_OP_DONE || state == LOOM_OP_IDLE;
    if (*done || e->threaded) return LOOM_OK;
    loom_status st = loom_comm_test(&op->h, done, err);
    if (st || *done) finish_op(op, st);
    return st;
}
