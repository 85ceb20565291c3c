/* The bf16 ops' call-site wrappers (--precision bf16, docs/precision.md): the tables that
 * set these ops keep some activations, the logits or the pre-activations in bf16; the
 * loom_backend_bf16_* predicates say which. Beside backend.h, whose fp32 wrappers every
 * kernel caller needs, so that only the bf16 paths include these. */
#ifndef LOOM_KERNELS_BACKEND_BF16_H
#define LOOM_KERNELS_BACKEND_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"

/* 1 when the table keeps GEMM-only activations in bf16 (linear_forward_in_bf16 and
 * round_bf16 set). */
static inline int loom_backend_bf16_activations(const loom_backend *be) {
    return be->ops->linear_forward_in_bf16 != NULL && be->ops->round_bf16 != NULL;
}
static inline void loom_backend_linear_forward_in_bf16(const loom_backend *be, float *out,
                                                       const loom_bf16 *inp, const float *weight,
                                                       const float *bias, int N, int IC, int OC) {
    be->ops->linear_forward_in_bf16(be, out, inp, weight, bias, N, IC, OC);
}
static inline void loom_backend_round_bf16(const loom_backend *be, loom_bf16 *dst, const float *src,
                                           size_t n) {
    be->ops->round_bf16(be, dst, src, n);
}
static inline void loom_backend_linear_forward_bf16(const loom_backend *be, float *out,
                                                    const loom_bf16 *inp, const loom_bf16 *weight,
                                                    const float *bias, int N, int IC, int OC) {
    be->ops->linear_forward_bf16(be, out, inp, weight, bias, N, IC, OC);
}
static inline void loom_backend_linear_backward_input_bf16(const loom_backend *be, float *dinp,
                                                           const float *dout,
                                                           const loom_bf16 *weight, int N, int IC,
                                                           int OC) {
    be->ops->linear_backward_input_bf16(be, dinp, dout, weight, N, IC, OC);
}
static inline void loom_backend_linear_backward_weight_bf16(const loom_backend *be, float *dweight,
                                                            float *dbias, const float *dout,
                                                            const loom_bf16 *inp, int N, int IC,
                                                            int OC) {
    be->ops->linear_backward_weight_bf16(be, dweight, dbias, dout, inp, N, IC, OC);
}

/* 1 when the table keeps the LM head's logits in bf16 (the ops above set). */
static inline int loom_backend_bf16_logits(const loom_backend *be) {
    return be->ops->linear_forward_out_bf16 != NULL && be->ops->crossentropy_forward_bf16 != NULL;
}
static inline void loom_backend_linear_forward_out_bf16(const loom_backend *be, loom_bf16 *out,
                                                        const float *inp, const loom_bf16 *inp16,
                                                        const float *weight, int N, int IC,
                                                        int OC) {
    be->ops->linear_forward_out_bf16(be, out, inp, inp16, weight, N, IC, OC);
}
static inline void loom_backend_linear_backward_input_dbf16(const loom_backend *be, float *dinp,
                                                            const loom_bf16 *dout,
                                                            const float *weight, int N, int IC,
                                                            int OC) {
    be->ops->linear_backward_input_dbf16(be, dinp, dout, weight, N, IC, OC);
}
static inline void loom_backend_linear_backward_weight_dbf16(const loom_backend *be, float *dweight,
                                                             const loom_bf16 *dout,
                                                             const float *inp,
                                                             const loom_bf16 *inp16, int N, int IC,
                                                             int OC) {
    be->ops->linear_backward_weight_dbf16(be, dweight, dout, inp, inp16, N, IC, OC);
}
static inline loom_status loom_backend_linear_prepare_out_bf16(const loom_backend *be, int N,
                                                               int IC, int OC, loom_error *err) {
    return be->ops->linear_prepare_out_bf16 ? be->ops->linear_prepare_out_bf16(be, N, IC, OC, err)
                                            : LOOM_OK;
}
static inline void loom_backend_round_bf16_values(const loom_backend *be, float *x, size_t n) {
    be->ops->round_bf16_values(be, x, n);
}
/* 1 when the table keeps the MLP's pre-activation and attention's qkv in bf16 (the ops
 * below set). */
static inline int loom_backend_bf16_pre_activations(const loom_backend *be) {
    return be->ops->gelu_forward_in_bf16 != NULL && be->ops->gelu_backward_in_bf16 != NULL &&
           be->ops->swiglu_forward_in_bf16 != NULL && be->ops->swiglu_backward_in_bf16 != NULL &&
           be->ops->widen_bf16 != NULL && be->ops->round_bf16 != NULL;
}
static inline void loom_backend_gelu_forward_in_bf16(const loom_backend *be, float *out,
                                                     const loom_bf16 *inp, size_t n) {
    be->ops->gelu_forward_in_bf16(be, out, inp, n);
}
static inline void loom_backend_gelu_backward_in_bf16(const loom_backend *be, float *dinp,
                                                      const loom_bf16 *inp, const float *dout,
                                                      size_t n) {
    be->ops->gelu_backward_in_bf16(be, dinp, inp, dout, n);
}
static inline void loom_backend_swiglu_forward_in_bf16(const loom_backend *be, float *out,
                                                       const loom_bf16 *inp, int N, int F) {
    be->ops->swiglu_forward_in_bf16(be, out, inp, N, F);
}
static inline void loom_backend_swiglu_backward_in_bf16(const loom_backend *be, float *dinp,
                                                        const float *dout, const loom_bf16 *inp,
                                                        int N, int F) {
    be->ops->swiglu_backward_in_bf16(be, dinp, dout, inp, N, F);
}
static inline void loom_backend_widen_bf16(const loom_backend *be, float *dst, const loom_bf16 *src,
                                           size_t n) {
    be->ops->widen_bf16(be, dst, src, n);
}
/* 1 when the table has the ops the shared backward scratch needs (model/transformer.c). */
static inline int loom_backend_bf16_shared_scratch(const loom_backend *be) {
    return loom_backend_bf16_pre_activations(be) && be->ops->gelu_backward_in_bf16_inplace &&
           be->ops->attention_scratch_floats_bf16 && be->ops->attention_backward_in_bf16;
}
static inline void loom_backend_gelu_backward_in_bf16_inplace(const loom_backend *be, float *d,
                                                              const loom_bf16 *inp, size_t n) {
    be->ops->gelu_backward_in_bf16_inplace(be, d, inp, n);
}
static inline size_t loom_backend_attention_scratch_floats_bf16(const loom_backend *be, int T,
                                                                int hd) {
    return be->ops->attention_scratch_floats_bf16(be, T, hd);
}
static inline void loom_backend_attention_backward_in_bf16(const loom_backend *be, float *dqkv,
                                                           float *scratch, const float *dout,
                                                           const loom_bf16 *qkv,
                                                           const loom_bf16 *out, const float *lse,
                                                           int B, int T, int H, int KV, int hd) {
    be->ops->attention_backward_in_bf16(be, dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd);
}
static inline void loom_backend_crossentropy_forward_bf16(const loom_backend *be, float *losses,
                                                          const loom_bf16 *logits,
                                                          const int32_t *targets, int N, int V) {
    be->ops->crossentropy_forward_bf16(be, losses, logits, targets, N, V);
}
static inline void loom_backend_crossentropy_forward_backward_bf16(const loom_backend *be,
                                                                   float *losses, loom_bf16 *logits,
                                                                   const int32_t *targets, int N,
                                                                   int V, float dloss) {
    be->ops->crossentropy_forward_backward_bf16(be, losses, logits, targets, N, V, dloss);
}

#endif
