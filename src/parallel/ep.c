#include "parallel/ep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_writer.h"

loom_status loom_ep_reduce_grads(const loom_param_table *t, float *grads, loom_comm *dp,
                                 loom_comm *edp, loom_error *err) {
    loom_status st = LOOM_OK;
    for (int i = 0; i < t->n_params && !st;) {
        const int expert = t->params[i].expert >= 0;
        int j = i;
        while (j < t->n_params && (t->params[j].expert >= 0) == expert) j++;
        const size_t lo = t->params[i].offset,
                     hi = t->params[j - 1].offset + t->params[j - 1].numel;
        st = loom_comm_allreduce_sum(expert ? edp : dp, grads + lo, hi - lo, err);
        i = j;
    }
    return st;
}

loom_status loom_ep_gather_flat(const loom_param_table *local, const float *flat,
                                const loom_param_table *global, float *global_flat, loom_comm *ep,
                                loom_error *err) {
    const int R = ep->size;
    int *counts = calloc((size_t)R, sizeof(int)), *displs = calloc((size_t)R, sizeof(int));
    float *buf = NULL;
    loom_status st = LOOM_OK;
    if (!counts || !displs) st = loom_error_set(err, LOOM_ERR_NOMEM, "ep gather: out of memory");
    for (int i = 0; i < global->n_params && !st && global_flat; i++) {
        const loom_param *g = &global->params[i];
        if (g->expert >= 0) continue;
        const int li = loom_params_find(local, g->name);
        if (li < 0) return loom_error_set(err, LOOM_ERR_STATE, "ep gather: %s missing", g->name);
        memcpy(global_flat + g->offset, flat + local->params[li].offset, g->numel * sizeof(float));
    }
    /* Each layer's experts are contiguous: this rank's block of n_local experts, and in
     * the global table all n_experts in order. */
    for (int l = 0; l < local->n_layer && !st; l++) {
        const loom_block_params *k = &local->blocks[l], *gk = &global->blocks[l];
        if (!k->moe) continue;
        const size_t block = (size_t)local->n_local_experts * k->expert_stride;
        const size_t all = block * (size_t)R;
        if (!buf) buf = malloc(all * sizeof(float));
        if (!buf) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "ep gather: out of memory");
            break;
        }
        for (int r = 0; r < R; r++) counts[r] = (int)block, displs[r] = (int)(block * r);
        memcpy(buf + block * (size_t)ep->rank, flat + k->expert0.fc_w, block * sizeof(float));
        st = loom_comm_allgatherv(ep, buf, counts, displs, err);
        if (!st && global_flat) memcpy(global_flat + gk->expert0.fc_w, buf, all * sizeof(float));
    }
    free(buf);
    free(counts);
    free(displs);
    return st;
}

loom_status loom_ep_plan_written(loom_ckpt_plan *plan, const loom_param_table *t,
                                 const loom_ckpt_descs *ct, loom_ckpt_kind kind, size_t dense_lo,
                                 size_t dense_hi, int q, int edp_size, loom_error *err) {
    size_t experts = 0;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].expert >= 0) experts += t->params[i].numel;
    const size_t x_lo = experts * (size_t)q / (size_t)edp_size,
                 x_hi = experts * (size_t)(q + 1) / (size_t)edp_size;
    /* Flat ranges to write, merged when adjacent (fewer, larger pieces). */
    size_t run_lo = 0, run_hi = 0, x = 0;
    loom_status st = LOOM_OK;
    for (int i = 0; i < t->n_params && !st; i++) {
        const loom_param *p = &t->params[i];
        size_t a, b;
        if (p->expert >= 0) { /* elements [x, x + numel) of the expert order */
            a = x > x_lo ? x : x_lo;
            b = x + p->numel < x_hi ? x + p->numel : x_hi;
            a = a - x + p->offset, b = b - x + p->offset;
            x += p->numel;
        } else {
            a = p->offset > dense_lo ? p->offset : dense_lo;
            b = p->offset + p->numel < dense_hi ? p->offset + p->numel : dense_hi;
        }
        if (a >= b) continue;
        if (a != run_hi && run_hi > run_lo) {
            st = loom_ckpt_plan_range(plan, ct, kind, run_lo, run_hi, 1, LOOM_CKPT_CHUNK_FLOATS,
                                      err);
            run_lo = a;
        } else if (run_hi == run_lo) {
            run_lo = a;
        }
        run_hi = b;
    }
    if (!st && run_hi > run_lo)
        st = loom_ckpt_plan_range(plan, ct, kind, run_lo, run_hi, 1, LOOM_CKPT_CHUNK_FLOATS, err);
    return st;
}

loom_status loom_ep_tp_gather_flat(loom_tp *tp, loom_comm *ep, const loom_param_table *local,
                                   const float *flat, const loom_param_table *global,
                                   float *global_flat, const loom_model_config *mc,
                                   const loom_layer_set *layers, loom_error *err) {
    /* tp first (into this ep rank's experts, tensors whole), then ep on tp rank 0 */
    loom_param_table mid;
    loom_status st = loom_params_build(&mid, mc,
                                       &(loom_params_options){.ep_rank = local->ep_rank,
                                                              .ep_size = local->ep_size,
                                                              .layers = layers},
                                       err);
    if (st) return st;
    float *mid_flat = tp->rank == 0 ? malloc(mid.total * sizeof(float)) : NULL;
    if (tp->rank == 0 && !mid_flat)
        st = loom_error_set(err, LOOM_ERR_NOMEM, "ep gather: out of memory");
    if (!st) st = loom_tp_gather_flat(tp, local, flat, &mid, mid_flat, err);
    if (!st && tp->rank == 0)
        st = loom_ep_gather_flat(&mid, mid_flat, global, global_flat, ep, err);
    free(mid_flat);
    loom_params_free(&mid);
    return st;
}
