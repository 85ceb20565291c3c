/* IDX reader (see idx.h): one code path for plain and gzip files (zlib's gzread passes
 * plain files through unchanged). */
#include "data/idx.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_MAX_N 0x7fffffff
#define IDX_MAX_SIDE 65535

/* Reads exactly n bytes; 0 on success, else fills err ("what" names the part read). */
static loom_status read_exact(gzFile f, const char *path, void *buf, int64_t n, const char *what,
                              loom_error *err) {
    unsigned char *p = buf;
    int64_t done = 0;
    while (done < n) {
        int64_t want = n - done > (1 << 30) ? (1 << 30) : n - done;
        int got = gzread(f, p + done, (unsigned)want);
        if (got < 0) {
            int code = 0;
            const char *msg = gzerror(f, &code);
            if (code == Z_BUF_ERROR) /* zlib: "unexpected end of file" */
                return loom_error_set(err, LOOM_ERR_INPUT,
                                      "%s: truncated %s: %" PRId64 " of %" PRId64
                                      " bytes present (%s)",
                                      path, what, done, n, msg);
            return loom_error_set(err, code == Z_ERRNO ? LOOM_ERR_IO : LOOM_ERR_INPUT,
                                  "%s: cannot read %s: %s", path, what,
                                  code == Z_ERRNO ? strerror(errno) : msg);
        }
        if (got == 0) {
            int code = 0;
            const char *msg = gzerror(f, &code);
            if (code != Z_OK && code != Z_BUF_ERROR)
                return loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot read %s: %s", path, what,
                                      msg);
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: truncated %s: %" PRId64 " of %" PRId64 " bytes present",
                                  path, what, done, n);
        }
        done += got;
    }
    return LOOM_OK;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Opens path, checks the magic and reads the ndim sizes into dims. */
static loom_status open_header(const char *path, uint32_t magic, int ndim, const char *kind,
                               gzFile *out, uint32_t *dims, loom_error *err) {
    *out = NULL;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return loom_error_set(err, errno == ENOENT ? LOOM_ERR_INPUT : LOOM_ERR_IO,
                              "%s: cannot open: %s", path,
                              errno ? strerror(errno) : "out of memory");
    unsigned char h[16];
    loom_status st = read_exact(f, path, h, 4, "IDX magic", err);
    if (st == LOOM_OK && be32(h) != magic)
        st = loom_error_set(
            err, LOOM_ERR_INPUT,
            "%s: magic 0x%08" PRIx32 ", expected 0x%08" PRIx32 " (IDX %s; 0x%08" PRIx32 " is %s)",
            path, be32(h), magic, kind,
            magic == LOOM_IDX_MAGIC_IMAGES ? LOOM_IDX_MAGIC_LABELS : LOOM_IDX_MAGIC_IMAGES,
            magic == LOOM_IDX_MAGIC_IMAGES ? "labels" : "images");
    if (st == LOOM_OK) st = read_exact(f, path, h + 4, 4 * ndim, "IDX header", err);
    if (st != LOOM_OK) {
        gzclose(f);
        return st;
    }
    for (int i = 0; i < ndim; i++) dims[i] = be32(h + 4 + 4 * i);
    *out = f;
    return LOOM_OK;
}

/* Reads the body and checks nothing follows it. */
static loom_status read_body(gzFile f, const char *path, uint8_t *buf, int64_t n, const char *what,
                             loom_error *err) {
    loom_status st = read_exact(f, path, buf, n, what, err);
    unsigned char extra[256];
    if (st == LOOM_OK) {
        int64_t trailing = 0;
        int got;
        while ((got = gzread(f, extra, sizeof extra)) > 0) trailing += got;
        if (trailing > 0)
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s: %" PRId64 " trailing bytes after the %" PRId64
                                " bytes of %s the header announces",
                                path, trailing, n, what);
        else if (got < 0)
            st = read_exact(f, path, extra, 1, "end of file", err);
    }
    return st;
}

loom_status loom_idx_read_images(const char *path, loom_idx_images *out, loom_error *err) {
    memset(out, 0, sizeof *out);
    gzFile f;
    uint32_t d[3] = {0};
    loom_status st =
        open_header(path, LOOM_IDX_MAGIC_IMAGES, 3, "u8 images [n, rows, cols]", &f, d, err);
    if (st != LOOM_OK) return st;
    if (d[0] < 1 || d[0] > IDX_MAX_N || d[1] < 1 || d[1] > IDX_MAX_SIDE || d[2] < 1 ||
        d[2] > IDX_MAX_SIDE)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: sizes [%" PRIu32 ", %" PRIu32 ", %" PRIu32
                            "], expected n in 1..%d and rows, cols in 1..%d",
                            path, d[0], d[1], d[2], IDX_MAX_N, IDX_MAX_SIDE);
    int64_t bytes = (int64_t)d[0] * d[1] * d[2];
    if (st == LOOM_OK && !(out->pixels = malloc((size_t)bytes)))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for %" PRId64 " bytes", path,
                            bytes);
    if (st == LOOM_OK) st = read_body(f, path, out->pixels, bytes, "pixels", err);
    gzclose(f);
    if (st != LOOM_OK) {
        loom_idx_images_free(out);
        return st;
    }
    out->n = d[0];
    out->rows = (int)d[1];
    out->cols = (int)d[2];
    return LOOM_OK;
}

void loom_idx_images_free(loom_idx_images *img) {
    if (!img) return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}

loom_status loom_idx_read_labels(const char *path, uint8_t **labels, int64_t *n, loom_error *err) {
    *labels = NULL;
    *n = 0;
    gzFile f;
    uint32_t d[1] = {0};
    loom_status st = open_header(path, LOOM_IDX_MAGIC_LABELS, 1, "u8 labels [n]", &f, d, err);
    if (st != LOOM_OK) return st;
    uint8_t *buf = NULL;
    if (d[0] < 1 || d[0] > IDX_MAX_N)
        st = loom_error_set(err, LOOM_ERR_INPUT, "%s: %" PRIu32 " labels, expected 1..%d", path,
                            d[0], IDX_MAX_N);
    if (st == LOOM_OK && !(buf = malloc(d[0])))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for %" PRIu32 " labels", path,
                            d[0]);
    if (st == LOOM_OK) st = read_body(f, path, buf, d[0], "labels", err);
    gzclose(f);
    if (st != LOOM_OK) {
        free(buf);
        return st;
    }
    *labels = buf;
    *n = d[0];
    return LOOM_OK;
}
