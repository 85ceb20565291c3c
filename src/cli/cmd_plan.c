/* loom plan: which layout to train a model with on a machine. Enumerates the layouts
 * `loom train` accepts for a world size, sizes each rank's memory the way the run does
 * (plan/memory.c) and predicts its step from a machine profile (plan/step_time.c), and
 * prints the best; --explain one layout's breakdown; --check a finished run against its
 * prediction; --html the picture. docs/PLAN.md. */
#include "cli/cmd_plan.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/plan_check.h"
#include "cli/plan_report.h"
#include "cli/train_options.h"
#include "plan/plan.h"

#define MAX_WORDS 512

typedef struct {
    int world;
    char profile[LOOM_PATH_MAX];
    double memory_gib;   /* 0: the profile's */
    double moe_load_max; /* 0: balanced routing (--check: the run's metrics) */
    int ranks_per_node;
    int top;
    char explain[4096];
    int explain_set; /* --explain "" explains the default layout (one process) */
    char check[LOOM_PATH_MAX];
    char html[LOOM_PATH_MAX];
    int json;
    int help;
    /* the rest: loom train's flags (the model, the batch, a base layout) */
    char *train_argv[MAX_WORDS];
    int train_argc;
    char *owned[MAX_WORDS]; /* words split from --explain */
    int n_owned;
} plan_args;

static loom_status push_word(plan_args *a, char *w, loom_error *err) {
    if (a->train_argc >= MAX_WORDS - 1)
        return loom_error_set(err, LOOM_ERR_INPUT, "too many arguments (at most %d)", MAX_WORDS);
    a->train_argv[a->train_argc++] = w;
    return LOOM_OK;
}

/* Splits a layout given as loom train's flags into words (spaces; no quoting). */
static loom_status split_words(plan_args *a, const char *text, loom_error *err) {
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        const char *q = p;
        while (*q && *q != ' ' && *q != '\t') q++;
        if (a->n_owned >= MAX_WORDS)
            return loom_error_set(err, LOOM_ERR_INPUT, "--explain: too long");
        char *w = strndup(p, (size_t)(q - p));
        if (!w) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        a->owned[a->n_owned++] = w;
        loom_status st = push_word(a, w, err);
        if (st) return st;
        p = q;
    }
    return LOOM_OK;
}

static loom_status parse_number(const char *flag, const char *v, double lo, double *out,
                                loom_error *err) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || errno || !(x >= lo) || !isfinite(x))
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected a number >= %g", flag,
                              v ? v : "", lo);
    *out = x;
    return LOOM_OK;
}

static loom_status set_whole(void *dst, const char *name, const char *v, loom_error *err) {
    double x = 0;
    loom_status st = parse_number(name, v, 1, &x, err);
    if (st) return st;
    if (x != floor(x) || x > 1 << 20)
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected a whole number", name, v);
    *(int *)dst = (int)x;
    return LOOM_OK;
}

static loom_status set_gib(void *dst, const char *name, const char *v, loom_error *err) {
    return parse_number(name, v, 1e-6, dst, err);
}

static loom_status set_load(void *dst, const char *name, const char *v, loom_error *err) {
    return parse_number(name, v, 1, dst, err);
}

static loom_status set_path(void *dst, const char *name, const char *v, loom_error *err) {
    if (strlen(v) >= LOOM_PATH_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s: too long", name);
    memcpy(dst, v, strlen(v) + 1);
    return LOOM_OK;
}

static loom_status set_explain(void *dst, const char *name, const char *v, loom_error *err) {
    plan_args *a = dst;
    if (strlen(v) >= sizeof a->explain)
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s: too long", name);
    memcpy(a->explain, v, strlen(v) + 1);
    a->explain_set = 1;
    return LOOM_OK;
}

static const loom_flag_group GROUPS[] = {{"Search the layouts", "docs/PLAN.md"},
                                         {"One layout, or a finished run", "docs/PLAN.md"}};

enum { PLAN_N_FLAGS = 10 };

static loom_flag_spec plan_spec(loom_flag (*flags)[PLAN_N_FLAGS], plan_args *a) {
    const loom_flag f[PLAN_N_FLAGS] = {
        LOOM_FLAG_FN(0, "world", &a->world, set_whole, "N", "the ranks to plan for"),
        LOOM_FLAG_FN(0, "profile", a->profile, set_path, "P",
                     "a machine profile (loom calibrate -o P, or profiles/*.json)"),
        LOOM_FLAG_FN(0, "memory-per-rank", &a->memory_gib, set_gib, "GB",
                     "memory a rank may hold (default: the profile's)"),
        LOOM_FLAG_FN(0, "ranks-per-node", &a->ranks_per_node, set_whole, "R",
                     "ranks sharing a node (its links)"),
        LOOM_FLAG_FN(0, "moe-load-max", &a->moe_load_max, set_load, "F",
                     "an MoE router's busiest expert over the mean load (a run's metrics\n"
                     "moe.load_max / moe.load_mean; default 1, balanced; --check reads\n"
                     "the run's)"),
        LOOM_FLAG_FN(0, "top", &a->top, set_whole, "K", "layouts listed (5)"),
        LOOM_FLAG_SW(0, "json", &a->json, "one JSON object instead of the table"),
        LOOM_FLAG_FN(0, "html", a->html, set_path, "FILE", "an HTML report beside"),
        LOOM_FLAG_FN(1, "explain", a, set_explain, "\"LAYOUT FLAGS\"",
                     "one layout's predicted breakdown (without --profile: memory only)"),
        LOOM_FLAG_FN(1, "check", a->check, set_path, "RUN_DIR",
                     "a finished `loom run` folder (its command and --metrics) against\n"
                     "the prediction, term by term"),
    };
    memcpy(*flags, f, sizeof f);
    return (loom_flag_spec){
        .usage = "usage: loom plan [MODEL AND BATCH FLAGS] --world N --profile P "
                 "[--memory-per-rank GB]\n"
                 "                 [--ranks-per-node R] [--moe-load-max F] [--top K] [--json]\n"
                 "                 [--html FILE]\n"
                 "       loom plan [MODEL AND BATCH FLAGS] --explain \"--dp 2 --tp 2 --zero 1\" "
                 "[--profile P] [--json]\n"
                 "       loom plan --check RUN_DIR [--profile P] [--html FILE]",
        .about =
            "\nModel and batch flags are loom train's (--model, --config, --d-model, --seq-len,\n"
            "--global-batch, --micro-batch, --threads ...). The plan enumerates the layouts loom\n"
            "train accepts (dp x tp x pp x cp, ep for MoE, ZeRO 0-3, sequence parallelism, every\n"
            "pipeline schedule, recomputation, micro-batch sizes), sizes each rank's memory as\n"
            "the start-up report does and predicts the step from the profile. docs/PLAN.md\n"
            "explains every term.",
        LOOM_FLAGS_TABLE(*flags, GROUPS)};
}

static loom_status parse_args(plan_args *a, const loom_flag_spec *spec, int argc, char **argv,
                              loom_error *err) {
    loom_status st = push_word(a, "train", err);
    char **rest = malloc(((size_t)argc + 1) * sizeof *rest);
    if (!rest) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    int n_rest = 0;
    if (!st) st = loom_flags_take(spec, argc, argv, rest, &n_rest, &a->help, err);
    for (int i = 0; i < n_rest && !st; i++) st = push_word(a, rest[i], err);
    free(rest);
    if (!st && a->explain[0]) st = split_words(a, a->explain, err);
    return st;
}

static void free_args(plan_args *a) {
    for (int i = 0; i < a->n_owned; i++) free(a->owned[i]);
}

/* loom train's options from the plan's words (the model, batch and layout flags). */
static loom_status train_options_of(plan_args *a, const loom_flag_spec *spec, loom_train_options *o,
                                    loom_error *err) {
    a->train_argv[a->train_argc] = NULL;
    loom_status st = loom_train_options_parse_within(o, a->train_argc, a->train_argv, spec, err);
    if (st) return st;
    /* A plan reads no data: the flag the run requires names what is not read. */
    if (!o->train.data[0]) snprintf(o->train.data, sizeof o->train.data, "(not read by loom plan)");
    return LOOM_OK;
}

static int exit_code(loom_status st) {
    return st == LOOM_ERR_INPUT ? 2 : 1;
}

int loom_cmd_plan(int argc, char **argv) {
    loom_error err = {0};
    plan_args a;
    loom_train_options o;
    loom_profile *prof = NULL;
    memset(&a, 0, sizeof a);
    a.top = 5;
    loom_flag flags[PLAN_N_FLAGS];
    const loom_flag_spec spec = plan_spec(&flags, &a);
    loom_status st = parse_args(&a, &spec, argc, argv, &err);
    int rc = 0;
    if (!st && a.help) {
        loom_flags_usage(&spec, stdout);
        free_args(&a);
        return 0;
    }
    if (!st && a.check[0]) {
        st = loom_plan_check_run(a.check, a.profile, a.moe_load_max, a.html, a.json,
                                 &a.train_argv[1], a.train_argc - 1, &err);
    } else if (!st) {
        st = train_options_of(&a, &spec, &o, &err);
        if (!st && a.moe_load_max > 0 && o.model.n_experts < 1)
            st = loom_error_set(&err, LOOM_ERR_INPUT,
                                "--moe-load-max %g: the model has no experts (expected "
                                "--n-experts E with it)",
                                a.moe_load_max);
        if (!st && a.moe_load_max > 0 && o.model.top_k > 0 &&
            a.moe_load_max > (double)o.model.n_experts / o.model.top_k)
            st = loom_error_set(&err, LOOM_ERR_INPUT,
                                "--moe-load-max %g: expected at most E / K = %g (an expert "
                                "takes each token at most once)",
                                a.moe_load_max, (double)o.model.n_experts / o.model.top_k);
        if (!st && a.profile[0]) st = loom_profile_load(&prof, a.profile, &err);
        if (!st && a.explain_set) {
            st = loom_plan_explain(&o.model, &o.train, prof, a.ranks_per_node, a.moe_load_max,
                                   a.json, a.html, &err);
        } else if (!st) {
            if (!a.world)
                st = loom_error_set(&err, LOOM_ERR_INPUT,
                                    "--world: required (the ranks to plan for), or --explain "
                                    "\"LAYOUT FLAGS\" for one layout");
            else if (!prof)
                st = loom_error_set(&err, LOOM_ERR_INPUT,
                                    "--profile: required to rank layouts (loom calibrate -o "
                                    "profile.json measures this machine; profiles/ has GPU "
                                    "clusters)");
            else
                st = loom_plan_search(&o.model, &o.train, prof, a.world, a.ranks_per_node,
                                      a.moe_load_max, a.memory_gib, a.top, a.json, a.html, &err);
        }
    }
    if (st) {
        fprintf(stderr, "loom plan: %s\n", err.msg);
        rc = exit_code(st);
    }
    loom_profile_free(prof);
    free_args(&a);
    return rc;
}
