/* The layouts a plan considers: every combination of loom train's layout flags for a
 * world size that training accepts, each with its memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"

typedef struct {
    loom_plan_candidate *v;
    int n, cap;
    loom_error refused; /* why the last refused layout was refused */
    int sized_refusal;  /* ... one that passed the flags' checks and failed in set-up */
} candidates;

static loom_status add(candidates *c, const loom_model_config *mc, const loom_train_config *tc,
                       loom_error *err) {
    loom_error quiet = {0}; /* a refused layout is skipped, not reported */
    loom_plan_candidate x;
    memset(&x, 0, sizeof x);
    x.tc = *tc;
    const int valid = !loom_plan_validate(mc, tc, &quiet);
    if (!valid || loom_plan_memory_max(mc, tc, &x.mem, &x.mem_stage, &quiet)) {
        if (quiet.code == LOOM_ERR_NOMEM)
            return loom_error_set(err, LOOM_ERR_NOMEM, "%s", quiet.msg);
        /* a layout refused while being set up says more than one its flags refuse */
        if (valid || !c->sized_refusal) c->refused = quiet;
        c->sized_refusal |= valid;
        return LOOM_OK;
    }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        loom_plan_candidate *v = realloc(c->v, (size_t)cap * sizeof *v);
        if (!v) return loom_error_set(err, LOOM_ERR_NOMEM, "loom plan: out of memory");
        c->v = v, c->cap = cap;
    }
    c->v[c->n++] = x;
    return LOOM_OK;
}

/* The pipeline's choices for one layout: each schedule (interleaved with 2 chunks). */
static loom_status schedules(candidates *c, const loom_model_config *mc, loom_train_config *tc,
                             loom_error *err) {
    static const char *names[] = {"1f1b", "gpipe", "interleaved", "zb"};
    loom_status st = LOOM_OK;
    if (tc->layout.pp == 1) {
        snprintf(tc->pp_schedule, sizeof tc->pp_schedule, "1f1b");
        snprintf(tc->vision_schedule, sizeof tc->vision_schedule, "first");
        tc->virtual_stages = 1;
        return add(c, mc, tc, err);
    }
    for (int i = 0; i < 4 && !st; i++) {
        snprintf(tc->pp_schedule, sizeof tc->pp_schedule, "%s", names[i]);
        tc->virtual_stages = i == 2 ? 2 : 1;
        snprintf(tc->vision_schedule, sizeof tc->vision_schedule, "first");
        const int before = c->n;
        st = add(c, mc, tc, err);
        /* a vlm: also its encoder's pieces in the pipeline's bubbles, where that runs */
        if (!st && c->n > before && mc->family == LOOM_FAMILY_VLM) {
            snprintf(tc->vision_schedule, sizeof tc->vision_schedule, "bubbles");
            st = add(c, mc, tc, err);
            snprintf(tc->vision_schedule, sizeof tc->vision_schedule, "first");
        }
    }
    return st;
}

/* ZeRO stages, sequence parallelism, recomputation, context-parallel modes. */
static loom_status options(candidates *c, const loom_model_config *mc, loom_train_config *tc,
                           loom_error *err) {
    const loom_layout l = tc->layout;
    const int zero_max = loom_layout_replicas(l) > 1 ? 3 : 0;
    const int sp_max = l.tp > 1 ? 1 : 0, modes = l.cp > 1 ? 2 : 1;
    loom_status st = LOOM_OK;
    for (int z = 0; z <= zero_max && !st; z++)
        for (int sp = 0; sp <= sp_max && !st; sp++)
            for (int rc = 0; rc <= 1 && !st; rc++)
                for (int m = 0; m < modes && !st; m++) {
                    tc->zero = z;
                    tc->sequence_parallel = sp;
                    tc->recompute = rc;
                    snprintf(tc->cp_mode, sizeof tc->cp_mode, "%s", m ? "ulysses" : "ring");
                    st = schedules(c, mc, tc, err);
                }
    return st;
}

loom_status loom_plan_enumerate(const loom_model_config *mc, const loom_train_config *base,
                                int world, int tp_max, loom_plan_candidate **out, int *n,
                                loom_error *refused, loom_error *err) {
    candidates c = {0};
    loom_status st = LOOM_OK;
    *out = NULL;
    *n = 0;
    for (int tp = 1; tp <= world && tp <= tp_max && !st; tp++) {
        if (world % tp) continue;
        for (int pp = 1; pp <= world / tp && !st; pp++) {
            if ((world / tp) % pp) continue;
            for (int cp = 1; cp <= world / tp / pp && !st; cp++) {
                if ((world / tp / pp) % cp) continue;
                const int dp = world / tp / pp / cp;
                for (int ep = 1; ep <= dp * cp && !st; ep++) {
                    if ((dp * cp) % ep || (ep > 1 && mc->n_experts == 0)) continue;
                    const int per_replica = base->global_batch / dp;
                    if (per_replica < 1 || base->global_batch % dp) continue;
                    for (int mb = 1; mb <= per_replica && !st; mb *= 2) {
                        if (per_replica % mb) continue;
                        loom_train_config tc = *base;
                        tc.layout = (loom_layout){dp, tp, pp, ep, cp};
                        tc.micro_batch = mb;
                        st = options(&c, mc, &tc, err);
                    }
                }
            }
        }
    }
    if (st) {
        free(c.v);
        return st;
    }
    *out = c.v;
    *n = c.n;
    if (refused) *refused = c.refused;
    return LOOM_OK;
}

void loom_plan_layout_flags(const loom_train_config *tc, char *buf, size_t n) {
    const loom_layout l = tc->layout;
    size_t k = 0;
#define PUT(...) k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__)
    PUT("--dp %d", l.dp);
    if (l.tp > 1) PUT(" --tp %d%s", l.tp, tc->sequence_parallel ? " --sequence-parallel" : "");
    if (l.pp > 1) {
        PUT(" --pp %d --pp-schedule %s", l.pp, tc->pp_schedule);
        if (tc->virtual_stages > 1) PUT(" --virtual-stages %d", tc->virtual_stages);
        if (strcmp(tc->vision_schedule, "bubbles") == 0) PUT(" --vision-schedule bubbles");
    }
    if (l.cp > 1) PUT(" --cp %d --cp-mode %s", l.cp, tc->cp_mode);
    if (l.ep > 1) PUT(" --ep %d", l.ep);
    if (tc->zero > 0) PUT(" --zero %d", tc->zero);
    if (strcmp(tc->grad_accum, "auto") != 0) PUT(" --grad-accum %s", tc->grad_accum);
    PUT(" --micro-batch %d", tc->micro_batch);
    if (tc->recompute == LOOM_RECOMPUTE_FULL) PUT(" --recompute");
    if (tc->recompute == LOOM_RECOMPUTE_SELECTIVE) PUT(" --recompute selective");
#undef PUT
}
