#include "core/philox.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

loom_philox_block loom_philox4x32(const uint32_t counter[4], const uint32_t key[2]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    loom_philox_block out = {{c0, c1, c2, c3}};
    return out;
}

double loom_philox_uniform(uint32_t bits) {
    return ((double)bits + 0.5) / 4294967296.0;
}

double loom_philox_normal(uint64_t seed, uint32_t stream_id, uint64_t index) {
    uint32_t counter[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ stream_id};
    loom_philox_block r = loom_philox4x32(counter, key);
    double u1 = loom_philox_uniform(r.v[0]), u2 = loom_philox_uniform(r.v[1]);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t loom_philox_u64(uint64_t seed, uint32_t stream_id, uint64_t a, uint32_t b) {
    uint32_t counter[4] = {(uint32_t)a, (uint32_t)(a >> 32), b, 1};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ stream_id};
    loom_philox_block r = loom_philox4x32(counter, key);
    return ((uint64_t)r.v[1] << 32) | r.v[0];
}

uint32_t loom_hash_name(const char *name) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h;
}
