/* Batched autoregressive decoding with a KV cache per sequence: one step feeds one token to
 * each of M sequences (each at its own position) and gives M rows of next-token logits.
 * The linear layers run once over the M rows (one GEMM each, where decoding one sequence
 * at a time runs M matrix-vector products); attention reads each sequence's own cache.
 * Same operations, in the same order per row, as model/generate.h's single-sequence
 * decoder. Mixture-of-experts layers run the training block one token at a time.
 * Tensor-parallel (loom_batch_generator_shard): the table is a tp rank's shard (Megatron
 * placement, model/params.h): each rank runs its heads and its slice of the MLP, the
 * row-parallel outputs and the vocabulary-parallel embedding are all-reduced over the
 * group and the vocabulary-parallel logits all-gathered, so every rank of the group ends
 * a step with the same whole logits. */
#ifndef LOOM_MODEL_GENERATE_BATCH_H
#define LOOM_MODEL_GENERATE_BATCH_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/moe.h"
#include "model/params.h"

typedef struct {
    loom_model_config cfg;
    const loom_param_table *table;
    const float *params;
    int max_batch, max_len;   /* sequences the caches hold; positions each (cfg.seq_len) */
    float *k_cache, *v_cache; /* [max_batch][n_layer][max_len][n_kv_head * head_dim] */
    float *x, *norm, *qkv, *att, *res, *fc, *act, *mean, *rstd, *scores; /* per row */
    float *logits;                                                       /* [M, vocab] */
    loom_moe *moe;
    const loom_backend *be; /* the CPU backend (host loops read the caches) */
    loom_comm *tp;          /* NULL: the table is whole; else its tensor-parallel group */
    float *parts;           /* tp: [tp size][max_batch, vocab / tp] logits to gather */
} loom_batch_generator;

loom_status loom_batch_generator_create(loom_batch_generator *g, const loom_model_config *cfg,
                                        const loom_param_table *table, const float *params,
                                        int max_batch, loom_error *err);
void loom_batch_generator_free(loom_batch_generator *g);
/* The generator's table is tp rank tp->rank's shard of a tensor-parallel group of
 * tp->size ranks (every rank of the group steps the same rows). Dense models only. */
loom_status loom_batch_generator_shard(loom_batch_generator *g, loom_comm *tp, loom_error *err);
/* Row r < M feeds tokens[r] at position pos[r] (0 <= pos < max_len; each sequence's
 * positions in order from 0) to sequence seq[r] (< max_batch, distinct); g->logits row r
 * then holds that sequence's next-token logits. Fails only in the tp group's
 * communication (never without one). */
loom_status loom_batch_generator_step(loom_batch_generator *g, int M, const int *seq,
                                      const int32_t *tokens, const int *pos, loom_error *err);

#endif
