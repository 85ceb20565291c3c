/* loom plan --check: a finished run's measured step against the plan's prediction for
 * its layout, term by term (the --metrics keys). */
#ifndef LOOM_CLI_PLAN_CHECK_H
#define LOOM_CLI_PLAN_CHECK_H

#include "core/error.h"

/* path: a `loom run` folder (its newest attempt's command.txt names the train flags and
 * the --metrics file) or a --metrics file, whose layout and model are then `words` (loom
 * train's flags). profile: required. moe_load_max: the router's busiest expert over the
 * mean to predict with; 0: the run's own (the median of its metrics' moe.load_max /
 * moe.load_mean). html: "" or the picture's path. */
loom_status loom_plan_check_run(const char *path, const char *profile, double moe_load_max,
                                const char *html, int json, char **words, int n_words,
                                loom_error *err);

#endif
