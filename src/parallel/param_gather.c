#include "parallel/param_gather.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/shard_geometry.h"

loom_status loom_param_gather_validate(int zero, loom_layout layout, loom_error *err) {
    if (zero != 1 && zero != 2)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--overlap-param-gather: needs --zero 1 or 2 (got --zero %d: stage 0 "
                              "gathers nothing, stage 3 gathers per block already)",
                              zero);
    if (layout.pp > 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--overlap-param-gather: not supported with --pp %d (pipeline stages "
                              "gather after their own schedule)",
                              layout.pp);
    if (layout.ep > 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--overlap-param-gather: not supported with --ep %d (the experts' "
                              "shards are gathered over their own group)",
                              layout.ep);
    return LOOM_OK;
}

loom_status loom_param_gather_create(loom_param_gather *g, loom_zero *z, float *params,
                                     loom_error *err) {
    memset(g, 0, sizeof *g);
    if (z->stage == 0 || z->stage == 3 || z->experts || z->dp->size == 1) return LOOM_OK;
    const loom_param_table *t = z->table;
    const int L = t->n_layer, R = z->dp->size;
    g->n_ranges = L + 2;
    g->ranges = calloc((size_t)g->n_ranges, sizeof *g->ranges);
    if (!g->ranges) goto nomem;
    const size_t first = L > 0 ? t->blocks[0].begin : t->head_begin;
    for (int i = 0; i < g->n_ranges; i++) {
        loom_param_gather_range *r = &g->ranges[i];
        r->begin = i == 0 ? 0 : i <= L ? t->blocks[i - 1].begin : t->head_begin;
        r->end = i == 0 ? first : i < L ? t->blocks[i].begin : i == L ? t->head_begin : t->total;
        r->counts = calloc((size_t)R, sizeof(int));
        r->displs = calloc((size_t)R, sizeof(int));
        if (!r->counts || !r->displs) goto nomem;
        loom_shard_layout_parts(&z->shards, r->begin, r->end, r->counts, r->displs);
        r->op.kind = LOOM_OP_ALLGATHERV;
        r->op.buf = params + r->begin;
        r->op.counts = r->counts;
        r->op.displs = r->displs;
    }
    g->zero = z;
    g->params = params;
    z->overlap = g;
    return LOOM_OK;
nomem:
    loom_param_gather_free(g);
    return loom_error_set(err, LOOM_ERR_NOMEM, "--overlap-param-gather: out of memory");
}

void loom_param_gather_free(loom_param_gather *g) {
    g->landed = NULL; /* an exit path: nothing reads the values any more */
    if (g->zero) {
        loom_error ignored;
        loom_param_gather_wait_all(g, &ignored); /* no buffer stays in MPI's hands */
        g->zero->overlap = NULL;
    }
    for (int i = 0; g->ranges && i < g->n_ranges; i++) {
        free(g->ranges[i].counts);
        free(g->ranges[i].displs);
    }
    free(g->ranges);
    memset(g, 0, sizeof *g);
}

/* Without an engine thread, MPI moves the gathers in flight only when called: test each. */
static loom_status progress(loom_param_gather *g, loom_error *err) {
    loom_status st = LOOM_OK;
    for (int k = 0; !st && !g->zero->engine.threaded && k < g->n_ranges; k++) {
        int done;
        if (g->ranges[k].in_flight)
            st = loom_comm_engine_test(&g->zero->engine, &g->ranges[k].op, &done, err);
    }
    return st;
}

loom_status loom_param_gather_post(loom_param_gather *g, int i, loom_error *err) {
    loom_param_gather_range *r = &g->ranges[i];
    if (i == 0) { /* a new step's gathers: the last step's waits are complete */
        const double w = g->zero->times.param_wait_ms;
        if (g->steps > 0 && w > g->wait_max_ms) g->wait_max_ms = w;
        g->steps++;
    }
    r->in_flight = 1;
    loom_status st = loom_comm_engine_post(&g->zero->engine, &r->op, err);
    return st ? st : progress(g, err);
}

/* Range r's gather waited for: no longer in flight, and its values are complete. */
static void landed(loom_param_gather *g, loom_param_gather_range *r) {
    r->in_flight = 0;
    if (g->landed) g->landed(g->landed_ctx, r->begin, r->end);
}

/* Range i complete; the time counts as the step's exposed parameter wait. */
static loom_status ensure(loom_param_gather *g, int i, loom_error *err) {
    if (!g->zero || i >= g->n_ranges) return LOOM_OK;
    loom_param_gather_range *r = &g->ranges[i];
    if (!r->in_flight) return LOOM_OK;
    double t0 = loom_now_ms();
    loom_status st = loom_comm_engine_wait(&g->zero->engine, &r->op, err);
    if (!st) {
        landed(g, r);
        st = progress(g, err);
    }
    const double waited = loom_now_ms() - t0;
    g->zero->times.param_wait_ms += waited;
    g->wait_ms += waited;
    return st;
}

void loom_param_gather_report(const loom_param_gather *g, int rank) {
    const int waited = g->steps - 1; /* the forwards after a step's gathers */
    if (!g->zero || waited < 1) return;
    fprintf(stderr,
            "loom: rank %d: --overlap-param-gather: the forward waited %.1f ms per step for "
            "parameters (most %.1f ms), over %d step(s)\n",
            rank, g->wait_ms / waited, g->wait_max_ms, waited);
}

loom_status loom_param_gather_begin_micro_batch(loom_param_gather *g, loom_error *err) {
    loom_status st = ensure(g, 0, err);
    /* No blocks: no hook waits for the tail. */
    if (!st && g->zero && g->n_ranges == 2) st = ensure(g, 1, err);
    return st;
}

loom_status loom_param_gather_before_block(void *ctx, int layer, int backward) {
    loom_param_gather *g = ctx;
    (void)backward; /* backward follows a forward that waited for every range */
    return ensure(g, layer + 1, g->err);
}

loom_status loom_param_gather_after_block(void *ctx, int layer, int backward) {
    loom_param_gather *g = ctx;
    /* The final norm and head run next in forward. */
    if (!backward && layer + 2 == g->n_ranges - 1) return ensure(g, g->n_ranges - 1, g->err);
    return LOOM_OK;
}

loom_status loom_param_gather_wait_all(loom_param_gather *g, loom_error *err) {
    if (!g || !g->zero) return LOOM_OK;
    loom_status st = LOOM_OK;
    for (int i = 0; i < g->n_ranges; i++) {
        loom_param_gather_range *r = &g->ranges[i];
        if (!r->in_flight) continue;
        loom_status w = loom_comm_engine_wait(&g->zero->engine, &r->op, err);
        if (!st) st = w; /* wait for all, so no buffer stays in MPI's hands */
        if (w)
            r->in_flight = 0;
        else
            landed(g, r);
    }
    return st;
}

/* AdamW range by range in forward order, each range's gather posted once this rank's
 * part of it is updated. Elementwise, so the same values as one call over the shard. */
loom_status loom_param_gather_optimizer_step(loom_param_gather *g, float *grads, double norm,
                                             float lr, const loom_adamw_config *cfg, int step,
                                             loom_error *err) {
    loom_zero *z = g->zero;
    float *params = g->params, *gr = loom_zero_reduced_grads(z, grads);
    /* The previous gather must be complete before the shard changes (the forward has
     * waited for every range already: a no-op unless a step had no forward). */
    loom_status st = loom_param_gather_wait_all(g, err);
    if (st) return st;
    double t0 = loom_now_ms(), c0 = loom_thread_cpu_ms();
    loom_grad_clip(z->be, gr, z->hi - z->lo, norm, cfg->grad_clip);
    for (int i = 0; i < g->n_ranges && !st; i++) {
        const loom_param_gather_range *r = &g->ranges[i];
        const size_t a = r->begin > z->lo ? r->begin : z->lo, e = r->end < z->hi ? r->end : z->hi;
        if (a < e)
            loom_adamw_step(z->be, z->table, params + a, gr + (a - z->lo), z->m + (a - z->lo),
                            z->v + (a - z->lo), a, e, lr, cfg, step);
        double t1 = loom_now_ms();
        st = loom_param_gather_post(g, i, err);
        z->times.param_gather_ms += loom_now_ms() - t1;
    }
    /* the gathers' posting counts as param_gather_ms, inside the optimizer's time */
    z->times.optimizer_ms = loom_now_ms() - t0 - z->times.param_gather_ms;
    z->times.optimizer_cpu_ms = loom_thread_cpu_ms() - c0;
    return st;
}
