/* PNG folder reader (see png_folder.h). */
#include "data/png_folder.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "data/image_shard.h"
#include "data/png_error.h"

loom_status loom_png_read(const char *path, int channels, uint8_t **pixels, int *height, int *width,
                          loom_error *err) {
    *pixels = NULL;
    *height = *width = 0;
    if (channels != 1 && channels != 3)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: %d channels requested, expected 1 or 3",
                              path, channels);
    FILE *f = fopen(path, "rb");
    if (!f) return loom_error_set(err, LOOM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char sig[8];
    if (fread(sig, 1, 8, f) != 8 || png_sig_cmp(sig, 0, 8) != 0) {
        fclose(f);
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: not a PNG file (bad signature)", path);
    }
    loom_png_ctx ctx = {{0}};
    png_structp png =
        png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, loom_png_on_error, loom_png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        fclose(f);
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for libpng", path);
    }
    /* Locals changed after setjmp and read after a longjmp must be volatile. */
    uint8_t *volatile hwc = NULL;
    png_bytep *volatile rows = NULL;
    volatile loom_status st = LOOM_OK;
    if (setjmp(png_jmpbuf(png))) {
        if (st == LOOM_OK)
            st = loom_error_set(err, LOOM_ERR_INPUT, "%s: bad or truncated PNG: %s", path, ctx.msg);
        goto done;
    }
    png_init_io(png, f);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (w > LOOM_IMAGE_MAX_DIM || h > LOOM_IMAGE_MAX_DIM ||
        (uint64_t)w * h * 3 > LOOM_IMAGE_MAX_SAMPLE_BYTES) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: %" PRIu32 "x%" PRIu32 " (HxW): expected at most %d per side "
                            "and %d pixels",
                            path, (uint32_t)h, (uint32_t)w, LOOM_IMAGE_MAX_DIM,
                            LOOM_IMAGE_MAX_SAMPLE_BYTES / 3);
        goto done;
    }
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_scale_16(png);
    png_set_strip_alpha(png); /* alpha, and the alpha palette_to_rgb makes of tRNS */
    int colour = type == PNG_COLOR_TYPE_PALETTE || (type & PNG_COLOR_MASK_COLOR);
    if (channels == 1 && colour) png_set_rgb_to_gray_fixed(png, 1, -1, -1);
    if (channels == 3 && !colour) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_channels(png, info) != channels || png_get_bit_depth(png, info) != 8) {
        st = loom_error_set(err, LOOM_ERR_STATE,
                            "%s: libpng gave %d channels of %d bits, expected %d of 8", path,
                            png_get_channels(png, info), png_get_bit_depth(png, info), channels);
        goto done;
    }
    size_t stride = (size_t)w * (size_t)channels;
    hwc = malloc((size_t)h * stride);
    rows = malloc((size_t)h * sizeof *rows);
    if (!hwc || !rows) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for %" PRIu32 "x%" PRIu32, path,
                            (uint32_t)h, (uint32_t)w);
        goto done;
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = hwc + y * stride;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    uint8_t *chw = malloc((size_t)h * stride);
    if (!chw) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t plane = (size_t)h * w;
    for (size_t p = 0; p < plane; p++)
        for (int c = 0; c < channels; c++) chw[c * plane + p] = hwc[p * channels + c];
    *pixels = chw;
    *height = (int)h;
    *width = (int)w;
done:
    png_destroy_read_struct(&png, &info, NULL);
    fclose(f);
    free(hwc);
    free(rows);
    return st;
}

/* ---- folder listing ---- */

typedef struct {
    char **v;
    size_t n, cap;
} name_list;

static void names_free(name_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_png_suffix(const char *name) {
    size_t n = strlen(name);
    return n > 4 && strcasecmp(name + n - 4, ".png") == 0;
}

/* Lists the entries of dir that are folders (want_dirs) or regular .png files, sorted. */
static loom_status list_dir(const char *dir, int want_dirs, name_list *out, loom_error *err) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d)
        return loom_error_set(err,
                              errno == ENOENT || errno == ENOTDIR ? LOOM_ERR_INPUT : LOOM_ERR_IO,
                              "%s: cannot open folder: %s", dir, strerror(errno));
    size_t cap = strlen(dir) + 512;
    char *path = malloc(cap);
    loom_status st = path ? LOOM_OK : loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    struct dirent *e;
    while (st == LOOM_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (!want_dirs && !has_png_suffix(e->d_name)) continue;
        snprintf(path, cap, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) continue; /* a dangling link: not an image or class */
        if (want_dirs ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode)) continue;
        if (out->n == out->cap) {
            size_t nc = out->cap ? out->cap * 2 : 64;
            char **nv = realloc(out->v, nc * sizeof *nv);
            if (!nv) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            out->v = nv;
            out->cap = nc;
        }
        if (!(out->v[out->n] = strdup(e->d_name)))
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
        else
            out->n++;
    }
    closedir(d);
    free(path);
    if (st != LOOM_OK)
        names_free(out);
    else if (out->n)
        qsort(out->v, out->n, sizeof *out->v, cmp_str);
    return st;
}

void loom_png_folder_free(loom_png_folder *f) {
    if (!f) return;
    free(f->pixels);
    free(f->labels);
    for (int i = 0; f->class_names && i < f->n_classes; i++) free(f->class_names[i]);
    free(f->class_names);
    memset(f, 0, sizeof *f);
}

/* Grows the sample arrays to hold at least `need` samples of `bytes` each. */
static loom_status reserve(loom_png_folder *f, int64_t *cap, int64_t need, size_t bytes,
                           const char *dir, loom_error *err) {
    if (need <= *cap) return LOOM_OK;
    int64_t nc = *cap ? *cap * 2 : 256;
    while (nc < need) nc *= 2;
    uint8_t *p = realloc(f->pixels, (size_t)nc * bytes);
    if (p) f->pixels = p;
    int32_t *l = p ? realloc(f->labels, (size_t)nc * sizeof *l) : NULL;
    if (l) f->labels = l;
    if (!p || !l)
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for %" PRId64 " images", dir,
                              nc);
    *cap = nc;
    return LOOM_OK;
}

loom_status loom_png_folder_read(const char *dir, int channels, loom_png_folder *out,
                                 loom_error *err) {
    memset(out, 0, sizeof *out);
    if (channels != 0 && channels != 1 && channels != 3)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: %d channels, expected 1, 3 or 0 (auto)",
                              dir, channels);
    name_list classes;
    loom_status st = list_dir(dir, 1, &classes, err);
    if (st != LOOM_OK) return st;
    if (classes.n == 0 || classes.n > LOOM_IMAGE_MAX_DIM) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: %zu class subfolders, expected 1..%d (one subfolder of PNG "
                            "files per class)",
                            dir, classes.n, LOOM_IMAGE_MAX_DIM);
        names_free(&classes);
        return st;
    }
    int read_c = channels ? channels : 3, all_gray = 1;
    out->class_names = classes.v; /* owned by out from here on */
    out->n_classes = (int)classes.n;
    classes.v = NULL;
    int64_t cap = 0;
    size_t pcap = strlen(dir) + 1024;
    char *path = malloc(pcap), *first = malloc(pcap);
    if (!path || !first) st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    for (int k = 0; st == LOOM_OK && k < out->n_classes; k++) {
        snprintf(path, pcap, "%s/%s", dir, out->class_names[k]);
        name_list files;
        st = list_dir(path, 0, &files, err);
        for (size_t i = 0; st == LOOM_OK && i < files.n; i++) {
            snprintf(path, pcap, "%s/%s/%s", dir, out->class_names[k], files.v[i]);
            uint8_t *img = NULL;
            int h = 0, w = 0;
            st = loom_png_read(path, read_c, &img, &h, &w, err);
            if (st == LOOM_OK && out->n == 0) {
                out->height = h;
                out->width = w;
                snprintf(first, pcap, "%s", path);
            } else if (st == LOOM_OK && (h != out->height || w != out->width)) {
                st = loom_error_set(err, LOOM_ERR_INPUT,
                                    "%s: %dx%d (HxW), expected %dx%d like the first image %s", path,
                                    h, w, out->height, out->width, first);
            }
            size_t bytes = (size_t)read_c * (size_t)h * (size_t)w;
            if (st == LOOM_OK) st = reserve(out, &cap, out->n + 1, bytes, dir, err);
            if (st == LOOM_OK) {
                memcpy(out->pixels + (size_t)out->n * bytes, img, bytes);
                if (read_c == 3 && all_gray) {
                    size_t plane = bytes / 3;
                    for (size_t p = 0; p < plane && all_gray; p++)
                        all_gray = img[p] == img[plane + p] && img[p] == img[2 * plane + p];
                }
                out->labels[out->n++] = k;
            }
            free(img);
        }
        names_free(&files);
    }
    free(path);
    free(first);
    if (st == LOOM_OK && out->n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: no .png file in its %d class subfolder(s), expected at least 1",
                            dir, out->n_classes);
    if (st != LOOM_OK) {
        loom_png_folder_free(out);
        return st;
    }
    out->channels = read_c;
    if (channels == 0 && all_gray) { /* keep the R plane of each image */
        size_t plane = (size_t)out->height * (size_t)out->width;
        for (int64_t i = 0; i < out->n; i++)
            memmove(out->pixels + (size_t)i * plane, out->pixels + (size_t)i * 3 * plane, plane);
        out->channels = 1;
    }
    return LOOM_OK;
}
