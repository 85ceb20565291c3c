/* The four bf16 GEMM kinds (all row-major, leading dimensions the natural ones), shared by
 * oneDNN's path (gemm_bf16.h) and the widened one (gemm_widened.h):
 *   NT  C[M,N] += A[M,K] @ B[N,K]^T   linear forward   (M tokens, N = OC, K = IC)
 *   NN  C[M,N] += A[M,K] @ B[K,N]     input gradient   (M tokens, N = IC, K = OC)
 *   TN  C[M,N] += A[K,M]^T @ B[K,N]   weight gradient  (M = OC, N = IC, K tokens)
 *   NT_OUT_BF16  C[M,N] = A[M,K] @ B[N,K]^T with C bf16 (overwritten, not accumulated):
 *       the LM head's logits under --precision bf16, the fp32 accumulator rounded to
 *       nearest even once at the end (as autocast's bf16 linear output) */
#ifndef LOOM_KERNELS_CPU_GEMM_KIND_H
#define LOOM_KERNELS_CPU_GEMM_KIND_H

typedef enum { LOOM_GEMM_NT, LOOM_GEMM_NN, LOOM_GEMM_TN, LOOM_GEMM_NT_OUT_BF16 } loom_gemm_kind;
#define LOOM_GEMM_KINDS 4

#endif
