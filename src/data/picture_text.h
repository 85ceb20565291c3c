/* Text in pictures: lines of text drawn with FreeType in DejaVu Sans (Debian's
 * fonts-dejavu-core), and a PNG sheet of gray images with a caption under each (the vlm
 * journey's held-out grids with the model's text, docs/vlm.md).
 *
 * The font file: $LOOM_FONT when set, else the first of DejaVuSans.ttf's usual places
 * (Debian/Ubuntu /usr/share/fonts/truetype/dejavu, Fedora /usr/share/fonts/dejavu-sans-fonts
 * and /usr/share/fonts/dejavu, Arch /usr/share/fonts/TTF) that exists; none: one error
 * naming the places tried and the package (fonts-dejavu-core). */
#ifndef LOOM_DATA_PICTURE_TEXT_H
#define LOOM_DATA_PICTURE_TEXT_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    void *library, *face; /* FT_Library, FT_Face */
    int pixels;           /* the size: an em of `pixels` pixels */
    int line_height;      /* baseline to baseline, pixels */
    int ascent;           /* baseline below a line's top, pixels */
    int descent;          /* the lowest ink below the baseline, pixels */
    char path[512];       /* the font file opened */
} loom_font;

/* Opens the font at an em of `pixels` (4..200) pixels. */
loom_status loom_font_open(loom_font *f, int pixels, loom_error *err);
void loom_font_close(loom_font *f);
/* Width in pixels of text (bytes as Latin-1 code points, control bytes < 32 skipped)
 * drawn in one line. */
int loom_font_width(const loom_font *f, const char *text, int len);
/* Draws len bytes of text in one line, ink 0 (black) blended over the gray image
 * [height][width] by glyph coverage, with the line's top-left at (x, y); clipped to the
 * image. */
void loom_font_draw(const loom_font *f, uint8_t *gray, int height, int width, int x, int y,
                    const char *text, int len);
/* Breaks text into lines no wider than max_width at spaces (a word wider than a line is cut
 * where it overflows) and draws them from (x, y) down, at most max_lines; returns the
 * number of lines drawn. */
int loom_font_draw_wrapped(const loom_font *f, uint8_t *gray, int height, int width, int x, int y,
                           int max_width, int max_lines, const char *text);

/* A PNG sheet of n gray images [n][height][width], `cols` per row, each scaled up by
 * `scale` (1..8, nearest) in a white cell with texts[i] under it in up to `lines` wrapped
 * lines of the font; written as PATH.tmp and renamed (data/picture.h). */
loom_status loom_picture_write_captioned(const char *path, const uint8_t *images, int n, int height,
                                         int width, int scale, int cols, const char *const *texts,
                                         const loom_font *f, int lines, loom_error *err);

#endif
