/* Image data: IDX reader (plain and gzip), PNG folders of mixed colour types, the image
 * shard writer and reader with every validation error, moving-object clips (determinism,
 * bounces, labels) and the PNG/GIF picture writers read back with libpng and giflib.
 * Random inputs per run; the seed is printed and LOOM_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <gif_lib.h>
#include <inttypes.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/philox.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/image_shard.h"
#include "data/moving_clips.h"
#include "data/picture.h"
#include "data/png_folder.h"

static int rnd_in(int lo, int hi) {
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

/* Expects status `want` and a message containing every given string (NULL-terminated). */
static void expect_msg(loom_status st, const loom_error *err, loom_status want, ...) {
    if (st != want) fail_msg("status %d (expected %d), message '%s'", st, want, err->msg);
    va_list ap;
    va_start(ap, want);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
        if (!strstr(err->msg, s)) fail_msg("message '%s' lacks '%s'", err->msg, s);
    va_end(ap);
}

/* ---- IDX ---- */

static void put_be32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)(v >> 24), b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8), b[3] = (unsigned char)v;
}

/* Writes an IDX file (gz or plain): magic, dims, then `bytes` of body (data, or garbage
 * when data is NULL). */
static void write_idx(const char *path, int gz, uint32_t magic, int ndim, const uint32_t *dims,
                      const uint8_t *data, size_t bytes) {
    unsigned char h[16];
    put_be32(h, magic);
    for (int i = 0; i < ndim; i++) put_be32(h + 4 + 4 * i, dims[i]);
    uint8_t *body = malloc(bytes + 1);
    assert_non_null(body);
    for (size_t i = 0; i < bytes; i++) body[i] = data ? data[i] : (uint8_t)rnd();
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, h, (unsigned)(4 + 4 * ndim)), 4 + 4 * ndim);
        if (bytes) assert_int_equal(gzwrite(f, body, (unsigned)bytes), (int)bytes);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(h, 1, (size_t)(4 + 4 * ndim), f), (size_t)(4 + 4 * ndim));
        assert_int_equal(fwrite(body, 1, bytes, f), bytes);
        assert_int_equal(fclose(f), 0);
    }
    free(body);
}

static void test_idx_round_trip(void **state) {
    char p[512];
    for (int gz = 0; gz < 2; gz++) {
        uint32_t d[3] = {(uint32_t)rnd_in(1, 300), (uint32_t)rnd_in(1, 40),
                         (uint32_t)rnd_in(1, 40)};
        size_t bytes = (size_t)d[0] * d[1] * d[2];
        uint8_t *pix = malloc(bytes), *lab = malloc(d[0]);
        for (size_t i = 0; i < bytes; i++) pix[i] = (uint8_t)rnd();
        for (uint32_t i = 0; i < d[0]; i++) lab[i] = (uint8_t)rnd_in(0, 9);
        path_in(p, sizeof p, *state, gz ? "img.gz" : "img");
        write_idx(p, gz, LOOM_IDX_MAGIC_IMAGES, 3, d, pix, bytes);
        loom_idx_images img;
        loom_error err = {0};
        assert_int_equal(loom_idx_read_images(p, &img, &err), LOOM_OK);
        assert_int_equal(img.n, d[0]);
        assert_int_equal(img.rows, d[1]);
        assert_int_equal(img.cols, d[2]);
        assert_memory_equal(img.pixels, pix, bytes);
        loom_idx_images_free(&img);
        path_in(p, sizeof p, *state, gz ? "lab.gz" : "lab");
        write_idx(p, gz, LOOM_IDX_MAGIC_LABELS, 1, d, lab, d[0]);
        uint8_t *got = NULL;
        int64_t n = 0;
        assert_int_equal(loom_idx_read_labels(p, &got, &n, &err), LOOM_OK);
        assert_int_equal(n, d[0]);
        assert_memory_equal(got, lab, d[0]);
        free(got);
        free(pix);
        free(lab);
    }
}

static void test_idx_errors(void **state) {
    char p[512];
    loom_error err = {0};
    loom_idx_images img;
    uint8_t *lab;
    int64_t n;
    for (int gz = 0; gz < 2; gz++) {
        uint32_t d[3] = {5, 4, 3};
        path_in(p, sizeof p, *state, gz ? "e.gz" : "e");
        /* labels given as images, and images as labels */
        write_idx(p, gz, LOOM_IDX_MAGIC_LABELS, 1, d, NULL, 5);
        expect_msg(loom_idx_read_images(p, &img, &err), &err, LOOM_ERR_INPUT, p, "0x00000803",
                   "0x00000801", NULL);
        assert_null(img.pixels);
        write_idx(p, gz, LOOM_IDX_MAGIC_IMAGES, 3, d, NULL, 60);
        expect_msg(loom_idx_read_labels(p, &lab, &n, &err), &err, LOOM_ERR_INPUT, p, "0x00000801",
                   NULL);
        /* truncated body, truncated header, trailing bytes, zero dims */
        write_idx(p, gz, LOOM_IDX_MAGIC_IMAGES, 3, d, NULL, 59);
        expect_msg(loom_idx_read_images(p, &img, &err), &err, LOOM_ERR_INPUT, p, "truncated",
                   "59 of 60", NULL);
        write_idx(p, gz, LOOM_IDX_MAGIC_IMAGES, 2, d, NULL, 0);
        expect_msg(loom_idx_read_images(p, &img, &err), &err, LOOM_ERR_INPUT, p, "truncated",
                   "header", NULL);
        write_idx(p, gz, LOOM_IDX_MAGIC_IMAGES, 3, d, NULL, 61);
        expect_msg(loom_idx_read_images(p, &img, &err), &err, LOOM_ERR_INPUT, p, "1 trailing",
                   NULL);
        write_idx(p, gz, LOOM_IDX_MAGIC_LABELS, 1, d, NULL, 7);
        expect_msg(loom_idx_read_labels(p, &lab, &n, &err), &err, LOOM_ERR_INPUT, p, "2 trailing",
                   NULL);
        uint32_t z[3] = {5, 0, 3};
        write_idx(p, gz, LOOM_IDX_MAGIC_IMAGES, 3, z, NULL, 0);
        expect_msg(loom_idx_read_images(p, &img, &err), &err, LOOM_ERR_INPUT, p, "[5, 0, 3]", NULL);
    }
    /* a gzip stream cut short */
    uint32_t d[3] = {50, 20, 20};
    path_in(p, sizeof p, *state, "cut.gz");
    write_idx(p, 1, LOOM_IDX_MAGIC_IMAGES, 3, d, NULL, 20000);
    assert_int_equal(truncate(p, 2000), 0);
    expect_msg(loom_idx_read_images(p, &img, &err), &err, LOOM_ERR_INPUT, p, "truncated", NULL);
    path_in(p, sizeof p, *state, "missing");
    assert_int_not_equal(loom_idx_read_images(p, &img, &err), LOOM_OK);
    assert_non_null(strstr(err.msg, p));
}

/* ---- PNG folders ---- */

enum { K_GRAY8, K_GRAY16, K_GRAY2I, K_GRAYA8, K_RGB8, K_RGBA16, K_PAL, K_RGB_GRAYISH, K_N };

/* Writes a PNG of kind k, h x w, with random content; fills the expected RGB8 planes
 * e[3][h][w]. */
static void make_png(const char *path, int k, int h, int w, uint8_t *e) {
    static const int types[K_N] = {PNG_COLOR_TYPE_GRAY,    PNG_COLOR_TYPE_GRAY,
                                   PNG_COLOR_TYPE_GRAY,    PNG_COLOR_TYPE_GRAY_ALPHA,
                                   PNG_COLOR_TYPE_RGB,     PNG_COLOR_TYPE_RGB_ALPHA,
                                   PNG_COLOR_TYPE_PALETTE, PNG_COLOR_TYPE_RGB};
    static const int depths[K_N] = {8, 16, 2, 8, 8, 16, 8, 8};
    static const int chans[K_N] = {1, 1, 1, 2, 3, 4, 1, 3};
    const int depth = depths[k], ch = chans[k], bps = depth == 16 ? 2 : 1;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    assert_non_null(info);
    if (setjmp(png_jmpbuf(png))) fail_msg("libpng failed writing %s", path);
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, types[k],
                 k == K_GRAY2I ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_color pal[16];
    png_byte trans[16];
    for (int i = 0; i < 16; i++) {
        pal[i] = (png_color){(png_byte)rnd(), (png_byte)rnd(), (png_byte)rnd()};
        trans[i] = (png_byte)rnd();
    }
    if (k == K_PAL) {
        png_set_PLTE(png, info, pal, 16);
        png_set_tRNS(png, info, trans, 16, NULL);
    }
    png_write_info(png, info);
    if (depth < 8) png_set_packing(png);
    size_t plane = (size_t)h * w;
    png_bytep img = malloc(plane * ch * bps);
    png_bytep *rows = malloc((size_t)h * sizeof *rows);
    for (size_t p = 0; p < plane; p++) {
        uint8_t rgb[3];
        if (k == K_PAL) {
            int idx = rnd_in(0, 15);
            img[p] = (png_byte)idx;
            rgb[0] = pal[idx].red, rgb[1] = pal[idx].green, rgb[2] = pal[idx].blue;
        } else {
            uint8_t shared = (uint8_t)rnd();
            for (int c = 0; c < ch; c++) {
                unsigned v = depth == 16          ? (unsigned)(rnd() & 0xffff)
                             : depth == 2         ? (unsigned)rnd_in(0, 3)
                             : k == K_RGB_GRAYISH ? shared
                                                  : (unsigned)(rnd() & 0xff);
                if (bps == 2) {
                    img[(p * ch + c) * 2] = (png_byte)(v >> 8);
                    img[(p * ch + c) * 2 + 1] = (png_byte)v;
                } else {
                    img[p * ch + c] = (png_byte)v;
                }
                uint8_t v8 = depth == 16  ? (uint8_t)((v * 255 + 32767) / 65535)
                             : depth == 2 ? (uint8_t)(v * 85)
                                          : (uint8_t)v;
                if (c < 3) rgb[c] = v8;
            }
            if (ch < 3) rgb[1] = rgb[2] = rgb[0];
        }
        for (int c = 0; c < 3; c++) e[c * plane + p] = rgb[c];
    }
    for (int y = 0; y < h; y++) rows[y] = img + (size_t)y * w * ch * bps;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    assert_int_equal(fclose(f), 0);
    free(img);
    free(rows);
}

static int is_colour_kind(int k) {
    return k == K_RGB8 || k == K_RGBA16 || k == K_PAL;
}

/* Checks folder image `got` ([C][h][w]) against the expected RGB planes. */
static void check_png_pixels(const uint8_t *got, int C, const uint8_t *e, int k, size_t plane,
                             const char *what) {
    for (size_t p = 0; p < plane; p++) {
        if (C == 3) {
            for (int c = 0; c < 3; c++)
                if (got[c * plane + p] != e[c * plane + p])
                    fail_msg("%s kind %d pixel %zu channel %d: %d, expected %d", what, k, p, c,
                             got[c * plane + p], e[c * plane + p]);
        } else {
            double y = (6968.0 * e[p] + 23434.0 * e[plane + p] + 2366.0 * e[2 * plane + p]) / 32768;
            double tol = is_colour_kind(k) ? 1.01 : 0;
            if (!(got[p] >= y - tol - 0.5 && got[p] <= y + tol + 0.5))
                fail_msg("%s kind %d pixel %zu: gray %d, expected %.2f", what, k, p, got[p], y);
        }
    }
}

static void test_png_folder(void **state) {
    const int h = rnd_in(2, 24), w = rnd_in(2, 24);
    const size_t plane = (size_t)h * w;
    char p[512];
    /* Folders named so that sorted order differs from creation order. */
    const char *classes[3] = {"c_shoe", "a_shirt", "b_bag"};
    const int kinds[3][3] = {
        {K_RGB8, K_PAL, K_GRAY8}, {K_GRAY16, K_GRAY2I, K_GRAYA8}, {K_RGBA16, K_RGB_GRAYISH, -1}};
    uint8_t *expect[3][3] = {{0}};
    for (int c = 0; c < 3; c++) {
        path_in(p, sizeof p, *state, classes[c]);
        assert_int_equal(mkdir(p, 0755), 0);
        for (int i = 0; i < 3 && kinds[c][i] >= 0; i++) {
            char f[600];
            snprintf(f, sizeof f, "%s/%s/img%d.%s", (char *)*state, classes[c], i,
                     i == 1 ? "PNG" : "png");
            expect[c][i] = malloc(3 * plane);
            make_png(f, kinds[c][i], h, w, expect[c][i]);
        }
    }
    snprintf(p, sizeof p, "%s/a_shirt/notes.txt", (char *)*state); /* ignored */
    FILE *t = fopen(p, "w");
    fputs("x", t);
    fclose(t);
    /* sorted: a_shirt (1) -> 0, b_bag (2) -> 1, c_shoe (0) -> 2 */
    const int order[3] = {1, 2, 0};
    for (int ci = 0; ci < 3; ci++) {
        int C = ci == 0 ? 0 : ci == 1 ? 1 : 3;
        loom_png_folder f;
        loom_error err = {0};
        assert_int_equal(loom_png_folder_read(*state, C, &f, &err), LOOM_OK);
        assert_int_equal(f.n, 8);
        assert_int_equal(f.n_classes, 3);
        assert_int_equal(f.height, h);
        assert_int_equal(f.width, w);
        assert_int_equal(f.channels, C == 0 ? 3 : C); /* auto: colour images present */
        assert_string_equal(f.class_names[0], "a_shirt");
        int64_t s = 0;
        for (int k = 0; k < 3; k++) {
            int c = order[k];
            for (int i = 0; i < 3 && kinds[c][i] >= 0; i++, s++) {
                assert_int_equal(f.labels[s], k);
                check_png_pixels(f.pixels + s * f.channels * plane, f.channels, expect[c][i],
                                 kinds[c][i], plane, classes[c]);
            }
        }
        assert_int_equal(s, f.n);
        loom_png_folder_free(&f);
    }
    /* auto with gray content only (b_bag holds RGB with R == G == B): 1 channel, exact */
    snprintf(p, sizeof p, "%s/b_bag/img0.png", (char *)*state);
    assert_int_equal(unlink(p), 0);
    snprintf(p, sizeof p, "%s/c_shoe", (char *)*state);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -r '%s'", p);
    assert_int_equal(system(cmd), 0);
    loom_png_folder f;
    loom_error err = {0};
    assert_int_equal(loom_png_folder_read(*state, 0, &f, &err), LOOM_OK);
    assert_int_equal(f.channels, 1);
    assert_int_equal(f.n, 4);
    assert_int_equal(f.n_classes, 2);
    assert_memory_equal(f.pixels, expect[1][0], plane);
    assert_memory_equal(f.pixels + 3 * plane, expect[2][1], plane);
    assert_int_equal(f.labels[3], 1);
    loom_png_folder_free(&f);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 3; i++) free(expect[c][i]);
}

static void test_png_folder_errors(void **state) {
    char p[600], q[600];
    loom_png_folder f;
    loom_error err = {0};
    uint8_t *e = malloc(3 * 40 * 40);
    expect_msg(loom_png_folder_read(*state, 0, &f, &err), &err, LOOM_ERR_INPUT, *state,
               "class subfolders", NULL);
    path_in(p, sizeof p, *state, "k0");
    assert_int_equal(mkdir(p, 0755), 0);
    expect_msg(loom_png_folder_read(*state, 0, &f, &err), &err, LOOM_ERR_INPUT, *state, "no .png",
               NULL);
    snprintf(p, sizeof p, "%s/k0/a.png", (char *)*state);
    make_png(p, K_GRAY8, 28, 28, e);
    snprintf(q, sizeof q, "%s/k0/b.png", (char *)*state);
    make_png(q, K_RGB8, 30, 28, e);
    expect_msg(loom_png_folder_read(*state, 0, &f, &err), &err, LOOM_ERR_INPUT, q, "30x28",
               "expected 28x28", p, NULL);
    assert_null(f.pixels);
    FILE *t = fopen(q, "wb");
    fputs("not a png at all", t);
    fclose(t);
    expect_msg(loom_png_folder_read(*state, 3, &f, &err), &err, LOOM_ERR_INPUT, q, "not a PNG",
               NULL);
    make_png(q, K_RGB8, 28, 28, e);
    assert_int_equal(truncate(q, 100), 0);
    expect_msg(loom_png_folder_read(*state, 1, &f, &err), &err, LOOM_ERR_INPUT, q, "PNG", NULL);
    expect_msg(loom_png_folder_read(*state, 2, &f, &err), &err, LOOM_ERR_INPUT, "2 channels", NULL);
    path_in(p, sizeof p, *state, "nosuch");
    assert_int_not_equal(loom_png_folder_read(p, 0, &f, &err), LOOM_OK);
    assert_non_null(strstr(err.msg, p));
    free(e);
}

/* ---- shards ---- */

static loom_image_shape rnd_shape(void) {
    return (loom_image_shape){rnd_in(1, 3), rnd() % 2 ? 1 : 3, rnd_in(1, 12), rnd_in(1, 12),
                              rnd_in(1, 20)};
}

/* Random samples for a shape: labels[n], pixels[n][sample]. */
static void rnd_samples(const loom_image_shape *s, int64_t n, int32_t **labels, uint8_t **pixels) {
    int64_t sb = loom_image_sample_bytes(s);
    *labels = malloc((size_t)(n ? n : 1) * sizeof **labels);
    *pixels = malloc((size_t)(n ? n : 1) * (size_t)sb);
    for (int64_t i = 0; i < n; i++) (*labels)[i] = rnd_in(0, s->n_classes - 1);
    for (int64_t i = 0; i < n * sb; i++) (*pixels)[i] = (uint8_t)rnd();
}

static int write_split(const char *dir, const char *split, const loom_image_shape *s, int64_t n,
                       int64_t per, const int32_t *labels, const uint8_t *pixels) {
    loom_image_writer w;
    loom_error err = {0};
    assert_int_equal(loom_image_writer_open(&w, dir, split, s, n, per, &err), LOOM_OK);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(loom_image_writer_put(&w, labels[i], pixels + i * w.sample_bytes, &err),
                         LOOM_OK);
    int shards = w.n_shards;
    assert_int_equal(loom_image_writer_finish(&w, &err), LOOM_OK);
    return shards;
}

static void test_shard_round_trip(void **state) {
    char pat[512], p[512];
    loom_image_shape s = rnd_shape();
    int64_t n = rnd_in(1, 200), per = rnd_in(1, 60);
    int32_t *labels;
    uint8_t *pixels;
    rnd_samples(&s, n, &labels, &pixels);
    /* a longer earlier run leaves stale shards that must go */
    int32_t *l2;
    uint8_t *p2;
    rnd_samples(&s, 5 * n, &l2, &p2);
    write_split(*state, "train", &s, 5 * n, per, l2, p2);
    int shards = write_split(*state, "train", &s, n, per, labels, pixels);
    assert_int_equal(shards, (n + per - 1) / per);
    snprintf(p, sizeof p, "%s/train_%06d.bin", (char *)*state, shards);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(pat, sizeof pat, "%s/train_*.bin", (char *)*state);
    loom_image_dataset ds;
    loom_error err = {0};
    assert_int_equal(loom_image_dataset_open(&ds, pat, &err), LOOM_OK);
    assert_int_equal(ds.n_shards, shards);
    assert_int_equal(ds.n, n);
    assert_int_equal(ds.frames, s.frames);
    assert_int_equal(ds.channels, s.channels);
    assert_int_equal(ds.height, s.height);
    assert_int_equal(ds.width, s.width);
    assert_int_equal(ds.n_classes, s.n_classes);
    int64_t sb = loom_image_sample_bytes(&s);
    assert_int_equal(ds.sample_bytes, sb);
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(loom_image_dataset_label(&ds, i), labels[i]);
        assert_memory_equal(loom_image_dataset_pixels(&ds, i), pixels + i * sb, (size_t)sb);
    }
    /* the picker is the token sampler's draw, mod n, and covers the dataset */
    uint64_t seed = rnd();
    int64_t hits = 0;
    for (int64_t step = 0; step < 20; step++)
        for (int64_t q = 0; q < 50; q++) {
            int64_t i = loom_image_dataset_pick(&ds, seed, step, q);
            assert_int_equal(
                i, (int64_t)(loom_philox_u64(seed, LOOM_DATA_STREAM, (uint64_t)step, (uint32_t)q) %
                             (uint64_t)n));
            hits += i == n - 1;
        }
    if (n <= 20) assert_true(hits > 0);
    loom_image_dataset_close(&ds);
    /* one file at once, and a header-only shard next to it */
    path_in(p, sizeof p, *state, "one.bin");
    assert_int_equal(loom_image_shard_write(p, &s, n, labels, pixels, &err), LOOM_OK);
    path_in(p, sizeof p, *state, "one_empty.bin");
    assert_int_equal(loom_image_shard_write(p, &s, 0, labels, pixels, &err), LOOM_OK);
    snprintf(pat, sizeof pat, "%s/one*.bin", (char *)*state);
    assert_int_equal(loom_image_dataset_open(&ds, pat, &err), LOOM_OK);
    assert_int_equal(ds.n, n);
    assert_int_equal(ds.n_shards, 2);
    assert_memory_equal(loom_image_dataset_pixels(&ds, n - 1), pixels + (n - 1) * sb, (size_t)sb);
    loom_image_dataset_close(&ds);
    /* a split with no samples writes nothing and removes the old files */
    write_split(*state, "train", &s, 0, per, labels, pixels);
    snprintf(p, sizeof p, "%s/train_000000.bin", (char *)*state);
    assert_int_not_equal(access(p, F_OK), 0);
    free(labels);
    free(pixels);
    free(l2);
    free(p2);
}

/* Writes DIR/NAME with header fields h[0..7] and `body` bytes (labels 0, pixels random). */
static void write_raw_shard(const char *dir, const char *name, const int32_t h8[8], size_t body,
                            size_t header_bytes) {
    char p[512];
    path_in(p, sizeof p, dir, name);
    int32_t h[256] = {0};
    memcpy(h, h8, 8 * sizeof *h);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, 1, header_bytes, f), header_bytes);
    for (size_t i = 0; i < body; i++) fputc(i < (size_t)4 * h8[2] ? 0 : (int)(rnd() & 0xff), f);
    assert_int_equal(fclose(f), 0);
}

/* Opens DIR/ *.bin expecting LOOM_ERR_INPUT naming NAME and containing `expect`. */
static void expect_open_error(const char *dir, const char *name, const char *expect) {
    char pat[512], p[512];
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    path_in(p, sizeof p, dir, name);
    loom_image_dataset ds;
    loom_error err = {0};
    expect_msg(loom_image_dataset_open(&ds, pat, &err), &err, LOOM_ERR_INPUT, p, expect, NULL);
    assert_null(ds.shards);
    assert_int_equal(ds.n_shards, 0);
    loom_image_dataset_close(&ds);
    assert_int_equal(unlink(p), 0);
}

static void test_shard_errors(void **state) {
    const char *d = *state;
    loom_image_shape s = {1, 1, 4, 3, 10};
    int32_t *labels;
    uint8_t *pixels;
    rnd_samples(&s, 10, &labels, &pixels);
    char p[512];
    if (rnd() % 2) { /* sometimes good shards first: their cleanup is exercised too */
        path_in(p, sizeof p, d, "a_good.bin");
        assert_int_equal(loom_image_shard_write(p, &s, 10, labels, pixels, NULL), LOOM_OK);
    }
    const size_t body = 10 * 4 + 10 * 12;
    int32_t h[8] = {LOOM_IMAGE_SHARD_MAGIC, 1, 10, 1, 1, 4, 3, 10};
    write_raw_shard(d, "z.bin", h, 0, 1000);
    expect_open_error(d, "z.bin", "truncated header");
    write_raw_shard(d, "z.bin", h, body - 1, 1024);
    expect_open_error(d, "z.bin", "truncated");
    write_raw_shard(d, "z.bin", h, body + 3, 1024);
    expect_open_error(d, "z.bin", "trailing");
    int32_t tok[8] = {LOOM_SHARD_MAGIC_U16, 1, 10};
    write_raw_shard(d, "z.bin", tok, 20, 1024);
    expect_open_error(d, "z.bin", "token shard");
    int32_t bad[8] = {12345, 1, 10, 1, 1, 4, 3, 10};
    write_raw_shard(d, "z.bin", bad, body, 1024);
    expect_open_error(d, "z.bin", "bad magic");
    int32_t ver[8] = {LOOM_IMAGE_SHARD_MAGIC, 2, 10, 1, 1, 4, 3, 10};
    write_raw_shard(d, "z.bin", ver, body, 1024);
    expect_open_error(d, "z.bin", "version 2");
    int32_t neg[8] = {LOOM_IMAGE_SHARD_MAGIC, 1, -1, 1, 1, 4, 3, 10};
    write_raw_shard(d, "z.bin", neg, 0, 1024);
    expect_open_error(d, "z.bin", "count -1");
    int32_t dim[8] = {LOOM_IMAGE_SHARD_MAGIC, 1, 10, 1, 0, 4, 3, 10};
    write_raw_shard(d, "z.bin", dim, body, 1024);
    expect_open_error(d, "z.bin", "C 0");
    /* label out of range: the 7th label becomes 10 (n_classes 10) */
    path_in(p, sizeof p, d, "z.bin");
    labels[6] = 9;
    assert_int_equal(loom_image_shard_write(p, &s, 10, labels, pixels, NULL), LOOM_OK);
    FILE *f = fopen(p, "r+b");
    int32_t ten = 10;
    fseek(f, 1024 + 6 * 4, SEEK_SET);
    fwrite(&ten, 4, 1, f);
    fclose(f);
    expect_open_error(d, "z.bin", "label 10 of sample 6");
    /* shards that disagree: both files and both values named */
    loom_image_shape other = s;
    other.width = 5;
    path_in(p, sizeof p, d, "a_0.bin");
    assert_int_equal(loom_image_shard_write(p, &s, 10, labels, pixels, NULL), LOOM_OK);
    path_in(p, sizeof p, d, "z.bin");
    assert_int_equal(loom_image_shard_write(p, &other, 2, labels, pixels, NULL), LOOM_OK);
    expect_open_error(d, "z.bin", "width 5, expected 3 like");
    other = s;
    other.n_classes = 11;
    assert_int_equal(loom_image_shard_write(p, &other, 2, labels, pixels, NULL), LOOM_OK);
    expect_open_error(d, "z.bin", "n_classes 11, expected 10");
    path_in(p, sizeof p, d, "a_0.bin");
    unlink(p);
    /* nothing matches; only empty shards */
    char pat[512];
    snprintf(pat, sizeof pat, "%s/nothing_*.bin", d);
    loom_image_dataset ds;
    loom_error err = {0};
    expect_msg(loom_image_dataset_open(&ds, pat, &err), &err, LOOM_ERR_INPUT, pat, "no image shard",
               NULL);
    path_in(p, sizeof p, d, "empty.bin");
    assert_int_equal(loom_image_shard_write(p, &s, 0, labels, pixels, NULL), LOOM_OK);
    snprintf(pat, sizeof pat, "%s/empty.bin", d);
    expect_msg(loom_image_dataset_open(&ds, pat, &err), &err, LOOM_ERR_INPUT, pat, "no sample",
               NULL);
    /* the writers refuse bad labels and shapes */
    labels[3] = 10;
    path_in(p, sizeof p, d, "w.bin");
    expect_msg(loom_image_shard_write(p, &s, 10, labels, pixels, &err), &err, LOOM_ERR_INPUT, p,
               "label 10", NULL);
    loom_image_writer w;
    assert_int_equal(loom_image_writer_open(&w, d, "wt", &s, 2, 1, &err), LOOM_OK);
    expect_msg(loom_image_writer_put(&w, -1, pixels, &err), &err, LOOM_ERR_INPUT, "label -1", NULL);
    loom_image_writer_abort(&w);
    other = s;
    other.height = 70000;
    expect_msg(loom_image_writer_open(&w, d, "wt", &other, 2, 1, &err), &err, LOOM_ERR_INPUT,
               "H 70000", NULL);
    free(labels);
    free(pixels);
}

/* ---- moving clips ---- */

/* A random source dataset of n images C x H x W in DIR/src_*.bin. */
static void make_source(const char *dir, loom_image_dataset *ds, int64_t n, int C, int H, int W,
                        int n_classes) {
    loom_image_shape s = {1, C, H, W, n_classes};
    int32_t *labels;
    uint8_t *pixels;
    rnd_samples(&s, n, &labels, &pixels);
    write_split(dir, "src", &s, n, rnd_in(1, (int)n), labels, pixels);
    char pat[512];
    snprintf(pat, sizeof pat, "%s/src_*.bin", dir);
    loom_error err = {0};
    assert_int_equal(loom_image_dataset_open(ds, pat, &err), LOOM_OK);
    free(labels);
    free(pixels);
}

/* Step-by-step bouncing: move, reflect until inside. */
static int simulate(int p, int v, int limit, int frames) {
    if (limit == 0) return 0;
    for (int f = 0; f < frames; f++) {
        p += v;
        while (p < 0 || p > limit) {
            if (p < 0) p = -p, v = -v;
            if (p > limit) p = 2 * limit - p, v = -v;
        }
    }
    return p;
}

static void test_moving_position(void **state) {
    (void)state;
    for (int t = 0; t < 20000; t++) {
        int limit = rnd_in(0, t % 2 ? 4 : 60), v = rnd_in(1, 3) * (rnd() % 2 ? -1 : 1);
        int p0 = rnd_in(0, limit), f = rnd_in(0, 200);
        int got = loom_moving_position(p0, v, limit, f);
        if (got != simulate(p0, v, limit, f))
            fail_msg("p0 %d v %d limit %d frame %d: %d, simulated %d", p0, v, limit, f, got,
                     simulate(p0, v, limit, f));
    }
}

static void test_moving_clips(void **state) {
    const int C = rnd() % 2 ? 1 : 3, H = rnd_in(3, 10), W = rnd_in(3, 10);
    loom_image_dataset src;
    make_source(*state, &src, rnd_in(5, 60), C, H, W, rnd_in(1, 10));
    loom_moving_options o = {.frames = rnd_in(1, 12),
                             .size = rnd_in(H > W ? H : W, 20),
                             .objects = rnd_in(1, 4),
                             .seed = rnd(),
                             .stream = LOOM_MOVING_STREAM_TRAIN};
    loom_error err = {0};
    assert_int_equal(loom_moving_check(&src, &o, &err), LOOM_OK);
    const int S = o.size, F = o.frames;
    const size_t frame = (size_t)C * S * S, clip = frame * F, plane = (size_t)H * W;
    uint8_t *a = malloc(clip), *b = malloc(clip), *naive = malloc(clip);
    loom_moving_object objs[4], objs2[4];
    int64_t n_clips = rnd_in(1, 40);
    int nonzero = 0;
    for (int64_t i = 0; i < n_clips; i++) {
        int32_t label = loom_moving_render(&src, &o, i, objs, a);
        assert_int_equal(loom_moving_render(&src, &o, i, objs2, b), label); /* deterministic */
        assert_memory_equal(a, b, clip);
        assert_int_equal(label, loom_image_dataset_label(&src, objs[0].image));
        memset(naive, 0, clip);
        for (int j = 0; j < o.objects; j++) {
            assert_int_equal(objs[j].image,
                             (int64_t)(loom_philox_u64(o.seed, o.stream, (uint64_t)i, (uint32_t)j) %
                                       (uint64_t)src.n));
            assert_true(abs(objs[j].vx) >= 1 && abs(objs[j].vx) <= 3);
            assert_true(abs(objs[j].vy) >= 1 && abs(objs[j].vy) <= 3);
            const uint8_t *img = loom_image_dataset_pixels(&src, objs[j].image);
            for (int f = 0; f < F; f++) {
                int x = simulate(objs[j].x0, objs[j].vx, S - W, f);
                int y = simulate(objs[j].y0, objs[j].vy, S - H, f);
                assert_true(x >= 0 && x + W <= S && y >= 0 && y + H <= S); /* in the canvas */
                for (int c = 0; c < C; c++)
                    for (int dy = 0; dy < H; dy++)
                        for (int dx = 0; dx < W; dx++) {
                            uint8_t v = img[c * plane + (size_t)dy * W + dx];
                            uint8_t *d = naive + f * frame + (size_t)c * S * S +
                                         (size_t)(y + dy) * S + (x + dx);
                            if (v > *d) *d = v;
                        }
            }
        }
        assert_memory_equal(a, naive, clip);
        for (size_t q = 0; q < clip; q++) nonzero += a[q] != 0;
    }
    assert_true(nonzero > 0);
    /* written shards hold exactly the rendered clips; another seed or stream differs */
    int64_t per = rnd_in(1, 10);
    assert_int_equal(loom_moving_write(&src, &o, n_clips, *state, "mv", per, &err), LOOM_OK);
    char pat[512];
    snprintf(pat, sizeof pat, "%s/mv_*.bin", (char *)*state);
    loom_image_dataset mv;
    assert_int_equal(loom_image_dataset_open(&mv, pat, &err), LOOM_OK);
    assert_int_equal(mv.n, n_clips);
    assert_int_equal(mv.frames, F);
    assert_int_equal(mv.channels, C);
    assert_int_equal(mv.height, S);
    assert_int_equal(mv.width, S);
    assert_int_equal(mv.n_classes, src.n_classes);
    int differ = 0;
    for (int64_t i = 0; i < n_clips; i++) {
        int32_t label = loom_moving_render(&src, &o, i, objs, a);
        assert_memory_equal(loom_image_dataset_pixels(&mv, i), a, clip);
        assert_int_equal(loom_image_dataset_label(&mv, i), label);
        loom_moving_options o2 = o;
        o2.seed ^= 1;
        loom_moving_render(&src, &o2, i, objs, b);
        o2 = o;
        o2.stream = LOOM_MOVING_STREAM_VAL;
        loom_moving_render(&src, &o2, i, objs2, naive);
        differ += memcmp(a, b, clip) != 0 && memcmp(a, naive, clip) != 0;
    }
    if (S >= (H > W ? H : W) + 4 && n_clips >= 8) assert_true(differ > 0);
    loom_image_dataset_close(&mv);
    /* bad options */
    loom_moving_options bad = o;
    bad.size = (H > W ? H : W) - 1;
    expect_msg(loom_moving_check(&src, &bad, &err), &err, LOOM_ERR_INPUT, "--size", NULL);
    bad = o;
    bad.objects = 0;
    expect_msg(loom_moving_check(&src, &bad, &err), &err, LOOM_ERR_INPUT, "--objects", NULL);
    bad = o;
    bad.frames = 0;
    expect_msg(loom_moving_write(&src, &bad, 3, *state, "mv", 1, &err), &err, LOOM_ERR_INPUT,
               "--frames", NULL);
    free(a);
    free(b);
    free(naive);
    loom_image_dataset_close(&src);
}

/* ---- pictures ---- */

/* Reads an 8-bit gray or RGB PNG with libpng's simplified API into pixels [h][w][C]. */
static uint8_t *read_png(const char *path, int C, int *h, int *w) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    assert_true(png_image_begin_read_from_file(&img, path));
    assert_int_equal(img.format, C == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB); /* as written */
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    assert_true(png_image_finish_read(&img, NULL, buf, 0, NULL));
    *h = (int)img.height;
    *w = (int)img.width;
    png_image_free(&img);
    return buf;
}

/* Checks grid pixels [gh][gw][C] against images (image i at base + i*stride). */
static void check_grid(const uint8_t *g, int gh, int gw, const uint8_t *base, int64_t stride, int n,
                       int C, int H, int W, int cols) {
    int rows = (n + cols - 1) / cols;
    assert_int_equal(gh, rows * H + rows - 1);
    assert_int_equal(gw, cols * W + cols - 1);
    for (int y = 0; y < gh; y++)
        for (int x = 0; x < gw; x++) {
            int cy = y / (H + 1), cx = x / (W + 1), iy = y % (H + 1), ix = x % (W + 1);
            int i = cy * cols + cx, gap = iy == H || ix == W || i >= n;
            for (int c = 0; c < C; c++) {
                int want = gap ? LOOM_PICTURE_GAP
                               : base[i * stride + (int64_t)c * H * W + (int64_t)iy * W + ix];
                if (g[((size_t)y * gw + x) * C + c] != want)
                    fail_msg("pixel (%d, %d) channel %d: %d, expected %d", y, x, c,
                             g[((size_t)y * gw + x) * C + c], want);
            }
        }
}

static void test_picture_png(void **state) {
    char p[512];
    loom_error err = {0};
    for (int C = 1; C <= 3; C += 2) {
        int n = rnd_in(1, 9), H = rnd_in(1, 12), W = rnd_in(1, 12), cols = rnd_in(1, 5);
        size_t bytes = (size_t)n * C * H * W;
        uint8_t *images = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) images[i] = (uint8_t)rnd();
        path_in(p, sizeof p, *state, "grid.png");
        assert_int_equal(loom_picture_write_png_grid(p, images, n, C, H, W, cols, &err), LOOM_OK);
        int gh, gw;
        uint8_t *g = read_png(p, C, &gh, &gw);
        check_grid(g, gh, gw, images, (int64_t)C * H * W, n, C, H, W, cols < n ? cols : n);
        free(g);
        /* strip: n clips of F frames = n rows of F columns */
        int F = rnd_in(1, 5), nc = rnd_in(1, 4);
        uint8_t *clips = malloc((size_t)nc * F * C * H * W);
        for (size_t i = 0; i < (size_t)nc * F * C * H * W; i++) clips[i] = (uint8_t)rnd();
        path_in(p, sizeof p, *state, "strip.png");
        assert_int_equal(loom_picture_write_png_strip(p, clips, nc, F, C, H, W, &err), LOOM_OK);
        g = read_png(p, C, &gh, &gw);
        check_grid(g, gh, gw, clips, (int64_t)C * H * W, nc * F, C, H, W, F);
        free(g);
        free(clips);
        free(images);
    }
    uint8_t px[4] = {0};
    path_in(p, sizeof p, *state, "bad.png");
    expect_msg(loom_picture_write_png_grid(p, px, 1, 2, 1, 2, 1, &err), &err, LOOM_ERR_INPUT, p,
               NULL);
    expect_msg(loom_picture_write_png_grid(p, px, 0, 1, 1, 1, 1, &err), &err, LOOM_ERR_INPUT, p,
               NULL);
    assert_int_not_equal(access(p, F_OK), 0);
    path_in(p, sizeof p, *state, "nosuch/x.png");
    expect_msg(loom_picture_write_png_grid(p, px, 1, 1, 1, 1, 1, &err), &err, LOOM_ERR_IO, p, NULL);
}

static void test_picture_gif(void **state) {
    char p[512];
    loom_error err = {0};
    for (int C = 1; C <= 3; C += 2) {
        int n = rnd_in(1, 6), F = rnd_in(1, 6), H = rnd_in(1, 10), W = rnd_in(1, 10);
        int cols = rnd_in(1, 4), delay = rnd_in(1, 50);
        size_t clip = (size_t)F * C * H * W;
        uint8_t *clips = malloc((size_t)n * clip);
        for (size_t i = 0; i < (size_t)n * clip; i++) clips[i] = (uint8_t)rnd();
        path_in(p, sizeof p, *state, "clips.gif");
        assert_int_equal(loom_picture_write_gif(p, clips, n, F, C, H, W, cols, delay, &err),
                         LOOM_OK);
        int code = 0;
        GifFileType *gif = DGifOpenFileName(p, &code);
        assert_non_null(gif);
        assert_int_equal(DGifSlurp(gif), GIF_OK);
        assert_int_equal(gif->ImageCount, F);
        int ec = cols < n ? cols : n, rows = (n + ec - 1) / ec;
        assert_int_equal(gif->SWidth, ec * W + ec - 1);
        assert_int_equal(gif->SHeight, rows * H + rows - 1);
        assert_non_null(gif->SColorMap);
        assert_int_equal(gif->SColorMap->ColorCount, 256);
        /* looping: the NETSCAPE2.0 application extension before the first image */
        int loops = 0;
        const SavedImage *s0 = &gif->SavedImages[0];
        for (int e = 0; e < s0->ExtensionBlockCount; e++)
            loops += s0->ExtensionBlocks[e].Function == APPLICATION_EXT_FUNC_CODE &&
                     s0->ExtensionBlocks[e].ByteCount == 11 &&
                     memcmp(s0->ExtensionBlocks[e].Bytes, "NETSCAPE2.0", 11) == 0;
        assert_int_equal(loops, 1);
        for (int f = 0; f < F; f++) {
            GraphicsControlBlock gcb;
            assert_int_equal(DGifSavedExtensionToGCB(gif, f, &gcb), GIF_OK);
            assert_int_equal(gcb.DelayTime, delay);
            const GifByteType *r = gif->SavedImages[f].RasterBits;
            for (int t = 0; t < 50; t++) { /* random pixels of frame f of random clips */
                int i = rnd_in(0, n - 1), y = rnd_in(0, H - 1), x = rnd_in(0, W - 1);
                int gy = (i / ec) * (H + 1) + y, gx = (i % ec) * (W + 1) + x;
                const GifColorType *col = &gif->SColorMap->Colors[r[gy * gif->SWidth + gx]];
                const uint8_t *px = clips + i * clip + (size_t)f * C * H * W + (size_t)y * W + x;
                int got[3] = {col->Red, col->Green, col->Blue};
                for (int c = 0; c < 3; c++) {
                    int want = px[(C == 3 ? c : 0) * H * W];
                    int tol = C == 1 ? 0 : c == 1 ? 255 / 12 + 1 : 255 / 10 + 1;
                    if (abs(got[c] - want) > tol)
                        fail_msg("C %d frame %d clip %d (%d, %d) channel %d: %d, expected %d", C, f,
                                 i, y, x, c, got[c], want);
                }
            }
            if (gif->SWidth > W || gif->SHeight > H) { /* a gap pixel */
                int gx = gif->SWidth > W ? W : 0, gy = gif->SWidth > W ? 0 : H;
                const GifColorType *col = &gif->SColorMap->Colors[r[gy * gif->SWidth + gx]];
                assert_int_equal(col->Red, LOOM_PICTURE_GAP);
                assert_int_equal(col->Green, LOOM_PICTURE_GAP);
                assert_int_equal(col->Blue, LOOM_PICTURE_GAP);
            }
        }
        DGifCloseFile(gif, &code);
        free(clips);
    }
    uint8_t px[1] = {0};
    path_in(p, sizeof p, *state, "bad.gif");
    expect_msg(loom_picture_write_gif(p, px, 1, 0, 1, 1, 1, 1, 5, &err), &err, LOOM_ERR_INPUT, p,
               NULL);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed =
        env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    g_rng = seed;
    printf("test_image_data: LOOM_TEST_SEED=%" PRIu64 "\n", seed);
#define T(f) cmocka_unit_test_setup_teardown(f, setup_dir, teardown_dir)
    const struct CMUnitTest tests[] = {
        T(test_idx_round_trip),    T(test_idx_errors),       T(test_png_folder),
        T(test_png_folder_errors), T(test_shard_round_trip), T(test_shard_errors),
        T(test_moving_position),   T(test_moving_clips),     T(test_picture_png),
        T(test_picture_gif),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
