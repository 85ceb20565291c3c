/* The token embedding's gradient, reduced in two parts so that neither waits for the end
 * of backward (data parallelism, parallel/zero.h).
 *
 * In the last micro-batch's backward, the dense part of d(wte) is final right after the
 * head's backward: GPT-2's tied head writes all of it there, and for an untied head (Llama)
 * it holds only earlier micro-batches' sums. Only the embedding backward, the very last
 * thing backward does, still adds to it: the rows of this micro-batch's tokens. So the
 * model leaves the embedding backward to this module (loom_model.defer_embedding_grad),
 * ZeRO posts the dense wte range at the start of backward, where it is hidden behind all
 * of it, and at the end the rows travel as data: every rank's tokens and d(embedding
 * output) rows are all-gathered (N x (C+1) floats a rank, N = tokens per micro-batch,
 * ~0.8 MB on GPT-2 124M at 2 x 128 tokens, against 154 MB for the dense range) and every
 * rank adds them, rank by rank in token order, into its reduced gradient. The order of
 * additions is fixed, so runs are bitwise reproducible; it differs from one process's
 * (sum of all ranks' dense parts, then the rows) only by float rounding. The position
 * embedding (GPT-2's wpe, T x C) is summed locally here and reduced as a normal range.
 * Token ids travel as floats: exact below 2^24 (the plan checks the vocabulary). */
#ifndef LOOM_PARALLEL_EMBED_GRAD_H
#define LOOM_PARALLEL_EMBED_GRAD_H

#include <stdint.h>

#include "comm/engine.h"
#include "model/params.h"

typedef struct {
    int enabled;
    size_t wte_end; /* the wte rows are [0, wte_end) of the flat buffer */
    size_t wpe;     /* LOOM_NO_PARAM without learned positions */
    int C, T, N, R; /* row width, sequence length, tokens per micro-batch, ranks */
    float *rows;    /* [R][N * (C + 1)]: each rank's token ids, then its N rows */
    int *counts, *displs;
    loom_comm_op op; /* the all-gather of rows */
} loom_embed_grad;

/* The dense wte range's end [0, wte_end) loom_embed_grad_plan would set for this table
 * over `ranks` (0: no split), without allocating (sizing). */
size_t loom_embed_grad_wte_end(const loom_param_table *t, int ranks);
/* The bytes loom_embed_grad_plan allocates for this table over `ranks` with micro-batches of
 * n_tokens (0: no split): every rank's token ids and d(embedding) rows, gathered in one
 * buffer, and the all-gather's counts and displacements. */
size_t loom_embed_grad_buffer_bytes(const loom_param_table *t, int ranks, int n_tokens);
/* Enables the split when it applies (ranks > 1, wte first in the flat buffer and not
 * split by tensor parallelism, vocabulary < 2^24); otherwise leaves eg disabled. */
loom_status loom_embed_grad_plan(loom_embed_grad *eg, const loom_param_table *t, int ranks,
                                 int n_tokens, int seq_len, loom_error *err);
void loom_embed_grad_free(loom_embed_grad *eg);
/* End of backward: adds d(wpe) into grads and posts the all-gather of this rank's rows. */
loom_status loom_embed_grad_post(loom_embed_grad *eg, loom_comm_engine *e, int rank, float *grads,
                                 const float *d_embed, const int32_t *tokens, loom_error *err);
/* After the dense wte range is reduced: waits for the rows and adds them into dst, which
 * holds flat range [lo, hi) of the reduced gradient. */
loom_status loom_embed_grad_apply(loom_embed_grad *eg, loom_comm_engine *e, float *dst, size_t lo,
                                  size_t hi, loom_error *err);

#endif
