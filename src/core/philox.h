/* Philox-4x32-10 counter-based RNG (Salmon et al., SC'11). Stateless: the same
 * (key, counter) always gives the same numbers, so any shard of a tensor can draw
 * exactly the values of its own global elements. */
#ifndef LOOM_CORE_PHILOX_H
#define LOOM_CORE_PHILOX_H

#include <stdint.h>

typedef struct {
    uint32_t v[4];
} loom_philox_block;

/* One Philox-4x32-10 evaluation. */
loom_philox_block loom_philox4x32(const uint32_t counter[4], const uint32_t key[2]);

/* Uniform in (0, 1), never 0 or 1, from a 32-bit draw. */
double loom_philox_uniform(uint32_t bits);

/* Standard normal for element `index` of stream (seed, stream_id): Box-Muller on the
 * first two words of Philox(counter = {index lo, index hi, 0, 0}, key = {seed lo,
 * seed hi ^ stream_id}). */
double loom_philox_normal(uint64_t seed, uint32_t stream_id, uint64_t index);

/* Uniform 64-bit integer for (seed, stream_id, a, b): used by the data sampler. */
uint64_t loom_philox_u64(uint64_t seed, uint32_t stream_id, uint64_t a, uint32_t b);

/* FNV-1a hash of a string: turns a parameter name into a stream id. */
uint32_t loom_hash_name(const char *name);

#endif
