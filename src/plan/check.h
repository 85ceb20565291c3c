/* loom plan --check's reading of a finished run: the newest attempt's `loom train`
 * command of a loom run folder, and the measured medians of its --metrics file, with the
 * keys the prediction's terms carry (cli/plan_check.c predicts the same layout and
 * prints the two side by side). */
#ifndef LOOM_PLAN_CHECK_H
#define LOOM_PLAN_CHECK_H

#include <stddef.h>

#include "core/error.h"
#include "plan/plan.h"

#define LOOM_PLAN_CHECK_MAX_WORDS 512
#define LOOM_PLAN_CHECK_MAX_STEPS 100000

/* What --metrics measures of a step; the prediction's terms carry the same keys. */
#define LOOM_PLAN_CHECK_KEYS 5
extern const char *const loom_plan_check_keys[LOOM_PLAN_CHECK_KEYS];

typedef struct {
    char *buf; /* the command line's text, split in place (free it) */
    char *words[LOOM_PLAN_CHECK_MAX_WORDS];
    int n;
} loom_plan_command;

/* The newest attempt's command.txt of a loom run folder: "" if there is none. */
void loom_plan_newest_command(const char *dir, char *out, size_t n);
/* The `loom train` command of a command.txt: c->words from "train" on. */
loom_status loom_plan_read_command(loom_plan_command *c, const char *path, loom_error *err);
/* The measured medians over the steps after the first two (their start-up costs):
 * step_ms, each loom_plan_check_keys[k] (has[k] 0 when the metrics do not carry it) and
 * the MoE router's moe.load_max / moe.load_mean (0 without it). */
loom_status loom_plan_read_metrics(const char *path, double *step_ms, double *keys, int *has,
                                   double *moe_load_max, int *steps, loom_error *err);
/* The predicted ms of the terms that carry metric `key`. */
double loom_plan_predicted_of(const loom_plan_time *t, const char *key);

#endif
