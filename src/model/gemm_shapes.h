/* The GEMM shapes a model's linear layers run, for a backend that makes something per
 * shape before the step (the bf16 table's oneDNN primitives: kernels/backend.h,
 * linear_prepare). */
#ifndef LOOM_MODEL_GEMM_SHAPES_H
#define LOOM_MODEL_GEMM_SHAPES_H

#include "core/error.h"
#include "kernels/backend.h"
#include "model/params.h"

/* Every 2-D parameter [OC, IC] of the registry, and every run of up to 3 back-to-back
 * parameters of the same width that the model multiplies as one (Llama's q/k/v and
 * gate/up), as a linear layer over each of the n_rows row counts. Nothing for an fp32
 * table (no linear_prepare). A linear the registry does not describe (MoE experts,
 * whose token counts change) runs unprepared. bf16_logits: the model keeps its logits in
 * bf16 (model/model_impl.h, loom_model_keep_bf16_logits): the head's GEMMs over rows[0]
 * (a bf16 output, the backward from bf16 dlogits) instead of the fp32-output ones, whose
 * operand buffers would hold N x V. */
loom_status loom_model_prepare_gemms(const loom_backend *be, const loom_param_table *t,
                                     const int *rows, int n_rows, int bf16_logits, loom_error *err);

#endif
