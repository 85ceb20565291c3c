/* What loom plan prints: one layout explained, or the best layouts of a world size. */
#ifndef LOOM_CLI_PLAN_REPORT_H
#define LOOM_CLI_PLAN_REPORT_H

#include "core/error.h"
#include "plan/plan.h"

/* Where a plan's ranks run: ranks_per_node 0 means the profile's node (a CPU node holds
 * the whole world: its ranks share the cores; a GPU node its devices). moe_load_max: the
 * router's busiest expert over the mean (loom plan --moe-load-max; 0: balanced). */
loom_plan_placement loom_plan_placement_of(const loom_profile *p, const loom_train_config *tc,
                                           int world, int ranks_per_node, double moe_load_max);

/* The layout tc (loom train's flags) of model mc: its memory per rank (the start-up
 * report's lines) and, with a profile, its predicted step term by term, ending in
 * "predicted step: X ms". json: one JSON object instead. html: also the picture. */
loom_status loom_plan_explain(const loom_model_config *mc, const loom_train_config *tc,
                              const loom_profile *p, int ranks_per_node, double moe_load_max,
                              int json, const char *html, loom_error *err);

/* The `top` fastest layouts of `world` ranks that fit memory_gib per rank (0: the
 * profile's memory), each with why it is ahead. LOOM_ERR_INPUT when none fits, naming
 * the smallest memory a layout needs. */
loom_status loom_plan_search(const loom_model_config *mc, const loom_train_config *base,
                             const loom_profile *p, int world, int ranks_per_node,
                             double moe_load_max, double memory_gib, int top, int json,
                             const char *html, loom_error *err);

/* The JSON object of one evaluated layout ({"layout", "world", "memory", "time"}). */
void *loom_plan_candidate_json(const loom_model_config *mc, const loom_plan_candidate *c,
                               int with_time);

#endif
