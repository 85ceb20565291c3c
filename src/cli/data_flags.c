/* loom_data_parse_flags (cmd_data_images.h): the loom data subcommands' flag tables read by
 * the one flag parser (core/flags.h), each kind of value by a setter below. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_data_images.h"
#include "core/flags.h"

typedef struct {
    const loom_data_flag *flag;
    int given;
} data_slot;

static loom_status data_set(void *dst, const char *name, const char *arg, loom_error *err) {
    data_slot *slot = dst;
    const loom_data_flag *f = slot->flag;
    slot->given = 1;
    switch (f->kind) {
    case LOOM_DATA_FLAG_STR:
        *f->str = arg;
        return LOOM_OK;
    case LOOM_DATA_FLAG_STRS:
        f->str[(*f->count)++] = arg;
        return LOOM_OK;
    case LOOM_DATA_FLAG_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(arg, &end, 10);
        if (errno || end == arg || *end || v < f->lo || v > f->hi)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--%s '%s': expected an integer from %lld to %lld", name, arg,
                                  (long long)f->lo, (long long)f->hi);
        *f->i64 = v;
        return LOOM_OK;
    }
    case LOOM_DATA_FLAG_FRACTION: {
        char *end = NULL;
        errno = 0;
        double v = strtod(arg, &end);
        if (errno || end == arg || *end || !(v >= 0 && v < 1))
            return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected a number in [0, 1)",
                                  name, arg);
        *f->f64 = v;
        return LOOM_OK;
    }
    case LOOM_DATA_FLAG_CHOICE: {
        for (int k = 0; f->choices[k]; k++)
            if (strcmp(arg, f->choices[k]) == 0) {
                *f->choice = f->values[k];
                return LOOM_OK;
            }
        char list[256] = "";
        for (int k = 0; f->choices[k]; k++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                     k == 0              ? ""
                     : f->choices[k + 1] ? ", "
                                         : " or ",
                     f->choices[k]);
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected %s", name, arg, list);
    }
    }
    return LOOM_ERR_INPUT;
}

int loom_data_parse_flags(int argc, char **argv, const loom_data_flag *flags, int n,
                          const char *usage) {
    if (n > LOOM_DATA_MAX_FLAGS) {
        fprintf(stderr, "loom data: %d flags, at most %d\n", n, LOOM_DATA_MAX_FLAGS);
        return 2;
    }
    data_slot slots[LOOM_DATA_MAX_FLAGS];
    loom_flag table[LOOM_DATA_MAX_FLAGS];
    for (int i = 0; i < n; i++) {
        slots[i] = (data_slot){&flags[i], 0};
        table[i] = (loom_flag)LOOM_FLAG_FN(0, flags[i].name, &slots[i], data_set, "V", "");
    }
    const loom_flag_spec spec = {.usage = usage,
                                 .about = NULL,
                                 .footer = NULL,
                                 .flags = table,
                                 .n_flags = n,
                                 .groups = NULL,
                                 .n_groups = 0,
                                 .positional = 0};
    loom_error err = {0};
    int help = 0;
    if (loom_flags_parse(&spec, argc, argv, &help, NULL, &err)) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        return 2;
    }
    if (help) { /* the usage of every loom data subcommand, grouped, with their pages */
        fputs(usage, stdout);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (flags[i].required && !slots[i].given) {
            fprintf(stderr, "loom data: --%s is required\n", flags[i].name);
            return 2;
        }
    return -1;
}
