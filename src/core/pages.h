/* Handing memory pages back to the kernel (anonymous mappings: they read as zero after). */
#ifndef LOOM_CORE_PAGES_H
#define LOOM_CORE_PAGES_H

#include <stddef.h>

/* Hands the whole pages inside [base + begin, base + end) (bytes) back to the kernel; the
 * pages the range only partly covers stay, so neighbours' bytes are never touched. */
void loom_pages_release(void *base, size_t begin, size_t end);

#endif
