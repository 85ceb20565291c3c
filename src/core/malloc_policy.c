#include "core/malloc_policy.h"

#include <limits.h>
#include <malloc.h>
#include <stdlib.h>

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
    return ok;
}
