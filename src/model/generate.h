/* Autoregressive decoding with a KV cache: one token at a time, each step attends to the
 * cached keys and values of every earlier position (no recomputation), for both
 * families. Mixture-of-experts layers run the training block (model/moe.h) on the one
 * token, all experts local: the same router, top-k and experts; a capacity of
 * ceil(cf * K / E) >= 1 per expert never drops one token's assignments, so decoding is
 * dropless. Sampling: temperature, top-k, top-p (nucleus). */
#ifndef LOOM_MODEL_GENERATE_H
#define LOOM_MODEL_GENERATE_H

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
    int max_len;              /* positions the cache holds (cfg.seq_len) */
    float *k_cache, *v_cache; /* [n_layer][max_len][n_kv_head * head_dim] */
    float *x, *norm, *qkv, *att, *res, *fc, *act, *logits, *scores;
    float mean, rstd;
    loom_moe *moe; /* MoE layers: the training block for one token (NULL: dense) */
    /* The CPU backend: every op and buffer goes through it; the attention over the cache
     * is a host loop (one query row), and mean/rstd are host fields. */
    const loom_backend *be;
} loom_generator;

loom_status loom_generator_create(loom_generator *g, const loom_model_config *cfg,
                                  const loom_param_table *table, const float *params,
                                  loom_error *err);
/* The same on backend `be` (host memory: the CPU's, or its bf16 table for --precision
 * bf16; NULL: the CPU's). */
loom_status loom_generator_create_on(loom_generator *g, const loom_model_config *cfg,
                                     const loom_param_table *table, const float *params,
                                     const loom_backend *be, loom_error *err);
void loom_generator_free(loom_generator *g);
/* Feeds `token` at position pos (0 <= pos < max_len, positions in order from 0);
 * g->logits then holds the next-token logits (vocab_size). */
void loom_generator_step(loom_generator *g, int32_t token, int pos);
/* The same with the decoder's input row at pos given (d_model floats, the generator's
 * memory): a vlm's image slot, whose row is the projector's output (model/vlm_pieces.h's
 * loom_vlm_encode) instead of a token's embedding. */
void loom_generator_step_row(loom_generator *g, const float *row, int pos);

typedef struct {
    float temperature; /* 0: greedy (argmax) */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off */
} loom_sampling;

/* Draws a token from logits (overwritten: used as scratch) with uniform u in [0, 1);
 * order: V ints of scratch (the caller's, so that a decoding loop does not allocate).
 * margin (NULL: not computed) gets the draw's margin: the smallest relative change of its
 * inputs that could change the token (u's distance to the ends of the token's interval of
 * the kept mass; the token's gap to its neighbours in the sorted order; the gaps at the
 * top-k and top-p cuts; greedy: the best logit's lead over the next). Two layouts whose
 * logits differ by rounding can draw different tokens only where it is that small (the
 * layout tests' near-tie rule, tests/harness/sample_flips.py). */
int32_t loom_sample(float *logits, int V, const loom_sampling *s, double u, int *order,
                    double *margin);

#endif
