/* Text in pictures with FreeType (data/picture_text.h). */
#include "data/picture_text.h"

#include <ft2build.h>
#include FT_FREETYPE_H
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/picture.h"

static const char *const FONT_PLACES[] = {
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
};

loom_status loom_font_open(loom_font *f, int pixels, loom_error *err) {
    memset(f, 0, sizeof *f);
    if (pixels < 4 || pixels > 200)
        return loom_error_set(err, LOOM_ERR_INPUT, "font size %d pixels (expected 4..200)", pixels);
    const char *env = getenv("LOOM_FONT");
    if (env && *env) {
        if (access(env, R_OK) != 0)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "LOOM_FONT=%s: no such readable file (expected a TrueType font)",
                                  env);
        snprintf(f->path, sizeof f->path, "%s", env);
    } else {
        for (size_t i = 0; i < sizeof FONT_PLACES / sizeof *FONT_PLACES && !f->path[0]; i++)
            if (access(FONT_PLACES[i], R_OK) == 0)
                snprintf(f->path, sizeof f->path, "%s", FONT_PLACES[i]);
        if (!f->path[0])
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "font: DejaVuSans.ttf not found in %s or 3 other usual places "
                                  "(install fonts-dejavu-core, or set LOOM_FONT to a .ttf file)",
                                  FONT_PLACES[0]);
    }
    FT_Library lib = NULL;
    FT_Face face = NULL;
    if (FT_Init_FreeType(&lib))
        return loom_error_set(err, LOOM_ERR_NOMEM, "font: FreeType did not start");
    if (FT_New_Face(lib, f->path, 0, &face) || FT_Set_Pixel_Sizes(face, 0, (FT_UInt)pixels)) {
        if (face) FT_Done_Face(face);
        FT_Done_FreeType(lib);
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: not a font FreeType can read", f->path);
    }
    f->library = lib;
    f->face = face;
    f->pixels = pixels;
    f->ascent = (int)((face->size->metrics.ascender + 63) >> 6);
    f->descent = (int)((-face->size->metrics.descender + 63) >> 6);
    f->line_height = (int)((face->size->metrics.height + 63) >> 6);
    if (f->line_height < f->ascent + f->descent) f->line_height = f->ascent + f->descent;
    return LOOM_OK;
}

void loom_font_close(loom_font *f) {
    if (f->face) FT_Done_Face((FT_Face)f->face);
    if (f->library) FT_Done_FreeType((FT_Library)f->library);
    memset(f, 0, sizeof *f);
}

int loom_font_width(const loom_font *f, const char *text, int len) {
    FT_Face face = f->face;
    long w = 0;
    for (int i = 0; i < len; i++)
        if ((unsigned char)text[i] >= 32 &&
            !FT_Load_Char(face, (unsigned char)text[i], FT_LOAD_DEFAULT))
            w += face->glyph->advance.x;
    return (int)((w + 63) >> 6);
}

void loom_font_draw(const loom_font *f, uint8_t *gray, int height, int width, int x, int y,
                    const char *text, int len) {
    FT_Face face = f->face;
    const int baseline = y + f->ascent;
    long pen = (long)x << 6;
    for (int i = 0; i < len; i++) {
        if ((unsigned char)text[i] < 32) continue; /* control bytes: nothing drawn */
        if (FT_Load_Char(face, (unsigned char)text[i], FT_LOAD_RENDER)) continue;
        const FT_GlyphSlot g = face->glyph;
        const FT_Bitmap *b = &g->bitmap;
        const int x0 = (int)(pen >> 6) + g->bitmap_left, y0 = baseline - g->bitmap_top;
        for (unsigned r = 0; r < b->rows; r++)
            for (unsigned c = 0; c < b->width; c++) {
                const int py = y0 + (int)r, px = x0 + (int)c;
                if (py < 0 || py >= height || px < 0 || px >= width) continue;
                const unsigned a = b->buffer[(long)r * b->pitch + c]; /* coverage 0..255 */
                uint8_t *d = &gray[(size_t)py * width + px];
                *d = (uint8_t)((*d * (255u - a) + 127u) / 255u);
            }
        pen += g->advance.x;
    }
}

int loom_font_draw_wrapped(const loom_font *f, uint8_t *gray, int height, int width, int x, int y,
                           int max_width, int max_lines, const char *text) {
    int lines = 0;
    const char *s = text;
    while (*s && lines < max_lines) {
        while (*s == ' ') s++;
        if (!*s) break;
        /* the longest run of whole words that fits; else as many bytes as fit, at least 1 */
        int fit = 0, end = 0;
        for (int i = 0;; i++) {
            if (s[i] == ' ' || s[i] == '\0' || s[i] == '\n') {
                if (loom_font_width(f, s, i) > max_width) break;
                fit = i;
                if (s[i] != ' ') break;
            }
        }
        if (fit == 0) {
            while (s[end] && s[end] != '\n' && loom_font_width(f, s, end + 1) <= max_width) end++;
            fit = end > 0 ? end : 1;
        }
        loom_font_draw(f, gray, height, width, x, y + lines * f->line_height, s, fit);
        lines++;
        s += fit;
        if (*s == '\n') s++;
    }
    return lines;
}

loom_status loom_picture_write_captioned(const char *path, const uint8_t *images, int n, int height,
                                         int width, int scale, int cols, const char *const *texts,
                                         const loom_font *f, int lines, loom_error *err) {
    if (n < 1 || height < 1 || width < 1 || scale < 1 || scale > 8 || cols < 1 || lines < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %d images of %d x %d at scale %d in %d columns (expected at "
                              "least one image, scale 1..8)",
                              path, n, width, height, scale, cols);
    if (cols > n) cols = n;
    const int pad = 4, iw = width * scale, ih = height * scale;
    const int cw = iw + 2 * pad > 8 * f->pixels ? iw + 2 * pad : 8 * f->pixels;
    const int ch = pad + ih + pad + lines * f->line_height + pad;
    const int rows = (n + cols - 1) / cols, W = cols * cw, H = rows * ch;
    uint8_t *sheet = malloc((size_t)W * H);
    if (!sheet)
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for a %dx%d picture", path, W,
                              H);
    memset(sheet, 255, (size_t)W * H);
    for (int i = 0; i < n; i++) {
        const int ox = (i % cols) * cw, oy = (i / cols) * ch, ix = ox + (cw - iw) / 2;
        const uint8_t *img = images + (size_t)i * height * width;
        for (int y = 0; y < ih; y++)
            for (int x = 0; x < iw; x++)
                sheet[(size_t)(oy + pad + y) * W + ix + x] =
                    img[(size_t)(y / scale) * width + x / scale];
        if (texts && texts[i])
            loom_font_draw_wrapped(f, sheet, H, W, ox + pad, oy + pad + ih + pad, cw - 2 * pad,
                                   lines, texts[i]);
    }
    loom_status st = loom_picture_write_png_grid(path, sheet, 1, 1, H, W, 1, err);
    free(sheet);
    return st;
}
