#include "train/ckpt_tensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_ckpt_tensors_describe(loom_ckpt_descs *out, const loom_param_table *t,
                                       loom_error *err) {
    memset(out, 0, sizeof *out);
    out->items = calloc((size_t)(t->n_params ? t->n_params : 1), sizeof *out->items);
    if (!out->items) return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint: out of memory");
    out->n = t->n_params;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        loom_ckpt_desc *d = &out->items[i];
        snprintf(d->name, sizeof d->name, "%s", p->name);
        d->ndim = p->ndim;
        d->global_shape[0] = p->global_shape[0];
        d->global_shape[1] = p->ndim == 2 ? p->global_shape[1] : 1;
        d->local_shape[0] = p->shape[0];
        d->local_shape[1] = p->ndim == 2 ? p->shape[1] : 1;
        d->offset = p->offset;
        /* A tp slice: this rank's slice of each of the tp_parts fused blocks of tp_dim. */
        const int split = p->tp_dim >= 0 && p->tp_size > 1;
        d->dim = split ? p->tp_dim : 0;
        d->parts = split ? p->tp_parts : 1;
        if (split) {
            d->origin[d->dim] = (int64_t)p->tp_rank * (d->local_shape[d->dim] / d->parts);
            d->part_step = d->global_shape[d->dim] / d->parts;
        }
        /* Replicated over tp: tp rank 0 writes it; a pipeline replica: its owner stage. */
        d->written = !(p->tp_dim < 0 && p->tp_size > 1 && p->tp_rank != 0) && !p->replica;
    }
    return LOOM_OK;
}

loom_status loom_ckpt_tensors_describe_as(loom_ckpt_descs *out, const loom_param_table *t,
                                          const loom_ckpt_descs *order, loom_error *err) {
    loom_ckpt_descs own;
    loom_status st = loom_ckpt_tensors_describe(&own, t, err);
    if (st) return st;
    memset(out, 0, sizeof *out);
    out->items = calloc((size_t)(order->n ? order->n : 1), sizeof *out->items);
    if (!out->items) {
        loom_ckpt_descs_free(&own);
        return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint: out of memory");
    }
    out->n = order->n;
    int found = 0;
    for (int i = 0; i < order->n; i++) {
        const loom_ckpt_desc *o = &order->items[i];
        int j = 0;
        while (j < own.n && strcmp(own.items[j].name, o->name) != 0) j++;
        if (j < own.n) {
            out->items[i] = own.items[j];
            /* expert parallelism: the ep group is one replica of the whole model, its
             * experts split over its ranks; its dense tensors are written by ep rank 0 */
            if (t->ep_size > 1 && t->ep_rank != 0 && t->params[j].expert < 0)
                out->items[i].written = 0;
            found++;
            continue;
        }
        loom_ckpt_desc *d = &out->items[i]; /* held elsewhere: no element here */
        *d = *o;
        d->local_shape[0] = 0;
        d->local_shape[1] = 1;
        d->origin[0] = d->origin[1] = 0;
        d->dim = 0, d->parts = 1, d->part_step = 0;
        d->offset = 0;
        d->written = 0;
    }
    const int n_own = own.n;
    loom_ckpt_descs_free(&own);
    if (found != n_own) {
        loom_ckpt_descs_free(out);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "checkpoint: %d of this rank's %d tensors are not in the other "
                              "layout",
                              n_own - found, n_own);
    }
    return LOOM_OK;
}
