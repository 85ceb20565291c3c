/* The outer gradient's wire format (parallel/outer.h): fp32 as is, bf16 rounded to
 * nearest even by kernels/bf16.h (as every bf16 in loom: subnormals to signed zero),
 * int8 / int4 with one fp32 absmax scale per block (symmetric: int8 in [-127, 127],
 * int4 in [-7, 7] stored as q + 8, two per byte, low nibble first). Scales
 * come first, then the values. */
#include <math.h>
#include <string.h>

#include "kernels/bf16.h"
#include "parallel/outer.h"

static size_t blocks_of(size_t n, int block) {
    return (n + (size_t)block - 1) / (size_t)block;
}

size_t loom_outer_wire_bytes(loom_outer_dtype dtype, size_t n, int block) {
    switch (dtype) {
    case LOOM_OUTER_BF16:
        return 2 * n;
    case LOOM_OUTER_INT8:
        return 4 * blocks_of(n, block) + n;
    case LOOM_OUTER_INT4:
        return 4 * blocks_of(n, block) + (n + 1) / 2;
    case LOOM_OUTER_FP32:
    default:
        return 4 * n;
    }
}

void loom_outer_quantize(loom_outer_dtype dtype, const float *x, size_t n, int block,
                         uint8_t *out) {
    if (dtype == LOOM_OUTER_FP32) {
        memcpy(out, x, n * sizeof(float));
        return;
    }
    if (dtype == LOOM_OUTER_BF16) {
        for (size_t i = 0; i < n; i++) {
            loom_bf16 h = loom_bf16_from_f32(x[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return;
    }
    const size_t nb = blocks_of(n, block);
    const float qmax = dtype == LOOM_OUTER_INT8 ? 127.0f : 7.0f;
    uint8_t *vals = out + 4 * nb;
    if (dtype == LOOM_OUTER_INT4) memset(vals, 0, (n + 1) / 2);
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + block : n;
        float amax = 0.0f;
        for (size_t i = lo; i < hi; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float scale = amax / qmax, inv = amax > 0.0f ? qmax / amax : 0.0f;
        memcpy(out + 4 * b, &scale, 4);
        for (size_t i = lo; i < hi; i++) {
            float q = nearbyintf(x[i] * inv);
            q = q > qmax ? qmax : q < -qmax ? -qmax : q;
            if (dtype == LOOM_OUTER_INT8) {
                vals[i] = (uint8_t)(int8_t)q;
            } else {
                const uint8_t nib = (uint8_t)((int)q + 8);
                vals[i / 2] |= (uint8_t)(i % 2 ? nib << 4 : nib);
            }
        }
    }
}

void loom_outer_dequantize(loom_outer_dtype dtype, const uint8_t *in, size_t n, int block,
                           float *x) {
    if (dtype == LOOM_OUTER_FP32) {
        memcpy(x, in, n * sizeof(float));
        return;
    }
    if (dtype == LOOM_OUTER_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, in + 2 * i, 2);
            x[i] = loom_bf16_to_f32(h);
        }
        return;
    }
    const size_t nb = blocks_of(n, block);
    const uint8_t *vals = in + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + block : n;
        float scale;
        memcpy(&scale, in + 4 * b, 4);
        for (size_t i = lo; i < hi; i++) {
            const int q = dtype == LOOM_OUTER_INT8
                              ? (int)(int8_t)vals[i]
                              : (int)((vals[i / 2] >> (i % 2 ? 4 : 0)) & 15) - 8;
            x[i] = (float)q * scale;
        }
    }
}
