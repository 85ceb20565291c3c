/* One linear layer's backward, the piece every family's linears share (the language
 * models' blocks and head, the dit's blocks, modulation, embedders and final layer, the
 * vlm's encoder and projector, the MoE experts and router): y[N, OC] = x[N, IC] @ w^T + b
 * with w [OC, IC]. The tensor-parallel linears (model/model_impl.h, tp_linear.c) are
 * built on it. */
#ifndef LOOM_MODEL_LINEAR_BACKWARD_H
#define LOOM_MODEL_LINEAR_BACKWARD_H

#include "kernels/backend.h"

/* A linear layer's input as the model keeps it: fp32, or (activations kept in bf16 under
 * --precision bf16, docs/precision.md) the bf16 bits its GEMMs would round it to. Exactly
 * one of the two is set. */
typedef struct {
    const float *f32;
    const loom_bf16 *bf16;
} loom_act;

static inline loom_act loom_act_f32(const float *x) {
    return (loom_act){x, NULL};
}
/* The bf16 copy when there is one, else the fp32 buffer. */
static inline loom_act loom_act_of(const float *x, const loom_bf16 *x16) {
    return x16 ? (loom_act){NULL, x16} : (loom_act){x, NULL};
}

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

/* The same with the input x as a loom_act (a bf16 x: the weight gradient's GEMM reads
 * it as it is, the same bits the fp32 signature would round x to). */
void loom_linear_backward_act(const loom_backend *be, float *dx, loom_dx_mode mode, const float *dy,
                              const float *w, float *dw, float *db, loom_act x, int N, int IC,
                              int OC);

#endif
