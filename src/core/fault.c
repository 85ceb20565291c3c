#include "core/fault.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

static const char *KINDS[LOOM_FAULT_KIND_COUNT] = {
    "crash", "hang", "slow", "nan", "corrupt-ckpt", "kill-during-save", "spike", "admit", "segv"};

const char *loom_fault_kind_name(loom_fault_kind k) {
    return k >= 0 && k < LOOM_FAULT_KIND_COUNT ? KINDS[k] : "unknown";
}

static loom_status bad(loom_error *err, const char *what, const char *spec, const char *why) {
    return loom_error_set(
        err, LOOM_ERR_INPUT,
        "%s '%s': %s (expected KIND@STEP[:RANK[:ARG]][+|/ATTEMPT], KIND one of crash, "
        "hang, slow, nan, spike, corrupt-ckpt, kill-during-save, admit, segv)",
        what, spec, why);
}

static int parse_int(const char *s, const char *end, long long *out) {
    if (s == end) return -1;
    long long v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9' || v > 1000000000LL) return -1;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return 0;
}

static loom_status parse_one(loom_fault *f, const char *spec, const char *what, loom_error *err) {
    memset(f, 0, sizeof *f);
    f->arg = 3.0;
    const char *at = strchr(spec, '@');
    if (!at) return bad(err, what, spec, "no '@STEP'");
    size_t klen = (size_t)(at - spec);
    int kind = -1;
    for (int k = 0; k < LOOM_FAULT_KIND_COUNT; k++)
        if (strlen(KINDS[k]) == klen && strncmp(KINDS[k], spec, klen) == 0) kind = k;
    if (kind < 0) return bad(err, what, spec, "unknown kind");
    f->kind = (loom_fault_kind)kind;
    const char *p = at + 1, *end = spec + strlen(spec);
    if (end > p && end[-1] == '+') {
        f->every = 1;
        end--;
    }
    const char *slash = NULL;
    for (const char *q = p; q < end; q++)
        if (*q == '/') slash = q;
    if (slash) {
        long long a;
        if (parse_int(slash + 1, end, &a) || a > 1 << 20)
            return bad(err, what, spec, "ATTEMPT must be an integer >= 0");
        f->attempt = (int)a;
        end = slash;
    }
    const char *fields[3] = {p, NULL, NULL}, *ends[3] = {end, NULL, NULL};
    int nf = 1;
    for (const char *q = p; q < end; q++)
        if (*q == ':') {
            if (nf == 3) return bad(err, what, spec, "too many ':' fields");
            ends[nf - 1] = q;
            fields[nf] = q + 1;
            ends[nf] = end;
            nf++;
        }
    long long v;
    if (parse_int(fields[0], ends[0], &v) || v < 1)
        return bad(err, what, spec, "STEP must be an integer >= 1");
    f->step = v;
    if (nf >= 2) {
        if (parse_int(fields[1], ends[1], &v) || v > 1 << 20)
            return bad(err, what, spec, "RANK must be an integer >= 0");
        f->rank = (int)v;
    }
    if (nf == 3) {
        char num[32];
        size_t n = (size_t)(ends[2] - fields[2]);
        if (f->kind != LOOM_FAULT_SLOW || n == 0 || n >= sizeof num)
            return bad(err, what, spec, "only slow takes an ARG (the factor)");
        memcpy(num, fields[2], n);
        num[n] = 0;
        char *e = NULL;
        f->arg = strtod(num, &e);
        if (*e || !(f->arg >= 1.0 && f->arg <= 1000.0))
            return bad(err, what, spec, "the slow factor must be a number in [1, 1000]");
    }
    return LOOM_OK;
}

loom_status loom_fault_parse(loom_fault_list *list, const char *text, const char *what,
                             loom_error *err) {
    const char *p = text;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char spec[128];
        if (n >= sizeof spec) return bad(err, what, p, "too long");
        memcpy(spec, p, n);
        spec[n] = 0;
        if (n > 0) {
            if (list->n == LOOM_FAULT_MAX)
                return loom_error_set(err, LOOM_ERR_INPUT, "%s: more than %d faults", what,
                                      LOOM_FAULT_MAX);
            loom_status st = parse_one(&list->items[list->n], spec, what, err);
            if (st) return st;
            list->n++;
        }
        p = comma ? comma + 1 : NULL;
    }
    return LOOM_OK;
}

int loom_fault_attempt_from_env(void) {
    const char *a = getenv("LOOM_FT_ATTEMPT");
    long long v;
    if (!a || parse_int(a, a + strlen(a), &v)) return 0;
    return (int)v;
}

int loom_fault_slot_of(int rank) {
    const char *p = getenv("LOOM_FT_SLOTS");
    for (int r = 0; p && *p; r++) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0) return rank;
        if (r == rank) return (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    return rank;
}

/* The armed faults of this process (set once before training starts). */
static loom_fault_list armed;
static int64_t current_step;
static double last_ms; /* slow: the last step's compute */

void loom_fault_arm(const loom_fault_list *list, int rank, int attempt) {
    armed.n = 0;
    for (int i = 0; i < list->n; i++) {
        const loom_fault *f = &list->items[i];
        if (f->rank == rank && (f->every || attempt == f->attempt)) armed.items[armed.n++] = *f;
    }
}

static const loom_fault *find(loom_fault_kind kind, int64_t step, int from_on) {
    for (int i = 0; i < armed.n; i++) {
        const loom_fault *f = &armed.items[i];
        if (f->kind == kind && (from_on ? step >= f->step : step == f->step)) return f;
    }
    return NULL;
}

int loom_fault_armed(loom_fault_kind kind, int64_t step) {
    return armed.n > 0 && find(kind, step, 0) != NULL;
}

int loom_fault_any(loom_fault_kind kind) {
    for (int i = 0; i < armed.n; i++)
        if (armed.items[i].kind == kind) return 1;
    return 0;
}

void loom_fault_kill_self(const char *why) {
    fprintf(stderr, "loom: fault injection: %s (pid %d, at %.6f)\n", why, (int)getpid(),
            loom_wall_s());
    fflush(stderr);
    kill(getpid(), SIGKILL);
}

void loom_fault_in_save(const char *step_dir, const char *data_file) {
    const char *s = strrchr(step_dir, '/');
    s = s ? s + 1 : step_dir;
    long long step;
    if (armed.n == 0 || strncmp(s, "step_", 5) != 0 || parse_int(s + 5, s + strlen(s), &step))
        return;
    char why[96];
    if (find(LOOM_FAULT_KILL_DURING_SAVE, step, 0)) {
        snprintf(why, sizeof why, "kill during the save of step %lld", step);
        loom_fault_kill_self(why);
    }
    if (!find(LOOM_FAULT_CORRUPT_CKPT, step, 0)) return;
    FILE *fp = fopen(data_file, "r+b");
    if (!fp) return;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    for (long off = size / 2; off < size && off < size / 2 + 64; off++) { /* inside the data */
        fseek(fp, off, SEEK_SET);
        int c = fgetc(fp);
        fseek(fp, off, SEEK_SET);
        fputc(c ^ 0x5a, fp);
    }
    fclose(fp);
    fprintf(stderr, "loom: fault injection: corrupted %s (checkpoint of step %lld)\n", data_file,
            step);
}

void loom_fault_on_step(int64_t step) {
    current_step = step;
    if (armed.n == 0) return;
    if (find(LOOM_FAULT_CRASH, step, 0)) {
        char why[64];
        snprintf(why, sizeof why, "crash at step %lld", (long long)step);
        loom_fault_kill_self(why);
    }
    if (find(LOOM_FAULT_SEGV, step, 0)) {
        fprintf(stderr,
                "loom: fault injection: a call through a NULL function pointer at step "
                "%lld (pid %d, at %.6f)\n",
                (long long)step, (int)getpid(), loom_wall_s());
        fflush(stderr);
        void (*volatile null_call)(void) = NULL; /* volatile: the call is made, not elided */
        null_call();
    }
}

void loom_fault_at_collective(void) {
    if (armed.n == 0 || !find(LOOM_FAULT_HANG, current_step, 0)) return;
    fprintf(stderr, "loom: fault injection: hang at step %lld (pid %d, at %.6f)\n",
            (long long)current_step, (int)getpid(), loom_wall_s());
    fflush(stderr);
    for (;;) pause(); /* the heartbeat thread keeps beating; only a signal ends this */
}

void loom_fault_after_compute(double *loss_sum, double compute_ms) {
    if (armed.n == 0) return;
    const loom_fault *slow = find(LOOM_FAULT_SLOW, current_step, 1);
    /* the stretch is priced on the shorter of this step's compute and the last one's, so
     * that a step the whole process was stopped in (SIGSTOP, a stalled machine) is not
     * stretched by the stop as well */
    const double base = last_ms > 0 && last_ms < compute_ms ? last_ms : compute_ms;
    last_ms = compute_ms;
    if (slow && base > 0) {
        double ms = (slow->arg - 1.0) * base;
        struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
        nanosleep(&ts, NULL);
    }
    if (find(LOOM_FAULT_NAN, current_step, 0)) {
        fprintf(stderr, "loom: fault injection: NaN loss at step %lld\n", (long long)current_step);
        *loss_sum = NAN;
    }
    if (find(LOOM_FAULT_SPIKE, current_step, 0)) {
        fprintf(stderr, "loom: fault injection: loss spike at step %lld\n",
                (long long)current_step);
        *loss_sum *= 100.0;
    }
}
