/* Rollouts: sampled completions of many prompts at once with the batched KV-cache decoder
 * (model/generate_batch.h). Token i of sequence s's completion is drawn with the uniform
 * Philox(seed, stream[s], i): one random stream per sequence, so a completion does not
 * depend on which other sequences share its batch, rank or layout. */
#ifndef LOOM_RL_ROLLOUT_H
#define LOOM_RL_ROLLOUT_H

#include <stdint.h>

#include "core/error.h"
#include "model/generate.h"
#include "model/generate_batch.h"

typedef struct {
    loom_sampling sampling;
    int max_new;         /* completion tokens at most */
    const uint8_t *stop; /* [vocab]: 1 for tokens that end a completion (kept as its last
                            token: a newline, an end-of-text); NULL: none */
    uint64_t seed;
    float *margin; /* NULL, or [n, max_new]: each draw's margin (loom_sample) */
} loom_rollout_options;

/* Sequences s < n: prompt[s][0 .. plen[s]) with 1 <= plen[s] <= g->max_len. Writes the
 * completion to comp[s * max_new ...] and its length to clen[s]: it ends after a stop
 * token, after max_new tokens, or when prompt and completion fill max_len + 1 tokens (a
 * training record). Runs the sequences in batches of g->max_batch. max_new >= 1. */
loom_status loom_rollout_run(loom_batch_generator *g, const loom_rollout_options *o, int n,
                             const int32_t *const *prompt, const int *plen, const uint64_t *stream,
                             int32_t *comp, int *clen, loom_error *err);

#endif
