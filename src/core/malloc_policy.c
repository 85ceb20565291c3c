#include "core/malloc_policy.h"

#include <limits.h>
#include <malloc.h>
#include <stdlib.h>

int loom_malloc_keep_pages(void) {
    static const char *user[] = {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_",
                                 "MALLOC_TRIM_THRESHOLD_"};
    for (size_t i = 0; i < sizeof user / sizeof user[0]; i++)
        if (getenv(user[i])) return 0;
    /* Both: without the second a freed block at the top of the heap is trimmed back to
     * the kernel. A block larger than a thread arena's heap (64 MiB) comes from the main
     * heap then (glibc retries there), so no allocation fails for this. */
    int ok = mallopt(M_MMAP_MAX, 0) == 1;
    ok &= mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
    return ok;
}
