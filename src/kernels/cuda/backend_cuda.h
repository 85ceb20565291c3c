/* The CUDA backend: the table of kernels/backend.h over one device (CUDA builds only).
 * The backend object holds the CUDA context (stream, cuBLAS handles, workspace), the
 * sticky first error of its ops and the device scratch of sum_squares. Ops without a
 * CUDA kernel yet set the sticky error "not implemented on cuda: <op>" (and do nothing
 * else): the vocabulary-parallel cross-entropy pieces (crossentropy_shard_*) and the
 * mixture-of-experts routing pieces (moe_*). */
#ifndef LOOM_KERNELS_CUDA_BACKEND_CUDA_H
#define LOOM_KERNELS_CUDA_BACKEND_CUDA_H

#include "core/error.h"
#include "kernels/backend.h"

/* Creates the context on `device`; *out is freed by loom_backend_cuda_destroy. No
 * driver or GPU: LOOM_ERR_STATE "no CUDA device: <reason>". */
loom_status loom_backend_cuda_create(loom_backend **out, int device, loom_error *err);
void loom_backend_cuda_destroy(loom_backend *be);
/* The same with --precision bf16's ops (kernels/backend_bf16.h; docs/precision.md): the
 * bf16 GEMMs through cuBLAS (bf16 operands, fp32 accumulation, fp32 results; the logits'
 * GEMM writes bf16), the fp32-signature linear ops rounding their operands to bf16 into a
 * device scratch (sized by linear_prepare; never a cudaMalloc per call), round/widen, the
 * logits' bf16 ops, GELU/SwiGLU from bf16; every rounding loom's (kernels/bf16.h) but the
 * logits GEMM's own (cuBLAS, nearest even). The causal attention's bf16 backward is not
 * there (NULL: the model's fp32 fallback). Freed by loom_backend_cuda_destroy. Not yet
 * chosen by `loom train --device cuda --precision bf16`, which still refuses. */
loom_status loom_backend_cuda_bf16_create(loom_backend **out, int device, loom_error *err);
/* "cuBLAS bf16 GEMMs (fp32 accumulation), 12 linear_prepare calls, operand scratch
 * 3.0 MiB, grown 0 times in calls" */
void loom_backend_cuda_bf16_describe(const loom_backend *be, char *buf, size_t size);

#endif
