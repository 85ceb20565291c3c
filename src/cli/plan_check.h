/* loom plan --check: a finished run's measured step against the plan's prediction for
 * its layout, term by term (the --metrics keys). */
#ifndef LOOM_CLI_PLAN_CHECK_H
#define LOOM_CLI_PLAN_CHECK_H

#include "core/error.h"

/* path: a `loom run` folder (its newest attempt's command.txt names the train flags and
 * the --metrics file) or a --metrics file, whose layout and model are then `words` (loom
 * train's flags). profile: required. html: "" or the picture's path. */
loom_status loom_plan_check_run(const char *path, const char *profile, const char *html, int json,
                                char **words, int n_words, loom_error *err);

#endif
