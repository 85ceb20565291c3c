/* IDX files (the MNIST format), plain or gzip-compressed.
 *
 * An IDX file is a big-endian header, then the data: 4 bytes magic 0x0000TTDD (TT = 0x08
 * for unsigned bytes, DD = the number of dimensions), DD big-endian uint32 sizes, then the
 * product of the sizes in bytes, row-major. loom reads two kinds:
 *   images: magic 0x00000803, sizes [n, rows, cols], n*rows*cols uint8 pixels;
 *   labels: magic 0x00000801, size [n], n uint8 labels.
 * The file may be gzip-compressed (zlib reads plain files too). Nothing may follow the
 * data. Errors (LOOM_ERR_INPUT) name the file and what was expected. */
#ifndef LOOM_DATA_IDX_H
#define LOOM_DATA_IDX_H

#include <stdint.h>

#include "core/error.h"

#define LOOM_IDX_MAGIC_IMAGES 0x00000803u
#define LOOM_IDX_MAGIC_LABELS 0x00000801u

typedef struct {
    int64_t n;
    int rows, cols;
    uint8_t *pixels; /* [n][rows][cols], malloc'd */
} loom_idx_images;

/* Reads an IDX image file; n >= 1, rows and cols in 1..65535. */
loom_status loom_idx_read_images(const char *path, loom_idx_images *out, loom_error *err);
void loom_idx_images_free(loom_idx_images *img);

/* Reads an IDX label file into *labels (malloc'd, *n of them, n >= 1). */
loom_status loom_idx_read_labels(const char *path, uint8_t **labels, int64_t *n, loom_error *err);

#endif
