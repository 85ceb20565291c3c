/* bf16 storage (bfloat16: fp32's sign and 8-bit exponent, 7 stored mantissa bits) and its
 * conversions. A bf16 value is a uint16_t holding the top half of an fp32's bits, so
 * widening is exact (a shift) and narrowing is a rounding:
 *  - round to nearest, ties to even (the default everywhere, what oneDNN and PyTorch's
 *    .to(torch.bfloat16) do for normal numbers);
 *  - fp32 subnormal inputs become a zero of the same sign (as AVX512-BF16's
 *    VCVTNE2PS2BF16 does, which never consults MXCSR: the scalar path matches it
 *    bitwise); fp32 normals never round to a bf16 subnormal (same exponent range);
 *  - NaN stays NaN and becomes quiet: the top 16 bits with the quiet bit (0x0040) set;
 *  - +-inf stays +-inf; a finite value at or above the largest finite bf16 plus half
 *    an ulp (0x7F7F8000 and up, ties to even) rounds to inf.
 * Stochastic rounding adds 16 random bits below the kept half before truncating, so a
 * value rounds up with probability (distance to the lower bf16) / ulp; the bits come from
 * Philox keyed by (seed, stream) at counter (element index / 8), so any split of a buffer
 * over threads or shards draws the same bits for the same element (bitwise reproducible).
 * The _n functions pick AVX512-BF16 at run time where the CPU has it (cpuid), else AVX2,
 * else a scalar loop; all give the same bits (tests/unit/test_bf16.c). */
#ifndef LOOM_KERNELS_BF16_H
#define LOOM_KERNELS_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t loom_bf16;

static inline uint32_t loom_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float loom_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float loom_bf16_to_f32(loom_bf16 h) {
    return loom_f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even (see above for subnormals, NaN and overflow). */
static inline loom_bf16 loom_bf16_from_f32(float x) {
    uint32_t u = loom_f32_bits(x);
    uint32_t e = u & 0x7F800000u;
    if (e == 0x7F800000u) /* inf stays inf; NaN: quiet, top payload bits kept */
        return (loom_bf16)((u >> 16) | ((u & 0x007FFFFFu) ? 0x0040u : 0u));
    if (e == 0) return (loom_bf16)((u >> 16) & 0x8000u); /* zero, subnormal: signed zero */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (loom_bf16)(u >> 16);
}

/* Stochastic rounding with 16 random bits r (uniform in [0, 2^16)). */
static inline loom_bf16 loom_bf16_from_f32_sr(float x, uint32_t r) {
    uint32_t u = loom_f32_bits(x);
    uint32_t e = u & 0x7F800000u;
    if (e == 0x7F800000u) return (loom_bf16)((u >> 16) | ((u & 0x007FFFFFu) ? 0x0040u : 0u));
    if (e == 0) return (loom_bf16)((u >> 16) & 0x8000u);
    u += r & 0xFFFFu;
    return (loom_bf16)(u >> 16);
}

/* Whether this CPU has AVX512-BF16 (cpuid leaf 7 subleaf 1, EAX bit 5) and AMX-BF16
 * (leaf 7 subleaf 0, EDX bit 22); LOOM_BF16_PRETEND_NO_CPU=1 in the environment makes
 * both report 0 (to test what a CPU without them does). */
int loom_cpu_has_avx512_bf16(void);
int loom_cpu_has_amx_bf16(void);

/* dst[i] = round_nearest_even(src[i]) over n values (AVX512-BF16 or scalar). */
void loom_bf16_from_f32_n(loom_bf16 *dst, const float *src, size_t n);
/* dst[i] = widen(src[i]) (exact). */
void loom_bf16_to_f32_n(float *dst, const loom_bf16 *src, size_t n);
/* dst[i] = widen(pieces[i]) + widen(pieces[n + i]) + ... + widen(pieces[(count-1) n + i]),
 * added in fp32 in piece order (count >= 1): the sum of bf16 messages from `count` ranks,
 * received in rank order, that does not depend on which arrived first or on the collective's
 * algorithm (the gradient reduction with --grad-reduce-dtype bf16, parallel/zero_bf16.c; the
 * tensor-parallel sums under --precision bf16, tp/tp.c). */
void loom_bf16_sum_pieces(float *dst, const loom_bf16 *pieces, size_t n, int count);
/* The two paths of loom_bf16_from_f32_n, for the tests; _avx512 returns 0 without doing
 * anything where the CPU has no AVX512-BF16, 1 otherwise. */
void loom_bf16_from_f32_n_scalar(loom_bf16 *dst, const float *src, size_t n);
int loom_bf16_from_f32_n_avx512(loom_bf16 *dst, const float *src, size_t n);
/* The same rule in AVX2 integer operations (CPUs without AVX512-BF16): 0 without AVX2. */
int loom_bf16_from_f32_n_avx2(loom_bf16 *dst, const float *src, size_t n);
/* Stochastic rounding of elements index0 .. index0 + n - 1 of stream (seed, stream). */
void loom_bf16_from_f32_stochastic_n(loom_bf16 *dst, const float *src, size_t n, uint64_t seed,
                                     uint32_t stream, uint64_t index0);
/* The 16 random bits stochastic rounding uses for element `index` of (seed, stream). */
uint32_t loom_bf16_sr_bits(uint64_t seed, uint32_t stream, uint64_t index);

#endif
