/* One flag-table parser for every command: a table of flags (name, kind, destination,
 * help, group) parsed GNU style (--name VALUE, --name=VALUE, unambiguous prefixes, -o
 * short names, positional arguments anywhere, -- ends the flags), a help grouped by
 * purpose with each group's docs page, and one message for an unknown flag that names
 * the nearest known one ("did you mean --steps?"). Messages never name the command:
 * the caller prefixes them once ("loom plot: ..."). */
#ifndef LOOM_CORE_FLAGS_H
#define LOOM_CORE_FLAGS_H

#include <stdio.h>

#include "core/error.h"

typedef enum {
    LOOM_FLAG_STRING, /* const char **dst = the value as given (argv's own string) */
    LOOM_FLAG_SWITCH, /* int *dst = 1; takes no value */
    LOOM_FLAG_INT,    /* int *dst: a whole number in [lo, hi] */
    LOOM_FLAG_LONG,   /* long *dst: a whole number in [lo, hi] */
    LOOM_FLAG_DOUBLE, /* double *dst: a number in [lo, hi] */
    LOOM_FLAG_FLOAT,  /* float *dst: a number in [lo, hi] */
    LOOM_FLAG_U64,    /* unsigned long long *dst: a non-negative integer */
    LOOM_FLAG_CALL,   /* set(dst, name, value, err): the command's own conversion */
} loom_flag_kind;

typedef loom_status (*loom_flag_setter)(void *dst, const char *name, const char *value,
                                        loom_error *err);

typedef struct {
    const char *name; /* the long name without "--"; NULL for a short flag only */
    char short_name;  /* -o, or 0 */
    loom_flag_kind kind;
    void *dst;
    const char *arg;  /* the value's name in the help ("FILE", "N"); NULL for a switch */
    const char *help; /* one line (may hold '\n' for more) */
    int group;        /* index into the spec's groups */
    double lo, hi;    /* numbers: the range allowed ([lo, hi]; (lo, hi] with lo_open) */
    int lo_open;
    const char *expect; /* numbers: the message on a bad value ("--NAME: EXPECT"), or NULL */
    int quote_value;    /* with expect: "--NAME 'VALUE': EXPECT" */
    loom_flag_setter set;
    int optional; /* LOOM_FLAG_CALL only: the value may be left out (value "1") */
    int hidden;   /* parsed but not listed in the help (a command's internal flags) */
    /* optional: a bare flag also takes the next word as its value when it is one of these
     * (NULL-terminated), as --recompute selective */
    const char *const *next_words;
} loom_flag;

typedef struct {
    const char *title; /* "Sampling" */
    const char *page;  /* "docs/training.md", or NULL */
} loom_flag_group;

typedef struct loom_flag_spec_s {
    const char *usage;  /* the synopsis, printed first ("usage: loom plot [...] FILE...") */
    const char *about;  /* printed after the synopsis, or NULL */
    const char *footer; /* printed after the flags, or NULL */
    const loom_flag *flags;
    int n_flags;
    const loom_flag_group *groups;
    int n_groups;
    int positional;  /* 0: no positional arguments allowed; 1: they are kept */
    const char *see; /* an unknown flag's hint in parentheses (default "see --help") */
    int exact;       /* 1: long names only in full (no unambiguous prefixes, as --max-r) */
    const struct loom_flag_spec_s *also; /* an outer command's flags: suggested too */
} loom_flag_spec;

/* Parses argv[1..argc) (argv[0] is the command's name). *help = 1 on --help or -h (then
 * parsing stops, LOOM_OK). With spec->positional the positional arguments are moved to
 * argv[*first..argc) (first may be NULL otherwise). LOOM_ERR_INPUT with one line naming
 * the flag on an unknown flag (and the nearest known one), a missing or bad value, or an
 * unexpected positional argument. */
loom_status loom_flags_parse(const loom_flag_spec *spec, int argc, char **argv, int *help,
                             int *first, loom_error *err);

/* For a command that hands the flags it does not know to another parser (loom rl and
 * loom plan: loom train's): takes the table's flags (exact long names, --name VALUE or
 * --name=VALUE, and short ones) out of argv[1..argc) and appends every other word, in
 * order, to rest (room for argc words). *help = 1 on --help or -h. */
loom_status loom_flags_take(const loom_flag_spec *spec, int argc, char **argv, char **rest,
                            int *n_rest, int *help, loom_error *err);

/* What a command does after loom_flags_run: go on, or return the value as its exit status. */
typedef enum {
    LOOM_FLAGS_GO = -1,  /* parsed: the command goes on */
    LOOM_FLAGS_HELP = 0, /* --help or -h: the help was printed on stdout (exit 0) */
    LOOM_FLAGS_BAD = 2,  /* a bad flag: one line "CMD: MESSAGE" was printed on stderr (exit 2) */
} loom_flags_outcome;

/* The front of a command named cmd ("loom plot"): loom_flags_parse, then on a bad flag
 * the one line on stderr, on --help the help on stdout. A command goes on when it returns
 * LOOM_FLAGS_GO and else returns that value:
 *     loom_flags_outcome fo = loom_flags_run(&spec, "loom plot", argc, argv, &first);
 *     if (fo != LOOM_FLAGS_GO) return fo; */
loom_flags_outcome loom_flags_run(const loom_flag_spec *spec, const char *cmd, int argc,
                                  char **argv, int *first);

/* The same ending for a parse done another way (loom_flags_take): st and help are what it
 * returned, err its message. */
loom_flags_outcome loom_flags_end(const loom_flag_spec *spec, const char *cmd, loom_status st,
                                  int help, const loom_error *err);

/* The help: the synopsis, then each group's flags under "Title (page):". */
void loom_flags_usage(const loom_flag_spec *spec, FILE *f);

/* One help line for a flag: "  --name ARG   help", wrapping after long names. */
void loom_flags_usage_line(FILE *f, const char *name, const char *arg, const char *help);

/* ": did you mean --NAME?" for word (a mistyped "--flag" or "--flag=value") among the
 * table's names and "help", or "" when none is near. */
void loom_flags_suggest(const loom_flag_spec *spec, const char *word, char *out, size_t cap);

/* Table rows (designated initializers: the fields left out are 0). */
#define LOOM_FLAG_STR(g, nm, d, a, h)                                                              \
    { .name = (nm), .kind = LOOM_FLAG_STRING, .dst = (d), .arg = (a), .help = (h), .group = (g) }
/* A string with a short name too ("-o, --output FILE"). */
#define LOOM_FLAG_STR_SHORT(g, nm, sn, d, a, h)                                                    \
    {                                                                                              \
        .name = (nm), .short_name = (sn), .kind = LOOM_FLAG_STRING, .dst = (d), .arg = (a),        \
        .help = (h), .group = (g)                                                                  \
    }
#define LOOM_FLAG_SW(g, nm, d, h)                                                                  \
    { .name = (nm), .kind = LOOM_FLAG_SWITCH, .dst = (d), .help = (h), .group = (g) }
#define LOOM_FLAG_FN(g, nm, d, fn, a, h)                                                           \
    {                                                                                              \
        .name = (nm), .kind = LOOM_FLAG_CALL, .dst = (d), .set = (fn), .arg = (a), .help = (h),    \
        .group = (g)                                                                               \
    }

#define LOOM_FLAG_NUM(g, nm, k, d, a, h, l, u, e)                                                  \
    {                                                                                              \
        .name = (nm), .kind = (k), .dst = (d), .arg = (a), .help = (h), .group = (g), .lo = (l),   \
        .hi = (u), .expect = (e)                                                                   \
    }

/* The kind of a number flag from its destination's type (another type does not compile). */
#define LOOM_FLAG_KIND_OF(d)                                                                       \
    _Generic((d),                                                                                  \
        int *: LOOM_FLAG_INT,                                                                      \
        long *: LOOM_FLAG_LONG,                                                                    \
        double *: LOOM_FLAG_DOUBLE,                                                                \
        float *: LOOM_FLAG_FLOAT,                                                                  \
        unsigned long long *: LOOM_FLAG_U64)

/* A number in [l, u] of d's type, whose bad value is told with the value quoted and what
 * is expected: "--NAME 'VALUE': expected E" (e: a string literal). */
#define LOOM_FLAG_NUMBER(g, nm, d, a, h, l, u, e)                                                  \
    {                                                                                              \
        .name = (nm), .kind = LOOM_FLAG_KIND_OF(d), .dst = (d), .arg = (a), .help = (h),           \
        .group = (g), .lo = (l), .hi = (u), .expect = "expected " e, .quote_value = 1              \
    }

#define LOOM_FLAGS_COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* A spec's flags and groups from two arrays (designated initializers):
 * (loom_flag_spec){.usage = ..., LOOM_FLAGS_TABLE(flags, groups)}. */
#define LOOM_FLAGS_TABLE(fl, gr)                                                                   \
    .flags = (fl), .n_flags = LOOM_FLAGS_COUNT(fl), .groups = (gr), .n_groups = LOOM_FLAGS_COUNT(gr)

#endif
