/* PNG grids/strips and animated GIFs of uint8 samples (see picture.h). */
#include "data/picture.h"

#include <errno.h>
#include <fcntl.h>
#include <gif_lib.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/png_error.h"

#define PICTURE_MAX_SIDE 65535 /* PNG allows more, GIF does not */

/* Checks the arguments and computes the grid size. */
static loom_status grid_size(const char *path, int n, int channels, int height, int width,
                             int *cols, int *gh, int *gw, loom_error *err) {
    if (n < 1 || (channels != 1 && channels != 3) || height < 1 || width < 1 || *cols < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %d images of %dx%dx%d (CxHxW) in %d columns: expected at "
                              "least 1 image, 1 or 3 channels, positive sizes and columns",
                              path, n, channels, height, width, *cols);
    if (*cols > n) *cols = n;
    int64_t rows = (n + *cols - 1) / *cols;
    int64_t h = rows * height + rows - 1, w = (int64_t)*cols * width + *cols - 1;
    if (h > PICTURE_MAX_SIDE || w > PICTURE_MAX_SIDE)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: a %lldx%lld picture, expected at most %d per side", path,
                              (long long)h, (long long)w, PICTURE_MAX_SIDE);
    *gh = (int)h;
    *gw = (int)w;
    return LOOM_OK;
}

/* Fills out[gh][gw][C] (interleaved) with the grid of n images, image i at base + i*stride
 * ([C][H][W] planes). */
static void compose(uint8_t *out, const uint8_t *base, int64_t stride, int n, int C, int H, int W,
                    int cols, int gh, int gw) {
    memset(out, LOOM_PICTURE_GAP, (size_t)gh * gw * C);
    const size_t plane = (size_t)H * W;
    for (int i = 0; i < n; i++) {
        const uint8_t *img = base + (int64_t)i * stride;
        int y0 = (i / cols) * (H + 1), x0 = (i % cols) * (W + 1);
        for (int y = 0; y < H; y++) {
            uint8_t *row = out + ((size_t)(y0 + y) * gw + x0) * C;
            for (int x = 0; x < W; x++)
                for (int c = 0; c < C; c++) row[x * C + c] = img[c * plane + (size_t)y * W + x];
        }
    }
}

static char *tmp_name(const char *path) {
    size_t cap = strlen(path) + 8;
    char *tmp = malloc(cap);
    if (tmp) snprintf(tmp, cap, "%s.tmp", path);
    return tmp;
}

/* Renames tmp onto path (or removes tmp when st failed); frees tmp. */
static loom_status finish_file(loom_status st, char *tmp, const char *path, loom_error *err) {
    if (st == LOOM_OK && rename(tmp, path) != 0)
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot rename into place: %s", path,
                            strerror(errno));
    if (st != LOOM_OK) unlink(tmp);
    free(tmp);
    return st;
}

/* Writes pixels [h][w][C] (C 1 or 3) as an 8-bit PNG to the open file f. */
static loom_status png_put(FILE *f, const char *path, const uint8_t *pixels, int C, int h, int w,
                           loom_error *err) {
    loom_png_ctx ctx = {{0}};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, loom_png_on_error,
                                              loom_png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(png ? &png : NULL, NULL);
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for libpng", path);
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot write PNG: %s", path, ctx.msg);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8,
                 C == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, pixels + (size_t)y * w * C);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return LOOM_OK;
}

/* The grid of n images (image i at base + i*stride) as a PNG. */
static loom_status write_png(const char *path, const uint8_t *base, int64_t stride, int n, int C,
                             int H, int W, int cols, loom_error *err) {
    int gh = 0, gw = 0;
    loom_status st = grid_size(path, n, C, H, W, &cols, &gh, &gw, err);
    if (st != LOOM_OK) return st;
    uint8_t *grid = malloc((size_t)gh * gw * C);
    char *tmp = tmp_name(path);
    if (!grid || !tmp) {
        free(grid);
        free(tmp);
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for a %dx%d picture", path,
                              gh, gw);
    }
    compose(grid, base, stride, n, C, H, W, cols, gh, gw);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        st = png_put(f, path, grid, C, gh, gw, err);
        if (fclose(f) != 0 && st == LOOM_OK)
            st = loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    }
    free(grid);
    return finish_file(st, tmp, path, err);
}

loom_status loom_picture_write_png_grid(const char *path, const uint8_t *images, int n,
                                        int channels, int height, int width, int cols,
                                        loom_error *err) {
    return write_png(path, images, (int64_t)channels * height * width, n, channels, height, width,
                     cols, err);
}

loom_status loom_picture_write_png_strip(const char *path, const uint8_t *clips, int n, int frames,
                                         int channels, int height, int width, loom_error *err) {
    if (frames < 1 || n < 1 || (int64_t)n * frames > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %d clips of %d frames: expected at least 1 of each", path, n,
                              frames);
    /* [n][F] images in row-major order are n rows of F columns. */
    return write_png(path, clips, (int64_t)channels * height * width, n * frames, channels, height,
                     width, frames, err);
}

/* ---- GIF ---- */

static int cube_level(uint8_t v, int levels) {
    return (v * (levels - 1) + 127) / 255;
}

static loom_status gif_fail(GifFileType *gif, int code, const char *path, loom_error *err) {
    const char *why = GifErrorString(code);
    loom_error_set(err, LOOM_ERR_IO, "%s: cannot write GIF: %s", path, why ? why : "unknown");
    if (gif) {
        int ignored;
        EGifCloseFile(gif, &ignored);
    }
    return LOOM_ERR_IO;
}

static loom_status gif_put(const char *tmp, const char *path, const uint8_t *clips, int n,
                           int frames, int C, int H, int W, int cols, int gh, int gw, int delay_cs,
                           uint8_t *grid, GifPixelType *line, loom_error *err) {
    GifColorType colors[256];
    memset(colors, 0, sizeof colors);
    if (C == 1) {
        for (int i = 0; i < 256; i++) colors[i] = (GifColorType){i, i, i};
    } else {
        for (int r = 0; r < 6; r++)
            for (int g = 0; g < 7; g++)
                for (int b = 0; b < 6; b++)
                    colors[(r * 7 + g) * 6 + b] =
                        (GifColorType){r * 255 / 5, g * 255 / 6, b * 255 / 5};
        colors[252] = (GifColorType){LOOM_PICTURE_GAP, LOOM_PICTURE_GAP, LOOM_PICTURE_GAP};
    }
    int code = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); /* giflib would use 0600 */
    if (fd < 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    GifFileType *gif = EGifOpenFileHandle(fd, &code); /* closes fd from here on */
    if (!gif) {
        close(fd);
        return gif_fail(NULL, code, path, err);
    }
    ColorMapObject *map = GifMakeMapObject(256, colors);
    if (!map) return gif_fail(gif, E_GIF_ERR_NOT_ENOUGH_MEM, path, err);
    EGifSetGifVersion(gif, true);
    int rc = EGifPutScreenDesc(gif, gw, gh, 8, 0, map);
    GifFreeMapObject(map);
    if (rc == GIF_ERROR) return gif_fail(gif, gif->Error, path, err);
    unsigned char loop[3] = {1, 0, 0}; /* sub-block 1: loop count 0 = forever */
    if (EGifPutExtensionLeader(gif, APPLICATION_EXT_FUNC_CODE) == GIF_ERROR ||
        EGifPutExtensionBlock(gif, 11, "NETSCAPE2.0") == GIF_ERROR ||
        EGifPutExtensionBlock(gif, 3, loop) == GIF_ERROR ||
        EGifPutExtensionTrailer(gif) == GIF_ERROR)
        return gif_fail(gif, gif->Error, path, err);
    GraphicsControlBlock gcb = {.DisposalMode = DISPOSE_DO_NOT,
                                .UserInputFlag = false,
                                .DelayTime = delay_cs,
                                .TransparentColor = NO_TRANSPARENT_COLOR};
    GifByteType ext[4];
    int ext_len = (int)EGifGCBToExtension(&gcb, ext);
    const int64_t sample = (int64_t)C * H * W, clip = sample * frames;
    for (int f = 0; f < frames; f++) {
        compose(grid, clips + f * sample, clip, n, C, H, W, cols, gh, gw);
        if (EGifPutExtension(gif, GRAPHICS_EXT_FUNC_CODE, ext_len, ext) == GIF_ERROR ||
            EGifPutImageDesc(gif, 0, 0, gw, gh, false, NULL) == GIF_ERROR)
            return gif_fail(gif, gif->Error, path, err);
        for (int y = 0; y < gh; y++) {
            const uint8_t *row = grid + (size_t)y * gw * C;
            for (int x = 0; x < gw; x++) {
                if (C == 1) {
                    line[x] = row[x];
                } else {
                    const uint8_t *p = row + 3 * x;
                    int gap = p[0] == LOOM_PICTURE_GAP && p[1] == LOOM_PICTURE_GAP &&
                              p[2] == LOOM_PICTURE_GAP;
                    line[x] =
                        gap ? 252
                            : (GifPixelType)((cube_level(p[0], 6) * 7 + cube_level(p[1], 7)) * 6 +
                                             cube_level(p[2], 6));
                }
            }
            if (EGifPutLine(gif, line, gw) == GIF_ERROR)
                return gif_fail(gif, gif->Error, path, err);
        }
    }
    if (EGifCloseFile(gif, &code) == GIF_ERROR) return gif_fail(NULL, code, path, err);
    return LOOM_OK;
}

loom_status loom_picture_write_gif(const char *path, const uint8_t *clips, int n, int frames,
                                   int channels, int height, int width, int cols, int delay_cs,
                                   loom_error *err) {
    int gh = 0, gw = 0;
    loom_status st = grid_size(path, n, channels, height, width, &cols, &gh, &gw, err);
    if (st != LOOM_OK) return st;
    if (frames < 1 || delay_cs < 0 || delay_cs > 65535)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %d frames, delay %d cs: expected at least 1 frame and a delay "
                              "in 0..65535",
                              path, frames, delay_cs);
    uint8_t *grid = malloc((size_t)gh * gw * channels);
    GifPixelType *line = malloc((size_t)gw * sizeof *line);
    char *tmp = tmp_name(path);
    if (!grid || !line || !tmp)
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for a %dx%d picture", path, gh,
                            gw);
    if (st == LOOM_OK)
        st = gif_put(tmp, path, clips, n, frames, channels, height, width, cols, gh, gw, delay_cs,
                     grid, line, err);
    free(grid);
    free(line);
    if (!tmp) return st;
    return finish_file(st, tmp, path, err);
}
