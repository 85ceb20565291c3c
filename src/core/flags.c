#include "core/flags.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "core/suggest.h"

enum { FLAGS_MAX = 160, FLAG_HELP = 1, FLAG_FIRST = 1000 };

void loom_flags_suggest(const loom_flag_spec *spec, const char *word, char *out, size_t cap) {
    const char *names[2 * FLAGS_MAX + 1];
    int n = 0;
    for (const loom_flag_spec *sp = spec; sp; sp = sp == spec ? spec->also : NULL)
        for (int i = 0; i < sp->n_flags && n < 2 * FLAGS_MAX; i++)
            if (sp->flags[i].name) names[n++] = sp->flags[i].name;
    names[n++] = "help";
    loom_suggest_flag(out, cap, word, names, n);
}

/* "--name", or "-n" for a short flag only. */
static const char *shown(const loom_flag *f, char *buf, size_t cap) {
    if (f->name)
        snprintf(buf, cap, "--%s", f->name);
    else
        snprintf(buf, cap, "-%c", f->short_name);
    return buf;
}

static loom_status set_value(const loom_flag *f, const char *v, loom_error *err) {
    char nm[72];
    char *end = NULL;
    errno = 0;
    switch (f->kind) {
    case LOOM_FLAG_STRING:
        *(const char **)f->dst = v;
        return LOOM_OK;
    case LOOM_FLAG_SWITCH:
        *(int *)f->dst = 1;
        return LOOM_OK;
    case LOOM_FLAG_INT:
    case LOOM_FLAG_LONG:
    case LOOM_FLAG_DOUBLE:
    case LOOM_FLAG_FLOAT:
    case LOOM_FLAG_U64: {
        const int whole =
            f->kind == LOOM_FLAG_INT || f->kind == LOOM_FLAG_LONG || f->kind == LOOM_FLAG_U64;
        double x = f->kind == LOOM_FLAG_U64 ? (double)strtoull(v, &end, 10)
                   : whole                  ? (double)strtoll(v, &end, 10)
                                            : strtod(v, &end);
        int ok = *v && !*end && !errno && (f->lo_open ? x > f->lo : x >= f->lo) && x <= f->hi;
        if (f->kind == LOOM_FLAG_U64 && (v[0] == '-' || v[0] == ' ')) ok = 0;
        if (!ok && f->expect && f->quote_value)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': %s", shown(f, nm, sizeof nm), v,
                                  f->expect);
        if (!ok && f->expect)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s: %s", shown(f, nm, sizeof nm),
                                  f->expect);
        if (!ok)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected %s in %c%.15g, %.15g]",
                                  shown(f, nm, sizeof nm), v, whole ? "an integer" : "a number",
                                  f->lo_open ? '(' : '[', f->lo, f->hi);
        if (f->kind == LOOM_FLAG_INT) *(int *)f->dst = (int)x;
        if (f->kind == LOOM_FLAG_LONG) *(long *)f->dst = (long)x;
        if (f->kind == LOOM_FLAG_DOUBLE) *(double *)f->dst = x;
        if (f->kind == LOOM_FLAG_FLOAT) *(float *)f->dst = strtof(v, NULL);
        if (f->kind == LOOM_FLAG_U64) *(unsigned long long *)f->dst = strtoull(v, NULL, 10);
        return LOOM_OK;
    }
    case LOOM_FLAG_CALL:
        return f->set(f->dst, f->name ? f->name : shown(f, nm, sizeof nm), v, err);
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
    int nl = 0;
    for (int i = 0; i < spec->n_flags; i++) {
        const loom_flag *f = &spec->flags[i];
        if (f->name)
            longopts[nl++] = (struct option){f->name, takes_value(f), NULL, FLAG_FIRST + i};
        if (f->short_name) {
            shorts[ns++] = f->short_name;
            if (f->kind != LOOM_FLAG_SWITCH) shorts[ns++] = ':';
        }
    }
    shorts[ns] = 0;
    longopts[nl] = (struct option){"help", no_argument, NULL, FLAG_HELP};
    longopts[nl + 1] = (struct option){NULL, 0, NULL, 0};
    const char *see = spec->see ? spec->see : "see --help";
    *help = 0;
    optind = 0; /* GNU: a full reinitialisation (commands parse more than once) */
    opterr = 0;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, shorts, longopts, &li)) != -1) {
        if (spec->exact && li >= 0 && c != '?' && c != ':') { /* the word, as typed */
            const char *w = optarg && optind >= 2 && optarg == argv[optind - 1] ? argv[optind - 2]
                                                                                : argv[optind - 1];
            size_t n = strlen(longopts[li].name);
            if (strncmp(w, "--", 2) == 0 &&
                (strncmp(w + 2, longopts[li].name, n) != 0 || (w[2 + n] != 0 && w[2 + n] != '='))) {
                char hint[96];
                loom_flags_suggest(spec, w, hint, sizeof hint);
                return loom_error_set(err, LOOM_ERR_INPUT, "unknown option '%s'%s (%s)", w, hint,
                                      see);
            }
        }
        li = -1;
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
            if (optopt >= FLAG_FIRST || optopt == FLAG_HELP) /* --switch=VALUE */
                return loom_error_set(err, LOOM_ERR_INPUT, "option '%s' takes no value (%s)",
                                      argv[optind - 1], see);
            if (optopt) /* an unknown short option (possibly inside a cluster) */
                return loom_error_set(err, LOOM_ERR_INPUT, "unknown option '-%c' (%s)", optopt,
                                      see);
            char hint[96];
            loom_flags_suggest(spec, argv[optind - 1], hint, sizeof hint);
            return loom_error_set(err, LOOM_ERR_INPUT, "unknown option '%s'%s (%s)",
                                  argv[optind - 1], hint, see);
        }
        const loom_flag *f = NULL;
        if (c >= FLAG_FIRST && c < FLAG_FIRST + spec->n_flags) f = &spec->flags[c - FLAG_FIRST];
        for (int i = 0; !f && i < spec->n_flags; i++)
            if (spec->flags[i].short_name == c) f = &spec->flags[i];
        if (!f) continue;
        const char *v = optarg;
        for (int k = 0; !v && f->next_words && optind < argc && f->next_words[k]; k++)
            if (strcmp(argv[optind], f->next_words[k]) == 0) v = argv[optind++];
        loom_status st = set_value(f, v ? v : "1", err);
        if (st) return st;
    }
    if (first) *first = optind;
    if (!spec->positional && optind < argc)
        return loom_error_set(err, LOOM_ERR_INPUT, "unexpected argument '%s' (see --help)",
                              argv[optind]);
    return LOOM_OK;
}

loom_status loom_flags_take(const loom_flag_spec *spec, int argc, char **argv, char **rest,
                            int *n_rest, int *help, loom_error *err) {
    *help = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *help = 1;
            return LOOM_OK;
        }
        const loom_flag *f = NULL;
        const int is_long = a[0] == '-' && a[1] == '-';
        size_t len = is_long ? strcspn(a + 2, "=") : 0;
        for (int k = 0; k < spec->n_flags && !f; k++) {
            const loom_flag *c = &spec->flags[k];
            if (is_long ? c->name && strlen(c->name) == len && strncmp(a + 2, c->name, len) == 0
                        : c->short_name && a[0] == '-' && a[1] == c->short_name && !a[2])
                f = c;
        }
        if (!f) {
            rest[(*n_rest)++] = argv[i];
            continue;
        }
        const char *v = "1";
        if (is_long && a[2 + len] == '=')
            v = a + 3 + len;
        else if (f->kind != LOOM_FLAG_SWITCH && !f->optional && i + 1 < argc)
            v = argv[++i];
        else if (f->kind != LOOM_FLAG_SWITCH && !f->optional)
            return loom_error_set(err, LOOM_ERR_INPUT, "option '%s' needs a value", a);
        loom_status st = set_value(f, v, err);
        if (st) return st;
    }
    return LOOM_OK;
}

loom_flags_outcome loom_flags_end(const loom_flag_spec *spec, const char *cmd, loom_status st,
                                  int help, const loom_error *err) {
    if (st) {
        fprintf(stderr, "%s: %s\n", cmd, err->msg);
        return LOOM_FLAGS_BAD;
    }
    if (help) {
        loom_flags_usage(spec, stdout);
        return LOOM_FLAGS_HELP;
    }
    return LOOM_FLAGS_GO;
}

loom_flags_outcome loom_flags_run(const loom_flag_spec *spec, const char *cmd, int argc,
                                  char **argv, int *first) {
    loom_error err = {0};
    int help = 0;
    loom_status st = loom_flags_parse(spec, argc, argv, &help, first, &err);
    return loom_flags_end(spec, cmd, st, help, &err);
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
            if ((spec->n_groups && fl->group != g) || fl->hidden) continue;
            char left[96];
            snprintf(left, sizeof left, "%s%c%s%s%s%s%s", fl->short_name ? "-" : "",
                     fl->short_name ? fl->short_name : ' ', fl->short_name && fl->name ? ", " : "",
                     fl->name ? "--" : "", fl->name ? fl->name : "", fl->arg ? " " : "",
                     fl->arg ? fl->arg : "");
            usage_left(f, fl->short_name ? left : left + 1, fl->help);
        }
        if (g == 0) usage_left(f, "-h, --help", "this help");
    }
    if (spec->footer) fprintf(f, "\n%s", spec->footer);
}
