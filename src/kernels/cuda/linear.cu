/* Linear layers through cuBLAS/cuBLASLt. Row-major [N, IC] @ [OC, IC]^T is the
 * column-major product out^T = W^T(op T) x inp^T, so no transposes are materialised.
 * Forward: cuBLASLt with the bias fused as an epilogue. Backward: cublasGemmEx with
 * beta = 1 (the += contract). fp32 uses CUBLAS_COMPUTE_32F (TF32 off, the math mode is
 * CUBLAS_DEFAULT_MATH); bf16 inputs use CUBLAS_COMPUTE_32F too (fp32 accumulation), with
 * a bf16 output (the all-bf16 variants) or an fp32 one (the _bf16_f32 variants: the
 * backend table's bf16 GEMMs, kernels/backend.h). The operands' type (in_type) and the
 * output's (out_type) are the helpers' two cudaDataType_t arguments; the transposes are
 * the fp32 path's in every precision. The bias gradient is a fixed-order column reduction
 * (deterministic). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>

#include "kernels/cuda/common.cuh"

#define COL_LANES 16

static loom_status blas_fail(loom_error *err, const char *op, int st, int N, int IC, int OC) {
    return loom_error_set(err, LOOM_ERR_STATE, "cuBLAS %s failed (status %d) for N=%d IC=%d OC=%d",
                          op, st, N, IC, OC);
}

template <typename T> __global__ void bias_grad_kernel(float *dbias, const T *dout, int N, int OC) {
    int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    double acc = 0.0; /* double for long sums, as the CPU */
    if (c < OC)
        for (int n = y; n < N; n += COL_LANES) acc += ld(dout + (size_t)n * OC + c);
    __shared__ double shd[COL_LANES][33];
    shd[y][threadIdx.x] = acc;
    __syncthreads();
    if (y != 0 || c >= OC) return;
    for (int k = 1; k < COL_LANES; k++) acc += shd[k][threadIdx.x];
    dbias[c] += (float)acc;
}

/* out[n, c] = bias[c] or 0 (the IC == 0 case, where there is no product). */
template <typename T> __global__ void fill_bias_kernel(T *out, const T *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st(out + i, bias ? ld(bias + i % OC) : 0.0f);
}

/* D[OC x N] = op_T(W)[OC x IC] x inp[IC x N] (+ bias per row of D), column-major. A, B
 * in in_type; D (and the bias: cuBLASLt's default bias type is D's) in out_type. */
static loom_status lt_forward(loom_cuda_ctx *ctx, void *out, const void *inp, const void *weight,
                              const void *bias, int N, int IC, int OC, cudaDataType_t in_type,
                              cudaDataType_t out_type, loom_error *err) {
    cublasLtHandle_t lt = (cublasLtHandle_t)ctx->blaslt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld_ = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == CUBLAS_STATUS_SUCCESS && bias)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&la, in_type, IC, OC, IC);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lb, in_type, IC, N, IC);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&ld_, out_type, OC, N, OC);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = ctx->workspace_bytes;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld_, ld_, pref, 1, &result, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(lt, op, &one, weight, la, inp, lb, &zero, out, ld_, out, ld_,
                            &result.algo, ctx->workspace, ws, ctx->stream);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld_) cublasLtMatrixLayoutDestroy(ld_);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return st == CUBLAS_STATUS_SUCCESS ? LOOM_OK : blas_fail(err, "Lt forward", (int)st, N, IC, OC);
}

/* out (TO, out_type) = bias (TO) + inp @ weight^T (TI, in_type). */
template <typename TI, typename TO>
static loom_status forward(loom_cuda_ctx *ctx, TO *out, const TI *inp, const TI *weight,
                           const TO *bias, int N, int IC, int OC, cudaDataType_t in_type,
                           cudaDataType_t out_type, loom_error *err) {
    if (N <= 0 || OC <= 0) return LOOM_OK;
    if (IC <= 0) {
        fill_bias_kernel<<<grid_for((size_t)N * OC, 256), 256, 0, ctx->stream>>>(out, bias, N, OC);
        return LOOM_OK;
    }
    if (lt_forward(ctx, out, inp, weight, bias, N, IC, OC, in_type, out_type, err) == LOOM_OK)
        return LOOM_OK;
    /* No Lt algorithm for this shape/type (e.g. odd leading dimensions in bf16): seed out
     * with the bias and accumulate one cublasGemmEx onto it, as the CPU kernel does. */
    fill_bias_kernel<<<grid_for((size_t)N * OC, 256), 256, 0, ctx->stream>>>(out, bias, N, OC);
    const float one = 1.0f;
    cublasStatus_t st = cublasGemmEx((cublasHandle_t)ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC,
                                     &one, weight, in_type, IC, inp, in_type, IC, &one, out,
                                     out_type, OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? LOOM_OK : blas_fail(err, "forward", (int)st, N, IC, OC);
}

/* dinp[IC x N] += W[IC x OC] x dout[OC x N] (column-major views); W, dout in in_type,
 * dinp in out_type. */
static loom_status backward_input(loom_cuda_ctx *ctx, void *dinp, const void *dout,
                                  const void *weight, int N, int IC, int OC, cudaDataType_t in_type,
                                  cudaDataType_t out_type, loom_error *err) {
    if (N <= 0 || IC <= 0 || OC <= 0) return LOOM_OK;
    const float one = 1.0f;
    cublasStatus_t st = cublasGemmEx((cublasHandle_t)ctx->blas, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC,
                                     &one, weight, in_type, IC, dout, in_type, OC, &one, dinp,
                                     out_type, IC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? LOOM_OK
                                       : blas_fail(err, "backward input", (int)st, N, IC, OC);
}

/* dW^T[IC x OC] += inp[IC x N] x dout^T[N x OC]; dW is fp32 for either input type. */
template <typename T>
static loom_status backward_weight(loom_cuda_ctx *ctx, float *dweight, float *dbias, const T *dout,
                                   const T *inp, int N, int IC, int OC, cudaDataType_t type,
                                   loom_error *err) {
    if (N <= 0 || OC <= 0) return LOOM_OK;
    if (IC > 0) {
        const float one = 1.0f;
        cublasStatus_t st = cublasGemmEx((cublasHandle_t)ctx->blas, CUBLAS_OP_N, CUBLAS_OP_T, IC,
                                         OC, N, &one, inp, type, IC, dout, type, OC, &one, dweight,
                                         CUDA_R_32F, IC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return blas_fail(err, "backward weight", (int)st, N, IC, OC);
    }
    if (dbias)
        bias_grad_kernel<<<(unsigned)((OC + 31) / 32), dim3(32, COL_LANES), 0, ctx->stream>>>(
            dbias, dout, N, OC);
    return LOOM_OK;
}

/* The first failure stays in the context (sticky); later calls still run. */
static void keep(loom_cuda_ctx *ctx, loom_status st, const loom_error *e) {
    if (st != LOOM_OK && ctx->status == LOOM_OK) {
        ctx->status = st;
        ctx->error = *e;
    }
}

extern "C" {

void loom_cuda_linear_forward(loom_cuda_ctx *ctx, float *out, const float *inp, const float *weight,
                              const float *bias, int N, int IC, int OC) {
    loom_error e;
    keep(ctx, forward(ctx, out, inp, weight, bias, N, IC, OC, CUDA_R_32F, CUDA_R_32F, &e), &e);
}
void loom_cuda_linear_backward_input(loom_cuda_ctx *ctx, float *dinp, const float *dout,
                                     const float *weight, int N, int IC, int OC) {
    loom_error e;
    keep(ctx, backward_input(ctx, dinp, dout, weight, N, IC, OC, CUDA_R_32F, CUDA_R_32F, &e), &e);
}
void loom_cuda_linear_backward_weight(loom_cuda_ctx *ctx, float *dweight, float *dbias,
                                      const float *dout, const float *inp, int N, int IC, int OC) {
    loom_error e;
    keep(ctx, backward_weight(ctx, dweight, dbias, dout, inp, N, IC, OC, CUDA_R_32F, &e), &e);
}
void loom_cuda_linear_forward_bf16(loom_cuda_ctx *ctx, loom_bf16 *out, const loom_bf16 *inp,
                                   const loom_bf16 *weight, const loom_bf16 *bias, int N, int IC,
                                   int OC) {
    loom_error e;
    keep(ctx,
         forward(ctx, as_bf16(out), as_bf16(inp), as_bf16(weight), as_bf16(bias), N, IC, OC,
                 CUDA_R_16BF, CUDA_R_16BF, &e),
         &e);
}
void loom_cuda_linear_backward_input_bf16(loom_cuda_ctx *ctx, loom_bf16 *dinp,
                                          const loom_bf16 *dout, const loom_bf16 *weight, int N,
                                          int IC, int OC) {
    loom_error e;
    keep(ctx, backward_input(ctx, dinp, dout, weight, N, IC, OC, CUDA_R_16BF, CUDA_R_16BF, &e), &e);
}
void loom_cuda_linear_backward_weight_bf16(loom_cuda_ctx *ctx, float *dweight, float *dbias,
                                           const loom_bf16 *dout, const loom_bf16 *inp, int N,
                                           int IC, int OC) {
    loom_error e;
    keep(ctx,
         backward_weight(ctx, dweight, dbias, as_bf16(dout), as_bf16(inp), N, IC, OC, CUDA_R_16BF,
                         &e),
         &e);
}
void loom_cuda_linear_forward_bf16_f32(loom_cuda_ctx *ctx, float *out, const loom_bf16 *inp,
                                       const loom_bf16 *weight, const float *bias, int N, int IC,
                                       int OC) {
    loom_error e;
    keep(ctx,
         forward(ctx, out, as_bf16(inp), as_bf16(weight), bias, N, IC, OC, CUDA_R_16BF, CUDA_R_32F,
                 &e),
         &e);
}
void loom_cuda_linear_backward_input_bf16_f32(loom_cuda_ctx *ctx, float *dinp,
                                              const loom_bf16 *dout, const loom_bf16 *weight, int N,
                                              int IC, int OC) {
    loom_error e;
    keep(ctx, backward_input(ctx, dinp, dout, weight, N, IC, OC, CUDA_R_16BF, CUDA_R_32F, &e), &e);
}

} /* extern "C" */
