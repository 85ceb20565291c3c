#include "parallel/grad_sync.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ep.h"
#include "parallel/ep_zero.h"

/* ---- the strategies ---- */

static loom_status dense_range_ready(loom_grad_sync *s, size_t begin, size_t end) {
    return loom_zero_grads_ready(&s->bucket_ctx, begin, end);
}

static loom_status dense_after_backward(loom_grad_sync *s) {
    (void)s;
    return LOOM_OK;
}

/* Expert parallelism reduces after backward (parallel/ep.h): a range only waits. */
static loom_status experts_range_ready(loom_grad_sync *s, size_t begin, size_t end) {
    (void)s, (void)begin, (void)end;
    return LOOM_OK;
}

static loom_status experts_after_backward(loom_grad_sync *s) {
    if (s->zero->experts) return loom_ep_zero_reduce(s->zero, s->grads, s->err);
    return loom_ep_reduce_grads(s->table, s->grads, &s->mesh->dp, &s->mesh->edp, s->err);
}

/* --grad-accum sharded with --ep: each range of every micro-batch reduced per kind into
 * the segments' sum as backward finishes it (parallel/ep_zero.h); nothing after. */
static loom_status experts_sharded_range_ready(loom_grad_sync *s, size_t begin, size_t end) {
    return loom_ep_zero_reduce_range(s->zero, s->grads, begin, end, s->err);
}

static loom_status experts_sharded_after_backward(loom_grad_sync *s) {
    (void)s;
    return LOOM_OK;
}

static const loom_grad_sync_ops dense_ops = {LOOM_GRAD_SYNC_DENSE, "dense", dense_range_ready,
                                             dense_after_backward};
static const loom_grad_sync_ops experts_ops = {LOOM_GRAD_SYNC_EXPERTS, "experts",
                                               experts_range_ready, experts_after_backward};
static const loom_grad_sync_ops experts_sharded_ops = {
    LOOM_GRAD_SYNC_EXPERTS, "experts, sharded accumulation", experts_sharded_range_ready,
    experts_sharded_after_backward};

/* ---- the optimizer update and the gradient gather ---- */

static loom_status zero_update(loom_grad_sync *s, double norm, float lr,
                               const loom_adamw_config *cfg, int step, loom_error *err) {
    if (s->fsdp) return loom_fsdp_optimizer_step(s->fsdp, s->grads, norm, lr, cfg, step, err);
    return loom_zero_optimizer_step(s->zero, s->params, NULL, s->grads, norm, lr, cfg, step, err);
}

static loom_status overlapped_update(loom_grad_sync *s, double norm, float lr,
                                     const loom_adamw_config *cfg, int step, loom_error *err) {
    return loom_param_gather_optimizer_step(s->pg, s->grads, norm, lr, cfg, step, err);
}

static loom_status segments_update(loom_grad_sync *s, double norm, float lr,
                                   const loom_adamw_config *cfg, int step, loom_error *err) {
    return loom_ep_zero_step(s->zero, s->params, s->fsdp ? s->fsdp->shard : NULL, s->grads, norm,
                             lr, cfg, step, err);
}

static loom_status zero_gather(loom_grad_sync *s, loom_error *err) {
    return loom_zero_gather_grads(s->zero, s->grads, err);
}

static loom_status segments_gather(loom_grad_sync *s, loom_error *err) {
    const loom_zero *z = s->zero;
    const loom_ep_zero *e = z->experts;
    for (int i = 0; z->accum && i < e->n_own; i++) /* --grad-accum sharded: the sum */
        memcpy(s->grads + e->own[i].lo, z->accum + e->own[i].lo,
               (e->own[i].hi - e->own[i].lo) * sizeof(float));
    return loom_ep_zero_gather(s->zero, s->grads, err);
}

/* ---- the norm's runs ---- */

static void add_run(loom_flat_run *runs, int *n, size_t lo, size_t hi) {
    if (lo >= hi) return;
    if (*n > 0 && runs[*n - 1].hi == lo)
        runs[*n - 1].hi = hi;
    else
        runs[(*n)++] = (loom_flat_run){lo, hi};
}

/* The flat ranges whose reduced gradient this rank holds and counts (one owner for
 * every element over the data-parallel replicas), in flat order; *n of them. */
static loom_flat_run *owned_ranges(const loom_grad_sync *s, int *n) {
    const loom_zero *z = s->zero;
    const loom_param_table *t = s->table;
    const loom_ep_zero *e = z->experts;
    loom_flat_run *own = calloc((size_t)(e ? e->n_own : t->n_params) + 1, sizeof *own);
    *n = 0;
    if (!own) return NULL;
    if (e) { /* ZeRO 1-3 with --ep: the rank's dense and expert segments */
        for (int r = 0; r < e->n_own; r++) add_run(own, n, e->own[r].lo, e->own[r].hi);
    } else if (s->ops->kind == LOOM_GRAD_SYNC_EXPERTS) {
        /* ZeRO-0 with --ep: dense tensors are replicated over dp, experts over edp; the
         * first replica of each counts */
        for (int i = 0; i < t->n_params; i++) {
            const loom_param *p = &t->params[i];
            const int first = p->expert >= 0 ? s->mesh->edp.rank == 0 : s->mesh->dp.rank == 0;
            if (first) add_run(own, n, p->offset, p->offset + p->numel);
        }
    } else if (z->stage >= 2) { /* the rank's shard */
        add_run(own, n, z->lo, z->hi);
    } else if (s->mesh->dp.rank == 0) {          /* every replica holds it all: the first counts */
        add_run(own, n, z->span_lo, z->span_hi); /* [0, total) unless --freeze */
    }
    return own;
}

static loom_status plan_norm(loom_grad_sync *s, loom_error *err) {
    int n_own;
    loom_flat_run *own = owned_ranges(s, &n_own);
    const loom_param_table *t = s->table;
    s->norm_runs = calloc((size_t)t->n_params + (size_t)n_own + 1, sizeof *s->norm_runs);
    if (!own || !s->norm_runs) {
        free(own);
        return loom_error_set(err, LOOM_ERR_NOMEM, "gradient norm: out of memory");
    }
    s->n_norm_runs = 0;
    int r = 0; /* both lists are in flat order */
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        if (!p->counted_in_norm || p->frozen) continue; /* --freeze: no gradient */
        const size_t plo = p->offset, phi = p->offset + p->numel;
        while (r < n_own && own[r].hi <= plo) r++;
        for (int k = r; k < n_own && own[k].lo < phi; k++) {
            const size_t a = own[k].lo > plo ? own[k].lo : plo;
            const size_t b = own[k].hi < phi ? own[k].hi : phi;
            add_run(s->norm_runs, &s->n_norm_runs, a, b);
        }
    }
    free(own);
    return LOOM_OK;
}

/* ---- the object ---- */

loom_status loom_grad_sync_create(loom_grad_sync *s, const loom_grad_sync_options *o,
                                  loom_error *err) {
    memset(s, 0, sizeof *s);
    s->ops = o->mesh->ep.size == 1                ? &dense_ops
             : o->zero->experts && o->zero->accum ? &experts_sharded_ops
                                                  : &experts_ops;
    s->table = o->table;
    s->mesh = o->mesh;
    s->zero = o->zero;
    s->fsdp = o->fsdp;
    s->pg = o->pg;
    s->tp = o->tp;
    s->update = o->zero->experts   ? segments_update
                : o->zero->overlap ? overlapped_update
                                   : zero_update;
    s->gather = o->zero->experts ? segments_gather : zero_gather;
    s->params = o->params;
    s->grads = o->grads;
    s->err = o->err;
    s->bucket_ctx = (loom_zero_ready_ctx){o->zero, o->grads, o->err, o->d_embed, o->tokens};
    return plan_norm(s, err);
}

void loom_grad_sync_free(loom_grad_sync *s) {
    free(s->norm_runs);
    memset(s, 0, sizeof *s);
}

void loom_grad_sync_step_begin(loom_grad_sync *s) {
    loom_zero_step_begin(s->zero);
    loom_zero_grads_clear(s->zero, s->grads);
}

void loom_grad_sync_begin(loom_grad_sync *s) {
    loom_zero_begin_reduction(s->zero);
}

/* Sequence parallelism: the norm parameters' gradients are partial sums over this rank's
 * rows; summed over tp once final (before any bucket reads them). */
static loom_status reduce_norm_grads(loom_grad_sync *s, size_t begin, size_t end) {
    if (!s->tp->sequence_parallel) return LOOM_OK;
    const loom_param_table *t = s->table;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        if (!p->sp_partial || p->frozen || p->offset < begin || p->offset >= end) continue;
        loom_status st =
            loom_comm_allreduce_sum(s->tp->comm, s->grads + p->offset, p->numel, s->tp->err);
        if (st) return st;
    }
    return LOOM_OK;
}

loom_status loom_grad_sync_ready(void *ctx, size_t begin, size_t end) {
    loom_grad_sync *s = ctx;
    loom_status st = reduce_norm_grads(s, begin, end);
    return st ? st : s->ops->range_ready(s, begin, end);
}

loom_status loom_grad_sync_finish(loom_grad_sync *s, loom_error *err) {
    loom_status st = loom_zero_finish_reduction(s->zero, s->grads, err);
    if (!st) loom_zero_accum_finish(s->zero); /* --grad-accum sharded: the earlier ones */
    return st ? st : s->ops->reduce_after_backward(s);
}

int loom_grad_sync_sharded_accum(const loom_grad_sync *s) {
    return s->zero->accum != NULL;
}

loom_status loom_grad_sync_finish_micro_batch(loom_grad_sync *s, loom_error *err) {
    loom_status st = loom_zero_finish_reduction(s->zero, s->grads, err);
    if (!st) loom_zero_accum_micro_batch(s->zero, s->grads);
    return st;
}

void loom_grad_sync_begin_ranges(loom_grad_sync *s, size_t top, int first) {
    loom_zero_begin_ranges(s->zero, top, first);
}

loom_status loom_grad_sync_finish_ranges(loom_grad_sync *s, size_t bottom, size_t top,
                                         loom_error *err) {
    return loom_zero_finish_ranges(s->zero, s->grads, bottom, top, err);
}

loom_status loom_grad_sync_reduced_pieces(const loom_grad_sync *s, loom_flat_piece **out, int *n,
                                          loom_error *err) {
    loom_zero *z = s->zero;
    const loom_ep_zero *e = z->experts;
    const int count = e ? e->n_own : 1;
    loom_flat_piece *p = calloc((size_t)count + 1, sizeof *p);
    if (!p) return loom_error_set(err, LOOM_ERR_NOMEM, "gradient pieces: out of memory");
    if (e) { /* full-layout buffers (parallel/ep_zero.h) */
        float *base = z->accum ? z->accum : s->grads;
        for (int i = 0; i < count; i++)
            p[i] = (loom_flat_piece){base + e->own[i].lo, e->own[i].hi - e->own[i].lo};
    } else if (z->stage >= 2) {
        p[0] = (loom_flat_piece){loom_zero_reduced_grads(z, s->grads), z->hi - z->lo};
    } else {
        p[0] = (loom_flat_piece){s->grads, s->table->total};
    }
    *out = p, *n = count;
    return LOOM_OK;
}

loom_status loom_grad_sync_norm(loom_grad_sync *s, double *norm, loom_error *err) {
    double sq = 0.0;
    const loom_zero *z = s->zero; /* --grad-accum sharded: the shard's sum, [lo, hi) */
    for (int i = 0; i < s->n_norm_runs; i++) {
        const size_t lo = s->norm_runs[i].lo, n = s->norm_runs[i].hi - lo;
        const float *g = z->accum ? z->accum + (lo - z->lo) : s->grads + lo;
        sq += loom_backend_sum_squares(z->be, g, n);
    }
    loom_status st = loom_comm_allreduce_sum_f64(&s->mesh->world, &sq, 1, err);
    *norm = sqrt(sq);
    return st;
}

/* Where this rank's weights of its optimizer range are (ZeRO-3: in the shard; with
 * --freeze partly in `train`, parallel/fsdp.h). */
static void owned_weights(const loom_grad_sync *s, loom_zero_weights *w) {
    const loom_zero *z = s->zero;
    if (s->fsdp)
        loom_fsdp_span_weights(s->fsdp, w);
    else
        *w = (loom_zero_weights){.at = {s->params + z->lo}, .cut = {z->lo, z->hi}, .n = 1};
}

loom_status loom_grad_sync_step(loom_grad_sync *s, double norm, float lr,
                                const loom_adamw_config *cfg, int step, loom_error *err) {
    loom_status st = s->update(s, norm, lr, cfg, step, err);
    const float *shard = s->fsdp ? s->fsdp->shard : NULL;
    loom_zero_weights w;
    if (!st && s->zero->experts) {
        loom_ep_zero_ema_update(s->zero, s->params, shard);
    } else if (!st && s->zero->ema) {
        owned_weights(s, &w);
        loom_zero_ema_update(s->zero, &w);
    }
    if (s->fsdp) loom_fsdp_invalidate(s->fsdp);
    return st;
}

void loom_grad_sync_step_end(loom_grad_sync *s) {
    loom_zero_step_end(s->zero);
}

loom_status loom_grad_sync_gather_grads(loom_grad_sync *s, loom_error *err) {
    return s->gather(s, err);
}

const loom_flat_run *loom_grad_sync_norm_runs(const loom_grad_sync *s, int *n) {
    *n = s->n_norm_runs;
    return s->norm_runs;
}

loom_status loom_grad_sync_ema_enable(loom_grad_sync *s, float decay, loom_error *err) {
    return s->zero->experts ? loom_ep_zero_ema_enable(s->zero, decay, err)
                            : loom_zero_ema_enable(s->zero, decay, err);
}

loom_status loom_grad_sync_ema_reset(loom_grad_sync *s, loom_error *err) {
    const float *shard = s->fsdp ? s->fsdp->shard : NULL;
    if (!s->zero->ema) return LOOM_OK;
    if (s->zero->experts) {
        loom_ep_zero_ema_reset(s->zero, s->params, shard);
        return LOOM_OK;
    }
    /* ZeRO-3 with --freeze: the span shard's weights held elsewhere, fetched first */
    loom_status st = s->fsdp && s->zero->span_on ? loom_fsdp_fetch_span(s->fsdp, err) : LOOM_OK;
    loom_zero_weights w;
    owned_weights(s, &w);
    if (!st) loom_zero_ema_reset(s->zero, &w);
    return st;
}

loom_status loom_grad_sync_ema_gather(loom_grad_sync *s, float *full, loom_error *err) {
    if (s->zero->experts) return loom_ep_zero_ema_gather(s->zero, full, err);
    /* --freeze: the frozen weights outside the span are their own average (ZeRO-3: the
     * weights gathered whole first) */
    loom_status st = s->zero->span_on ? loom_grad_sync_params_whole(s, err) : LOOM_OK;
    return st ? st : loom_zero_ema_gather(s->zero, full, s->params, err);
}
