/* libpng's callbacks (see png_error.h). */
#include "data/png_error.h"

#include <stdio.h>

void loom_png_on_error(png_structp png, png_const_charp msg) {
    loom_png_ctx *ctx = png_get_error_ptr(png);
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    png_longjmp(png, 1);
}

void loom_png_on_warning(png_structp png, png_const_charp msg) {
    (void)png, (void)msg;
}
