/* Tensor parallelism (Megatron-LM) and sequence parallelism (Megatron-SP): the
 * collectives the sharded layers of the model call, over the tensor-parallel group.
 *
 * Without sequence parallelism every rank holds all N = B*T rows of the residual stream;
 * a column-parallel layer's input is used as it is, a row-parallel layer's partial output
 * [N, C] is all-reduced (forward), and the partial input gradient of a column-parallel
 * layer is all-reduced (backward): 4 all-reduces of N x C per block and step.
 * With sequence parallelism a rank holds rows [rank * N/tp, (rank+1) * N/tp) of the
 * residual stream (norms, residual adds and their activations are split by tp); the
 * all-reduces become an all-gather before each column-parallel layer and a
 * reduce-scatter after each row-parallel one, and norm-parameter gradients are
 * partial sums over the rank's rows, all-reduced once at the end of backward
 * (parallel/grad_sync.h).
 *
 * This layer sits below model/ (src/LAYERS): it knows the group and the buffers' shapes,
 * nothing of the registry; the registry's side of tensor parallelism (validation,
 * gathering shards into whole tensors) is parallel/tp_shards.h. */
#ifndef LOOM_TP_TP_H
#define LOOM_TP_TP_H

#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"
#include "core/error.h"

typedef struct {
    loom_comm *comm;        /* the tensor-parallel group */
    const loom_backend *be; /* where the loss pieces run (the model's; loom_tp_create: CPU) */
    int rank, size;
    int sequence_parallel;
    int rows, width;              /* N tokens per micro-batch, C model width */
    int max_rows;                 /* rows at creation: what the buffers hold */
    int local_rows;               /* N / size with sequence parallelism, else N */
    int *counts, *displs;         /* per rank: its local_rows * width floats (gather/scatter) */
    int *row_counts, *row_displs; /* per rank: rows (the row maxima of the loss) */
    float *maxes;                 /* [size * rows] */
    double *sums;                 /* [2 * rows]: sum of exponentials, target logit */
    loom_error *err;              /* where failures inside forward/backward are reported */
} loom_tp;

loom_status loom_tp_create(loom_tp *tp, loom_comm *comm, int sequence_parallel, int rows, int width,
                           loom_error *err);
void loom_tp_free(loom_tp *tp);
/* The following calls move `rows` rows (1 <= rows <= max_rows; with sequence parallelism a
 * multiple of the group's size): a model running part of its planned positions
 * (loom_model_set_tokens). LOOM_ERR_STATE otherwise, nothing changed. */
loom_status loom_tp_set_rows(loom_tp *tp, int rows, loom_error *err);

/* Row-parallel output: sums partial [rows, width] over the group. Without sequence
 * parallelism in place (out must be partial); with it, reduce-scatter: out receives this
 * rank's local_rows. */
loom_status loom_tp_reduce(loom_tp *tp, float *partial, float *out);
/* Column-parallel input: with sequence parallelism all-gathers every rank's local rows
 * into full [rows, width] and sets *inp = full; else *inp = local. */
loom_status loom_tp_gather(loom_tp *tp, const float *local, float *full, const float **inp);

/* Vocabulary-parallel softmax-cross-entropy over logits [rows, V] (columns
 * [v0, v0 + V) of the full logits), without gathering the logits: the row maxima are
 * all-gathered, the sums of exponentials and the target logits all-reduced. Fills
 * losses[rows] (the same on every rank); with backward, logits become dlogits with
 * weight dloss per token. */
loom_status loom_tp_crossentropy(loom_tp *tp, float *losses, float *logits, const int32_t *targets,
                                 int V, int v0, float dloss, int backward);

#endif
