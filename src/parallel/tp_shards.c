#include "parallel/tp_shards.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
