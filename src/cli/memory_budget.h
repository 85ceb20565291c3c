/* loom train --memory-per-rank: refuse a layout whose rank does not fit (cli/memory_budget.c). */
#ifndef LOOM_CLI_MEMORY_BUDGET_H
#define LOOM_CLI_MEMORY_BUDGET_H

#include "core/error.h"
#include "model/config.h"
#include "train/train_config.h"

/* LOOM_OK when tc->memory_per_rank is 0 or the layout's largest rank fits it; else
 * LOOM_ERR_INPUT naming the smallest layout of `world` ranks that fits (least tp x pp x cp,
 * then the lowest ZeRO stage, then no recomputation before any), or saying none does. */
loom_status loom_memory_budget_check(const loom_model_config *mc, const loom_train_config *tc,
                                     int world, loom_error *err);

#endif
