/* Inside the context-parallel module: the two modes' forward/backward (ring.c,
 * ulysses.c) and the layout helpers they share (cp.c). */
#ifndef LOOM_CP_CP_IMPL_H
#define LOOM_CP_CP_IMPL_H

#include "cp/cp.h"

/* Global position of chunk j's first token on rank r (the layout of cp.h). */
int loom_cp_chunk_pos(const loom_cp *cp, int r, int j);

/* The name of ring step i (0-based) forward (backward 0) or backward (1); of Ulysses'
 * exchange of qkv-wide (i 0) or output-wide (i 1) messages. */
const char *loom_cp_label(const loom_cp *cp, int backward, int i);

loom_status loom_cp_ring_forward(loom_cp *cp, float *out, float *lse, const float *qkv);
loom_status loom_cp_ring_backward(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse);
loom_status loom_cp_ulysses_forward(loom_cp *cp, float *out, float *lse, const float *qkv);
loom_status loom_cp_ulysses_backward(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                     const float *out, const float *lse);

#endif
