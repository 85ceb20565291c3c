/* TensorBoard event writer: hand-encoded protobuf inside TFRecord framing. */
#include "train/tensorboard.h"

#include "core/clock.h"
#include "core/crc32c.h"
#include "core/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct loom_tb_writer {
    FILE *file;
    char *path;
    int failed; /* a write failed: the file may end in a torn record, so no more records */
};

/* Protobuf tags: (field number << 3) | wire type. */
enum {
    EVENT_WALL_TIME = (1 << 3) | 1,    /* double, 64-bit */
    EVENT_STEP = (2 << 3) | 0,         /* int64, varint */
    EVENT_FILE_VERSION = (3 << 3) | 2, /* string */
    EVENT_SUMMARY = (5 << 3) | 2,      /* Summary message */
    SUMMARY_VALUE = (1 << 3) | 2,      /* repeated Summary.Value */
    VALUE_TAG = (1 << 3) | 2,          /* string */
    VALUE_SIMPLE_VALUE = (2 << 3) | 5, /* float, 32-bit */
};

static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = loom_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static unsigned char *put_varint(unsigned char *p, uint64_t v) {
    while (v >= 0x80) *p++ = (unsigned char)(v | 0x80), v >>= 7;
    *p++ = (unsigned char)v;
    return p;
}

static unsigned char *put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

static unsigned char *put_double(unsigned char *p, double d) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return put_le(p, bits, 8);
}

/* double -> float without the undefined behaviour of converting an out-of-range value. */
static float to_float(double v) {
    if (v > FLT_MAX) return INFINITY;
    if (v < -FLT_MAX) return -INFINITY;
    return (float)v; /* NaN stays NaN */
}

/* Writes one record around the n bytes of an Event. */
static loom_status write_record(loom_tb_writer *w, const unsigned char *data, size_t n,
                                loom_error *err) {
    if (w->failed) return loom_error_set(err, LOOM_ERR_IO, "%s: an earlier write failed", w->path);
    unsigned char head[12], tail[4];
    put_le(head, (uint64_t)n, 8);
    put_le(head + 8, masked_crc(head, 8), 4);
    put_le(tail, masked_crc(data, n), 4);
    if (fwrite(head, 1, sizeof head, w->file) != sizeof head || fwrite(data, 1, n, w->file) != n ||
        fwrite(tail, 1, sizeof tail, w->file) != sizeof tail) {
        w->failed = 1;
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    }
    return LOOM_OK;
}

/* Creates the event file with O_EXCL, so two writers never share one file. */
static loom_status create_file(loom_tb_writer *w, const char *dir, loom_error *err) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long long secs = (long long)time(NULL);
    size_t cap = strlen(dir) + strlen(host) + 64;
    for (int attempt = 0; attempt < 1000; attempt++) {
        char *path = malloc(cap);
        if (!path) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
        int len = snprintf(path, cap, "%s/events.out.tfevents.%010lld.%s", dir, secs, host);
        if (attempt > 0) snprintf(path + len, cap - (size_t)len, ".%d", attempt);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) {
            int e = errno;
            if (e == EEXIST) {
                free(path);
                continue;
            }
            loom_status st = loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot create event file: %s",
                                            path, strerror(e));
            free(path);
            return st;
        }
        w->file = fdopen(fd, "wb");
        if (!w->file) {
            loom_status st =
                loom_error_set(err, LOOM_ERR_IO, "%s: fdopen: %s", path, strerror(errno));
            close(fd);
            unlink(path);
            free(path);
            return st;
        }
        w->path = path;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_IO, "%s: 1000 event files already named for second %lld",
                          dir, secs);
}

loom_status loom_tb_open(loom_tb_writer **out, const char *dir, loom_error *err) {
    *out = NULL;
    if (!dir || !dir[0])
        return loom_error_set(err, LOOM_ERR_INPUT, "tensorboard: empty directory name");
    if (loom_mkdir_p(dir) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: cannot create the TensorBoard directory: %s", dir,
                              strerror(errno));
    loom_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    loom_status st = create_file(w, dir, err);
    if (st != LOOM_OK) {
        free(w);
        return st;
    }
    static const char version[] = "brain.Event:2";
    unsigned char buf[64], *p = buf;
    *p++ = EVENT_WALL_TIME;
    p = put_double(p, loom_wall_s());
    *p++ = EVENT_FILE_VERSION;
    p = put_varint(p, sizeof version - 1);
    memcpy(p, version, sizeof version - 1);
    p += sizeof version - 1;
    st = write_record(w, buf, (size_t)(p - buf), err);
    if (st == LOOM_OK) st = loom_tb_flush(w, err);
    if (st != LOOM_OK) {
        loom_tb_close(w);
        return st;
    }
    *out = w;
    return LOOM_OK;
}

loom_status loom_tb_scalar(loom_tb_writer *w, const char *tag, int64_t step, double value,
                           loom_error *err) {
    if (!w) return loom_error_set(err, LOOM_ERR_STATE, "tensorboard: writer is not open");
    if (!tag || !tag[0])
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: empty scalar tag", w->path);
    size_t tag_len = strlen(tag);
    /* Summary.Value = tag + simple_value; Summary = one Value; Event = time, step, summary. */
    size_t value_len = 1 + varint_len(tag_len) + tag_len + 1 + 4;
    size_t summary_len = 1 + varint_len(value_len) + value_len;
    size_t event_len =
        1 + 8 + 1 + varint_len((uint64_t)step) + 1 + varint_len(summary_len) + summary_len;
    unsigned char small[256];
    unsigned char *buf = event_len <= sizeof small ? small : malloc(event_len);
    if (!buf) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", w->path);
    unsigned char *p = buf;
    *p++ = EVENT_WALL_TIME;
    p = put_double(p, loom_wall_s());
    *p++ = EVENT_STEP;
    p = put_varint(p, (uint64_t)step); /* int64: negatives take ten bytes */
    *p++ = EVENT_SUMMARY;
    p = put_varint(p, summary_len);
    *p++ = SUMMARY_VALUE;
    p = put_varint(p, value_len);
    *p++ = VALUE_TAG;
    p = put_varint(p, tag_len);
    memcpy(p, tag, tag_len);
    p += tag_len;
    *p++ = VALUE_SIMPLE_VALUE;
    float f = to_float(value);
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    p = put_le(p, bits, 4);
    loom_status st = write_record(w, buf, (size_t)(p - buf), err);
    if (buf != small) free(buf);
    return st;
}

loom_status loom_tb_flush(loom_tb_writer *w, loom_error *err) {
    if (!w) return LOOM_OK;
    if (fflush(w->file) != 0) {
        w->failed = 1; /* part of a record may have reached the file */
        return loom_error_set(err, LOOM_ERR_IO, "%s: flush failed: %s", w->path, strerror(errno));
    }
    return LOOM_OK;
}

const char *loom_tb_path(const loom_tb_writer *w) {
    return w ? w->path : "";
}

void loom_tb_close(loom_tb_writer *w) {
    if (!w) return;
    if (w->file) fclose(w->file);
    free(w->path);
    free(w);
}
