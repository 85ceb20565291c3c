#include "cli/plan_check.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/plan_html.h"
#include "cli/plan_report.h"
#include "cli/train_options.h"
#include "plan/check.h"
#include "plan/plan.h"

loom_status loom_plan_check_run(const char *path, const char *profile, double moe_load_max,
                                const char *html, int json, char **words, int n_words,
                                loom_error *err) {
    struct stat s;
    if (stat(path, &s) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--check '%s': no such file or folder", path);
    if (!profile[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--check: needs --profile (the machine profile to predict with)");
    loom_plan_command c = {0};
    char *argv[LOOM_PLAN_CHECK_MAX_WORDS + 1];
    int argc = 0;
    char cmd_path[LOOM_PATH_MAX + 320];
    loom_status st = LOOM_OK;
    if (S_ISDIR(s.st_mode)) {
        loom_plan_newest_command(path, cmd_path, sizeof cmd_path);
        if (!cmd_path[0])
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--check '%s': no attempt_N/command.txt (expected a loom run "
                                  "folder, or a --metrics file with the layout's flags)",
                                  path);
        if ((st = loom_plan_read_command(&c, cmd_path, err))) {
            free(c.buf);
            return st;
        }
        for (int i = 0; i < c.n; i++) argv[argc++] = c.words[i];
    } else {
        argv[argc++] = "train";
        for (int i = 0; i < n_words && argc < LOOM_PLAN_CHECK_MAX_WORDS; i++)
            argv[argc++] = words[i];
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
    double step_ms = 0, keys[LOOM_PLAN_CHECK_KEYS], run_load_max = 0;
    int has[LOOM_PLAN_CHECK_KEYS], steps = 0;
    if (!st) st = loom_plan_read_metrics(metrics, &step_ms, keys, has, &run_load_max, &steps, err);
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
        for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) {
            if (!has[k]) continue;
            json_t *x = json_object();
            json_object_set_new(x, "metric", json_string(loom_plan_check_keys[k]));
            json_object_set_new(x, "predicted_ms",
                                json_real(loom_plan_predicted_of(&t, loom_plan_check_keys[k])));
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
        for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) {
            const double p = loom_plan_predicted_of(&t, loom_plan_check_keys[k]);
            if (!has[k]) continue;
            printf("  %-22s %9.3f ms %9.3f ms %7.1f%%\n", loom_plan_check_keys[k], p, keys[k],
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
        for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) {
            if (!has[k] || keys[k] <= 0) continue;
            loom_plan_term *x = &bars[1].time.terms[bars[1].time.n_terms++];
            x->name = loom_plan_check_keys[k];
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
        for (int k = 0; k < LOOM_PLAN_CHECK_KEYS; k++) {
            const double p = loom_plan_predicted_of(&t, loom_plan_check_keys[k]);
            if (!has[k] || keys[k] <= 0 || p <= 0) continue;
            g.terms[g.n_terms].name = loom_plan_check_keys[k];
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
