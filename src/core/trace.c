#include "core/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"

typedef struct {
    int64_t ts_ns, dur_ns;           /* relative to the open time; dur_ns < 0: span still open */
    const char *name, *cat;          /* compute spans: the caller's static strings; comm: NULL */
    int32_t tid;                     /* 0: "compute"; 1 + k: lane "comm k" */
    char cname[LOOM_TRACE_NAME_MAX]; /* comm spans: the copied name */
} trace_event;

struct loom_trace {
    pthread_mutex_t mu;
    int rank;
    int64_t origin_ns; /* CLOCK_MONOTONIC at open */
    trace_event *ev;
    size_t cap, n;
    uint64_t dropped, unmatched_ends;
    int depth;                           /* may exceed LOOM_TRACE_MAX_DEPTH (dropped levels) */
    int64_t stack[LOOM_TRACE_MAX_DEPTH]; /* event index per open level, -1 if dropped */
    int64_t lane_end[LOOM_TRACE_MAX_LANES];
    int lanes_used;
};

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double loom_trace_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

loom_status loom_trace_open(loom_trace **t, int rank, size_t max_events, loom_error *err) {
    if (!t)
        return loom_error_set(err, LOOM_ERR_STATE, "trace open: expected a place for the trace");
    *t = NULL;
    if (rank < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "trace open: rank %d, expected >= 0", rank);
    size_t most = SIZE_MAX / 2 / sizeof(trace_event);
    if (max_events == 0 || max_events > most)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "trace open: max_events %zu, expected between 1 and %zu", max_events,
                              most);
    loom_trace *tr = calloc(1, sizeof *tr);
    trace_event *ev = malloc(max_events * sizeof *ev);
    if (!tr || !ev) {
        free(tr);
        free(ev);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "trace open: cannot allocate room for %zu events (%zu MiB)",
                              max_events, max_events * sizeof *ev >> 20);
    }
    /* Touch every page now, so recording never takes a page fault. */
    memset(ev, 0, max_events * sizeof *ev);
    if (pthread_mutex_init(&tr->mu, NULL) != 0) {
        free(tr);
        free(ev);
        return loom_error_set(err, LOOM_ERR_STATE, "trace open: cannot create its mutex");
    }
    tr->rank = rank;
    tr->ev = ev;
    tr->cap = max_events;
    tr->origin_ns = mono_ns();
    *t = tr;
    return LOOM_OK;
}

void loom_trace_close(loom_trace *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->ev);
    free(t);
}

void loom_trace_begin(loom_trace *t, const char *name, const char *cat) {
    if (!t) return;
    int64_t now = mono_ns() - t->origin_ns;
    pthread_mutex_lock(&t->mu);
    int64_t idx = -1;
    if (t->depth < LOOM_TRACE_MAX_DEPTH && t->n < t->cap) {
        idx = (int64_t)t->n++;
        trace_event *e = &t->ev[idx];
        e->ts_ns = now;
        e->dur_ns = -1;
        e->name = name ? name : "?";
        e->cat = cat ? cat : "compute";
        e->tid = 0;
    }
    if (t->depth < LOOM_TRACE_MAX_DEPTH) t->stack[t->depth] = idx;
    if (idx < 0) t->dropped++;
    t->depth++;
    pthread_mutex_unlock(&t->mu);
}

void loom_trace_end(loom_trace *t) {
    if (!t) return;
    int64_t now = mono_ns() - t->origin_ns;
    pthread_mutex_lock(&t->mu);
    if (t->depth == 0) {
        t->unmatched_ends++;
    } else {
        t->depth--;
        if (t->depth < LOOM_TRACE_MAX_DEPTH && t->stack[t->depth] >= 0) {
            trace_event *e = &t->ev[t->stack[t->depth]];
            e->dur_ns = now - e->ts_ns;
        }
    }
    pthread_mutex_unlock(&t->mu);
}

/* Copies at most LOOM_TRACE_NAME_MAX - 1 bytes, never cutting a UTF-8 character. */
static void copy_name(char *dst, const char *src) {
    size_t n = strnlen(src, LOOM_TRACE_NAME_MAX);
    if (n == LOOM_TRACE_NAME_MAX) {
        n = LOOM_TRACE_NAME_MAX - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) n--;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void loom_trace_comm(loom_trace *t, const char *name, double start_us, double end_us) {
    if (!t) return;
    /* 1e15 µs is 31 years: beyond that (or NaN) the time is garbage, not a span. */
    int bad =
        !isfinite(start_us) || !isfinite(end_us) || fabs(start_us) > 1e15 || fabs(end_us) > 1e15;
    int64_t s = bad ? 0 : llround(start_us * 1e3) - t->origin_ns;
    int64_t e = bad ? 0 : llround(end_us * 1e3) - t->origin_ns;
    if (e < s) e = s;
    pthread_mutex_lock(&t->mu);
    int lane = -1;
    if (!bad && t->n < t->cap) {
        for (int k = 0; k < t->lanes_used && lane < 0; k++)
            if (t->lane_end[k] <= s) lane = k;
        if (lane < 0 && t->lanes_used < LOOM_TRACE_MAX_LANES) lane = t->lanes_used++;
    }
    if (lane < 0) {
        t->dropped++;
    } else {
        trace_event *ev = &t->ev[t->n++];
        ev->ts_ns = s;
        ev->dur_ns = e - s;
        ev->name = NULL;
        ev->cat = "comm";
        ev->tid = 1 + lane;
        copy_name(ev->cname, name ? name : "?");
        t->lane_end[lane] = e;
    }
    pthread_mutex_unlock(&t->mu);
}

/* Length of the valid UTF-8 sequence at p (2 to 4), or 0 if it is not one (what jansson
 * and browsers reject: overlong forms, surrogates, code points past U+10FFFF). */
static int utf8_len(const unsigned char *p) {
    int n = p[0] >= 0xF5 ? 0 : p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    uint32_t cp = p[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0; /* also stops at the NUL */
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

static void put_string(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p) {
        int n = *p < 0x80 ? 1 : utf8_len(p);
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else if (n > 0)
            fwrite(p, 1, (size_t)n, f);
        else
            fputs("\\ufffd", f); /* an invalid byte */
        p += n > 0 ? n : 1;
    }
    fputc('"', f);
}

/* Nanoseconds as microseconds with exactly three decimals (no rounding). */
static void put_us(FILE *f, int64_t ns) {
    if (ns < 0) {
        fputc('-', f);
        ns = -ns;
    }
    fprintf(f, "%" PRId64 ".%03d", ns / 1000, (int)(ns % 1000));
}

static void put_meta(FILE *f, int pid, int tid, const char *what, const char *key, const char *sval,
                     long ival) {
    fprintf(f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", what, pid,
            tid, key);
    if (sval)
        put_string(f, sval);
    else
        fprintf(f, "%ld", ival);
    fputs("}},\n", f);
}

static void put_events(FILE *f, const loom_trace *t, int64_t now) {
    int r = t->rank;
    uint64_t unfinished = 0;
    for (size_t i = 0; i < t->n; i++) unfinished += t->ev[i].dur_ns < 0;
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
            "\"rank %d\",\"dropped_events\":%" PRIu64 ",\"recorded_events\":%zu,\"max_events\":"
            "%zu,\"unfinished_spans\":%" PRIu64 ",\"unmatched_ends\":%" PRIu64 "}},\n",
            r, r, t->dropped, t->n, t->cap, unfinished, t->unmatched_ends);
    put_meta(f, r, 0, "process_sort_index", "sort_index", NULL, r);
    if (t->dropped > 0) {
        char label[64];
        snprintf(label, sizeof label, "dropped %" PRIu64 " events", t->dropped);
        put_meta(f, r, 0, "process_labels", "labels", label, 0);
    }
    put_meta(f, r, 0, "thread_name", "name", "compute", 0);
    put_meta(f, r, 0, "thread_sort_index", "sort_index", NULL, 0);
    for (int k = 0; k < t->lanes_used; k++) {
        char lane[32];
        snprintf(lane, sizeof lane, "comm %d", k);
        put_meta(f, r, 1 + k, "thread_name", "name", lane, 0);
        put_meta(f, r, 1 + k, "thread_sort_index", "sort_index", NULL, 1 + k);
    }
    for (size_t i = 0; i < t->n; i++) {
        const trace_event *e = &t->ev[i];
        int open = e->dur_ns < 0;
        fputs("{\"name\":", f);
        put_string(f, e->name ? e->name : e->cname);
        fputs(",\"cat\":", f);
        put_string(f, e->cat);
        fputs(",\"ph\":\"X\",\"ts\":", f);
        put_us(f, e->ts_ns);
        fputs(",\"dur\":", f);
        put_us(f, open ? (now > e->ts_ns ? now - e->ts_ns : 0) : e->dur_ns);
        fprintf(f, ",\"pid\":%d,\"tid\":%d%s}%s", r, (int)e->tid,
                open ? ",\"args\":{\"unfinished\":true}" : "", i + 1 < t->n ? ",\n" : "");
    }
}

loom_status loom_trace_serialize(const loom_trace *t, char **json, size_t *len, loom_error *err) {
    if (!json || !len)
        return loom_error_set(err, LOOM_ERR_STATE, "trace serialize: expected output pointers");
    *json = NULL;
    *len = 0;
    if (!t) {
        *json = calloc(1, 1);
        if (!*json) return loom_error_set(err, LOOM_ERR_NOMEM, "trace serialize: out of memory");
        return LOOM_OK;
    }
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f)
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "trace serialize: rank %d: cannot open a memory stream: %s", t->rank,
                              strerror(errno));
    /* The buffer is only read, but comm spans may be arriving from another thread. */
    loom_trace *m = (loom_trace *)t;
    int64_t now = mono_ns() - t->origin_ns;
    pthread_mutex_lock(&m->mu);
    put_events(f, t, now);
    size_t n = t->n;
    pthread_mutex_unlock(&m->mu);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || !buf) {
        free(buf);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "trace serialize: rank %d: out of memory writing %zu events as JSON",
                              t->rank, n);
    }
    /* A fragment never ends with the separator: the last event has none, and with no
     * events the metadata's trailing ",\n" is cut here. */
    while (size > 0 && (buf[size - 1] == '\n' || buf[size - 1] == ',')) buf[--size] = '\0';
    *json = buf;
    *len = size;
    return LOOM_OK;
}

/* A fragment must be a list of objects: first non-space byte '{', last '}'. */
static int fragment_ok(const char *s, size_t len, size_t *lo, size_t *hi) {
    size_t a = 0, b = len;
    while (a < b && (s[a] == ' ' || s[a] == '\n' || s[a] == '\t' || s[a] == '\r')) a++;
    while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\n' || s[b - 1] == '\t' || s[b - 1] == '\r'))
        b--;
    *lo = a;
    *hi = b;
    return a == b || (s[a] == '{' && s[b - 1] == '}');
}

static loom_status write_body(FILE *f, const char *tmp, char **fragments, const size_t *lens,
                              int n_ranks, loom_error *err) {
    fputs("{\"traceEvents\":[\n", f);
    int first = 1;
    for (int r = 0; r < n_ranks; r++) {
        size_t lo = 0, hi = 0;
        if (lens[r] > 0) fragment_ok(fragments[r], lens[r], &lo, &hi);
        if (lo == hi) continue;
        if (!first) fputs(",\n", f);
        fwrite(fragments[r] + lo, 1, hi - lo, f);
        first = 0;
    }
    fprintf(f,
            "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"writer\":\"loom\",\"ranks\":%d,"
            "\"clock\":\"CLOCK_MONOTONIC in microseconds since each rank opened its trace; "
            "ranks on different hosts are not aligned\"}}\n",
            n_ranks);
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "trace file %s: write failed: %s", tmp,
                              strerror(errno));
    return LOOM_OK;
}

loom_status loom_trace_write_file(const char *path, char **fragments, const size_t *lens,
                                  int n_ranks, loom_error *err) {
    if (!path || !*path || !fragments || !lens || n_ranks < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "trace file %s: expected a path, fragments and lengths for at "
                              "least one rank (got %d ranks)",
                              path ? path : "(null)", n_ranks);
    for (int r = 0; r < n_ranks; r++) {
        size_t lo, hi;
        if (lens[r] > 0 && (!fragments[r] || !fragment_ok(fragments[r], lens[r], &lo, &hi)))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "trace file %s: the fragment of rank %d (%zu bytes) is not a "
                                  "list of JSON objects; expected the output of "
                                  "loom_trace_serialize",
                                  path, r, lens[r]);
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return loom_error_set(err, LOOM_ERR_NOMEM, "trace file %s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    loom_status st = LOOM_OK;
    FILE *f = NULL;
    if (loom_mkdir_parent(path) != 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "trace file %s: cannot create its folder: %s", path,
                            strerror(errno));
        goto done;
    }
    f = fopen(tmp, "w");
    if (!f) {
        st = loom_error_set(err, LOOM_ERR_IO, "trace file %s: cannot create: %s", tmp,
                            strerror(errno));
        goto done;
    }
    st = write_body(f, tmp, fragments, lens, n_ranks, err);
    int closed = fclose(f);
    if (st == LOOM_OK && closed != 0)
        st = loom_error_set(err, LOOM_ERR_IO, "trace file %s: close failed: %s", tmp,
                            strerror(errno));
    if (st == LOOM_OK && rename(tmp, path) != 0)
        st = loom_error_set(err, LOOM_ERR_IO, "trace file %s: cannot rename %s to it: %s", path,
                            tmp, strerror(errno));
    if (st != LOOM_OK) unlink(tmp);
done:
    free(tmp);
    return st;
}
