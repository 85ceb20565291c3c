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
                          const loom_data_help *help) {
    if (n > LOOM_DATA_MAX_FLAGS) {
        fprintf(stderr, "loom data: %d flags, at most %d\n", n, LOOM_DATA_MAX_FLAGS);
        return 2;
    }
    data_slot slots[LOOM_DATA_MAX_FLAGS];
    loom_flag table[LOOM_DATA_MAX_FLAGS];
    for (int i = 0; i < n; i++) {
        slots[i] = (data_slot){&flags[i], 0};
        /* the help's synopsis and text name them */
        table[i] = (loom_flag){.name = flags[i].name,
                               .kind = LOOM_FLAG_CALL,
                               .dst = &slots[i],
                               .set = data_set,
                               .hidden = 1};
    }
    char usage[1024];
    snprintf(usage, sizeof usage, "usage: %s", help->synopsis);
    const loom_flag_group group[] = {{help->group, help->page}};
    const loom_flag_spec spec = {.usage = usage,
                                 .about = help->about,
                                 .flags = table,
                                 .n_flags = n,
                                 .groups = group,
                                 .n_groups = 1};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom data", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    for (int i = 0; i < n; i++)
        if (flags[i].required && !slots[i].given) {
            fprintf(stderr, "loom data: --%s is required\n", flags[i].name);
            return 2;
        }
    return -1;
}
