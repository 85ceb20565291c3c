#include "tp/tp.h"

#include <stdlib.h>
#include <string.h>

/* rows of the following calls: the gather/scatter counts and the loss's row counts */
static void set_rows(loom_tp *tp, int rows) {
    tp->rows = rows;
    tp->local_rows = tp->sequence_parallel ? rows / tp->size : rows;
    for (int r = 0; r < tp->size; r++) {
        tp->counts[r] = tp->local_rows * tp->width;
        tp->displs[r] = r * tp->local_rows * tp->width;
        tp->row_counts[r] = rows;
        tp->row_displs[r] = r * rows;
    }
}

loom_status loom_tp_create(loom_tp *tp, loom_comm *comm, int sequence_parallel, int rows, int width,
                           loom_error *err) {
    memset(tp, 0, sizeof *tp);
    tp->comm = comm;
    tp->be = loom_backend_cpu();
    tp->rank = comm->rank;
    tp->size = comm->size;
    tp->sequence_parallel = sequence_parallel && comm->size > 1;
    tp->rows = tp->max_rows = rows;
    tp->width = width;
    const size_t S = (size_t)comm->size;
    tp->counts = calloc(S, sizeof(int));
    tp->displs = calloc(S, sizeof(int));
    tp->row_counts = calloc(S, sizeof(int));
    tp->row_displs = calloc(S, sizeof(int));
    tp->maxes = malloc(S * (size_t)rows * sizeof(float));
    tp->sums = malloc(2 * (size_t)rows * sizeof(double));
    if (!tp->counts || !tp->displs || !tp->row_counts || !tp->row_displs || !tp->maxes ||
        !tp->sums) {
        loom_tp_free(tp);
        return loom_error_set(err, LOOM_ERR_NOMEM, "tensor parallelism: out of memory");
    }
    set_rows(tp, rows);
    return LOOM_OK;
}

loom_status loom_tp_set_rows(loom_tp *tp, int rows, loom_error *err) {
    if (rows < 1 || rows > tp->max_rows || (tp->sequence_parallel && rows % tp->size))
        return loom_error_set(err, LOOM_ERR_STATE,
                              "tensor parallelism: cannot move %d rows (at most %d%s)", rows,
                              tp->max_rows, tp->sequence_parallel ? ", a multiple of tp" : "");
    set_rows(tp, rows);
    return LOOM_OK;
}

void loom_tp_free(loom_tp *tp) {
    free(tp->counts);
    free(tp->displs);
    free(tp->row_counts);
    free(tp->row_displs);
    free(tp->maxes);
    free(tp->sums);
    memset(tp, 0, sizeof *tp);
}

loom_status loom_tp_reduce(loom_tp *tp, float *partial, float *out) {
    if (tp->size == 1) return LOOM_OK;
    if (!tp->sequence_parallel)
        return loom_comm_allreduce_sum(tp->comm, partial, (size_t)tp->rows * tp->width, tp->err);
    loom_comm_handle h;
    loom_status st = loom_comm_ireduce_scatter_sum(tp->comm, partial, out, tp->counts, &h, tp->err);
    return st ? st : loom_comm_wait(&h, tp->err);
}

loom_status loom_tp_gather(loom_tp *tp, const float *local, float *full, const float **inp) {
    if (!tp->sequence_parallel) {
        *inp = local;
        return LOOM_OK;
    }
    memcpy(full + tp->displs[tp->rank], local, (size_t)tp->counts[tp->rank] * sizeof(float));
    *inp = full;
    return loom_comm_allgatherv(tp->comm, full, tp->counts, tp->displs, tp->err);
}

loom_status loom_tp_crossentropy(loom_tp *tp, float *losses, float *logits, const int32_t *targets,
                                 int V, int v0, float dloss, int backward) {
    const int N = tp->rows;
    float *mine = tp->maxes + (size_t)tp->rank * N;
    loom_backend_crossentropy_shard_max(tp->be, mine, logits, N, V);
    loom_status st =
        loom_comm_allgatherv(tp->comm, tp->maxes, tp->row_counts, tp->row_displs, tp->err);
    if (st) return st;
    /* The global maximum of each row, into rank 0's slot (the same on every rank). */
    for (int r = 1; r < tp->size; r++)
        for (int n = 0; n < N; n++) {
            float x = tp->maxes[(size_t)r * N + n];
            if (x > tp->maxes[n]) tp->maxes[n] = x;
        }
    double *sums = tp->sums, *target_logit = tp->sums + N;
    if (backward)
        loom_backend_crossentropy_shard_exp(tp->be, sums, target_logit, logits, targets, tp->maxes,
                                            N, V, v0);
    else
        loom_backend_crossentropy_shard_sums(tp->be, sums, target_logit, logits, targets, tp->maxes,
                                             N, V, v0);
    if ((st = loom_comm_allreduce_sum_f64(tp->comm, tp->sums, 2 * N, tp->err))) return st;
    loom_backend_crossentropy_shard_losses(tp->be, losses, tp->maxes, sums, target_logit, N);
    if (backward)
        loom_backend_crossentropy_shard_backward(tp->be, logits, targets, sums, N, V, v0, dloss);
    return LOOM_OK;
}
