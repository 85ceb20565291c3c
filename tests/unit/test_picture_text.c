/* Text in pictures (data/picture_text.h): a short text drawn with FreeType darkens pixels
 * inside the box its width and line height give and nowhere else; a captioned sheet read
 * back with libpng has each image, scaled, in its cell and ink under it, only where a
 * caption was given. Random texts and images per run; the seed is printed and
 * LOOM_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/picture_text.h"

static uint64_t g_rng;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void random_text(char *s, int n) {
    for (int i = 0; i < n; i++) s[i] = (char)('a' + rnd() % 26);
    s[n] = '\0';
}

/* The font at `pixels`, opened or the test failed. */
static void open_font(loom_font *f, int pixels) {
    loom_error err = {0};
    if (loom_font_open(f, pixels, &err) != LOOM_OK) fail_msg("loom_font_open: %s", err.msg);
}

/* Inked (not white) pixels of a W-wide image in rows [r0, r1), columns [c0, c1). */
static int ink_in(const uint8_t *img, int W, int r0, int r1, int c0, int c1) {
    int ink = 0;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) ink += img[r * W + c] < 255;
    return ink;
}

/* loom_font_open at `pixels` with $LOOM_FONT set to font (NULL: unset) fails as bad input,
 * its message holding `says` (NULL: not checked). */
static void expect_font_error(const char *font, int pixels, const char *says) {
    loom_font f;
    loom_error err = {0};
    if (font) setenv("LOOM_FONT", font, 1);
    assert_int_equal(loom_font_open(&f, pixels, &err), LOOM_ERR_INPUT);
    if (says && !strstr(err.msg, says)) fail_msg("'%s' does not say '%s'", err.msg, says);
    unsetenv("LOOM_FONT");
}

static void test_draw_marks_the_text_box(void **state) {
    (void)state;
    loom_font f;
    open_font(&f, 12);
    enum { H = 40, W = 160 };
    uint8_t img[H * W];
    memset(img, 255, sizeof img);
    char text[16];
    random_text(text, 4 + (int)(rnd() % 8));
    const int x = 5 + (int)(rnd() % 10), y = 5 + (int)(rnd() % 10), len = (int)strlen(text);
    const int w = loom_font_width(&f, text, len);
    assert_true(w > 0 && x + w < W);
    loom_font_draw(&f, img, H, W, x, y, text, len);
    const int bottom = y + f.ascent + f.descent < H ? y + f.ascent + f.descent : H;
    const int inside = ink_in(img, W, y, bottom, x - 2, x + w + 2 < W ? x + w + 2 : W);
    const int all = ink_in(img, W, 0, H, 0, W);
    if (all != inside) fail_msg("'%s': %d inked pixels outside the text's box", text, all - inside);
    /* a lower-case letter at 12 pixels covers tens of pixels */
    if (inside < 10 * len) fail_msg("'%s': only %d pixels inked", text, inside);
    loom_font_close(&f);
}

static void test_captioned_sheet(void **state) {
    (void)state;
    loom_font f;
    loom_error err = {0};
    open_font(&f, 9);
    enum { N = 3, IH = 6, IW = 5, S = 2, LINES = 2 };
    uint8_t images[N * IH * IW];
    for (int i = 0; i < N * IH * IW; i++) images[i] = (uint8_t)(rnd() % 200);
    char t0[12], t2[12];
    random_text(t0, 10);
    random_text(t2, 10);
    const char *texts[N] = {t0, NULL, t2};
    char path[] = "/tmp/loom_picture_text_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(
        loom_picture_write_captioned(path, images, N, IH, IW, S, 2, texts, &f, LINES, &err),
        LOOM_OK);
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    assert_true(png_image_begin_read_from_file(&pi, path));
    pi.format = PNG_FORMAT_GRAY;
    uint8_t *g = malloc(PNG_IMAGE_SIZE(pi));
    assert_true(png_image_finish_read(&pi, NULL, g, 0, NULL));
    const int W = (int)pi.width, H = (int)pi.height, cw = W / 2, ch = H / 2, pad = 4;
    assert_int_equal(cw, 8 * f.pixels); /* wider than the scaled image */
    assert_int_equal(ch, pad + IH * S + pad + LINES * f.line_height + pad);
    for (int i = 0; i < 4; i++) {
        const int ox = (i % 2) * cw, oy = (i / 2) * ch, ix = ox + (cw - IW * S) / 2;
        for (int y = 0; y < IH * S && i < N; y++)
            for (int x = 0; x < IW * S; x++)
                assert_int_equal(g[(oy + pad + y) * W + ix + x],
                                 images[i * IH * IW + (y / S) * IW + x / S]);
        const int ink = ink_in(g, W, oy + pad + IH * S + pad, oy + ch, ox, ox + cw);
        if ((i == 0 || i == 2) && ink < 50)
            fail_msg("cell %d: caption '%s' not drawn", i, texts[i]);
        if ((i == 1 || i == 3) && ink) fail_msg("cell %d: %d inked pixels, no caption", i, ink);
    }
    free(g);
    png_image_free(&pi);
    unlink(path);
    loom_font_close(&f);
}

static void test_font_errors(void **state) {
    (void)state;
    expect_font_error(NULL, 2, NULL);
    expect_font_error("/nonexistent/font.ttf", 10, "LOOM_FONT=/nonexistent/font.ttf");
    expect_font_error("/etc/hostname", 10, "not a font");
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed =
        env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    g_rng = seed | 1;
    printf("test_picture_text: LOOM_TEST_SEED=%" PRIu64 "\n", seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draw_marks_the_text_box),
        cmocka_unit_test(test_captioned_sheet),
        cmocka_unit_test(test_font_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
