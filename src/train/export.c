/* Flat buffers as whole tensors, for weights files and reference dumps: the gather the
 * layout needs was chosen at setup (loom_run.export_kind). */
#include "parallel/ep.h"
#include "parallel/tp_shards.h"
#include "train/run.h"

#include <stdlib.h>

loom_status loom_run_export_flat(loom_run *r, const float *flat, const loom_param_table **table,
                                 const float **out, loom_error *err) {
    *table = &r->model.table;
    *out = flat;
    loom_status st = LOOM_OK;
    if (loom_run_on_device(r)) { /* one process (train_config: validate_device): a host copy */
        const size_t bytes = r->model.table.total * sizeof(float);
        if (!r->host_flat && !(r->host_flat = malloc(bytes ? bytes : 1)))
            return loom_error_set(err, LOOM_ERR_NOMEM, "export: out of host memory");
        loom_backend_copy_to_host(r->be, r->host_flat, flat, bytes);
        *out = r->host_flat;
        return loom_backend_status(r->be, err);
    }
    if (r->export_kind != LOOM_EXPORT_LOCAL) {
        *table = &r->global_table;
        *out = r->global_flat;
    }
    switch (r->export_kind) {
    case LOOM_EXPORT_LOCAL:
        break;
    case LOOM_EXPORT_EP_TP: /* over tp, then over ep */
        st = loom_ep_tp_gather_flat(&r->tp, &r->mesh->ep, &r->model.table, flat, &r->global_table,
                                    r->global_flat, r->mc, r->pipelined ? &r->pipe.layers : NULL,
                                    err);
        break;
    case LOOM_EXPORT_EP: /* expert parallelism: gather the experts (model/moe.h) */
        st = loom_ep_gather_flat(&r->model.table, flat, &r->global_table, r->global_flat,
                                 &r->mesh->ep, err);
        break;
    case LOOM_EXPORT_TP:
        st = loom_tp_gather_flat(&r->tp, &r->model.table, flat, &r->global_table, r->global_flat,
                                 err);
        break;
    }
    /* pipeline stages: the whole model on world rank 0 */
    if (!st && r->pipelined) st = loom_pipeline_export(r->pipelined, *table, *out, table, out, err);
    return st;
}
