/* bf16 conversions (kernels/bf16.h): a scalar path, AVX512-BF16's VCVTNE2PS2BF16 and an
 * AVX2 version of the scalar rule (CPUs without AVX-512), chosen at run time by cpuid,
 * equal bit for bit. */
#include "kernels/bf16.h"

#include <cpuid.h>
#include <stdlib.h>

#include "core/philox.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LOOM_BF16_X86 1
#endif

static int pretend_missing(void) {
    const char *e = getenv("LOOM_BF16_PRETEND_NO_CPU");
    return e && e[0] && strcmp(e, "0") != 0;
}

int loom_cpu_has_avx512_bf16(void) {
#ifdef LOOM_BF16_X86
    unsigned a, b, c, d;
    if (pretend_missing() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1u;
#else
    return 0;
#endif
}

int loom_cpu_has_amx_bf16(void) {
#ifdef LOOM_BF16_X86
    unsigned a, b, c, d;
    if (pretend_missing() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (d >> 22) & 1u;
#else
    return 0;
#endif
}

/* Decided once (cpuid without the environment override: the conversion itself is the
 * same bits either way, the override is about the GEMMs). */
static int have_bf16_insn(void) {
    static int cached = -1;
    if (cached < 0) {
#ifdef LOOM_BF16_X86
        unsigned a, b, c, d;
        cached = __get_cpuid_count(7, 1, &a, &b, &c, &d) ? (int)((a >> 5) & 1u) : 0;
#else
        cached = 0;
#endif
    }
    return cached;
}

void loom_bf16_from_f32_n_scalar(loom_bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_from_f32(src[i]);
}

#ifdef LOOM_BF16_X86
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void
from_f32_avx512(loom_bf16 *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo); /* lo in the low half */
        _mm512_storeu_si512((void *)(dst + i), (__m512i)r);
    }
    if (i < n) { /* the tail through masked loads and stores */
        size_t left = n - i;
        __mmask16 m0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __mmask16 m1 = left > 16 ? (__mmask16)((1u << (left - 16)) - 1u) : 0;
        __m512 lo = _mm512_maskz_loadu_ps(m0, src + i);
        __m512 hi = _mm512_maskz_loadu_ps(m1, src + i + 16);
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
        __mmask32 m = (__mmask32)m0 | ((__mmask32)m1 << 16);
        _mm512_mask_storeu_epi16((void *)(dst + i), m, (__m512i)r);
    }
}

/* The scalar rule (bf16.h) on 8 values at a time: round to nearest even by integer
 * addition; inf and NaN (quieted) and zero/subnormal (signed zero) blended in. */
__attribute__((target("avx2"))) static void from_f32_avx2(loom_bf16 *dst, const float *src,
                                                          size_t n) {
    const __m256i exp_mask = _mm256_set1_epi32(0x7F800000), one = _mm256_set1_epi32(1);
    const __m256i bias = _mm256_set1_epi32(0x7FFF), mant = _mm256_set1_epi32(0x007FFFFF);
    const __m256i quiet = _mm256_set1_epi32(0x40), sign = _mm256_set1_epi32(0x8000);
    const __m256i zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i e = _mm256_and_si256(u, exp_mask), hi = _mm256_srli_epi32(u, 16);
        __m256i lsb = _mm256_and_si256(hi, one);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
        __m256i nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, mant), zero),
                                          quiet); /* 0x40 where the mantissa is not 0 */
        __m256i special = _mm256_or_si256(hi, nan);
        r = _mm256_blendv_epi8(r, special, _mm256_cmpeq_epi32(e, exp_mask));
        r = _mm256_blendv_epi8(r, _mm256_and_si256(hi, sign), _mm256_cmpeq_epi32(e, zero));
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
    }
    for (; i < n; i++) dst[i] = loom_bf16_from_f32(src[i]);
}
#endif

static int have_avx2(void) {
#ifdef LOOM_BF16_X86
    static int cached = -1;
    if (cached < 0) cached = __builtin_cpu_supports("avx2") ? 1 : 0;
    return cached;
#else
    return 0;
#endif
}

int loom_bf16_from_f32_n_avx2(loom_bf16 *dst, const float *src, size_t n) {
#ifdef LOOM_BF16_X86
    if (!have_avx2()) return 0;
    from_f32_avx2(dst, src, n);
    return 1;
#else
    (void)dst, (void)src, (void)n;
    return 0;
#endif
}

int loom_bf16_from_f32_n_avx512(loom_bf16 *dst, const float *src, size_t n) {
#ifdef LOOM_BF16_X86
    if (!have_bf16_insn()) return 0;
    from_f32_avx512(dst, src, n);
    return 1;
#else
    (void)dst, (void)src, (void)n;
    return 0;
#endif
}

/* Blocks of this many values per OpenMP task: big enough to amortise, small enough that
 * a weight matrix spreads over the threads. A conversion of one block or less runs on the
 * calling thread without entering an OpenMP region: many callers convert a row at a time
 * (GEMM output rows, attention's columns, the cross-entropy's blocks), and each region,
 * even one an if clause keeps to one thread, costs libgomp a team and a futex wake
 * (measured 2026-12-07: 158,000 regions a step in a bf16 llama, 40% of its step time). */
#define LOOM_BF16_BLOCK 65536

static size_t block_len(size_t n, size_t b) {
    const size_t lo = b * LOOM_BF16_BLOCK;
    return n - lo < LOOM_BF16_BLOCK ? n - lo : LOOM_BF16_BLOCK;
}

static void from_f32_block(loom_bf16 *dst, const float *src, size_t len, int fast) {
    if ((!fast || !loom_bf16_from_f32_n_avx512(dst, src, len)) &&
        !loom_bf16_from_f32_n_avx2(dst, src, len))
        loom_bf16_from_f32_n_scalar(dst, src, len);
}

void loom_bf16_from_f32_n(loom_bf16 *dst, const float *src, size_t n) {
    const int fast = have_bf16_insn();
    const size_t nb = (n + LOOM_BF16_BLOCK - 1) / LOOM_BF16_BLOCK;
    if (nb <= 1) {
        from_f32_block(dst, src, n, fast);
        return;
    }
#pragma omp parallel for
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * LOOM_BF16_BLOCK;
        from_f32_block(dst + lo, src + lo, block_len(n, b), fast);
    }
}

static void to_f32_block(float *dst, const loom_bf16 *src, size_t len) {
    for (size_t i = 0; i < len; i++) dst[i] = loom_bf16_to_f32(src[i]);
}

void loom_bf16_to_f32_n(float *dst, const loom_bf16 *src, size_t n) {
    const size_t nb = (n + LOOM_BF16_BLOCK - 1) / LOOM_BF16_BLOCK;
    if (nb <= 1) {
        to_f32_block(dst, src, n);
        return;
    }
#pragma omp parallel for
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * LOOM_BF16_BLOCK;
        to_f32_block(dst + lo, src + lo, block_len(n, b));
    }
}

static float sum_piece(const loom_bf16 *pieces, size_t n, int count, size_t i) {
    float s = loom_bf16_to_f32(pieces[i]);
    for (int k = 1; k < count; k++) s += loom_bf16_to_f32(pieces[(size_t)k * n + i]);
    return s;
}

void loom_bf16_sum_pieces(float *dst, const loom_bf16 *pieces, size_t n, int count) {
    /* piece order, whatever arrived first: the same sum on every run */
    if (n <= LOOM_BF16_BLOCK) {
        for (size_t i = 0; i < n; i++) dst[i] = sum_piece(pieces, n, count, i);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = sum_piece(pieces, n, count, i);
}

/* One Philox block gives 8 16-bit draws: elements 8k .. 8k+7 share counter k. */
static loom_philox_block sr_block(uint64_t seed, uint32_t stream, uint64_t k) {
    const uint32_t counter[4] = {(uint32_t)k, (uint32_t)(k >> 32), stream, 0x62663136u /* bf16 */};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    return loom_philox4x32(counter, key);
}

static uint32_t sr_lane(const loom_philox_block *r, unsigned lane) {
    return (r->v[lane >> 1] >> ((lane & 1u) * 16u)) & 0xFFFFu;
}

uint32_t loom_bf16_sr_bits(uint64_t seed, uint32_t stream, uint64_t index) {
    loom_philox_block r = sr_block(seed, stream, index >> 3);
    return sr_lane(&r, (unsigned)(index & 7u));
}

/* Elements [lo, hi) of loom_bf16_from_f32_stochastic_n. */
static void stochastic_range(loom_bf16 *dst, const float *src, size_t lo, size_t hi, uint64_t seed,
                             uint32_t stream, uint64_t index0) {
    size_t i = lo;
    while (i < hi) {
        uint64_t g = index0 + i, k = g >> 3;
        loom_philox_block r = sr_block(seed, stream, k);
        for (unsigned lane = (unsigned)(g & 7u); lane < 8 && i < hi; lane++, i++)
            dst[i] = loom_bf16_from_f32_sr(src[i], sr_lane(&r, lane));
    }
}

void loom_bf16_from_f32_stochastic_n(loom_bf16 *dst, const float *src, size_t n, uint64_t seed,
                                     uint32_t stream, uint64_t index0) {
    const size_t nb = (n + LOOM_BF16_BLOCK - 1) / LOOM_BF16_BLOCK;
    if (nb <= 1) { /* one block: no OpenMP region (above) */
        stochastic_range(dst, src, 0, n, seed, stream, index0);
        return;
    }
#pragma omp parallel for
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * LOOM_BF16_BLOCK;
        stochastic_range(dst, src, lo, lo + block_len(n, b), seed, stream, index0);
    }
}
