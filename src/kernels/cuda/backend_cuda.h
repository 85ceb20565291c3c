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

#endif
