/* bf16 GEMMs through oneDNN's matmul primitive (or, on a CPU without bf16 GEMM
 * instructions, widened to fp32 for OpenBLAS: gemm_widened.h): bf16 A and B, fp32
 * accumulation and fp32 C, always accumulating (C += A op B: oneDNN's sum post-op; a
 * caller that wants C = A op B clears or seeds C first). A primitive is made once per (kind, M, N,
 * K) by loom_gemm_bf16_prepare, at set-up; loom_gemm_bf16_run looks the shape up and only runs it.
 * A shape nobody prepared (MoE experts' token counts change every step) runs on its kind's
 * primitive with run-time dimensions made at creation (oneDNN's gemm:jit, slower), so no primitive
 * is ever created inside a step; those calls are counted.
 *
 * Kinds: kernels/cpu/gemm_kind.h.
 *
 * Error bound (what tests/unit/test_gemm_bf16.c checks against float64 on the unrounded
 * fp32 inputs): each input rounded to bf16 has relative error <= u = 2^-8, so each product
 * a_i b_i is off by <= (2u + u^2) |a_i b_i|; fp32 accumulation of K terms adds at most
 * gamma_K = K 2^-24 / (1 - K 2^-24) times sum |a_i b_i| (Higham 3.1); in all
 * |C - C64| <= (2u + u^2 + gamma_K) sum_i |a_i b_i|. */
#ifndef LOOM_KERNELS_CPU_GEMM_BF16_H
#define LOOM_KERNELS_CPU_GEMM_BF16_H

#include <stddef.h>

#include "core/error.h"
#include "kernels/bf16.h"
#include "kernels/cpu/gemm_kind.h"

typedef struct loom_gemm_bf16 loom_gemm_bf16;

/* The oneDNN CPU engine, stream and the run-time-shape primitives; on a CPU without
 * AVX512-BF16 or AMX-BF16 (kernels/bf16.h: loom_cpu_has_*; LOOM_BF16_PRETEND_NO_CPU=1
 * pretends so), the widened path's scratch instead (oneDNN 2.6 has no bf16 matmul there). */
loom_status loom_gemm_bf16_create(loom_gemm_bf16 **out, loom_error *err);
void loom_gemm_bf16_destroy(loom_gemm_bf16 *g); /* NULL: nothing */
/* Makes the primitive of one shape (nothing if it exists); M, N, K >= 1. */
loom_status loom_gemm_bf16_prepare(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K,
                                   loom_error *err);
/* C += A op B (see the kinds; C is float, or loom_bf16 for NT_OUT_BF16); M, N or K <= 0:
 * nothing. */
void loom_gemm_bf16_run(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K, void *C,
                        const loom_bf16 *A, const loom_bf16 *B);
/* The implementation oneDNN chose for the largest prepared shape ("brg:avx512_core_bf16"),
 * or of the run-time-shape primitive when none is prepared; the widened path's name. */
const char *loom_gemm_bf16_impl(const loom_gemm_bf16 *g);
size_t loom_gemm_bf16_prepared(const loom_gemm_bf16 *g);
/* 1 when the calls run widened to fp32 (gemm_widened.h), 0 on oneDNN. */
int loom_gemm_bf16_is_widened(const loom_gemm_bf16 *g);
/* Calls that ran on the run-time-shape primitives (no prepared shape), and the first
 * failure of oneDNN inside run (0: none; run cannot return it). */
size_t loom_gemm_bf16_unprepared_calls(const loom_gemm_bf16 *g);
loom_status loom_gemm_bf16_status(const loom_gemm_bf16 *g, loom_error *err);

#endif
