#include "parallel/embed_grad.h"

#include <stdlib.h>
#include <string.h>

/* The wte parameter's index when the split applies to this table, else -1. */
static int split_wte(const loom_param_table *t, int ranks) {
    size_t head_end = t->n_layer > 0 ? t->blocks[0].begin : t->head_begin;
    int w = -1;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].offset == t->wte) w = i;
    if (ranks < 2 || w < 0 || t->wte != 0 || t->params[w].ndim != 2 || t->params[w].tp_size > 1 ||
        t->params[w].shape[0] >= (1 << 24) || t->params[w].numel > head_end)
        return -1;
    return w;
}

size_t loom_embed_grad_wte_end(const loom_param_table *t, int ranks) {
    const int w = split_wte(t, ranks);
    return w < 0 ? 0 : t->params[w].numel;
}

size_t loom_embed_grad_buffer_bytes(const loom_param_table *t, int ranks, int n_tokens) {
    const int w = split_wte(t, ranks);
    if (w < 0) return 0;
    const size_t slot = (size_t)n_tokens * ((size_t)t->params[w].shape[1] + 1);
    return (size_t)ranks * (slot * sizeof(float) + 2 * sizeof(int));
}

loom_status loom_embed_grad_plan(loom_embed_grad *eg, const loom_param_table *t, int ranks,
                                 int n_tokens, int seq_len, loom_error *err) {
    memset(eg, 0, sizeof *eg);
    const int w = split_wte(t, ranks);
    if (w < 0) return LOOM_OK;
    eg->wte_end = t->params[w].numel;
    eg->wpe = t->wpe;
    eg->C = (int)t->params[w].shape[1];
    eg->T = seq_len;
    eg->N = n_tokens;
    eg->R = ranks;
    size_t slot = (size_t)n_tokens * (eg->C + 1);
    eg->rows = malloc((size_t)ranks * slot * sizeof(float));
    eg->counts = calloc((size_t)ranks, sizeof(int));
    eg->displs = calloc((size_t)ranks, sizeof(int));
    if (!eg->rows || !eg->counts || !eg->displs) {
        loom_embed_grad_free(eg);
        return loom_error_set(err, LOOM_ERR_NOMEM, "embedding gradient: out of memory");
    }
    for (int r = 0; r < ranks; r++) {
        eg->counts[r] = (int)slot;
        eg->displs[r] = (int)(slot * (size_t)r);
    }
    eg->enabled = 1;
    return LOOM_OK;
}

void loom_embed_grad_free(loom_embed_grad *eg) {
    free(eg->rows);
    free(eg->counts);
    free(eg->displs);
    memset(eg, 0, sizeof *eg);
}

loom_status loom_embed_grad_post(loom_embed_grad *eg, loom_comm_engine *e, int rank, float *grads,
                                 const float *d_embed, const int32_t *tokens, loom_error *err) {
    const int C = eg->C, T = eg->T, B = eg->N / eg->T;
    if (eg->wpe != LOOM_NO_PARAM) /* the same sums as the embedding kernel's */
        for (int t = 0; t < T; t++) {
            float *d = grads + eg->wpe + (size_t)t * C;
            for (int b = 0; b < B; b++) {
                const float *g = d_embed + ((size_t)b * T + t) * C;
                for (int c = 0; c < C; c++) d[c] += g[c];
            }
        }
    float *mine = eg->rows + eg->displs[rank];
    for (int i = 0; i < eg->N; i++) mine[i] = (float)tokens[i];
    memcpy(mine + eg->N, d_embed, (size_t)eg->N * C * sizeof(float));
    eg->op.kind = LOOM_OP_ALLGATHERV;
    eg->op.buf = eg->rows;
    eg->op.counts = eg->counts;
    eg->op.displs = eg->displs;
    return loom_comm_engine_post(e, &eg->op, err);
}

loom_status loom_embed_grad_apply(loom_embed_grad *eg, loom_comm_engine *e, float *dst, size_t lo,
                                  size_t hi, loom_error *err) {
    loom_status st = loom_comm_engine_wait(e, &eg->op, err);
    if (st) return st;
    const size_t C = (size_t)eg->C;
    for (int r = 0; r < eg->R; r++) {
        const float *ids = eg->rows + eg->displs[r], *rows = ids + eg->N;
        for (int i = 0; i < eg->N; i++) {
            size_t at = (size_t)ids[i] * C;       /* wte starts the flat buffer */
            if (at < lo || at + C > hi) continue; /* shards hold whole rows */
            float *d = dst + (at - lo);
            const float *g = rows + (size_t)i * C;
            for (size_t c = 0; c < C; c++) d[c] += g[c];
        }
    }
    return LOOM_OK;
}
