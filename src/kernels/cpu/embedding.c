/* Token + position embedding lookup and its scatter-add backward, for the whole
 * vocabulary or for one tensor-parallel shard of it (rows [v0, v0 + V)): the unsharded
 * kernels are the shard kernels with every token owned, so both do the same arithmetic. */
#include "kernels/kernels.h"

#include <stdint.h>
#include <string.h>

/* Channels per task in the backward: tasks own disjoint channel slices of dwte, so
 * repeated tokens never race and the accumulation order is deterministic. */
#define LOOM_EMB_COLS 64

void loom_embedding_forward_shard(float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int v0, int V, int B, int T, int C) {
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        float *restrict o = out + (size_t)bt * C;
        const int tok = tokens[bt] - v0;
        const float *restrict p = wpe ? wpe + (size_t)(bt % T) * C : NULL;
        if (tok >= 0 && tok < V) {
            const float *restrict e = wte + (size_t)tok * C;
            if (p)
                for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
            else
                for (int c = 0; c < C; c++) o[c] = e[c];
        } else if (p) {
            for (int c = 0; c < C; c++) o[c] = p[c];
        } else {
            memset(o, 0, (size_t)C * sizeof *o);
        }
    }
}

void loom_embedding_backward_shard(float *dwte, float *dwpe, const float *dout,
                                   const int32_t *tokens, int v0, int V, int B, int T, int C) {
    int nblocks = (C + LOOM_EMB_COLS - 1) / LOOM_EMB_COLS;
#pragma omp parallel for
    for (int blk = 0; blk < nblocks; blk++) { /* disjoint channel slices: no races */
        int c0 = blk * LOOM_EMB_COLS;
        int nc = C - c0 < LOOM_EMB_COLS ? C - c0 : LOOM_EMB_COLS;
        for (int bt = 0; bt < B * T; bt++) {
            const int tok = tokens[bt] - v0;
            if (tok < 0 || tok >= V) continue;
            float *restrict d = dwte + (size_t)tok * C + c0;
            const float *restrict g = dout + (size_t)bt * C + c0;
            for (int j = 0; j < nc; j++) d[j] += g[j];
        }
    }
    if (!dwpe) return;
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        float *restrict d = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *restrict g = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
    }
}

void loom_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C) {
    loom_embedding_forward_shard(out, tokens, wte, wpe, 0, INT32_MAX, B, T, C);
}

void loom_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C) {
    loom_embedding_backward_shard(dwte, dwpe, dout, tokens, 0, INT32_MAX, B, T, C);
}
