#include "parallel/tp_shards.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

loom_status loom_tp_validate(const loom_model_config *cfg, int tp, int sequence_parallel, int rows,
                             loom_error *err) {
    if (tp <= 1) return LOOM_OK;
    loom_status st = loom_params_check_tp(cfg, tp, err);
    if (st) return st;
    if (sequence_parallel && rows % tp != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--sequence-parallel: --micro-batch x --seq-len = %d tokens must be "
                              "divisible by --tp %d (each rank holds an equal slice of the rows)",
                              rows, tp);
    return LOOM_OK;
}

loom_status loom_tp_grads_ready(void *ctx, size_t begin, size_t end) {
    loom_tp_ready_ctx *c = ctx;
    const loom_param_table *t = c->table;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        if (!p->sp_partial || p->offset < begin || p->offset >= end) continue;
        loom_status st =
            loom_comm_allreduce_sum(c->tp->comm, c->grads + p->offset, p->numel, c->tp->err);
        if (st) return st;
    }
    return c->next ? c->next(c->next_ctx, begin, end) : LOOM_OK;
}

loom_status loom_tp_grad_norm(loom_tp *tp, loom_zero *z, const float *grads, double *norm,
                              loom_error *err) {
    if (!tp || tp->size == 1) return loom_zero_grad_norm(z, grads, norm, err);
    /* This rank's reduced gradients: the whole buffer (stages 0, 1) or its shard. */
    const int sharded = z->stage >= 2;
    const size_t lo = sharded ? z->lo : 0, hi = sharded ? z->hi : z->total;
    const float *g = sharded ? z->grad_shard : grads;
    double sq = 0.0;
    for (int i = 0; i < z->table->n_params; i++) {
        const loom_param *p = &z->table->params[i];
        if (p->tp_dim < 0 && tp->rank != 0) continue; /* replicated: counted once */
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a < b) sq += loom_sum_squares(g + (a - lo), b - a);
    }
    loom_status st = sharded ? loom_comm_allreduce_sum_f64(z->dp, &sq, 1, err) : LOOM_OK;
    if (!st) st = loom_comm_allreduce_sum_f64(tp->comm, &sq, 1, err);
    *norm = sqrt(sq);
    return st;
}

loom_status loom_tp_gather_flat(loom_tp *tp, const loom_param_table *local, const float *flat,
                                const loom_param_table *global, float *global_flat,
                                loom_error *err) {
    const size_t P = local->total, S = (size_t)tp->size;
    if (P > (size_t)0x7fffffff / S)
        return loom_error_set(err, LOOM_ERR_INPUT, "gathering %zu x %zu parameters: too large", S,
                              P);
    float *all = malloc(S * P * sizeof(float));
    int *counts = malloc(S * sizeof(int)), *displs = malloc(S * sizeof(int));
    if (!all || !counts || !displs) {
        free(all);
        free(counts);
        free(displs);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "gathering tensor-parallel shards: out of memory");
    }
    for (size_t r = 0; r < S; r++) {
        counts[r] = (int)P;
        displs[r] = (int)(r * P);
    }
    memcpy(all + (size_t)tp->rank * P, flat, P * sizeof(float));
    loom_status st = loom_comm_allgatherv(tp->comm, all, counts, displs, err);
    if (!st && global_flat) {
        for (int i = 0; i < local->n_params; i++) {
            loom_param p = local->params[i];
            const loom_param *gp = &global->params[i];
            for (int r = 0; r < (p.tp_dim < 0 ? 1 : tp->size); r++) {
                p.tp_rank = r; /* rank r's placement of the same tensor */
                const float *src = all + (size_t)r * P + p.offset;
                for (int64_t j = 0; j < (int64_t)p.numel; j++)
                    global_flat[gp->offset + (size_t)loom_param_global_index(&p, j)] = src[j];
            }
        }
    }
    free(all);
    free(counts);
    free(displs);
    return st;
}
