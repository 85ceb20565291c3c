/* The gradient sync's parameter side (grad_sync.h): what the training loop and the step's
 * runners ask of ZeRO-3's gathers and --overlap-param-gather, by the sync's name. */
#include <stdio.h>

#include "parallel/grad_sync.h"

loom_status loom_grad_sync_begin_micro_batch(loom_grad_sync *s, loom_error *err) {
    loom_status st = LOOM_OK;
    if (s->fsdp && (st = loom_fsdp_begin_micro_batch(s->fsdp, err))) return st;
    return s->pg ? loom_param_gather_begin_micro_batch(s->pg, err) : LOOM_OK;
}

loom_status loom_grad_sync_params_complete(loom_grad_sync *s, loom_error *err) {
    return loom_param_gather_wait_all(s->pg, err);
}

loom_status loom_grad_sync_params_whole(loom_grad_sync *s, loom_error *err) {
    return s->fsdp ? loom_fsdp_gather_all(s->fsdp, err) : LOOM_OK;
}

double loom_grad_sync_step_wait_ms(const loom_grad_sync *s) {
    return s->zero->step_wait_ms;
}

int loom_grad_sync_ema_on(const loom_grad_sync *s) {
    return s->zero->ema != NULL;
}

void loom_grad_sync_report_end(const loom_grad_sync *s, int rank, size_t total_floats) {
    const loom_zero *z = s->zero;
    if (s->pg) loom_param_gather_report(s->pg, rank);
    if (rank == 0 && z->stage >= 2)
        fprintf(stderr,
                "loom: local gradients resident at the last micro-batch's layer boundaries: at "
                "most %.3f of %.3f MiB, %.3f MiB after the reduction (ZeRO-%d hands each "
                "bucket's pages outside its shard back once reduced)\n",
                z->grads_peak / 1048576.0, total_floats * 4 / 1048576.0, z->grads_after / 1048576.0,
                z->stage);
    if (rank == 0 && z->accum) /* the start-up report's two ranges, against what happened */
        fprintf(stderr,
                "loom: --grad-accum sharded: local gradients resident at every range boundary of "
                "every micro-batch: at most %.3f MiB measured, %.3f MiB planned (%s; the head "
                "in %d range(s))\n",
                z->grads_peak / 1048576.0, z->accum_resident / 1048576.0,
                z->experts ? "one range: --ep reduces each before the next" : "two ranges",
                z->head_pieces);
}
