/* Pictures of samples: PNG grids and strips (libpng) and animated GIFs (giflib).
 *
 * Grid layout: cell i (0-based) is at row i / cols, column i % cols, where cols is
 * min(cols, n) and rows = ceil(n / cols); cells are separated by 1-pixel gaps of dark
 * gray (LOOM_PICTURE_GAP) with no outer border, so the picture is
 * (rows*H + rows-1) x (cols*W + cols-1) pixels; cells past n are gap-coloured. Images are
 * uint8 [C][H][W] planes, C 1 (gray) or 3 (RGB). Files are written as PATH.tmp and renamed,
 * so PATH is either complete or untouched. */
#ifndef LOOM_DATA_PICTURE_H
#define LOOM_DATA_PICTURE_H

#include <stdint.h>

#include "core/error.h"

#define LOOM_PICTURE_GAP 32 /* gap gray level */

/* images [n][C][H][W] as an 8-bit gray (C 1) or RGB (C 3) PNG grid of `cols` columns. */
loom_status loom_picture_write_png_grid(const char *path, const uint8_t *images, int n,
                                        int channels, int height, int width, int cols,
                                        loom_error *err);

/* clips [n][F][C][H][W] as a looping animated GIF (NETSCAPE2.0 extension): GIF frame f is
 * the grid of frame f of every clip, shown for delay_cs hundredths of a second. Palette:
 * 256 grays for C 1 (index = value); for C 3 a fixed 6x7x6 colour cube (R and B in 6
 * levels, G in 7; index (r*7 + g)*6 + b, level = round(v * (levels-1) / 255)) plus the gap
 * gray at index 252. */
loom_status loom_picture_write_gif(const char *path, const uint8_t *clips, int n, int frames,
                                   int channels, int height, int width, int cols, int delay_cs,
                                   loom_error *err);

/* clips [n][F][C][H][W] as a PNG with one row per clip and one column per frame. */
loom_status loom_picture_write_png_strip(const char *path, const uint8_t *clips, int n, int frames,
                                         int channels, int height, int width, loom_error *err);

#endif
