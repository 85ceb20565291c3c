/* loom train --memory-per-rank GiB: a layout whose rank holds more is refused before any
 * allocation, naming the smallest layout of the same world that fits (loom plan's
 * enumeration and sizing: plan/memory.c, plan/search.c). */
#include "cli/memory_budget.h"

#include <stdlib.h>

#include "plan/plan.h"

/* How much model parallelism a layout uses: tp x pp x cp (then ZeRO, then memory). */
static long split_of(const loom_plan_candidate *c) {
    const loom_layout l = c->tc.layout;
    return (long)l.tp * l.pp * (l.cp > 0 ? l.cp : 1);
}

static int smaller(const loom_plan_candidate *a, const loom_plan_candidate *b) {
    if (split_of(a) != split_of(b)) return split_of(a) < split_of(b);
    if (a->tc.zero != b->tc.zero) return a->tc.zero < b->tc.zero;
    if (a->tc.recompute != b->tc.recompute) return a->tc.recompute < b->tc.recompute;
    return a->mem.total < b->mem.total;
}

loom_status loom_memory_budget_check(const loom_model_config *mc, const loom_train_config *tc,
                                     int world, loom_error *err) {
    if (!(tc->memory_per_rank > 0)) return LOOM_OK;
    const double GiB = 1 << 30, budget = tc->memory_per_rank * GiB;
    loom_plan_memory m;
    int stage = 0;
    loom_status st = loom_plan_memory_max(mc, tc, &m, &stage, err);
    if (st || (double)m.total <= budget) return st;
    loom_plan_candidate *all = NULL;
    int n = 0;
    st = loom_plan_enumerate(mc, tc, world, world, &all, &n, NULL, err);
    if (st) return st;
    const loom_plan_candidate *best = NULL;
    for (int i = 0; i < n; i++)
        if ((double)all[i].mem.total <= budget && (!best || smaller(&all[i], best))) best = &all[i];
    char flags[256] = "";
    if (best) loom_plan_layout_flags(&best->tc, flags, sizeof flags);
    st = best ? loom_error_set(err, LOOM_ERR_INPUT,
                               "--memory-per-rank %g: this layout holds %.2f GiB on a rank (stage "
                               "%d); the smallest layout of %d rank(s) that fits: %s (%.2f GiB)",
                               (double)tc->memory_per_rank, m.total / GiB, stage, world, flags,
                               best->mem.total / GiB)
              : loom_error_set(err, LOOM_ERR_INPUT,
                               "--memory-per-rank %g: this layout holds %.2f GiB on a rank and no "
                               "layout of %d rank(s) fits (loom plan --world N names larger ones)",
                               (double)tc->memory_per_rank, m.total / GiB, world);
    free(all);
    return st;
}
