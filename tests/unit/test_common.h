/* Helpers shared by the unit tests: a reproducible random stream (splitmix64, seeded
 * per run and printed by each test's main) and a scratch folder per test group. */
#ifndef LOOM_TEST_COMMON_H
#define LOOM_TEST_COMMON_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t g_rng;

static inline uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline int test_rm_entry(const char *path, const struct stat *sb, int flag,
                                struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* cmocka group setup/teardown: *state is a fresh folder under /tmp, removed after. */
static inline int setup_dir(void **state) {
    char *dir = strdup("/tmp/loom_test_XXXXXX");
    if (!dir || !mkdtemp(dir)) return -1;
    *state = dir;
    return 0;
}

static inline int teardown_dir(void **state) {
    nftw(*state, test_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(*state);
    return 0;
}

#endif
