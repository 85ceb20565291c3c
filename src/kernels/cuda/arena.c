/* The device memory arena: one cudaMalloc at start-up, carved by bump allocation like
 * the activation carver of model/transformer.c, so the step loop never calls cudaMalloc
 * (which synchronizes the device). Scratch scopes release back to a mark; the high-water
 * mark is the peak device memory the run needed. */
#include "kernels/cuda/kernels_cuda.h"

#include <stdio.h>
#include <string.h>

#define LOOM_ARENA_ALIGN 256 /* cudaMalloc's alignment: vector loads and cuBLAS like it */

loom_status loom_cuda_arena_create(loom_cuda_arena *a, size_t bytes, loom_error *err) {
    memset(a, 0, sizeof *a);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "device arena of %zu bytes: %s (device has %zu of %zu bytes free)",
                              bytes, cudaGetErrorString(e), free_b, total_b);
    }
    a->base = p;
    a->size = bytes;
    return LOOM_OK;
}

void loom_cuda_arena_destroy(loom_cuda_arena *a) {
    if (a->base) cudaFree(a->base);
    memset(a, 0, sizeof *a);
}

void *loom_cuda_arena_alloc(loom_cuda_arena *a, size_t bytes, const char *what, loom_error *err) {
    size_t at = (a->used + LOOM_ARENA_ALIGN - 1) / LOOM_ARENA_ALIGN * LOOM_ARENA_ALIGN;
    if (at > a->size || bytes > a->size - at) {
        loom_error_set(err, LOOM_ERR_NOMEM,
                       "device arena: %s needs %zu bytes, %zu of %zu left (plan a larger arena)",
                       what, bytes, a->size - (a->used < a->size ? a->used : a->size), a->size);
        return NULL;
    }
    a->used = at + bytes;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + at;
}

size_t loom_cuda_arena_mark(const loom_cuda_arena *a) {
    return a->used;
}

void loom_cuda_arena_release(loom_cuda_arena *a, size_t mark) {
    if (mark <= a->used) a->used = mark;
}

void loom_cuda_arena_report(const loom_cuda_arena *a, char *buf, size_t len) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    size_t free_b = 0, total_b = 0;
    int have = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
    if (!have) cudaGetLastError();
    int k = snprintf(buf, len, "arena %.3f GiB: peak %.3f GiB used", (double)a->size / gib,
                     (double)a->peak / gib);
    if (have && k >= 0 && (size_t)k < len)
        snprintf(buf + k, len - (size_t)k, "; device %.1f GiB total, %.1f GiB free",
                 (double)total_b / gib, (double)free_b / gib);
}
