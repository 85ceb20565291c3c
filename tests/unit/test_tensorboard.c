/* TensorBoard event files: CRC-32C test vectors, then random scalars written with
 * loom_tb_* and read back by an independent reader (TFRecord framing, both masked CRCs,
 * protobuf decoding), every single-byte corruption and truncation noticed, and, where
 * the tools exist, the same file decoded by protoc (--decode with Event's field numbers)
 * and by the Python tensorboard package. The seed is printed; LOOM_TEST_SEED overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <dirent.h>
#include <float.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "train/tensorboard.h"

static uint64_t g_seed;

static double rnd_unit(void) {
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

/* ---- an independent reader ---- */

typedef struct {
    double wall_time;
    int64_t step;
    int is_version; /* file_version event */
    char tag[512];
    float value;
} event;

typedef struct {
    event *ev;
    int n, cap;
    size_t ends[1024]; /* byte offset after each record */
} events;

static uint32_t masked(const unsigned char *p, size_t n) {
    uint32_t c = loom_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
static uint64_t le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
/* Protobuf varint at *p (below end); 0 if it runs off the end or past 10 bytes. */
static int varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    *v = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        unsigned char b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return 1;
    }
    return 0;
}
/* A length-delimited field: sets [*s, *s + *n). */
static int bytes_field(const unsigned char **p, const unsigned char *end, const unsigned char **s,
                       size_t *n) {
    uint64_t len;
    if (!varint(p, end, &len) || len > (uint64_t)(end - *p)) return 0;
    *s = *p, *n = (size_t)len, *p += len;
    return 1;
}

static const char *decode_value(const unsigned char *p, const unsigned char *end, event *e) {
    int have_tag = 0, have_value = 0;
    while (p < end) {
        uint64_t key;
        if (!varint(&p, end, &key)) return "bad Value key";
        if (key == ((1 << 3) | 2)) {
            const unsigned char *s;
            size_t n;
            if (!bytes_field(&p, end, &s, &n) || n >= sizeof e->tag) return "bad tag";
            memcpy(e->tag, s, n), e->tag[n] = '\0', have_tag = 1;
        } else if (key == ((2 << 3) | 5)) {
            if (end - p < 4) return "short simple_value";
            uint32_t bits = (uint32_t)le(p, 4);
            memcpy(&e->value, &bits, 4), p += 4, have_value = 1;
        } else {
            return "unexpected field in Summary.Value";
        }
    }
    return have_tag && have_value ? NULL : "Summary.Value without tag or simple_value";
}

static const char *decode_event(const unsigned char *p, const unsigned char *end, event *e) {
    memset(e, 0, sizeof *e);
    int have_time = 0, have_what = 0;
    while (p < end) {
        uint64_t key, v;
        const unsigned char *s;
        size_t n;
        if (!varint(&p, end, &key)) return "bad Event key";
        if (key == ((1 << 3) | 1)) {
            if (end - p < 8) return "short wall_time";
            uint64_t bits = le(p, 8);
            memcpy(&e->wall_time, &bits, 8), p += 8, have_time = 1;
        } else if (key == ((2 << 3) | 0)) {
            if (!varint(&p, end, &v)) return "bad step";
            e->step = (int64_t)v;
        } else if (key == ((3 << 3) | 2) && !have_what) {
            if (!bytes_field(&p, end, &s, &n)) return "bad file_version";
            if (n != 13 || memcmp(s, "brain.Event:2", 13) != 0) return "wrong file_version";
            e->is_version = have_what = 1;
        } else if (key == ((5 << 3) | 2) && !have_what) {
            if (!bytes_field(&p, end, &s, &n)) return "bad summary";
            const unsigned char *q = s, *qend = s + n, *vs;
            size_t vn;
            if (!varint(&q, qend, &v) || v != ((1 << 3) | 2) || !bytes_field(&q, qend, &vs, &vn) ||
                q != qend)
                return "summary is not exactly one Summary.Value";
            const char *why = decode_value(vs, vs + vn, e);
            if (why) return why;
            have_what = 1;
        } else {
            return "unexpected Event field";
        }
    }
    return have_time && have_what ? NULL : "Event without wall_time or payload";
}

/* Reads every record of the file; NULL or why it is not a valid event file. */
static const char *read_events(const unsigned char *buf, size_t size, events *out) {
    out->n = 0;
    size_t pos = 0;
    while (pos < size) {
        if (size - pos < 12) return "truncated record header";
        const unsigned char *h = buf + pos;
        if ((uint32_t)le(h + 8, 4) != masked(h, 8)) return "length CRC mismatch";
        uint64_t len = le(h, 8);
        if (len > size - pos - 12 || size - pos - 12 - len < 4) return "truncated record";
        const unsigned char *data = h + 12;
        if ((uint32_t)le(data + len, 4) != masked(data, len)) return "data CRC mismatch";
        if (out->n == out->cap) return "too many records";
        const char *why = decode_event(data, data + len, &out->ev[out->n]);
        if (why) return why;
        pos += 12 + len + 4;
        out->ends[out->n++] = pos;
    }
    return NULL;
}

static unsigned char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* ---- the tests ---- */

static void test_crc32c_vectors(void **state) {
    (void)state;
    unsigned char buf[32];
    assert_int_equal(loom_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(loom_crc32c(0, "", 0), 0);
    memset(buf, 0, 32); /* RFC 3720, B.4 */
    assert_int_equal(loom_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, 32);
    assert_int_equal(loom_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    assert_int_equal(loom_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
    assert_int_equal(loom_crc32c(0, buf, 32), 0x113FDB5Cu);
    size_t cut = rnd() % 33; /* extending in two pieces = one piece */
    assert_int_equal(loom_crc32c(loom_crc32c(0, buf, cut), buf + cut, 32 - cut), 0x113FDB5Cu);
}

typedef struct {
    char tag[400];
    int64_t step;
    double value;
} scalar;

static void random_scalar(scalar *s) {
    static const char *common[] = {"train/loss", "train/lr", "val/loss", "perf/tokens_per_s"};
    if (rnd() % 4) {
        snprintf(s->tag, sizeof s->tag, "%s", common[rnd() % 4]);
    } else { /* long, odd tags: up to 300 bytes, printable and UTF-8 */
        size_t n = 1 + rnd() % 300;
        for (size_t i = 0; i < n; i++) s->tag[i] = (char)(rnd() % 8 ? 33 + rnd() % 94 : 0xc3);
        if (s->tag[n - 1] == (char)0xc3) s->tag[n - 1] = 'x';
        s->tag[n] = '\0';
    }
    switch (rnd() % 8) {
    case 0:
        s->step = -(int64_t)(rnd() >> 2);
        break;
    case 1:
        s->step = INT64_MAX - (int64_t)(rnd() % 3);
        break;
    default:
        s->step = (int64_t)(rnd() % 100000);
    }
    switch (rnd() % 10) {
    case 0:
        s->value = 0.0;
        break;
    case 1:
        s->value = (rnd() % 2 ? 1 : -1) * 1e300;
        break; /* beyond float: infinity */
    case 2:
        s->value = NAN;
        break;
    case 3:
        s->value = 1e-300;
        break;
    default:
        s->value = (rnd_unit() - 0.5) * pow(10.0, (double)(rnd() % 20) - 10.0);
    }
}

static float expected_float(double v) {
    if (v > FLT_MAX) return INFINITY;
    if (v < -FLT_MAX) return -INFINITY;
    return (float)v;
}

static void assert_same_float(float got, double want) {
    float w = expected_float(want);
    if (isnan(w)) {
        assert_true(isnan(got));
        return;
    }
    uint32_t a, b;
    memcpy(&a, &got, 4), memcpy(&b, &w, 4);
    assert_int_equal(a, b);
}

/* protoc --decode with a subset of event.proto, where protoc exists. */
static void check_with_protoc(const char *dir, const unsigned char *buf, const events *evs,
                              const scalar *sc) {
    if (system("command -v protoc >/dev/null 2>&1") != 0) {
        printf("test_tensorboard: protoc not found, skipping the protoc check\n");
        return;
    }
    char proto[4096], rec[4096], cmd[16384], line[1024];
    snprintf(proto, sizeof proto, "%s/event.proto", dir);
    snprintf(rec, sizeof rec, "%s/record.bin", dir);
    FILE *f = fopen(proto, "w");
    assert_non_null(f);
    fputs("syntax = \"proto3\";\npackage tensorflow;\n"
          "message Summary { message Value { string tag = 1; float simple_value = 2; }\n"
          "  repeated Value value = 1; }\n"
          "message Event { double wall_time = 1; int64 step = 2;\n"
          "  oneof what { string file_version = 3; Summary summary = 5; } }\n",
          f);
    fclose(f);
    int checked = 0;
    for (int i = 1; i < evs->n; i++) {
        if (strchr(sc[i - 1].tag, (char)0xc3) || strchr(sc[i - 1].tag, '"') ||
            strchr(sc[i - 1].tag, '\\') || strchr(sc[i - 1].tag, '\''))
            continue; /* protoc escapes these; the plain ones are enough here */
        size_t start = evs->ends[i - 1] + 12, len = evs->ends[i] - 4 - start;
        f = fopen(rec, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf + start, 1, len, f), len);
        fclose(f);
        snprintf(cmd, sizeof cmd, "protoc -I'%s' --decode=tensorflow.Event '%s' <'%s'", dir, proto,
                 rec);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        int saw_tag = 0, saw_step = sc[i - 1].step == 0, saw_value = 0;
        while (fgets(line, sizeof line, p)) {
            char *s = line + strspn(line, " ");
            s[strcspn(s, "\n")] = '\0';
            if (strncmp(s, "tag: \"", 6) == 0)
                saw_tag = strlen(s) == 7 + strlen(sc[i - 1].tag) &&
                          strncmp(s + 6, sc[i - 1].tag, strlen(sc[i - 1].tag)) == 0;
            if (strncmp(s, "step: ", 6) == 0) saw_step = strtoll(s + 6, NULL, 10) == sc[i - 1].step;
            if (strncmp(s, "simple_value: ", 14) == 0) {
                float v = strtof(s + 14, NULL);
                float w = expected_float(sc[i - 1].value);
                saw_value = (isnan(v) && isnan(w)) || v == w;
            }
        }
        assert_int_equal(pclose(p), 0);
        /* proto3 leaves a zero simple_value out of the text */
        if (expected_float(sc[i - 1].value) == 0.0f) saw_value = 1;
        assert_true(saw_tag && saw_step && saw_value);
        checked++;
    }
    printf("test_tensorboard: protoc decoded %d events identically\n", checked);
}

/* The Python tensorboard package's own reader, where it is installed (not required). */
static void check_with_python_tensorboard(const char *path, const scalar *sc, int n) {
    if (system("/usr/bin/python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
        printf("test_tensorboard: python tensorboard not importable, skipping that check\n");
        return;
    }
    char cmd[8192], line[2048];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c 'import sys, struct\n"
             "from tensorboard.backend.event_processing import event_file_loader as L\n"
             "for e in L.LegacyEventFileLoader(sys.argv[1]).Load():\n"
             "    for v in e.summary.value:\n"
             "        print(e.step, struct.pack(\"<f\", v.simple_value).hex())\n' '%s'",
             path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int i = 0;
    while (fgets(line, sizeof line, p)) {
        assert_true(i < n);
        long long step = strtoll(line, NULL, 10);
        assert_int_equal(step, sc[i].step);
        float w = expected_float(sc[i].value);
        unsigned char b[4];
        memcpy(b, &w, 4);
        char hex[9];
        snprintf(hex, sizeof hex, "%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
        if (!isnan(w)) assert_non_null(strstr(line, hex));
        i++;
    }
    assert_int_equal(pclose(p), 0);
    assert_int_equal(i, n);
    printf("test_tensorboard: python tensorboard read %d scalars identically\n", n);
}

static void test_round_trip(void **state) {
    const char *dir = *state;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/a/b", dir); /* created by open */
    int n = 1 + (int)(rnd() % 300);
    scalar *sc = calloc((size_t)n, sizeof *sc);
    assert_non_null(sc);
    for (int i = 0; i < n; i++) random_scalar(&sc[i]);
    double t0 = (double)time(NULL);
    loom_tb_writer *w = NULL;
    loom_error err = {0};
    assert_int_equal(loom_tb_open(&w, sub, &err), LOOM_OK);
    for (int i = 0; i < n; i++) {
        assert_int_equal(loom_tb_scalar(w, sc[i].tag, sc[i].step, sc[i].value, &err), LOOM_OK);
        if (rnd() % 16 == 0) assert_int_equal(loom_tb_flush(w, &err), LOOM_OK);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", loom_tb_path(w));
    loom_tb_close(w);
    double t1 = (double)time(NULL) + 1;

    /* The name TensorBoard looks for: events.out.tfevents.<10-digit seconds>.<host>. */
    char host[256] = {0}, want[600];
    gethostname(host, sizeof host - 1);
    const char *base = strrchr(path, '/') + 1;
    assert_int_equal(strncmp(path, sub, strlen(sub)), 0);
    assert_int_equal(strncmp(base, "events.out.tfevents.", 20), 0);
    long long secs = strtoll(base + 20, NULL, 10);
    assert_true(secs >= (long long)t0 && secs <= (long long)t1);
    snprintf(want, sizeof want, "events.out.tfevents.%010lld.%s", secs, host);
    assert_string_equal(base, want);

    size_t size;
    unsigned char *buf = slurp(path, &size);
    events evs = {.ev = calloc((size_t)n + 1, sizeof(event)), .cap = n + 1};
    assert_non_null(evs.ev);
    const char *why = read_events(buf, size, &evs);
    if (why) fail_msg("%s: %s", path, why);
    assert_int_equal(evs.n, n + 1);
    assert_true(evs.ev[0].is_version);
    for (int i = 0; i <= n; i++)
        assert_true(evs.ev[i].wall_time >= t0 - 1 && evs.ev[i].wall_time <= t1 + 1);
    for (int i = 0; i < n; i++) {
        const event *e = &evs.ev[i + 1];
        assert_false(e->is_version);
        assert_string_equal(e->tag, sc[i].tag);
        assert_int_equal(e->step, sc[i].step);
        assert_same_float(e->value, sc[i].value);
    }
    check_with_protoc(dir, buf, &evs, sc);
    check_with_python_tensorboard(path, sc, n);
    free(evs.ev);
    free(buf);
    free(sc);
}

/* Every single-byte change and every truncation that does not end on a record boundary is
 * noticed; a truncation on a boundary reads as the records before it. */
static void test_corruption_noticed(void **state) {
    loom_tb_writer *w = NULL;
    loom_error err = {0};
    assert_int_equal(loom_tb_open(&w, *state, &err), LOOM_OK);
    scalar sc[3];
    for (int i = 0; i < 3; i++) {
        random_scalar(&sc[i]);
        assert_int_equal(loom_tb_scalar(w, sc[i].tag, sc[i].step, sc[i].value, &err), LOOM_OK);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", loom_tb_path(w));
    loom_tb_close(w);
    size_t size;
    unsigned char *buf = slurp(path, &size);
    event ev[8];
    events evs = {.ev = ev, .cap = 8};
    assert_null(read_events(buf, size, &evs));
    assert_int_equal(evs.n, 4);
    size_t ends[4];
    memcpy(ends, evs.ends, sizeof ends);
    for (size_t i = 0; i < size; i++) {
        unsigned char flip = (unsigned char)(1 + rnd() % 255);
        buf[i] ^= flip;
        if (!read_events(buf, size, &evs)) fail_msg("byte %zu ^= 0x%02x went unnoticed", i, flip);
        buf[i] ^= flip;
    }
    for (size_t len = 0; len < size; len++) {
        const char *why = read_events(buf, len, &evs);
        int boundary = len == 0 || len == ends[0] || len == ends[1] || len == ends[2];
        if (boundary)
            assert_null(why);
        else if (!why)
            fail_msg("truncation to %zu bytes went unnoticed", len);
    }
    free(buf);
}

static int count_event_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, "tfevents") != NULL;
    closedir(d);
    return n;
}

static void test_two_writers_and_errors(void **state) {
    const char *dir = *state;
    loom_tb_writer *a = NULL, *b = NULL;
    loom_error err = {0};
    assert_int_equal(loom_tb_open(&a, dir, &err), LOOM_OK);
    assert_int_equal(loom_tb_open(&b, dir, &err), LOOM_OK); /* same second: another name */
    assert_string_not_equal(loom_tb_path(a), loom_tb_path(b));
    assert_int_equal(count_event_files(dir), 2);
    assert_int_equal(loom_tb_scalar(a, "", 1, 1.0, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "tag"));
    loom_tb_close(a);
    loom_tb_close(b);
    loom_tb_close(NULL);

    char file[4096], below[4200];
    snprintf(file, sizeof file, "%s/plain_file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(below, sizeof below, "%s/logs", file);
    loom_tb_writer *c = (loom_tb_writer *)1;
    assert_int_equal(loom_tb_open(&c, below, &err), LOOM_ERR_INPUT);
    assert_null(c);
    assert_non_null(strstr(err.msg, below));
    assert_int_equal(loom_tb_open(&c, "", &err), LOOM_ERR_INPUT);
    assert_int_equal(loom_tb_open(&c, file, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, file));
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    g_rng = g_seed;
    printf("test_tensorboard: LOOM_TEST_SEED=%" PRIu64 "\n", g_seed);
#define T(f) cmocka_unit_test_setup_teardown(f, setup_dir, teardown_dir)
    const struct CMUnitTest tests[] = {
        T(test_crc32c_vectors), T(test_round_trip),         T(test_round_trip),
        T(test_round_trip),     T(test_corruption_noticed), T(test_two_writers_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
