/* CUDA devices and the per-device context (stream, cuBLAS/cuBLASLt handles, the Lt
 * workspace). Every failure is a loom_status with the CUDA reason, never an abort: with
 * no driver or no GPU the caller gets "no CUDA device: <reason>". */
#include "kernels/cuda/kernels_cuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <string.h>

/* The Lt heuristics pick faster algorithms with a workspace; 32 MiB is cuBLAS's advice
 * for Hopper. Allocated once with the context, never in the step loop. */
#define LOOM_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

static loom_status cuda_fail(loom_error *err, cudaError_t e, const char *what) {
    return loom_error_set(err, LOOM_ERR_STATE, "%s: %s (%s)", what, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

loom_status loom_cuda_devices(loom_cuda_device *out, int max, int *count, loom_error *err) {
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return loom_error_set(err, LOOM_ERR_STATE, "no CUDA device: %s", cudaGetErrorString(e));
    }
    if (n == 0) return loom_error_set(err, LOOM_ERR_STATE, "no CUDA device: none found");
    for (int i = 0; i < n && i < max; i++) {
        struct cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess) return cuda_fail(err, e, "cudaGetDeviceProperties");
        loom_cuda_device *d = &out[i];
        memset(d, 0, sizeof *d);
        d->index = i;
        snprintf(d->name, sizeof d->name, "%s", p.name);
        d->cc_major = p.major;
        d->cc_minor = p.minor;
        d->sm_count = p.multiProcessorCount;
        d->total_bytes = p.totalGlobalMem;
        if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&d->free_bytes, &d->total_bytes);
    }
    *count = n;
    return LOOM_OK;
}

loom_status loom_cuda_check(const char *what, int sync, loom_error *err) {
    cudaError_t e = sync ? cudaDeviceSynchronize() : cudaSuccess;
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? LOOM_OK : cuda_fail(err, e, what);
}

void loom_cuda_ctx_destroy(loom_cuda_ctx *ctx) {
    if (ctx->blaslt) cublasLtDestroy((cublasLtHandle_t)ctx->blaslt);
    if (ctx->blas) cublasDestroy((cublasHandle_t)ctx->blas);
    if (ctx->workspace) cudaFree(ctx->workspace);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    memset(ctx, 0, sizeof *ctx);
}

loom_status loom_cuda_ctx_create(loom_cuda_ctx *ctx, int device, loom_error *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->device = device;
    loom_cuda_device devs[16];
    int n = 0;
    if (loom_cuda_devices(devs, 16, &n, err) != LOOM_OK) return err ? err->code : LOOM_ERR_STATE;
    if (device < 0 || device >= n)
        return loom_error_set(err, LOOM_ERR_INPUT, "CUDA device %d: expected 0..%d", device, n - 1);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(&ctx->workspace, LOOM_CUDA_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        loom_cuda_ctx_destroy(ctx);
        return cuda_fail(err, e, "CUDA context");
    }
    ctx->workspace_bytes = LOOM_CUDA_WORKSPACE_BYTES;
    cublasHandle_t h = NULL;
    cublasLtHandle_t lt = NULL;
    cublasStatus_t st = cublasCreate(&h);
    ctx->blas = h;
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(h, ctx->stream);
    /* Plain fp32 math: no TF32 for fp32 GEMMs (the fp32 mode is the 1e-4 reference). */
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSetWorkspace(h, ctx->workspace, ctx->workspace_bytes);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtCreate(&lt);
    ctx->blaslt = lt;
    if (st != CUBLAS_STATUS_SUCCESS) {
        loom_cuda_ctx_destroy(ctx);
        return loom_error_set(err, LOOM_ERR_STATE, "cuBLAS initialisation failed (status %d)",
                              (int)st);
    }
    return LOOM_OK;
}

loom_status loom_cuda_ctx_status(loom_cuda_ctx *ctx, int sync, loom_error *err) {
    if (ctx->status == LOOM_OK) {
        cudaError_t e = sync ? cudaStreamSynchronize(ctx->stream) : cudaSuccess;
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) ctx->status = cuda_fail(&ctx->error, e, "CUDA");
    }
    if (ctx->status != LOOM_OK && err) *err = ctx->error;
    return ctx->status;
}
