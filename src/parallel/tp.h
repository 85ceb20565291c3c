/* Tensor parallelism (Megatron-LM) and sequence parallelism (Megatron-SP): the
 * collectives the sharded layers need, over the tensor-parallel group of the mesh.
 *
 * Without sequence parallelism every rank holds all N = B*T rows of the residual stream;
 * a column-parallel layer's input is used as it is, a row-parallel layer's partial output
 * [N, C] is all-reduced (forward), and the partial input gradient of a column-parallel
 * layer is all-reduced (backward): 4 all-reduces of N x C per block and step.
 * With sequence parallelism a rank holds rows [rank * N/tp, (rank+1) * N/tp) of the
 * residual stream (norms, residual adds and their activations are split by tp); the
 * all-reduces become an all-gather before each column-parallel layer and a
 * reduce-scatter after each row-parallel one, and norm-parameter gradients are
 * partial sums over the rank's rows, all-reduced once at the end of backward.
 *
 * The model calls these with its own buffers; kernels know nothing of this. */
#ifndef LOOM_PARALLEL_TP_H
#define LOOM_PARALLEL_TP_H

#include "comm/comm.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/zero.h"

typedef struct {
    loom_comm *comm; /* the tensor-parallel group */
    int rank, size;
    int sequence_parallel;
    int rows, width;              /* N tokens per micro-batch, C model width */
    int local_rows;               /* N / size with sequence parallelism, else N */
    int *counts, *displs;         /* per rank: its local_rows * width floats (gather/scatter) */
    int *row_counts, *row_displs; /* per rank: rows (the row maxima of the loss) */
    float *maxes;                 /* [size * rows] */
    double *sums;                 /* [2 * rows]: sum of exponentials, target logit */
    loom_error *err;              /* where failures inside forward/backward are reported */
} loom_tp;

/* Checks what --tp N (and --sequence-parallel) need of the model and the micro-batch of
 * `rows` = micro_batch * seq_len tokens; the message names the flag. */
loom_status loom_tp_validate(const loom_model_config *cfg, int tp, int sequence_parallel, int rows,
                             loom_error *err);
loom_status loom_tp_create(loom_tp *tp, loom_comm *comm, int sequence_parallel, int rows, int width,
                           loom_error *err);
void loom_tp_free(loom_tp *tp);

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

/* The loom_grads_ready_fn of the last micro-batch with sequence parallelism: all-reduces
 * the partial gradients of the norm parameters (sp_partial) inside [begin, end) over tp,
 * then passes the range on to `next` (data parallelism's bucketing). */
typedef struct {
    loom_tp *tp;
    const loom_param_table *table;
    float *grads;
    loom_status (*next)(void *ctx, size_t begin, size_t end);
    void *next_ctx;
} loom_tp_ready_ctx;
loom_status loom_tp_grads_ready(void *ctx, size_t begin, size_t end);

/* Global gradient norm with tensor parallelism: sharded tensors summed over the tp
 * group, replicated ones counted once; over dp as loom_zero_grad_norm does (which it is
 * when the group has one rank). */
loom_status loom_tp_grad_norm(loom_tp *tp, loom_zero *z, const float *grads, double *norm,
                              loom_error *err);

/* Gathers the TP shards of a flat buffer laid out by `local` into the unsharded flat
 * buffer laid out by `global` (a tp_size 1 registry of the same model), on rank 0 of
 * the group, where global_flat is not NULL (NULL: take part only). Collective. */
loom_status loom_tp_gather_flat(loom_tp *tp, const loom_param_table *local, const float *flat,
                                const loom_param_table *global, float *global_flat,
                                loom_error *err);

#endif
