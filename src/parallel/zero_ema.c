/* The exponential moving average of the weights (--ema-decay; parallel/zero.h): held like
 * AdamW's moments, over this rank's range [lo, hi) of the trainable span (the whole buffer
 * without --freeze). A frozen tensor's average is its weight: outside the span it is not
 * kept (gather fills it from the weights), inside it (a frozen part between two trained
 * ones) it is copied at reset and never blended. */
#include <stdlib.h>
#include <string.h>

#include "parallel/zero.h"

loom_status loom_zero_ema_enable(loom_zero *z, float decay, loom_error *err) {
    if (z->experts)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "--ema-decay: not available with --ep and ZeRO 1-3 (expert segments)");
    z->ema_decay = decay;
    for (int i = 0; i < z->table->n_params; i++) z->ema_frozen |= z->table->params[i].frozen;
    z->ema = calloc(z->shard_floats ? z->shard_floats : 1, sizeof(float));
    return z->ema ? LOOM_OK : loom_error_set(err, LOOM_ERR_NOMEM, "--ema-decay: out of memory");
}

void loom_zero_ema_reset(loom_zero *z, const loom_zero_weights *w) {
    if (!z->ema) return;
    for (int k = 0; k < w->n; k++)
        if (w->cut[k + 1] > w->cut[k])
            memcpy(z->ema + (w->cut[k] - z->lo), w->at[k],
                   (w->cut[k + 1] - w->cut[k]) * sizeof(float));
}

/* ema[0, n) = d ema + (1 - d) p, element by element. */
static void blend(float *ema, const float *p, size_t n, float d) {
    const float e = 1.0f - d;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) ema[i] = d * ema[i] + e * p[i];
}

/* Weights [a, e) at p: blended, the frozen tensors' runs (--freeze) left as they are. */
static void blend_trained(loom_zero *z, const float *p, size_t a, size_t e) {
    if (!z->ema_frozen) {
        blend(z->ema + (a - z->lo), p, e - a, z->ema_decay);
        return;
    }
    const loom_param_table *t = z->table;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *q = &t->params[i];
        const size_t lo = q->offset > a ? q->offset : a;
        const size_t hi = q->offset + q->numel < e ? q->offset + q->numel : e;
        if (!q->frozen && lo < hi)
            blend(z->ema + (lo - z->lo), p + (lo - a), hi - lo, z->ema_decay);
    }
}

void loom_zero_ema_update(loom_zero *z, const loom_zero_weights *w) {
    if (!z->ema) return;
    for (int k = 0; k < w->n; k++)
        if (w->cut[k + 1] > w->cut[k]) blend_trained(z, w->at[k], w->cut[k], w->cut[k + 1]);
}

loom_status loom_zero_ema_gather(loom_zero *z, float *full, const float *params, loom_error *err) {
    memcpy(full + z->lo, z->ema, (z->hi - z->lo) * sizeof(float));
    loom_status st = z->stage == 0 ? LOOM_OK
                                   : loom_comm_allgatherv_large(z->dp, full, z->shards.counts,
                                                                z->shards.displs, 0, err);
    if (st || !z->span_on) return st;
    /* --freeze: outside the span the average is the (never changed) weights */
    memcpy(full, params, z->span_lo * sizeof(float));
    memcpy(full + z->span_hi, params + z->span_hi, (z->total - z->span_hi) * sizeof(float));
    return LOOM_OK;
}
