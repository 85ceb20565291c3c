/* Strided 2-D copies and adds (kernels.h): the re-layout steps of context parallelism
 * (packing key/value blocks, head/sequence all-to-all buffers). Rows are split across
 * threads statically, so the result does not depend on timing. */
#include "kernels/kernels.h"

#include <string.h>

void loom_copy_2d(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                  size_t width) {
#pragma omp parallel for schedule(static) if (rows * width > 65536)
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_ld, src + r * src_ld, width * 4);
}

void loom_add_2d(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                 size_t width) {
#pragma omp parallel for schedule(static) if (rows * width > 65536)
    for (size_t r = 0; r < rows; r++) {
        float *restrict d = dst + r * dst_ld;
        const float *restrict s = src + r * src_ld;
        for (size_t c = 0; c < width; c++) d[c] += s[c];
    }
}
