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
#include "kernels/bf16.h"
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
    /* --precision bf16 (loom_tp_wire_bf16): the linears' collectives move bf16 */
    int wire_bf16;
    loom_bf16 *send16, *recv16;       /* [max_rows * width], [(max_rows + size) * width] */
    int *chunk_counts, *chunk_displs; /* per rank: its rows of an all-reduce's sum (elements) */
    int *piece_counts, *piece_displs; /* per rank: what this rank receives of each rank */
    /* Bytes this rank sent to the others through the calls below since creation, counted
     * per collective as its schedule sends them (an all-reduce as a reduce-scatter and an
     * all-gather; a reduce-scatter or all-gather of equal pieces: (size-1)/size of it). */
    double bytes_bf16; /* the linears' messages under --precision bf16 */
    double bytes_f32;  /* everything else (fp32; the loss's sums are f64) */
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

/* --precision bf16: the linears' collectives below move bf16 from now on (a host group of
 * two or more ranks; nothing to do otherwise). LOOM_ERR_NOMEM. */
loom_status loom_tp_wire_bf16(loom_tp *tp, loom_error *err);
/* The bytes of the bf16 send and receive buffers loom_tp_wire_bf16 allocates for tp (or
 * would: the same for a sized run that never calls it), (2 x max_rows + size) x width bf16
 * values; 0 where it allocates none (one rank, a device group). */
size_t loom_tp_wire_bf16_bytes(const loom_tp *tp);

/* The linear layers' collectives (model/tp_linear.c). In fp32 loom_tp_reduce and
 * loom_tp_gather. With wire_bf16 (docs/precision.md):
 *  - reduce: each rank rounds its partial sums to bf16 (nearest even) and sends every other
 *    rank its rows (one all-to-all of bf16: MPI adds nothing); each rank adds the pieces of
 *    its rows in fp32 in rank order (loom_bf16_sum_pieces), so the sum is the same whatever
 *    algorithm MPI uses and whenever the pieces arrive. With sequence parallelism that is the
 *    reduce-scatter; without, the summed rows are rounded to bf16 once more and all-gathered
 *    in bf16 (every rank widens the same bits), half the bytes of the fp32 all-reduce;
 *  - gather: every rank's rows rounded to bf16 and all-gathered in bf16, widened into full
 *    (the own rows too, so every rank reads the same values): for inputs whose only readers
 *    are bf16 GEMMs, which round them anyway, so no bit of the run changes. */
loom_status loom_tp_reduce_linear(loom_tp *tp, float *partial, float *out);
loom_status loom_tp_gather_linear(loom_tp *tp, const float *local, float *full, const float **inp);

/* Vocabulary-parallel softmax-cross-entropy over logits [rows, V] (columns
 * [v0, v0 + V) of the full logits), without gathering the logits: the row maxima are
 * all-gathered, the sums of exponentials and the target logits all-reduced. Fills
 * losses[rows] (the same on every rank); with backward, logits become dlogits with
 * weight dloss per token. */
loom_status loom_tp_crossentropy(loom_tp *tp, float *losses, float *logits, const int32_t *targets,
                                 int V, int v0, float dloss, int backward);

#endif
