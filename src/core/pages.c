#include "core/pages.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void loom_pages_release(void *base, size_t begin, size_t end) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)base + begin, e = (uintptr_t)base + end;
    a = (a + page - 1) / page * page;
    e = e / page * page;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}
