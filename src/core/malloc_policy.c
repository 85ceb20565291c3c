#include "core/malloc_policy.h"

#include <limits.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>

static int policy_set;      /* loom_malloc_keep_pages set the policy in this process */
static void *reserve_guard; /* the live block above the small-block reserve (never freed) */

int loom_malloc_keep_pages(void) {
    static const char *user[] = {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_",
                                 "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"};
    for (size_t i = 0; i < sizeof user / sizeof user[0]; i++)
        if (getenv(user[i])) return 0;
    /* All three: without the second a freed block at the top of the heap is trimmed back
     * to the kernel; without the third a thread's own arena, whose heaps hold at most
     * 64 MiB, serves a larger block with a fresh mmap whatever M_MMAP_MAX says (glibc's
     * sysmalloc falls back to mmap when such a heap cannot grow) and unmaps it on free:
     * the engine thread's libnbc temporary buffer of a 498 MB gradient all-reduce was new
     * memory every step (docs/ARCHITECTURE.md, "Memory the allocator keeps"). One arena
     * costs little here: loom's hot loops do not allocate. */
    int ok = mallopt(M_MMAP_MAX, 0) == 1;
    ok &= mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
    ok &= mallopt(M_ARENA_MAX, 1) == 1;
    policy_set = ok;
    return ok;
}

int loom_malloc_reserve_small(void) {
    if (!policy_set || reserve_guard) return 0;
    char *r = malloc(LOOM_MALLOC_SMALL_RESERVE);
    if (!r) return 0;
    /* A live block above the reserve keeps it from merging into the heap's top when it
     * is freed. A block of a size no tcache or fast bin holds comes from the smallest free
     * chunk that fits, else from the top (above r); the ones that land below r are given
     * back after. */
    enum { GUARD = 4096, TRIES = 64 };
    void *below[TRIES];
    int n = 0;
    while (n < TRIES) {
        char *g = malloc(GUARD);
        if (!g) break;
        if ((uintptr_t)g > (uintptr_t)r) {
            reserve_guard = g;
            break;
        }
        below[n++] = g;
    }
    free(r); /* the reserve: a free chunk bounded by live blocks, glibc's best fit for every
                small block that no smaller free chunk holds */
    for (int i = 0; i < n; i++) free(below[i]);
    return reserve_guard != NULL;
}
