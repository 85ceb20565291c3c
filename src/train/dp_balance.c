/* --balance-dp's sampling and figures (dp_balance.h). */
#include "train/dp_balance.h"

#include <stdlib.h>
#include <string.h>

#include "model/vlm.h"

loom_status loom_dp_balance_setup(loom_run *r, loom_error *err) {
    const loom_model_config *mc = r->mc;
    const loom_mesh *mesh = r->mesh;
    const int parts = mesh->layout.dp * (mesh->workers > 0 ? mesh->workers : 1);
    if (mc->family != LOOM_FAMILY_VLM || r->data.kind != LOOM_BATCH_VLM || parts < 2)
        return LOOM_OK;
    loom_status st = loom_vlm_balance_init(
        &r->balance, parts, r->tc->global_batch / mesh->layout.dp, mc->max_images,
        loom_vlm_image_flops(mc), loom_vlm_record_flops(mc), r->tc->balance_dp, err);
    if (st) return st;
    r->balance_on = 1;
    r->balance_ms = calloc(2 * (size_t)mesh->dp.size, sizeof *r->balance_ms);
    if (!r->balance_ms) return loom_error_set(err, LOOM_ERR_NOMEM, "--balance-dp: out of memory");
    r->dp_bal.balanced = r->tc->balance_dp;
    return LOOM_OK;
}

void loom_dp_balance_free(loom_run *r) {
    if (r->balance_on) loom_vlm_balance_free(&r->balance);
    free(r->balance_ms);
    r->balance_ms = NULL;
    r->balance_on = 0;
}

void loom_dp_balance_sample(loom_run *r, int64_t batch, int per_rank) {
    const loom_train_config *tc = r->tc;
    const int part = r->mesh->data_rank;
    if (r->balance_on) {
        loom_vlm_balance_plan(&r->balance, &r->data.vlm, tc->seed, batch);
        r->dp_bal.predicted = r->balance.max_over_mean;
        r->dp_bal.predicted_slices = r->balance.slices_max_over_mean;
    }
    if (r->balance_on && tc->balance_dp)
        loom_vlm_balance_records(&r->balance, &r->data.vlm, part, r->batch);
    else
        loom_batch_source_sample(&r->data, tc->seed, batch, (int64_t)part * per_rank, per_rank,
                                 r->batch);
}

loom_status loom_dp_balance_measure(loom_run *r, double compute_ms, double compute_cpu_ms,
                                    loom_error *err) {
    if (!r->balance_on) return LOOM_OK;
    loom_comm *dp = &r->mesh->dp;
    const int n = dp->size;
    memset(r->balance_ms, 0, 2 * (size_t)n * sizeof *r->balance_ms);
    r->balance_ms[dp->rank] = compute_ms;
    r->balance_ms[n + dp->rank] = compute_cpu_ms;
    loom_status st = loom_comm_allreduce_sum_f64(dp, r->balance_ms, 2 * n, err);
    if (st) return st;
    double max[2] = {0.0, 0.0}, sum[2] = {0.0, 0.0};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++) {
            const double v = r->balance_ms[k * n + i];
            sum[k] += v;
            if (v > max[k]) max[k] = v;
        }
    r->dp_bal.compute_max_ms = max[0];
    r->dp_bal.compute_mean_ms = sum[0] / n;
    r->dp_bal.compute_cpu_max_ms = max[1];
    r->dp_bal.compute_cpu_mean_ms = sum[1] / n;
    return LOOM_OK;
}
