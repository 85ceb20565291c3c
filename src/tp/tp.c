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
    if (!tp->chunk_counts) return;
    /* the all-reduce's rows: rows / size each, the first rows % size one more */
    const int S = tp->size, base = rows / S, extra = rows % S;
    for (int r = 0, at = 0; r < S; r++) {
        tp->chunk_counts[r] = (base + (r < extra)) * tp->width;
        tp->chunk_displs[r] = at;
        at += tp->chunk_counts[r];
    }
    const int mine = tp->sequence_parallel ? tp->counts[tp->rank] : tp->chunk_counts[tp->rank];
    for (int r = 0; r < S; r++) {
        tp->piece_counts[r] = mine;
        tp->piece_displs[r] = r * mine;
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

static int wire_bf16_here(const loom_tp *tp) {
    return tp->size > 1 && tp->comm && tp->comm->device == LOOM_COMM_HOST;
}

size_t loom_tp_wire_bf16_bytes(const loom_tp *tp) {
    if (!wire_bf16_here(tp)) return 0;
    return (2 * (size_t)tp->max_rows + (size_t)tp->size) * (size_t)tp->width * sizeof(loom_bf16);
}

loom_status loom_tp_wire_bf16(loom_tp *tp, loom_error *err) {
    if (!wire_bf16_here(tp)) return LOOM_OK;
    const size_t S = (size_t)tp->size, W = (size_t)tp->width, R = (size_t)tp->max_rows;
    /* loom_tp_wire_bf16_bytes: these two */
    tp->send16 = malloc(R * W * sizeof *tp->send16);
    tp->recv16 = malloc((R + S) * W * sizeof *tp->recv16);
    tp->chunk_counts = calloc(S, sizeof(int));
    tp->chunk_displs = calloc(S, sizeof(int));
    tp->piece_counts = calloc(S, sizeof(int));
    tp->piece_displs = calloc(S, sizeof(int));
    if (!tp->send16 || !tp->recv16 || !tp->chunk_counts || !tp->chunk_displs || !tp->piece_counts ||
        !tp->piece_displs)
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "tensor parallelism: out of memory for the bf16 messages");
    tp->wire_bf16 = 1;
    set_rows(tp, tp->rows);
    return LOOM_OK;
}

void loom_tp_free(loom_tp *tp) {
    free(tp->send16);
    free(tp->recv16);
    free(tp->chunk_counts);
    free(tp->chunk_displs);
    free(tp->piece_counts);
    free(tp->piece_displs);
    free(tp->counts);
    free(tp->displs);
    free(tp->row_counts);
    free(tp->row_displs);
    free(tp->maxes);
    free(tp->sums);
    memset(tp, 0, sizeof *tp);
}

/* What one rank sends of n elements of `bytes` each: the (size - 1) / size of them that go to
 * the other ranks (a reduce-scatter's or an all-gather's share, with equal pieces). */
static double share(const loom_tp *tp, double n, double bytes) {
    return n * bytes * (tp->size - 1) / tp->size;
}

static loom_status reduce_f32(loom_tp *tp, float *partial, float *out) {
    if (tp->size == 1) return LOOM_OK;
    const double n = (double)tp->rows * tp->width;
    if (!tp->sequence_parallel) {
        tp->bytes_f32 += 2 * share(tp, n, 4); /* a reduce-scatter and an all-gather */
        return loom_comm_allreduce_sum(tp->comm, partial, (size_t)tp->rows * tp->width, tp->err);
    }
    tp->bytes_f32 += share(tp, n, 4);
    loom_comm_handle h;
    loom_status st = loom_comm_ireduce_scatter_sum(tp->comm, partial, out, tp->counts, &h, tp->err);
    return st ? st : loom_comm_wait(&h, tp->err);
}

static loom_status gather_f32(loom_tp *tp, const float *local, float *full, const float **inp) {
    if (!tp->sequence_parallel) {
        *inp = local;
        return LOOM_OK;
    }
    tp->bytes_f32 += (double)tp->counts[tp->rank] * 4 * (tp->size - 1);
    memcpy(full + tp->displs[tp->rank], local, (size_t)tp->counts[tp->rank] * sizeof(float));
    *inp = full;
    return loom_comm_allgatherv(tp->comm, full, tp->counts, tp->displs, tp->err);
}

loom_status loom_tp_reduce(loom_tp *tp, float *partial, float *out) {
    return reduce_f32(tp, partial, out);
}

loom_status loom_tp_gather(loom_tp *tp, const float *local, float *full, const float **inp) {
    return gather_f32(tp, local, full, inp);
}

loom_status loom_tp_reduce_linear(loom_tp *tp, float *partial, float *out) {
    if (!tp->wire_bf16) return reduce_f32(tp, partial, out);
    const int S = tp->size, me = tp->rank, sp = tp->sequence_parallel;
    const int *counts = sp ? tp->counts : tp->chunk_counts;
    const int *displs = sp ? tp->displs : tp->chunk_displs;
    const size_t n = (size_t)tp->rows * tp->width, mine = (size_t)counts[me];
    loom_bf16_from_f32_n(tp->send16, partial, n);
    tp->bytes_bf16 += (double)(n - mine) * 2;
    loom_comm_handle h;
    loom_status st = loom_comm_ialltoallv_bf16(tp->comm, tp->send16, counts, displs, tp->recv16,
                                               tp->piece_counts, tp->piece_displs, &h, tp->err);
    if (st || (st = loom_comm_wait(&h, tp->err))) return st;
    float *sum = sp ? out : partial + displs[me];
    loom_bf16_sum_pieces(sum, tp->recv16, mine, S); /* rank order */
    if (sp) return LOOM_OK;
    /* every rank needs every row: the owners' sums, rounded once more, all-gathered */
    loom_bf16_from_f32_n(tp->send16 + displs[me], sum, mine);
    tp->bytes_bf16 += (double)mine * 2 * (S - 1);
    st = loom_comm_iallgatherv_bf16(tp->comm, tp->send16, counts, displs, &h, tp->err);
    if (st || (st = loom_comm_wait(&h, tp->err))) return st;
    loom_bf16_to_f32_n(partial, tp->send16, n);
    return LOOM_OK;
}

loom_status loom_tp_gather_linear(loom_tp *tp, const float *local, float *full, const float **inp) {
    if (!tp->wire_bf16 || !tp->sequence_parallel) return gather_f32(tp, local, full, inp);
    const int me = tp->rank;
    const size_t mine = (size_t)tp->counts[me];
    loom_bf16_from_f32_n(tp->send16 + tp->displs[me], local, mine);
    tp->bytes_bf16 += (double)mine * 2 * (tp->size - 1);
    loom_comm_handle h;
    loom_status st =
        loom_comm_iallgatherv_bf16(tp->comm, tp->send16, tp->counts, tp->displs, &h, tp->err);
    if (st || (st = loom_comm_wait(&h, tp->err))) return st;
    loom_bf16_to_f32_n(full, tp->send16, (size_t)tp->rows * tp->width);
    *inp = full;
    return LOOM_OK;
}

loom_status loom_tp_crossentropy(loom_tp *tp, float *losses, float *logits, const int32_t *targets,
                                 int V, int v0, float dloss, int backward) {
    const int N = tp->rows;
    float *mine = tp->maxes + (size_t)tp->rank * N;
    loom_backend_crossentropy_shard_max(tp->be, mine, logits, N, V);
    tp->bytes_f32 += (double)N * 4 * (tp->size - 1) + 2 * share(tp, 2.0 * N, 8);
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
