/* diagnosis.json and the human summary of one failure (the rules are in detect.c). */
#include "ft/detect.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAIL_LINES 20

/* The last TAIL_LINES lines of a file (bounded read of its end). */
static json_t *log_tail(const char *path) {
    json_t *a = json_array();
    FILE *fp = path && path[0] ? fopen(path, "rb") : NULL;
    if (!fp) return a;
    char buf[8192];
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(fp, from, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    char *lines[TAIL_LINES];
    int count = 0;
    for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (count == TAIL_LINES) {
            memmove(lines, lines + 1, (TAIL_LINES - 1) * sizeof *lines);
            count--;
        }
        lines[count++] = l;
    }
    for (int i = from > 0 ? 1 : 0; i < count; i++) json_array_append_new(a, json_string(lines[i]));
    return a;
}

static json_t *rank_list(const int *r, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(r[i]));
    return a;
}

/* The communicator instance of a wait record, into object o. */
static void group_json(json_t *o, const loom_wait_record *w) {
    json_object_set_new(o, "group", json_string(w->group));
    json_object_set_new(o, "group_first_rank",
                        w->comm_first >= 0 ? json_integer(w->comm_first) : json_null());
    json_object_set_new(o, "group_size", json_integer(w->comm_size));
    json_object_set_new(o, "group_ranks", rank_list(w->members, w->n_members));
}

/* Every collective waited in when the hang was detected (the victims' too). */
static json_t *waits_json(const loom_failure *f) {
    json_t *a = json_array();
    for (int i = 0; i < f->n_waits; i++) {
        const loom_wait_record *w = &f->waits[i];
        json_t *o = json_object();
        json_object_set_new(o, "communicator", json_string(w->comm));
        group_json(o, w);
        json_object_set_new(o, "op", json_string(w->op));
        json_object_set_new(o, "seq", json_integer((json_int_t)w->seq));
        json_object_set_new(o, "waited_s", json_real(round(w->waited_s * 1e3) / 1e3));
        json_object_set_new(o, "waiting", rank_list(w->waiting, w->n_waiting));
        json_object_set_new(o, "culprits", rank_list(w->culprits, w->n_culprits));
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *number_or_null(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

static void iso_now(char *out, size_t size) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static loom_status dump(json_t *j, const char *path, loom_error *err) {
    if (json_dump_file(j, path, JSON_INDENT(2)) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "loom run: cannot write %s", path);
    return LOOM_OK;
}

loom_status loom_diagnosis_write(const loom_failure *f, const char *dir, const char *attempt_dir,
                                 const char *rank_log, const char *recovery, json_t *batch,
                                 loom_error *err) {
    char when[32];
    iso_now(when, sizeof when);
    json_t *j = json_object();
    json_object_set_new(j, "time", json_string(when));
    json_object_set_new(j, "attempt", json_integer(f->attempt));
    json_object_set_new(j, "kind", json_string(loom_fail_kind_name(f->kind)));
    json_object_set_new(j, "rank", f->rank >= 0 ? json_integer(f->rank) : json_null());
    json_object_set_new(j, "host", json_string(f->host));
    json_object_set_new(j, "step", json_integer(f->step));
    json_object_set_new(j, "detail", json_string(f->detail));
    json_object_set_new(j, "exit_status", json_integer(f->exit_status));
    if (f->kind == LOOM_FAIL_SPIKE || f->kind == LOOM_FAIL_NONFINITE) {
        json_object_set_new(j, "loss", number_or_null(f->loss));
        json_object_set_new(j, "baseline_loss", number_or_null(f->baseline_loss));
    }
    if (f->kind == LOOM_FAIL_SPIKE) {
        json_t *sp = json_object();
        json_object_set_new(sp, "scope",
                            json_string("global: the mean over every rank's slice of the batch "
                                        "(no rank failed)"));
        json_object_set_new(sp, "culprits", rank_list(f->culprits, f->n_culprits));
        if (f->n_culprits) {
            json_object_set_new(sp, "culprit_loss", number_or_null(f->rank_loss));
            json_object_set_new(sp, "culprit_baseline", number_or_null(f->rank_baseline));
        }
        json_object_set_new(j, "spike", sp);
    }
    if (f->kind == LOOM_FAIL_HOST || f->kind == LOOM_FAIL_PARTITION)
        json_object_set_new(j, "host_ranks", rank_list(f->culprits, f->n_culprits));
    if (batch) json_object_set_new(j, "batch", batch);
    if (f->kind == LOOM_FAIL_HANG || f->kind == LOOM_FAIL_NONFINITE) {
        json_t *h = json_object();
        if (f->kind == LOOM_FAIL_HANG) {
            json_object_set_new(h, "communicator", json_string(f->comm));
            group_json(h, &f->hung);
            json_object_set_new(h, "op", json_string(f->op));
            json_object_set_new(h, "seq", json_integer((json_int_t)f->seq));
            json_object_set_new(h, "waited_s", json_real(round(f->waited_s * 1e3) / 1e3));
            json_object_set_new(h, "waiting", rank_list(f->waiting, f->n_waiting));
        }
        json_object_set_new(h, "culprits", rank_list(f->culprits, f->n_culprits));
        json_object_set_new(j, f->kind == LOOM_FAIL_HANG ? "collective" : "nonfinite", h);
        if (f->kind == LOOM_FAIL_HANG) json_object_set_new(j, "waits", waits_json(f));
    }
    json_object_set_new(j, "log", json_string(rank_log ? rank_log : ""));
    json_object_set_new(j, "log_tail", log_tail(rank_log));
    json_object_set_new(j, "recovery", json_string(recovery));
    char path[2048];
    snprintf(path, sizeof path, "%s/diagnosis.json", attempt_dir);
    loom_status st = dump(j, path, err);
    snprintf(path, sizeof path, "%s/diagnosis.json", dir);
    if (!st) st = dump(j, path, err);
    /* The human summary: the same facts in a few lines. */
    char text[8192];
    int n = snprintf(text, sizeof text, "loom run: FAILURE (attempt %d): %s", f->attempt,
                     loom_fail_kind_name(f->kind));
    if (f->kind == LOOM_FAIL_HOST || f->kind == LOOM_FAIL_PARTITION) {
        n += snprintf(text + n, sizeof text - n, " of host %s (rank%s", f->host,
                      f->n_culprits > 1 ? "s" : "");
        for (int i = 0; i < f->n_culprits && n < 1000; i++)
            n += snprintf(text + n, sizeof text - n, "%s%d", i ? "," : " ", f->culprits[i]);
        n += snprintf(text + n, sizeof text - n, ")");
    } else if (f->rank >= 0)
        n += snprintf(text + n, sizeof text - n, " of rank %d%s%s", f->rank,
                      f->host[0] ? " on " : "", f->host);
    n +=
        snprintf(text + n, sizeof text - n, " at step %lld\n  %s\n", (long long)f->step, f->detail);
    if (f->kind == LOOM_FAIL_HANG) {
        n += snprintf(text + n, sizeof text - n,
                      "  group %s; culprits (never entered):", f->hung.group);
        for (int i = 0; i < f->n_culprits; i++)
            n += snprintf(text + n, sizeof text - n, " %d", f->culprits[i]);
        n += snprintf(text + n, sizeof text - n, "; waiting in it:");
        for (int i = 0; i < f->n_waiting; i++)
            n += snprintf(text + n, sizeof text - n, " %d", f->waiting[i]);
        n += snprintf(text + n, sizeof text - n, "\n");
        for (int k = 0; k < f->n_waits && n < (int)sizeof text - 300; k++) {
            const loom_wait_record *w = &f->waits[k];
            n += snprintf(text + n, sizeof text - n, "  waits: %s #%llu on %s for %.1f s by", w->op,
                          (unsigned long long)w->seq, w->group, w->waited_s);
            for (int i = 0; i < w->n_waiting && i < 16; i++)
                n += snprintf(text + n, sizeof text - n, " %d", w->waiting[i]);
            n += snprintf(text + n, sizeof text - n, "; never entered by");
            for (int i = 0; i < w->n_culprits && i < 16; i++)
                n += snprintf(text + n, sizeof text - n, " %d", w->culprits[i]);
            n += snprintf(text + n, sizeof text - n, "\n");
        }
    }
    json_t *tail = json_object_get(j, "log_tail");
    size_t nt = json_array_size(tail);
    if (nt && rank_log) {
        n += snprintf(text + n, sizeof text - n, "  last lines of %s:\n", rank_log);
        for (size_t i = nt > 5 ? nt - 5 : 0; i < nt && n < (int)sizeof text - 200; i++)
            n += snprintf(text + n, sizeof text - n, "    | %s\n",
                          json_string_value(json_array_get(tail, i)));
    }
    json_t *seqs = batch ? json_object_get(batch, "sequences") : NULL;
    if (seqs && n < (int)sizeof text - 400) {
        n += snprintf(text + n, sizeof text - n, "  batch %lld of the data order:",
                      (long long)json_integer_value(json_object_get(batch, "index")));
        for (size_t i = 0; i < json_array_size(seqs) && i < 4; i++) {
            json_t *q = json_array_get(seqs, i);
            n += snprintf(text + n, sizeof text - n, "%s seq %lld (dp rank %lld) at token %lld",
                          i ? "," : "", (long long)json_integer_value(json_object_get(q, "seq")),
                          (long long)json_integer_value(json_object_get(q, "dp_rank")),
                          (long long)json_integer_value(json_object_get(q, "token_offset")));
        }
        n += snprintf(text + n, sizeof text - n, "%s (diagnosis.json lists all)\n",
                      json_array_size(seqs) > 4 ? ", ..." : "");
    }
    if (n < (int)sizeof text - 100)
        snprintf(text + n, sizeof text - n, "  recovery: %s\n", recovery);
    fputs(text, stderr);
    snprintf(path, sizeof path, "%s/diagnosis.txt", dir);
    FILE *fp = fopen(path, "a");
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    } else if (!st) {
        st = loom_error_set(err, LOOM_ERR_IO, "loom run: cannot write %s: %s", path,
                            strerror(errno));
    }
    json_decref(j);
    return st;
}

loom_status loom_stragglers_write(const loom_straggler *s, int n, const char *dir, int attempt,
                                  loom_error *err) {
    char path[2048];
    snprintf(path, sizeof path, "%s/stragglers.jsonl", dir);
    FILE *fp = fopen(path, "a");
    if (!fp)
        return loom_error_set(err, LOOM_ERR_IO, "loom run: cannot write %s: %s", path,
                              strerror(errno));
    for (int i = 0; i < n; i++) {
        fprintf(stderr,
                "loom run: STRAGGLER: rank %d on %s computes %.1f ms per step, %.2fx the others' "
                "%.1f ms, and waits %.1f ms for communication (the others %.1f ms; reported, "
                "not restarted)\n",
                s[i].rank, s[i].host, s[i].compute_ms, s[i].slowdown, s[i].others_ms,
                s[i].blocked_ms, s[i].others_blocked_ms);
        fprintf(fp,
                "{\"attempt\": %d, \"rank\": %d, \"host\": \"%s\", \"compute_ms\": %.3f, "
                "\"others_ms\": %.3f, \"slowdown\": %.3f, \"blocked_ms\": %.3f, "
                "\"others_blocked_ms\": %.3f}\n",
                attempt, s[i].rank, s[i].host, s[i].compute_ms, s[i].others_ms, s[i].slowdown,
                s[i].blocked_ms, s[i].others_blocked_ms);
    }
    fclose(fp);
    return LOOM_OK;
}
