#include "parallel/fsdp.h"

#include "core/clock.h"
#include "parallel/ep_zero.h"
#include "parallel/shard_geometry.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdint.h>
#include <unistd.h>

static loom_status range_init(loom_fsdp_range *r, const loom_zero *z, size_t begin, size_t end) {
    const int R = z->dp->size;
    r->begin = begin;
    r->end = end;
    r->counts = calloc((size_t)R, sizeof(int));
    r->displs = calloc((size_t)R, sizeof(int));
    if (!r->counts || !r->displs) return LOOM_ERR_NOMEM;
    if (z->span_on) /* --freeze: the parameter shards are the whole buffer's */
        loom_shard_range_parts(z->param_counts, z->param_displs, R, begin, end, r->counts,
                               r->displs);
    else
        loom_shard_layout_parts(&z->shards, begin, end, r->counts, r->displs);
    return LOOM_OK;
}

/* --freeze: the part of this rank's span shard [z->lo, z->hi) that its parameter shard
 * holds is updated there, in place: [f->own_lo, f->own_hi); the rest (below it, then above
 * it) is fetched into `train`. What this rank's parameter shard gives each other rank's span
 * shard, and what its span shard takes from each other rank's parameter shard (parallel
 * lists of counts and displacements, relative to the shard and to `train`). */
static loom_status plan_transfer(loom_fsdp *f) {
    const loom_zero *z = f->zero;
    const int R = z->dp->size, me = z->dp->rank;
    if (z->hi - z->lo > (size_t)INT_MAX || f->hi - f->lo > (size_t)INT_MAX) return LOOM_ERR_INPUT;
    const size_t below = f->lo < z->hi ? f->lo : z->hi, above = f->hi < z->hi ? f->hi : z->hi;
    f->own_lo = below > z->lo ? below : z->lo;
    f->own_hi = above > f->own_lo ? above : f->own_lo;
    const size_t own = f->own_hi - f->own_lo;
    f->xfer = calloc(4 * (size_t)R, sizeof(int));
    f->train = calloc(z->hi - z->lo - own ? z->hi - z->lo - own : 1, sizeof(float));
    if (!f->xfer || !f->train) return LOOM_ERR_NOMEM;
    int *give = f->xfer, *give_at = f->xfer + R, *take = f->xfer + 2 * R,
        *take_at = f->xfer + 3 * R;
    for (int q = 0; q < R; q++) {
        if (q == me) continue; /* its own part is updated in place */
        size_t slo, shi, plo, phi;
        loom_zero_shard_of(z, q, &slo, &shi);       /* q's span shard */
        loom_zero_param_shard_of(z, q, &plo, &phi); /* q's parameter shard */
        size_t a = slo > f->lo ? slo : f->lo, e = shi < f->hi ? shi : f->hi;
        give[q] = a < e ? (int)(e - a) : 0;
        give_at[q] = a < e ? (int)(a - f->lo) : 0;
        a = plo > z->lo ? plo : z->lo, e = phi < z->hi ? phi : z->hi;
        take[q] = a < e ? (int)(e - a) : 0;
        take_at[q] = a < e ? (int)(a - z->lo - (a < f->own_lo ? 0 : own)) : 0;
    }
    return LOOM_OK;
}

loom_status loom_fsdp_create(loom_fsdp *f, loom_zero *z, uint64_t seed, loom_error *err) {
    memset(f, 0, sizeof *f);
    f->zero = z;
    const loom_param_table *t = z->table;
    const int L = t->n_layer;
    f->n_ranges = L + 2;
    f->ranges = calloc((size_t)f->n_ranges, sizeof *f->ranges);
    loom_zero_own_param_shard(z, &f->lo, &f->hi);
    f->shard = calloc(f->hi - f->lo ? f->hi - f->lo : 1, sizeof(float));
    long page = sysconf(_SC_PAGESIZE);
    f->view_bytes = (t->total * sizeof(float) + (size_t)page - 1) / (size_t)page * (size_t)page;
    /* Anonymous mapping: untouched pages cost nothing, released ones go back; huge pages
     * where the kernel allows, since every block's pages are faulted in again each step. */
    f->view = loom_zero_map_huge(f->view_bytes);
    loom_status st = f->ranges && f->shard && f->view ? LOOM_OK : LOOM_ERR_NOMEM;
    /* A pipeline stage without the head: the tail range is empty. */
    const size_t tail = t->head_begin;
    for (int i = 0; i < f->n_ranges && !st; i++) {
        size_t begin = i == 0 ? 0 : i <= L ? t->blocks[i - 1].begin : tail;
        size_t end = i == 0   ? t->blocks[0].begin
                     : i < L  ? t->blocks[i].begin
                     : i == L ? tail
                              : t->total;
        st = range_init(&f->ranges[i], z, begin, end);
    }
    if (!st && z->span_on) st = plan_transfer(f);
    if (st) {
        loom_fsdp_free(f);
        return st == LOOM_ERR_INPUT
                   ? loom_error_set(err, st,
                                    "ZeRO-3 with --freeze: a shard of more than 2^31 parameters "
                                    "(expected fewer: more --dp ranks)")
                   : loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO-3: out of memory");
    }
    if (z->experts) /* --ep: the shard is full-layout, valid on its ranges (parallel/ep_zero.h) */
        loom_ep_zero_init_shard(z, f->shard, seed);
    else
        loom_params_init_range(t, f->shard, f->lo, f->hi, seed);
    return LOOM_OK;
}

void loom_fsdp_free(loom_fsdp *f) {
    if (f->ranges)
        for (int i = 0; i < f->n_ranges; i++) {
            free(f->ranges[i].counts);
            free(f->ranges[i].displs);
        }
    free(f->ranges);
    free(f->shard);
    free(f->train);
    free(f->xfer);
    if (f->view) munmap(f->view, f->view_bytes);
    memset(f, 0, sizeof *f);
}

/* Starts the all-gather of range i (own part copied in first). */
static loom_status start(loom_fsdp *f, int i, loom_error *err) {
    loom_fsdp_range *r = &f->ranges[i];
    if (r->state != 0) return LOOM_OK;
    if (f->zero->experts) { /* dense part over dp, experts over edp: blocking, no prefetch */
        r->state = 2;
        loom_status st =
            loom_ep_zero_gather_range(f->zero, f->shard, f->view, r->begin, r->end, err);
        if (!st && f->landed) f->landed(f->cb_ctx, r->begin, r->end);
        return st;
    }
    size_t a = f->lo > r->begin ? f->lo : r->begin, e = f->hi < r->end ? f->hi : r->end;
    if (a < e) memcpy(f->view + a, f->shard + (a - f->lo), (e - a) * sizeof(float));
    r->state = 1;
    r->op.kind = LOOM_OP_ALLGATHERV;
    r->op.buf = f->view + r->begin;
    r->op.counts = r->counts;
    r->op.displs = r->displs;
    return loom_comm_engine_post(&f->zero->engine, &r->op, err);
}

static loom_status ensure(loom_fsdp *f, int i, loom_error *err) {
    loom_fsdp_range *r = &f->ranges[i];
    loom_status st = start(f, i, err);
    const int in_flight = !st && r->state == 1;
    if (in_flight) st = loom_comm_engine_wait(&f->zero->engine, &r->op, err);
    if (!st) r->state = 2;
    if (!st && in_flight && f->landed) f->landed(f->cb_ctx, r->begin, r->end);
    return st;
}

loom_status loom_fsdp_fetch_span(loom_fsdp *f, loom_error *err) {
    const loom_zero *z = f->zero;
    const int R = z->dp->size;
    int *give = f->xfer, *give_at = f->xfer + R, *take = f->xfer + 2 * R,
        *take_at = f->xfer + 3 * R;
    return loom_comm_alltoallv(z->dp, f->shard, give, give_at, f->train, take, take_at, err);
}

void loom_fsdp_span_weights(const loom_fsdp *f, loom_zero_weights *w) {
    const loom_zero *z = f->zero;
    if (!z->span_on) {
        *w = (loom_zero_weights){.at = {f->shard}, .cut = {z->lo, z->hi}, .n = 1};
        return;
    }
    *w = (loom_zero_weights){
        .at = {f->train, f->shard + (f->own_lo - f->lo), f->train + (f->own_lo - z->lo)},
        .cut = {z->lo, f->own_lo, f->own_hi, z->hi},
        .n = 3};
}

loom_status loom_fsdp_optimizer_step(loom_fsdp *f, float *grads, double norm, float lr,
                                     const loom_adamw_config *cfg, int step, loom_error *err) {
    loom_zero *z = f->zero;
    if (!z->span_on)
        return loom_zero_optimizer_step(z, f->view, f->shard, grads, norm, lr, cfg, step, err);
    const int R = z->dp->size;
    int *give = f->xfer, *give_at = f->xfer + R, *take = f->xfer + 2 * R,
        *take_at = f->xfer + 3 * R;
    double t0 = loom_now_ms();
    loom_status st = loom_fsdp_fetch_span(f, err);
    const double fetch_ms = loom_now_ms() - t0;
    if (st) return st;
    /* clipping and AdamW as loom_zero_optimizer_step, on the three pieces of [lo, hi) */
    float *g = loom_zero_reduced_grads(z, grads);
    t0 = loom_now_ms();
    const double c0 = loom_thread_cpu_ms();
    loom_grad_clip(z->be, g, z->hi - z->lo, norm, cfg->grad_clip);
    const size_t cut[4] = {z->lo, f->own_lo, f->own_hi, z->hi};
    float *at[3] = {f->train, f->shard + (f->own_lo - f->lo), f->train + (f->own_lo - z->lo)};
    for (int k = 0; k < 3; k++) {
        const size_t a = cut[k], e = cut[k + 1], o = a - z->lo;
        if (a < e)
            loom_adamw_step(z->be, z->table, at[k], g + o, z->m + o, z->v + o, a, e, lr, cfg, step);
    }
    z->times.optimizer_ms = loom_now_ms() - t0;
    z->times.optimizer_cpu_ms = loom_thread_cpu_ms() - c0;
    t0 = loom_now_ms();
    st = loom_comm_alltoallv(z->dp, f->train, take, take_at, f->shard, give, give_at, err);
    z->times.param_gather_ms = fetch_ms + (loom_now_ms() - t0); /* the two exchanges */
    return st;
}

void loom_fsdp_release_span(size_t begin, size_t end, size_t *lo, size_t *hi) {
    const size_t huge = LOOM_HUGE_PAGE_BYTES / sizeof(float); /* the view starts on one */
    *lo = (begin + huge - 1) / huge * huge;
    *hi = end / huge * huge;
    if (*hi < *lo) *hi = *lo;
}

/* Hands the whole huge pages inside range i back to the kernel. */
static void release(loom_fsdp *f, int i) {
    loom_fsdp_range *r = &f->ranges[i];
    size_t lo, hi;
    loom_fsdp_release_span(r->begin, r->end, &lo, &hi);
    loom_zero_release_pages(f->view, lo, hi);
    if (f->released && r->state != 0) f->released(f->cb_ctx, lo, hi);
    r->state = 0;
}

loom_status loom_fsdp_before_block(void *ctx, int layer, int backward) {
    loom_fsdp *f = ctx;
    int i = layer + 1, next = backward ? i - 1 : i + 1;
    /* release_ends: the embedding after its forward, the tail after the head's backward */
    if (f->armed && !backward && i == 1) release(f, 0);
    if (f->armed && backward && i == f->n_ranges - 2) release(f, f->n_ranges - 1);
    loom_status st = ensure(f, i, f->err);
    /* Prefetch what runs next while this block computes: the next block, or after the
     * last block in forward the tail (a no-op when it is still resident). */
    if (!st && next >= 1 && next <= f->n_ranges - 1 - backward) st = start(f, next, f->err);
    return st;
}

loom_status loom_fsdp_after_block(void *ctx, int layer, int backward) {
    loom_fsdp *f = ctx;
    if (!f->keep_blocks) release(f, layer + 1);
    /* The final norm and head run next in forward. */
    if (!backward && layer + 2 == f->n_ranges - 1) return ensure(f, f->n_ranges - 1, f->err);
    return LOOM_OK;
}

loom_status loom_fsdp_begin_micro_batch(loom_fsdp *f, loom_error *err) {
    /* Input first: the embedding, and block 0 right behind it. */
    f->armed = f->release_ends && f->n_ranges > 2 && !f->keep_blocks && !f->zero->experts;
    loom_status st = start(f, 0, err);
    if (!st && f->n_ranges > 2) st = start(f, 1, err);
    if (!st) st = ensure(f, 0, err);
    /* No blocks: nothing prefetches the tail. */
    if (!st && f->n_ranges == 2) st = ensure(f, 1, err);
    return st;
}

void loom_fsdp_invalidate(loom_fsdp *f) {
    f->armed = 0;
    for (int i = 0; i < f->n_ranges; i++) release(f, i);
}

loom_status loom_fsdp_gather_all(loom_fsdp *f, loom_error *err) {
    loom_status st = LOOM_OK;
    f->armed = 0; /* everything stays until loom_fsdp_invalidate */
    for (int i = 0; i < f->n_ranges && !st; i++) st = ensure(f, i, err);
    return st;
}

size_t loom_fsdp_resident_bytes_of(const loom_param_table *t, size_t shard_floats, int keep_blocks,
                                   int release_ends) {
    if (keep_blocks) return (shard_floats + t->total) * sizeof(float);
    /* the ranges of loom_fsdp_create: 0 the embedding, 1..L the blocks, L+1 the tail; the
     * ends are handed back in a step only with release_ends */
    const int L = t->n_layer, ends = release_ends && L > 0;
    size_t handed_back = 0, in_use = 0, prev = 0;
    for (int i = 0; i < L + 2; i++) {
        const size_t begin = i == 0 ? 0 : i <= L ? t->blocks[i - 1].begin : t->head_begin;
        const size_t end = i == 0   ? (L > 0 ? t->blocks[0].begin : t->head_begin)
                           : i < L  ? t->blocks[i].begin
                           : i == L ? t->head_begin
                                    : t->total;
        size_t lo = 0, hi = 0;
        if ((i >= 1 && i <= L) || ends) loom_fsdp_release_span(begin, end, &lo, &hi);
        handed_back += hi - lo;
        /* in use: this range and the one before it (L == 1 without ends: block 0) */
        if ((hi - lo) + prev > in_use) in_use = (hi - lo) + prev;
        prev = hi - lo;
    }
    return (shard_floats + t->total - (handed_back - in_use)) * sizeof(float);
}

size_t loom_fsdp_resident_bytes(const loom_fsdp *f) {
    const size_t n = f->zero->span_on ? f->hi - f->lo : f->zero->shard_floats;
    return loom_fsdp_resident_bytes_of(f->zero->table, n, f->keep_blocks, f->release_ends);
}
