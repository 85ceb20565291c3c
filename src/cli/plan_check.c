#include "cli/plan_check.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/plan_html.h"
#include "cli/plan_report.h"
#include "cli/train_options.h"
#include "core/median.h"
#include "plan/plan.h"

#define MAX_WORDS 512
#define MAX_STEPS 100000

/* What --metrics measures of a step; the prediction's terms carry the same keys. */
static const char *KEYS[] = {"dp.compute_ms", "grad_wait_ms", "dp.optimizer_ms",
                             "dp.param_gather_ms", "dp.param_wait_ms"};
#define N_KEYS (int)(sizeof KEYS / sizeof KEYS[0])

typedef struct {
    char *buf; /* the command line's text, split in place */
    char *words[MAX_WORDS];
    int n;
} command;

/* The newest attempt's command.txt of a loom run folder: "" if there is none. */
static void newest_command(const char *dir, char *out, size_t n) {
    out[0] = 0;
    DIR *d = opendir(dir);
    int best = -1;
    for (struct dirent *e; d && (e = readdir(d));) {
        int k;
        char tail;
        if (sscanf(e->d_name, "attempt_%d%c", &k, &tail) != 1 || k <= best) continue;
        char path[LOOM_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s/command.txt", dir, e->d_name);
        struct stat s;
        if (stat(path, &s) == 0 && strlen(path) < n) best = k, snprintf(out, n, "%s", path);
    }
    if (d) closedir(d);
}

static loom_status read_command(command *c, const char *path, loom_error *err) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "r");
    if (!f) return loom_error_set(err, LOOM_ERR_INPUT, "--check: cannot read '%s'", path);
    size_t cap = 1 << 16, len = fread(c->buf = malloc(cap), 1, cap - 1, f);
    fclose(f);
    if (!c->buf) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    c->buf[len] = 0;
    int train = -1;
    for (char *save = NULL, *w = strtok_r(c->buf, " \t\n", &save); w && c->n < MAX_WORDS - 1;
         w = strtok_r(NULL, " \t\n", &save)) {
        const char *base = strrchr(w, '/') ? strrchr(w, '/') + 1 : w;
        if (train < 0 && !strcmp(w, "train") && c->n > 0 &&
            (!strcmp(base, "train") || strstr(c->words[c->n - 1], "loom")))
            train = c->n;
        c->words[c->n++] = w;
    }
    if (train < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--check: '%s' holds no `loom train` command (expected a loom run "
                              "folder's attempt_N/command.txt)",
                              path);
    /* keep "train" and what follows */
    memmove(c->words, c->words + train, (size_t)(c->n - train) * sizeof *c->words);
    c->n -= train;
    return LOOM_OK;
}

/* The measured medians over the steps after the first two (their start-up costs):
 * step_ms, each KEYS[k] (has[k] 0 when the metrics do not carry it) and the MoE router's
 * moe.load_max / moe.load_mean (0 without it). */
static loom_status read_metrics(const char *path, double *step_ms, double *keys, int *has,
                                double *moe_load_max, int *steps, loom_error *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--check: cannot read the metrics file '%s' (the run's --metrics)",
                              path);
    /* v[N_KEYS]: step_ms; v[N_KEYS + 1]: the MoE load ratio */
    double *v[N_KEYS + 2];
    int n = 0, lines = 0, bad = 0, has_moe = 1;
    int allocated = 1;
    for (int k = 0; k <= N_KEYS + 1; k++)
        allocated &= (v[k] = calloc(MAX_STEPS, sizeof(double))) != NULL;
    if (!allocated) {
        fclose(f);
        for (int k = 0; k <= N_KEYS + 1; k++) free(v[k]);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--check: out of memory");
    }
    for (int k = 0; k < N_KEYS; k++) has[k] = 1;
    char line[8192];
    while (fgets(line, sizeof line, f) && n < MAX_STEPS) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        lines++;
        json_t *s = o ? json_object_get(o, "step_ms") : NULL;
        if (!json_is_number(s)) {
            bad += !o;
            json_decref(o);
            continue;
        }
        if (lines > 2) {
            v[N_KEYS][n] = json_number_value(s);
            for (int k = 0; k < N_KEYS; k++) {
                const char *key = KEYS[k], *dot = strchr(key, '.');
                json_t *x = dot ? json_object_get(json_object_get(o, "dp"), dot + 1)
                                : json_object_get(o, key);
                if (json_is_number(x))
                    v[k][n] = json_number_value(x);
                else
                    has[k] = 0;
            }
            json_t *moe = json_object_get(o, "moe");
            const double lmax = json_number_value(json_object_get(moe, "load_max")),
                         lmean = json_number_value(json_object_get(moe, "load_mean"));
            if (lmean > 0)
                v[N_KEYS + 1][n] = lmax / lmean;
            else
                has_moe = 0;
            n++;
        }
        json_decref(o);
    }
    fclose(f);
    loom_status st = LOOM_OK;
    if (bad)
        st = loom_error_set(err, LOOM_ERR_INPUT, "--check: '%s': %d line(s) are not JSON", path,
                            bad);
    else if (n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "--check: '%s' has %d step(s); at least 3 are needed (the first two "
                            "are skipped)",
                            path, lines);
    if (!st) {
        *step_ms = loom_median(v[N_KEYS], n);
        for (int k = 0; k < N_KEYS; k++) keys[k] = has[k] ? loom_median(v[k], n) : 0;
        *moe_load_max = has_moe ? loom_median(v[N_KEYS + 1], n) : 0;
        *steps = n;
    }
    for (int k = 0; k <= N_KEYS + 1; k++) free(v[k]);
    return st;
}

static double predicted_of(const loom_plan_time *t, const char *key) {
    double ms = 0;
    for (int i = 0; i < t->n_terms; i++)
        if (t->terms[i].metric && !strcmp(t->terms[i].metric, key)) ms += t->terms[i].ms;
    return ms;
}

loom_status loom_plan_check_run(const char *path, const char *profile, double moe_load_max,
                                const char *html, int json, char **words, int n_words,
                                loom_error *err) {
    struct stat s;
    if (stat(path, &s) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--check '%s': no such file or folder", path);
    if (!profile[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--check: needs --profile (the machine profile to predict with)");
    command c = {0};
    char *argv[MAX_WORDS + 1];
    int argc = 0;
    char cmd_path[LOOM_PATH_MAX + 320];
    loom_status st = LOOM_OK;
    if (S_ISDIR(s.st_mode)) {
        newest_command(path, cmd_path, sizeof cmd_path);
        if (!cmd_path[0])
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--check '%s': no attempt_N/command.txt (expected a loom run "
                                  "folder, or a --metrics file with the layout's flags)",
                                  path);
        if ((st = read_command(&c, cmd_path, err))) {
            free(c.buf);
            return st;
        }
        for (int i = 0; i < c.n; i++) argv[argc++] = c.words[i];
    } else {
        argv[argc++] = "train";
        for (int i = 0; i < n_words && argc < MAX_WORDS; i++) argv[argc++] = words[i];
    }
    argv[argc] = NULL;
    loom_train_options o;
    loom_profile *prof = NULL;
    st = loom_train_options_parse(&o, argc, argv, err);
    if (!st && !o.train.data[0]) snprintf(o.train.data, sizeof o.train.data, "(not read)");
    const char *metrics = S_ISDIR(s.st_mode) ? o.train.metrics : path;
    if (!st && !metrics[0])
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "--check '%s': the run's command has no --metrics file to compare with",
                            path);
    double step_ms = 0, keys[N_KEYS], run_load_max = 0;
    int has[N_KEYS], steps = 0;
    if (!st) st = read_metrics(metrics, &step_ms, keys, has, &run_load_max, &steps, err);
    if (moe_load_max <= 0) moe_load_max = run_load_max;
    if (!st) st = loom_profile_load(&prof, profile, err);
    loom_plan_time t;
    const loom_layout l = o.train.layout;
    const int world = l.dp * l.cp * l.tp * l.pp;
    if (!st) st = loom_plan_validate(&o.model, &o.train, err);
    if (!st) {
        const loom_plan_placement place =
            loom_plan_placement_of(prof, &o.train, world, 0, moe_load_max);
        st = loom_plan_step_time(&o.model, &o.train, prof, &place, &t, err);
    }
    char flags[512] = "";
    if (!st) loom_plan_layout_flags(&o.train, flags, sizeof flags);
    if (!st && json) {
        json_t *r = json_object(), *terms = json_array();
        json_object_set_new(r, "layout", json_string(flags));
        json_object_set_new(r, "steps", json_integer(steps));
        json_object_set_new(r, "predicted_step_ms", json_real(t.step_ms));
        json_object_set_new(r, "measured_step_ms", json_real(step_ms));
        json_object_set_new(r, "error", json_real(step_ms > 0 ? t.step_ms / step_ms - 1 : 0));
        if (o.model.n_experts > 0)
            json_object_set_new(r, "moe_load_max", json_real(moe_load_max > 1 ? moe_load_max : 1));
        for (int k = 0; k < N_KEYS; k++) {
            if (!has[k]) continue;
            json_t *x = json_object();
            json_object_set_new(x, "metric", json_string(KEYS[k]));
            json_object_set_new(x, "predicted_ms", json_real(predicted_of(&t, KEYS[k])));
            json_object_set_new(x, "measured_ms", json_real(keys[k]));
            json_array_append_new(terms, x);
        }
        json_object_set_new(r, "terms", terms);
        char *out = json_dumps(r, JSON_COMPACT);
        printf("%s\n", out ? out : "{}");
        free(out);
        json_decref(r);
    } else if (!st) {
        printf("loom plan --check: layout %s, %d step(s) measured (medians, the first two "
               "skipped), profile '%s'\n",
               flags, steps, loom_profile_name(prof));
        if (o.model.n_experts > 0)
            printf("  routing: the busiest expert at %.3fx the mean load (%s)\n",
                   moe_load_max > 1 ? moe_load_max : 1.0,
                   run_load_max > 0 && moe_load_max == run_load_max ? "the run's metrics"
                   : moe_load_max > 0                               ? "--moe-load-max"
                                      : "balanced: the metrics carry no moe loads");
        printf("  %-22s %12s %12s %8s\n", "metric", "predicted", "measured", "error");
        for (int k = 0; k < N_KEYS; k++) {
            const double p = predicted_of(&t, KEYS[k]);
            if (!has[k]) continue;
            printf("  %-22s %9.3f ms %9.3f ms %7.1f%%\n", KEYS[k], p, keys[k],
                   keys[k] > 0 ? 100 * (p / keys[k] - 1) : 0.0);
        }
        printf("  %-22s %9.3f ms %9.3f ms %7.1f%%\n", "step_ms", t.step_ms, step_ms,
               step_ms > 0 ? 100 * (t.step_ms / step_ms - 1) : 0.0);
    }
    if (!st && html[0]) {
        /* the measured bar: each measured key, the rest of the step as "other" */
        loom_plan_bar bars[2];
        memset(bars, 0, sizeof bars);
        snprintf(bars[0].label, sizeof bars[0].label, "%s", flags);
        bars[0].note = "predicted";
        bars[0].time = t;
        snprintf(bars[1].label, sizeof bars[1].label, "%s", flags);
        bars[1].note = "measured (--metrics medians)";
        double rest = step_ms;
        for (int k = 0; k < N_KEYS; k++) {
            if (!has[k] || keys[k] <= 0) continue;
            loom_plan_term *x = &bars[1].time.terms[bars[1].time.n_terms++];
            x->name = KEYS[k];
            x->ms = keys[k];
            rest -= keys[k];
        }
        if (rest > 0) {
            loom_plan_term *x = &bars[1].time.terms[bars[1].time.n_terms++];
            x->name = "other (step_ms minus the above)";
            x->ms = rest;
        }
        bars[1].time.step_ms = step_ms;
        /* the predicted bar grouped by the same keys, so the two compare part by part */
        loom_plan_time g = {0};
        double rest_p = t.step_ms;
        for (int k = 0; k < N_KEYS; k++) {
            const double p = predicted_of(&t, KEYS[k]);
            if (!has[k] || keys[k] <= 0 || p <= 0) continue;
            g.terms[g.n_terms].name = KEYS[k];
            g.terms[g.n_terms++].ms = p;
            rest_p -= p;
        }
        if (rest_p > 0) {
            g.terms[g.n_terms].name = "other (step_ms minus the above)";
            g.terms[g.n_terms++].ms = rest_p;
        }
        g.step_ms = t.step_ms;
        bars[0].time = g;
        st = loom_plan_html_write(html, "loom plan --check: predicted and measured", bars, 2, err);
    }
    loom_profile_free(prof);
    free(c.buf);
    return st;
}
