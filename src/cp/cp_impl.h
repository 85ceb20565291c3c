/* Inside the context-parallel module: the two modes' forward/backward (ring.c,
 * ulysses.c, which cp.c dispatches to) and the layout helpers they share (here, inline, so
 * ring.c and ulysses.c do not call back into cp.c). */
#ifndef LOOM_CP_CP_IMPL_H
#define LOOM_CP_CP_IMPL_H

#include "cp/cp.h"

/* The layout of rank r of N (cp.h). */
static inline void loom_cp_layout(int N, int r, const loom_cp_options *o, int *Tl, int *n_chunks,
                                  int *chunk, int pos[2]) {
    *Tl = o->T / N;
    *n_chunks = o->mode == LOOM_CP_RING && o->causal && !o->no_zigzag ? 2 : 1;
    *chunk = *Tl / *n_chunks;
    pos[0] = *n_chunks == 2 ? r * *chunk : r * *Tl;
    pos[1] = *n_chunks == 2 ? (2 * N - 1 - r) * *chunk : pos[0];
}

/* Global position of chunk j's first token on rank r (the layout of cp.h). */
static inline int loom_cp_chunk_pos(const loom_cp *cp, int r, int j) {
    int Tl, n, chunk, pos[2];
    loom_cp_layout(cp->size, r, &cp->o, &Tl, &n, &chunk, pos);
    return pos[j];
}

/* The name of ring step i (0-based) forward (backward 0) or backward (1); of Ulysses'
 * exchange of qkv-wide (i 0) or output-wide (i 1) messages. */
static inline const char *loom_cp_label(const loom_cp *cp, int backward, int i) {
    if (cp->o.mode == LOOM_CP_ULYSSES) return cp->labels[2 * cp->size + (i != 0)];
    return cp->labels[(backward ? cp->size : 0) + i];
}

loom_status loom_cp_ring_forward(loom_cp *cp, float *out, float *lse, const float *qkv);
loom_status loom_cp_ring_backward(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse);
loom_status loom_cp_ulysses_forward(loom_cp *cp, float *out, float *lse, const float *qkv);
loom_status loom_cp_ulysses_backward(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                     const float *out, const float *lse);

#endif
