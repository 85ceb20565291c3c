/* libpng's error and warning callbacks for loom's PNG reader and writer: an error's text is
 * kept for the caller's one line (loom_png_ctx.msg) and libpng longjmps back to the setjmp around
 * the call; warnings are dropped (the result is checked instead). */
#ifndef LOOM_DATA_PNG_ERROR_H
#define LOOM_DATA_PNG_ERROR_H

#include <png.h>

typedef struct {
    char msg[256];
} loom_png_ctx;

/* png_create_{read,write}_struct(..., ctx, loom_png_on_error, loom_png_on_warning) */
void loom_png_on_error(png_structp png, png_const_charp msg);
void loom_png_on_warning(png_structp png, png_const_charp msg);

#endif
