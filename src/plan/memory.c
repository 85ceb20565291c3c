/* The planner's memory per rank: the training run's own sizing (train/run_memory.c) for
 * the rank of each pipeline stage, so a plan's figures are the start-up report's. */
#include <omp.h>
#include <string.h>

#include "core/cpu_boot.h"
#include "plan/plan.h"
#include "train/run.h"

static int world_of(loom_layout l) {
    return l.dp * l.cp * l.tp * l.pp;
}

loom_status loom_plan_memory_of(const loom_model_config *mc, const loom_train_config *tc, int stage,
                                loom_plan_memory *out, loom_error *err) {
    const loom_layout l = tc->layout;
    memset(out, 0, sizeof *out);
    if (stage < 0 || stage >= l.pp)
        return loom_error_set(err, LOOM_ERR_INPUT, "pipeline stage %d: expected 0..%d", stage,
                              l.pp - 1);
    /* tensor, context, data and expert rank 0 of the stage (mesh order: tp fastest) */
    const int rank = stage * l.tp * loom_layout_replicas(l);
    /* the CPU kernels' scratch is per thread: size with the run's --threads */
    const int before = omp_get_max_threads();
    loom_cpu_set_thread_count(tc->threads > 0 ? tc->threads : 1);
    loom_status st = loom_run_memory_of(mc, tc, world_of(l), rank, out, err);
    loom_cpu_set_thread_count(before);
    return st;
}

/* Which stages can hold the most: the first, the last (the head), and of the others the
 * first of each layer count (a later stage with as many layers holds as many
 * micro-batches in flight or fewer: every schedule's warm-up shrinks with the rank). */
static int stages_to_size(const loom_model_config *mc, const loom_train_config *tc, int *out) {
    const int pp = tc->layout.pp;
    loom_pp_config pc;
    loom_train_config_pipeline(tc, &pc);
    int counts[LOOM_PP_MAX_STAGES * LOOM_MAX_CHUNKS], held[LOOM_PP_MAX_STAGES], n = 0;
    /* --vision-schedule bubbles: any stage may hold encoder replicas */
    if (pp == 1 || pc.vision_bubbles || loom_pipeline_split_layers(mc, &pc, counts, NULL)) {
        for (int s = 0; s < pp; s++) out[n++] = s; /* (a refused split fails in sizing) */
        return n;
    }
    for (int s = 0; s < pp; s++) {
        held[s] = 0;
        for (int c = 0; c < pc.virtual_stages; c++) held[s] += counts[c * pp + s];
        int seen = 0;
        for (int k = 1; k < s && !seen; k++) seen = held[k] == held[s];
        if (s == 0 || s == pp - 1 || !seen) out[n++] = s;
    }
    return n;
}

loom_status loom_plan_memory_max(const loom_model_config *mc, const loom_train_config *tc,
                                 loom_plan_memory *out, int *stage, loom_error *err) {
    int stages[LOOM_PP_MAX_STAGES];
    if (tc->layout.pp < 1 || tc->layout.pp > LOOM_PP_MAX_STAGES)
        return loom_error_set(err, LOOM_ERR_INPUT, "--pp %d: expected 1..%d", tc->layout.pp,
                              LOOM_PP_MAX_STAGES);
    const int n = stages_to_size(mc, tc, stages);
    *stage = 0;
    for (int i = 0; i < n; i++) {
        loom_plan_memory m;
        loom_status st = loom_plan_memory_of(mc, tc, stages[i], &m, err);
        if (st) return st;
        if (i == 0 || m.total > out->total) *out = m, *stage = stages[i];
    }
    return LOOM_OK;
}

loom_status loom_plan_validate(const loom_model_config *mc, const loom_train_config *tc,
                               loom_error *err) {
    loom_status st = loom_train_config_validate_all(tc, mc, err);
    if (st) return st;
    return loom_layout_validate(tc->layout, world_of(tc->layout), err);
}
