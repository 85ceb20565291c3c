#include "rl/rollout.h"

#include <stdlib.h>

#include "core/philox.h"

#define ROLLOUT_STREAM 0x726f6c6cu /* "roll" */

/* Sequences [first, first + m) in one batch: every live sequence advances one position a
 * step (its prompt's next token, or the completion's last). */
static loom_status run_batch(loom_batch_generator *g, const loom_rollout_options *o, int first,
                             int m, const int32_t *const *prompt, const int *plen,
                             const uint64_t *stream, int32_t *comp, int *clen, int *seq,
                             int32_t *tok, int *pos, int *live, int *order, loom_error *err) {
    const int V = g->cfg.vocab_size;
    int n_live = 0;
    for (int i = 0; i < m; i++) {
        clen[first + i] = 0;
        live[n_live++] = first + i;
    }
    for (int p = 0; n_live > 0; p++) {
        for (int r = 0; r < n_live; r++) {
            const int s = live[r];
            seq[r] = s - first;
            pos[r] = p;
            tok[r] = p < plen[s] ? prompt[s][p] : comp[(size_t)s * o->max_new + p - plen[s]];
        }
        loom_status st = loom_batch_generator_step(g, n_live, seq, tok, pos, err);
        if (st) return st;
        int kept = 0;
        for (int r = 0; r < n_live; r++) {
            const int s = live[r];
            int done = 0;
            if (p + 1 >= plen[s]) {
                const int i = p + 1 - plen[s]; /* the completion token drawn now */
                const double u = loom_philox_uniform(
                    (uint32_t)loom_philox_u64(o->seed, ROLLOUT_STREAM, stream[s], (uint32_t)i));
                double margin;
                const int32_t t = loom_sample(g->logits + (size_t)r * V, V, &o->sampling, u, order,
                                              o->margin ? &margin : NULL);
                comp[(size_t)s * o->max_new + i] = t;
                if (o->margin) o->margin[(size_t)s * o->max_new + i] = (float)margin;
                clen[s] = i + 1;
                done = (o->stop && o->stop[t]) || i + 1 == o->max_new || p + 1 == g->max_len;
            }
            if (!done) live[kept++] = s;
        }
        n_live = kept;
    }
    return LOOM_OK;
}

loom_status loom_rollout_run(loom_batch_generator *g, const loom_rollout_options *o, int n,
                             const int32_t *const *prompt, const int *plen, const uint64_t *stream,
                             int32_t *comp, int *clen, loom_error *err) {
    const int B = g->max_batch;
    const int V = g->cfg.vocab_size;
    int *seq = malloc((size_t)(B * 3 + V) * sizeof(int) + (size_t)B * sizeof(int32_t));
    if (!seq) return loom_error_set(err, LOOM_ERR_NOMEM, "rollout: out of memory");
    int *pos = seq + B, *live = pos + B;
    int *order = live + B; /* the sampler's scratch */
    int32_t *tok = (int32_t *)(order + V);
    loom_status st = LOOM_OK;
    for (int first = 0; first < n && !st; first += B) {
        const int m = n - first < B ? n - first : B;
        st = run_batch(g, o, first, m, prompt, plen, stream, comp, clen, seq, tok, pos, live, order,
                       err);
    }
    free(seq);
    return st;
}
