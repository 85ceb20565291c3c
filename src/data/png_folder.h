/* A labelled image folder: DIR/CLASS/IMAGE.png.
 *
 * Every subfolder of DIR (hidden ones skipped) is a class; class index = the subfolder's
 * position in bytewise-sorted name order (an empty subfolder still takes its index). In
 * each, the files whose names end in .png (any case; hidden files skipped, other files
 * ignored) are read in sorted order with libpng: gray, gray+alpha, RGB, RGBA and palette
 * images of 1-16 bits. 16-bit samples are scaled to 8 bits (round(v*255/65535)), alpha
 * and tRNS transparency are dropped, gray is replicated to RGB for 3 channels and RGB is
 * converted to gray with libpng's default weights (about 0.2126 R + 0.7152 G + 0.0722 B)
 * for 1 channel. With channels 0 (auto) the images are read as RGB and kept with 1
 * channel when every pixel of every image has R == G == B, else 3. Every image must have
 * the height and width of the first. Errors name the file and what was expected. */
#ifndef LOOM_DATA_PNG_FOLDER_H
#define LOOM_DATA_PNG_FOLDER_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    int64_t n;
    int channels, height, width, n_classes;
    uint8_t *pixels;    /* [n][channels][height][width] */
    int32_t *labels;    /* [n], sorted by class */
    char **class_names; /* [n_classes] subfolder names */
} loom_png_folder;

/* channels: 1, 3 or 0 (auto, above). */
loom_status loom_png_folder_read(const char *dir, int channels, loom_png_folder *out,
                                 loom_error *err);
void loom_png_folder_free(loom_png_folder *f);

/* Reads one PNG as *pixels [channels][*height][*width] (malloc'd), channels 1 or 3, with
 * the conversions above. */
loom_status loom_png_read(const char *path, int channels, uint8_t **pixels, int *height, int *width,
                          loom_error *err);

#endif
