/* loom data images and loom data video (cmd_data.c dispatches to them), and the long-option
 * parsing every loom data subcommand shares. */
#ifndef LOOM_CLI_CMD_DATA_IMAGES_H
#define LOOM_CLI_CMD_DATA_IMAGES_H

#include <stdint.h>

/* How one long option's value is read. Each bad value is one line on stderr:
 * "loom data: --NAME 'VALUE': expected ...". */
typedef enum {
    LOOM_DATA_FLAG_STR,      /* *str = the value as given (the last one when repeated) */
    LOOM_DATA_FLAG_STRS,     /* str[(*count)++] = the value: repeatable, str has room for argc */
    LOOM_DATA_FLAG_INT,      /* *i64 = an integer from lo to hi */
    LOOM_DATA_FLAG_FRACTION, /* *f64 = a number in [0, 1) */
    LOOM_DATA_FLAG_CHOICE,   /* *choice = values[k] where the value is choices[k] */
} loom_data_flag_kind;

typedef struct {
    const char *name; /* without the leading "--" */
    loom_data_flag_kind kind;
    int required; /* "loom data: --NAME is required" when absent (checked in table order) */
    const char **str;
    int *count;
    int64_t *i64;
    int64_t lo, hi;
    double *f64;
    int *choice;
    const char *const *choices; /* NULL-terminated; the message lists them: "A, B or C" */
    const int *values;
} loom_data_flag;

#define LOOM_DATA_MAX_FLAGS 16
#define LOOM_DATA_N_FLAGS(table) ((int)(sizeof(table) / sizeof *(table)))

/* One subcommand's help (cmd_data.c holds them all; loom data --help prints them all). */
typedef struct {
    const char *name;     /* "prepare" */
    const char *group;    /* the heading it is listed under: "Text to token shards" */
    const char *page;     /* "docs/data.md" */
    const char *synopsis; /* "loom data prepare --input ..." (more lines indented under it) */
    const char *about;    /* what it does, each line indented by two spaces */
} loom_data_help;

/* Parses argv[1..argc) (argv[0] is the subcommand) against flags[0..n) and --help, which
 * prints the subcommand's help on stdout. Then no argument may remain and every required
 * flag must have been given. Returns -1 when the command should go on, 0 after --help, 2
 * after an error (one line "loom data: ..." on stderr). */
int loom_data_parse_flags(int argc, char **argv, const loom_data_flag *flags, int n,
                          const loom_data_help *help);

/* argv[0] is "images" / "video"; help is printed for --help. 0, or 2 on any error. */
int loom_cmd_data_images(int argc, char **argv, const loom_data_help *help);
int loom_cmd_data_video(int argc, char **argv, const loom_data_help *help);

#endif
