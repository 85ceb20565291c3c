/* Batched autoregressive decoding with a KV cache per sequence: one step feeds one token to
 * each of M sequences (each at its own position) and gives M rows of next-token logits.
 * The linear layers run once over the M rows (one GEMM each, where decoding one sequence
 * at a time runs M matrix-vector products); attention reads each sequence's own cache.
 * Same operations, in the same order per row, as model/generate.h's single-sequence
 * decoder. Mixture-of-experts layers run the training block one token at a time. */
#ifndef LOOM_MODEL_GENERATE_BATCH_H
#define LOOM_MODEL_GENERATE_BATCH_H

#include <stdint.h>

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
} loom_batch_generator;

loom_status loom_batch_generator_create(loom_batch_generator *g, const loom_model_config *cfg,
                                        const loom_param_table *table, const float *params,
                                        int max_batch, loom_error *err);
void loom_batch_generator_free(loom_batch_generator *g);
/* Row r < M feeds tokens[r] at position pos[r] (0 <= pos < max_len; each sequence's
 * positions in order from 0) to sequence seq[r] (< max_batch, distinct); g->logits row r
 * then holds that sequence's next-token logits. */
void loom_batch_generator_step(loom_batch_generator *g, int M, const int *seq,
                               const int32_t *tokens, const int *pos);

#endif
