/* bf16 GEMMs by widening blocks to fp32 for OpenBLAS (gemm_widened.h). */
#include "kernels/cpu/gemm_widened.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

struct loom_gemm_widened {
    int mb, nb, kb; /* block sizes */
    float *a;       /* mb x kb: a block of A, widened */
    float *b;       /* kb x nb: a block of B, widened */
    float *c;       /* mb x nb: NT_OUT_BF16's fp32 accumulator */
};

static float *alloc_floats(int rows, int cols) {
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

loom_status loom_gemm_widened_create(loom_gemm_widened **out, int mb, int nb, int kb,
                                     loom_error *err) {
    *out = NULL;
    if (mb < 1 || nb < 1 || kb < 1)
        return loom_error_set(err, LOOM_ERR_INPUT, "bf16 GEMM (widened): blocks %dx%dx%d", mb, nb,
                              kb);
    loom_gemm_widened *w = calloc(1, sizeof *w);
    if (w) {
        w->mb = mb, w->nb = nb, w->kb = kb;
        w->a = alloc_floats(mb, kb);
        w->b = alloc_floats(kb, nb);
        w->c = alloc_floats(mb, nb);
    }
    if (!w || !w->a || !w->b || !w->c) {
        loom_gemm_widened_destroy(w);
        return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 GEMM (widened): out of memory");
    }
    *out = w;
    return LOOM_OK;
}

void loom_gemm_widened_destroy(loom_gemm_widened *w) {
    if (!w) return;
    free(w->a), free(w->b), free(w->c);
    free(w);
}

static void widen_row(float *dst, const loom_bf16 *src, size_t ld, int cols, int r) {
    const loom_bf16 *s = src + (size_t)r * ld;
    float *d = dst + (size_t)r * (size_t)cols;
    for (int c = 0; c < cols; c++) d[c] = loom_bf16_to_f32(s[c]);
}

/* dst[r * cols + c] = widen(src[r * ld + c]) for r < rows, c < cols; small blocks on the
 * calling thread, outside any OpenMP region (kernels/cpu/bf16.c says why). */
static void widen_block(float *dst, const loom_bf16 *src, size_t ld, int rows, int cols) {
    if ((size_t)rows * (size_t)cols <= 65536) {
        for (int r = 0; r < rows; r++) widen_row(dst, src, ld, cols, r);
        return;
    }
#pragma omp parallel for
    for (int r = 0; r < rows; r++) widen_row(dst, src, ld, cols, r);
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

/* One block of outputs (mb x nb at m0, n0), its sum over K in blocks of w->kb added into
 * Cf (leading dimension ldc). */
static void run_block(loom_gemm_widened *w, loom_gemm_kind kind, int M, int N, int K, int m0,
                      int mb, int n0, int nb, float *Cf, int ldc, const loom_bf16 *A,
                      const loom_bf16 *B) {
    for (int k0 = 0; k0 < K; k0 += w->kb) {
        const int kb = min_int(w->kb, K - k0);
        switch (kind) {
        case LOOM_GEMM_NT: /* A [M,K], B [N,K] */
        case LOOM_GEMM_NT_OUT_BF16:
            widen_block(w->a, A + (size_t)m0 * K + k0, (size_t)K, mb, kb);
            widen_block(w->b, B + (size_t)n0 * K + k0, (size_t)K, nb, kb);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mb, nb, kb, 1.0f, w->a, kb, w->b,
                        kb, 1.0f, Cf, ldc);
            break;
        case LOOM_GEMM_NN: /* A [M,K], B [K,N] */
            widen_block(w->a, A + (size_t)m0 * K + k0, (size_t)K, mb, kb);
            widen_block(w->b, B + (size_t)k0 * N + n0, (size_t)N, kb, nb);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mb, nb, kb, 1.0f, w->a, kb, w->b,
                        nb, 1.0f, Cf, ldc);
            break;
        case LOOM_GEMM_TN: /* A stored [K,M], B [K,N] */
            widen_block(w->a, A + (size_t)k0 * M + m0, (size_t)M, kb, mb);
            widen_block(w->b, B + (size_t)k0 * N + n0, (size_t)N, kb, nb);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, mb, nb, kb, 1.0f, w->a, mb, w->b,
                        nb, 1.0f, Cf, ldc);
            break;
        }
    }
}

void loom_gemm_widened_run(loom_gemm_widened *w, loom_gemm_kind kind, int M, int N, int K, void *C,
                           const loom_bf16 *A, const loom_bf16 *B) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    for (int m0 = 0; m0 < M; m0 += w->mb) {
        const int mb = min_int(w->mb, M - m0);
        for (int n0 = 0; n0 < N; n0 += w->nb) {
            const int nb = min_int(w->nb, N - n0);
            if (kind != LOOM_GEMM_NT_OUT_BF16) {
                float *Cf = (float *)C + (size_t)m0 * N + n0;
                run_block(w, kind, M, N, K, m0, mb, n0, nb, Cf, N, A, B);
                continue;
            }
            /* bf16 output: the whole sum in fp32, rounded to nearest even once */
            memset(w->c, 0, (size_t)mb * (size_t)nb * sizeof(float));
            run_block(w, kind, M, N, K, m0, mb, n0, nb, w->c, nb, A, B);
            for (int r = 0; r < mb; r++)
                loom_bf16_from_f32_n((loom_bf16 *)C + (size_t)(m0 + r) * N + n0,
                                     w->c + (size_t)r * nb, (size_t)nb);
        }
    }
}
