/* loom plan --check's reading of a finished run (plan/check.h). */
#include "plan/check.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fs.h"
#include "core/median.h"

const char *const loom_plan_check_keys[LOOM_PLAN_CHECK_KEYS] = {
    "dp.compute_ms", "grad_wait_ms", "dp.optimizer_ms", "dp.param_gather_ms", "dp.param_wait_ms"};

/* The newest attempt's command.txt of a loom run folder: "" if there is none. */
void loom_plan_newest_command(const char *dir, char *out, size_t n) {
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

loom_status loom_plan_read_command(loom_plan_command *c, const char *path, loom_error *err) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "r");
    if (!f) return loom_error_set(err, LOOM_ERR_INPUT, "--check: cannot read '%s'", path);
    size_t cap = 1 << 16, len = fread(c->buf = malloc(cap), 1, cap - 1, f);
    fclose(f);
    if (!c->buf) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    c->buf[len] = 0;
    int train = -1;
    for (char *save = NULL, *w = strtok_r(c->buf, " \t\n", &save);
         w && c->n < LOOM_PLAN_CHECK_MAX_WORDS - 1; w = strtok_r(NULL, " \t\n", &save)) {
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
 * step_ms, each loom_plan_check_keys[k] (has[k] 0 when the metrics do not carry it) and the MoE
 * router's moe.load_max / moe.load_mean (0 without it). */
loom_status loom_plan_read_metrics(const char *path, double *step_ms, double *keys, int *has,
                                   double *moe_load_max, int *steps, loom_error *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--check: cannot read the metrics file '%s' (the run's --metrics)",
                              path);
    /* v[LOOM_PLAN_CHECK_KEYS]: step_ms; v[LOOM_PLAN_CHECK_KEYS + 1]: the MoE load ratio */
    double *v[LOOM_PLAN_CHECK_KEYS + 2];
    int n = 0, lines = 0, bad = 0, has_moe = 1;
    int allocated = 1;
    for (int k = 0; k <= LOOM_PLAN_CHECK_KEYS + 1; k++)
        allocated &= (v[k] = calloc(LOOM_PLAN_CHECK_MAX_STEPS, sizeof(double))) != NULL;
    if (!allocated) {
        fclose(f);
        for (int k = 0; k <= LOOM_PLAN_CHECK_KEYS + 1; k++) free(v[k]);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--check: out of memory");
    }
    for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) has[k] = 1;
    char line[8192];
    while (fgets(line, sizeof line, f) && n < LOOM_PLAN_CHECK_MAX_STEPS) {
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
            v[LOOM_PLAN_CHECK_KEYS][n] = json_number_value(s);
            for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) {
                const char *key = loom_plan_check_keys[k], *dot = strchr(key, '.');
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
                v[LOOM_PLAN_CHECK_KEYS + 1][n] = lmax / lmean;
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
        *step_ms = loom_median(v[LOOM_PLAN_CHECK_KEYS], n);
        for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) keys[k] = has[k] ? loom_median(v[k], n) : 0;
        *moe_load_max = has_moe ? loom_median(v[LOOM_PLAN_CHECK_KEYS + 1], n) : 0;
        *steps = n;
    }
    for (int k = 0; k <= LOOM_PLAN_CHECK_KEYS + 1; k++) free(v[k]);
    return st;
}

double loom_plan_predicted_of(const loom_plan_time *t, const char *key) {
    double ms = 0;
    for (int i = 0; i < t->n_terms; i++)
        if (t->terms[i].metric && !strcmp(t->terms[i].metric, key)) ms += t->terms[i].ms;
    return ms;
}
