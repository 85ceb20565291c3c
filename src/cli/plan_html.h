/* loom plan's picture: layouts as stacked bars of their step's terms (an HTML page with an
 * inline SVG: no script, opens anywhere). */
#ifndef LOOM_CLI_PLAN_HTML_H
#define LOOM_CLI_PLAN_HTML_H

#include "core/error.h"
#include "plan/plan.h"

/* One bar: a label and the terms stacked in it (time.terms; time.step_ms its length). */
typedef struct {
    char label[512];
    const char *note; /* under the label ("predicted", "measured"); NULL: none */
    loom_plan_time time;
} loom_plan_bar;

/* Writes `path`: a title, the bars (one row each, the same ms scale), a legend of the
 * terms' names. LOOM_ERR_INPUT naming the path if it cannot be written. */
loom_status loom_plan_html_write(const char *path, const char *title, const loom_plan_bar *bars,
                                 int n, loom_error *err);

#endif
