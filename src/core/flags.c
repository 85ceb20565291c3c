#include "core/flags.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "core/suggest.h"

enum { FLAGS_MAX = 96, FLAG_HELP = 1, FLAG_FIRST = 1000 };

void loom_flags_suggest(const loom_flag_spec *spec, const char *word, char *out, size_t cap) {
    const char *names[FLAGS_MAX + 1];
    int n = 0;
    for (int i = 0; i < spec->n_flags && n < FLAGS_MAX; i++) names[n++] = spec->flags[i].name;
    names[n++] = "help";
    loom_suggest_flag(out, cap, word, names, n);
}

static loom_status set_value(const loom_flag *f, const char *v, loom_error *err) {
    char *end = NULL;
    errno = 0;
    switch (f->kind) {
    case LOOM_FLAG_STRING:
        *(const char **)f->dst = v;
        return LOOM_OK;
    case LOOM_FLAG_SWITCH:
        *(int *)f->dst = 1;
        return LOOM_OK;
    case LOOM_FLAG_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < f->lo || x > f->hi)
            return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected an integer in [%g, %g]",
                                  f->name, v, f->lo, f->hi);
        *(int *)f->dst = (int)x;
        return LOOM_OK;
    }
    case LOOM_FLAG_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !(x >= f->lo && x <= f->hi))
            return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected a number in [%g, %g]",
                                  f->name, v, f->lo, f->hi);
        *(double *)f->dst = x;
        return LOOM_OK;
    }
    case LOOM_FLAG_CALL:
        return f->set(f->dst, f->name, v, err);
    }
    return LOOM_OK;
}

static int takes_value(const loom_flag *f) {
    return f->kind == LOOM_FLAG_SWITCH ? no_argument
           : f->optional               ? optional_argument
                                       : required_argument;
}

loom_status loom_flags_parse(const loom_flag_spec *spec, int argc, char **argv, int *help,
                             int *first, loom_error *err) {
    if (spec->n_flags > FLAGS_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT, "%d flags: at most %d", spec->n_flags,
                              FLAGS_MAX);
    struct option longopts[FLAGS_MAX + 2];
    char shorts[2 * FLAGS_MAX + 4] = ":h"; /* ':' first: a missing value returns ':' */
    size_t ns = strlen(shorts);
    for (int i = 0; i < spec->n_flags; i++) {
        const loom_flag *f = &spec->flags[i];
        longopts[i] = (struct option){f->name, takes_value(f), NULL, FLAG_FIRST + i};
        if (f->short_name) {
            shorts[ns++] = f->short_name;
            if (f->kind != LOOM_FLAG_SWITCH) shorts[ns++] = ':';
        }
    }
    shorts[ns] = 0;
    longopts[spec->n_flags] = (struct option){"help", no_argument, NULL, FLAG_HELP};
    longopts[spec->n_flags + 1] = (struct option){NULL, 0, NULL, 0};
    *help = 0;
    optind = 0; /* GNU: a full reinitialisation (commands parse more than once) */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
        if (c == 'h' || c == FLAG_HELP) {
            *help = 1;
            return LOOM_OK;
        }
        if (c == ':') {
            if (optopt && optopt < FLAG_FIRST)
                return loom_error_set(err, LOOM_ERR_INPUT, "option '-%c' needs a value", optopt);
            return loom_error_set(err, LOOM_ERR_INPUT, "option '%s' needs a value",
                                  argv[optind - 1]);
        }
        if (c == '?') {
            if (optopt) /* an unknown short option (possibly inside a cluster) */
                return loom_error_set(err, LOOM_ERR_INPUT, "unknown option '-%c' (see --help)",
                                      optopt);
            char hint[96];
            loom_flags_suggest(spec, argv[optind - 1], hint, sizeof hint);
            return loom_error_set(err, LOOM_ERR_INPUT, "unknown option '%s'%s (see --help)",
                                  argv[optind - 1], hint);
        }
        const loom_flag *f = NULL;
        if (c >= FLAG_FIRST && c < FLAG_FIRST + spec->n_flags) f = &spec->flags[c - FLAG_FIRST];
        for (int i = 0; !f && i < spec->n_flags; i++)
            if (spec->flags[i].short_name == c) f = &spec->flags[i];
        if (!f) continue;
        loom_status st = set_value(f, optarg ? optarg : "1", err);
        if (st) return st;
    }
    if (first) *first = optind;
    if (!spec->positional && optind < argc)
        return loom_error_set(err, LOOM_ERR_INPUT, "unexpected argument '%s' (see --help)",
                              argv[optind]);
    return LOOM_OK;
}

static void usage_left(FILE *f, const char *left, const char *help) {
    if (strlen(left) <= 22)
        fprintf(f, "  %-22s ", left);
    else
        fprintf(f, "  %s\n  %-22s ", left, "");
    for (const char *p = help; *p; p++) { /* continuation lines line up with the first */
        fputc(*p, f);
        if (*p == '\n' && p[1]) fprintf(f, "  %-22s ", "");
    }
    fputc('\n', f);
}

void loom_flags_usage_line(FILE *f, const char *name, const char *arg, const char *help) {
    char left[96];
    snprintf(left, sizeof left, "--%s%s%s", name, arg ? " " : "", arg ? arg : "");
    usage_left(f, left, help);
}

void loom_flags_usage(const loom_flag_spec *spec, FILE *f) {
    fprintf(f, "%s\n", spec->usage);
    if (spec->about) fprintf(f, "%s\n", spec->about);
    for (int g = 0; g < (spec->n_groups ? spec->n_groups : 1); g++) {
        if (spec->n_groups) {
            const loom_flag_group *gr = &spec->groups[g];
            if (gr->page)
                fprintf(f, "\n%s (%s):\n", gr->title, gr->page);
            else
                fprintf(f, "\n%s:\n", gr->title);
        } else {
            fprintf(f, "\n");
        }
        for (int i = 0; i < spec->n_flags; i++) {
            const loom_flag *fl = &spec->flags[i];
            if (spec->n_groups && fl->group != g) continue;
            char left[96];
            snprintf(left, sizeof left, "%s%c%s--%s%s%s", fl->short_name ? "-" : "",
                     fl->short_name ? fl->short_name : ' ', fl->short_name ? ", " : "", fl->name,
                     fl->arg ? " " : "", fl->arg ? fl->arg : "");
            usage_left(f, fl->short_name ? left : left + 1, fl->help);
        }
        if (g == 0) usage_left(f, "-h, --help", "this help");
    }
    if (spec->footer) fprintf(f, "\n%s", spec->footer);
}
