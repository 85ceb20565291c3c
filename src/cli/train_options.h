/* `loom train` options: GNU long flags and a `key = value` config file (INI sections
 * allowed) share one table; flags override the file, both override the preset. */
#ifndef LOOM_CLI_TRAIN_OPTIONS_H
#define LOOM_CLI_TRAIN_OPTIONS_H

#include <stdio.h>

#include "core/error.h"
#include "core/flags.h"
#include "model/config.h"
#include "train/trainer.h"

typedef struct {
    char preset[64];
    loom_model_config model;
    loom_train_config train;
    int help;
} loom_train_options;

/* Parses argv (argv[0] = "train"). LOOM_ERR_INPUT with a message naming the flag, file
 * or key on any bad input. */
loom_status loom_train_options_parse(loom_train_options *o, int argc, char **argv, loom_error *err);
/* The same for a command that takes loom train's flags beside its own (loom rl, loom plan):
 * an unknown flag's suggestion is the nearest of both tables. */
loom_status loom_train_options_parse_within(loom_train_options *o, int argc, char **argv,
                                            const loom_flag_spec *outer, loom_error *err);
/* Writes the effective configuration as `key = value` lines (a valid --config file). */
void loom_train_options_print(const loom_train_options *o, FILE *f);
void loom_train_options_usage(FILE *f);

#endif
