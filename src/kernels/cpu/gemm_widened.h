/* bf16 GEMMs on a CPU without bf16 GEMM instructions (no AVX512-BF16, no AMX-BF16), where
 * oneDNN 2.6's bf16 matmul is unimplemented: the bf16 operands are widened to fp32 block
 * by block (exact: a shift) and multiplied by OpenBLAS's sgemm, accumulating in fp32.
 * A product of two bf16 values has at most 16 significant bits, so fp32 holds it exactly
 * and the result obeys the same error bound as oneDNN's bf16 matmul (gemm_bf16.h): the
 * same arithmetic contract, bf16 in and fp32 accumulation, in another summation order.
 * It has bf16's numerics and bf16's bytes (activations, messages), not its speed: the
 * multiplications run at fp32's rate plus the widening.
 *
 * Blocks of at most mb x nb outputs and kb terms of the sum bound the scratch (9 MiB at
 * the defaults, allocated once at creation), so no call allocates. (OpenBLAS's per-element
 * order depends on the shape, so a tensor-parallel shard of the columns need not get the
 * one-process bits: the same holds for loom's fp32 GEMMs.) */
#ifndef LOOM_KERNELS_CPU_GEMM_WIDENED_H
#define LOOM_KERNELS_CPU_GEMM_WIDENED_H

#include "core/error.h"
#include "kernels/bf16.h"
#include "kernels/cpu/gemm_kind.h"

#define LOOM_WIDEN_MB 512
#define LOOM_WIDEN_NB 2048
#define LOOM_WIDEN_KB 512

typedef struct loom_gemm_widened loom_gemm_widened;

/* Block sizes >= 1 (loom uses the LOOM_WIDEN_* defaults; the tests small ones). */
loom_status loom_gemm_widened_create(loom_gemm_widened **out, int mb, int nb, int kb,
                                     loom_error *err);
void loom_gemm_widened_destroy(loom_gemm_widened *w); /* NULL: nothing */
/* C op= A op B of `kind` (gemm_kind.h), the arguments as loom_gemm_bf16_run's (gemm_bf16.h). */
void loom_gemm_widened_run(loom_gemm_widened *w, loom_gemm_kind kind, int M, int N, int K, void *C,
                           const loom_bf16 *A, const loom_bf16 *B);

#endif
