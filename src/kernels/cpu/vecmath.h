/* Small vectorisable math helpers for the CPU kernels. libm's expf is an opaque call
 * that blocks auto-vectorisation, and plain float sum reductions are not vectorised
 * without -ffast-math; these helpers keep softmax-style loops SIMD-friendly. */
#ifndef LOOM_KERNELS_CPU_VECMATH_H
#define LOOM_KERNELS_CPU_VECMATH_H

#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Hot elementwise/row loops are compiled three times (AVX-512, AVX2+FMA, baseline) and
 * the best one for the CPU is picked when the program loads (GCC function multi-
 * versioning), since the build itself targets baseline x86-64. OpenMP-outlined loop
 * bodies do not inherit the clones, so the loops live in LOOM_SIMD functions over a
 * [lo, hi) range and the public kernels split the range across threads with
 * loom_thread_range (static, equal split: results do not depend on timing). */
#define LOOM_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))

/* This thread's share [lo, hi) of n items inside an OpenMP parallel region. */
static inline void loom_thread_range(size_t n, size_t *lo, size_t *hi) {
    size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

/* expf via range reduction x = n ln2 + r and a Cephes degree-6 polynomial; relative
 * error ~1e-7. x is clamped to [-87, 88]: inputs below -87 return exp(-87) (~1.6e-38)
 * instead of 0, negligible inside softmax sums that include exp(0) = 1. The clamp is
 * done on the bit pattern because float compares block if-conversion (and so
 * vectorisation) under the default -ftrapping-math. */
static inline __attribute__((always_inline)) float loom_expf(float x) {
    uint32_t ux;
    memcpy(&ux, &x, sizeof ux);
    ux = ux > 0xC2AE0000u ? 0xC2AE0000u : ux; /* x < -87 (sign bit set, larger magnitude) */
    int32_t ix = (int32_t)ux;
    ix = ix > 0x42B00000 ? 0x42B00000 : ix; /* x > 88 */
    memcpy(&x, &ix, sizeof x);
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    int32_t ni;
    memcpy(&ni, &t, sizeof ni);
    ni -= 0x4B400000; /* low mantissa bits of t hold n */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * r * r + r + 1.0f;
    int32_t bits = (ni + 127) << 23; /* 2^n; n is in [-126, 127] after the clamp */
    float s;
    memcpy(&s, &bits, sizeof s);
    return e * s;
}

/* Sum in double with eight independent partial sums, so the loop vectorises. */
static inline __attribute__((always_inline)) double loom_sum_f64(const float *x, int n) {
    double part[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) part[k] += x[j + k];
    double s = 0.0;
    for (; j < n; j++) s += x[j];
    for (int k = 0; k < 8; k++) s += part[k];
    return s;
}

/* Maximum of n >= 1 values, eight running maxima so the loop vectorises. */
static inline __attribute__((always_inline)) float loom_max_f32(const float *x, int n) {
    float part[8];
    for (int k = 0; k < 8; k++) part[k] = x[0];
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) part[k] = x[j + k] > part[k] ? x[j + k] : part[k];
    float m = x[0];
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    for (int k = 0; k < 8; k++) m = part[k] > m ? part[k] : m;
    return m;
}

#endif
