/* One linear layer's backward, the piece every family's linears share (the language
 * models' blocks and head, the dit's blocks, modulation, embedders and final layer, the
 * vlm's encoder and projector, the MoE experts and router): y[N, OC] = x[N, IC] @ w^T + b
 * with w [OC, IC]. The tensor-parallel linears (model/model_impl.h, tp_linear.c) are
 * built on it. */
#ifndef LOOM_MODEL_LINEAR_BACKWARD_H
#define LOOM_MODEL_LINEAR_BACKWARD_H

#include "kernels/backend.h"

/* What the input gradient does with what dx held. */
typedef enum {
    LOOM_DX_SET = 0, /* dx = dy @ w (dx is zeroed first) */
    LOOM_DX_ADD = 1  /* dx += dy @ w */
} loom_dx_mode;

/* From dy [N, OC]: dx [N, IC] = (or +=, by mode) dy @ w, unless dx is NULL; dw += x^T dy
 * and db += the sum of dy's rows, unless dw is NULL (db NULL: no bias). A NULL dw is the
 * input-gradient half alone (split backward's B, a frozen layer), a NULL dx the weight
 * half alone (split backward's W, a first layer). */
void loom_linear_backward(const loom_backend *be, float *dx, loom_dx_mode mode, const float *dy,
                          const float *w, float *dw, float *db, const float *x, int N, int IC,
                          int OC);

#endif
