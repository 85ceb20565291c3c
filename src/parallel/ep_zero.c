#include "parallel/ep_zero.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/ckpt_writer.h"
#include "parallel/ep.h"
#include "parallel/shard_geometry.h"

static int kind_of(const loom_param *p) {
    return p->expert >= 0;
}

/* Copies [a, b) of kind k's sequence between the flat buffer and buf (buf[0] = element
 * a): to_flat 0 packs, 1 unpacks. */
static void copy_segment(const loom_ep_zero *e, int k, size_t a, size_t b, float *flat, float *buf,
                         int to_flat) {
    loom_shard_layout_copy(&e->seg[k], a, b, flat, buf,
                           to_flat ? LOOM_SHARD_UNPACK : LOOM_SHARD_PACK);
}

/* The elements of kind k in the flat range [begin, end) (whole tensors, or a piece of one:
 * an untied head's rows) are one piece [*kb, *ke) of the kind's sequence (empty: *kb >=
 * *ke; the same on every rank). */
static void kind_piece(const loom_ep_zero *e, int k, size_t begin, size_t end, size_t *kb,
                       size_t *ke) {
    const loom_param_table *t = e->table;
    const loom_shard_layout *l = &e->seg[k];
    *kb = l->total, *ke = 0;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        const size_t a = p->offset > begin ? p->offset : begin;
        const size_t b = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (kind_of(p) != k || a >= b) continue;
        const size_t s = loom_shard_layout_start(l, i) - p->offset; /* + a flat offset */
        *kb = s + a < *kb ? s + a : *kb;
        *ke = s + b > *ke ? s + b : *ke;
    }
}

static void ep_free(loom_ep_zero *e) {
    if (!e) return;
    for (int k = 0; k < 2; k++) loom_shard_layout_free(&e->seg[k]);
    free(e->own), free(e->pack), free(e->recv), free(e->gcounts), free(e->gdispls);
    free(e);
}

/* The rank's shard as merged flat ranges, in flat order. */
static int build_own(loom_ep_zero *e) {
    const loom_param_table *t = e->table;
    e->own = malloc((size_t)(t->n_params + 1) * sizeof *e->own);
    if (!e->own) return 0;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        const int k = kind_of(p);
        const size_t s = loom_shard_layout_start(&e->seg[k], i), a = e->seg[k].lo, b = e->seg[k].hi;
        const size_t lo = s > a ? s : a, hi = s + p->numel < b ? s + p->numel : b;
        if (lo >= hi) continue;
        const loom_ep_range r = {p->offset + (lo - s), p->offset + (hi - s)};
        if (e->n_own > 0 && e->own[e->n_own - 1].hi == r.lo)
            e->own[e->n_own - 1].hi = r.hi;
        else
            e->own[e->n_own++] = r;
        e->own_floats += hi - lo;
    }
    return 1;
}

/* The two segments' layouts and this rank's merged ranges (no buffers); NULL: no memory. */
static loom_ep_zero *ep_shape(loom_zero *z, loom_comm *edp) {
    loom_ep_zero *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->table = z->table;
    e->stage = z->stage;
    if (loom_shard_layout_init(&e->seg[0], z->table, LOOM_SHARD_DENSE, z->dp, NULL) ||
        loom_shard_layout_init(&e->seg[1], z->table, LOOM_SHARD_EXPERTS, edp, NULL) ||
        !build_own(e)) {
        ep_free(e);
        return NULL;
    }
    return e;
}

loom_status loom_ep_zero_size(loom_zero *z, loom_comm *edp, loom_error *err) {
    loom_ep_zero *e = ep_shape(z, edp);
    if (!e) return loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO with --ep: out of memory");
    z->lo = 0, z->hi = z->total;
    z->shard_floats = e->own_floats;
    z->experts = e;
    return LOOM_OK;
}

/* The pack buffer's floats: the larger segment's. */
static size_t pack_floats(const loom_ep_zero *e) {
    const size_t most = e->seg[0].total > e->seg[1].total ? e->seg[0].total : e->seg[1].total;
    return most ? most : 1;
}

/* The receive buffer's floats (stages >= 2): the larger of this rank's two shards. */
static size_t recv_floats(const loom_ep_zero *e) {
    size_t mine = 0;
    for (int k = 0; k < 2; k++)
        mine = e->seg[k].hi - e->seg[k].lo > mine ? e->seg[k].hi - e->seg[k].lo : mine;
    return mine ? mine : 1;
}

size_t loom_ep_zero_buffer_bytes(const loom_zero *z) {
    const loom_ep_zero *e = z->experts;
    if (!e) return 0;
    return (pack_floats(e) + (e->stage >= 2 ? recv_floats(e) : 0)) * sizeof(float) +
           2 * (size_t)z->dp->size * sizeof(int);
}

loom_status loom_ep_zero_attach(loom_zero *z, loom_comm *edp, loom_error *err) {
    const loom_param_table *t = z->table;
    loom_ep_zero *e = ep_shape(z, edp);
    if (!e) return loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO with --ep: out of memory");
    int ok = (e->pack = malloc(pack_floats(e) * sizeof(float))) &&
             (e->gcounts = calloc((size_t)z->dp->size, sizeof(int))) &&
             (e->gdispls = calloc((size_t)z->dp->size, sizeof(int)));
    if (ok && e->stage >= 2) ok = (e->recv = malloc(recv_floats(e) * sizeof(float))) != NULL;
    /* Full-layout moments: untouched pages of an anonymous mapping are never resident. */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    e->map_bytes = (t->total * sizeof(float) + page - 1) / page * page;
    void *m =
        ok ? mmap(NULL, e->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
           : MAP_FAILED;
    void *v = m != MAP_FAILED ? mmap(NULL, e->map_bytes, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                              : MAP_FAILED;
    if (m == MAP_FAILED || v == MAP_FAILED) {
        if (m != MAP_FAILED) munmap(m, e->map_bytes);
        ep_free(e);
        return loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO with --ep: out of memory");
    }
    free(z->m), free(z->v), free(z->grad_shard);
    z->m = m, z->v = v, z->grad_shard = NULL;
    z->lo = 0, z->hi = z->total;
    z->shard_floats = e->own_floats;
    z->experts = e;
    return LOOM_OK;
}

void loom_ep_zero_detach(loom_zero *z) {
    loom_ep_zero *e = z->experts;
    if (!e) return;
    if (z->accum) munmap(z->accum, e->map_bytes);
    z->accum = NULL;
    if (z->m) munmap(z->m, e->map_bytes);
    if (z->v) munmap(z->v, e->map_bytes);
    if (z->ema) munmap(z->ema, e->map_bytes);
    z->m = z->v = z->ema = NULL;
    ep_free(e);
    z->experts = NULL;
}

loom_status loom_ep_zero_reduce(loom_zero *z, float *grads, loom_error *err) {
    loom_ep_zero *e = z->experts;
    if (e->stage < 2)
        return loom_ep_reduce_grads(e->table, grads, e->seg[0].group, e->seg[1].group, err);
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        loom_comm *g = e->seg[k].group;
        if (g->size == 1 || e->seg[k].total == 0) continue;
        loom_comm_handle h;
        if (e->seg[k].total > (size_t)INT_MAX)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--ep with --zero %d: %zu elements in one segment (at most 2^31)",
                                  e->stage, e->seg[k].total);
        /* each rank's segment as int counts (the whole sequence is below 2^31) */
        loom_shard_layout_parts(&e->seg[k], 0, e->seg[k].total, e->gcounts, e->gdispls);
        copy_segment(e, k, 0, e->seg[k].total, grads, e->pack, 0);
        if (!(st = loom_comm_ireduce_scatter_sum(g, e->pack, e->recv, e->gcounts, &h, err)) &&
            !(st = loom_comm_wait(&h, err)))
            copy_segment(e, k, e->seg[k].lo, e->seg[k].hi, grads, e->recv, 1);
    }
    return st;
}

loom_status loom_ep_zero_reduce_range(loom_zero *z, float *grads, size_t begin, size_t end,
                                      loom_error *err) {
    loom_ep_zero *e = z->experts;
    const size_t resident = loom_zero_grads_resident(z, grads); /* the end line's peak */
    if (resident > z->grads_peak) z->grads_peak = resident;
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        const loom_shard_layout *l = &e->seg[k];
        size_t kb, ke;
        kind_piece(e, k, begin, end, &kb, &ke);
        if (kb >= ke) continue;
        loom_comm *g = l->group;
        if (ke - kb > (size_t)INT_MAX)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--grad-accum sharded with --ep: %zu elements in one range (at "
                                  "most 2^31)",
                                  ke - kb);
        /* every group rank's part of the piece; this rank's is [a, a + n) of the sequence */
        loom_shard_layout_parts(l, kb, ke, e->gcounts, e->gdispls);
        const size_t a = kb + (size_t)e->gdispls[g->rank], n = (size_t)e->gcounts[g->rank];
        float *mine = e->recv;
        if (g->size > 1) {
            loom_comm_handle h;
            copy_segment(e, k, kb, ke, grads, e->pack, 0);
            if ((st = loom_comm_ireduce_scatter_sum(g, e->pack, mine, e->gcounts, &h, err)) ||
                (st = loom_comm_wait(&h, err)))
                break;
        } else {
            copy_segment(e, k, a, a + n, grads, mine, 0);
        }
        if (n == 0) continue;
        if (z->accum_n == 0) { /* the step's first micro-batch: copied */
            copy_segment(e, k, a, a + n, z->accum, mine, 1);
            continue;
        }
        copy_segment(e, k, a, a + n, z->accum, e->pack, 0); /* sum += this micro-batch's */
        for (size_t i = 0; i < n; i++) e->pack[i] += mine[i];
        copy_segment(e, k, a, a + n, z->accum, e->pack, 1);
    }
    /* Added to the sum: the range and everything above it (ranges come from the top down)
     * is not needed this micro-batch; from begin's page up, so that the page it shares with
     * the range above goes back too. */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float);
    const size_t from = (begin + pg - 1) / pg * pg;
    if (!st && from < z->released_from) {
        loom_zero_release_pages(grads, from, z->released_from);
        z->released_from = from;
    }
    return st;
}

loom_status loom_ep_zero_gather(loom_zero *z, float *flat, loom_error *err) {
    loom_ep_zero *e = z->experts;
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        loom_comm *g = e->seg[k].group;
        if (g->size == 1 || e->seg[k].total == 0) continue;
        const size_t a = e->seg[k].lo;
        copy_segment(e, k, a, e->seg[k].hi, flat, e->pack + a, 0);
        if (!(st = loom_comm_allgatherv_large(g, e->pack, e->seg[k].counts, e->seg[k].displs, 0,
                                              err)))
            copy_segment(e, k, 0, e->seg[k].total, flat, e->pack, 1);
    }
    return st;
}

loom_status loom_ep_zero_step(loom_zero *z, float *params, float *shard, float *grads, double norm,
                              float lr, const loom_adamw_config *cfg, int step, loom_error *err) {
    const loom_ep_zero *e = z->experts;
    float *w = shard ? shard : params;
    float *g = z->accum ? z->accum : grads; /* --grad-accum sharded: the segments' sum */
    for (int i = 0; i < e->n_own; i++) {
        const size_t lo = e->own[i].lo, hi = e->own[i].hi;
        loom_grad_clip(z->be, g + lo, hi - lo, norm, cfg->grad_clip);
        loom_adamw_step(z->be, e->table, w + lo, g + lo, z->m + lo, z->v + lo, lo, hi, lr, cfg,
                        step);
    }
    return shard ? LOOM_OK : loom_ep_zero_gather(z, params, err); /* ZeRO-3: before use */
}

void loom_ep_zero_init_shard(const loom_zero *z, float *shard, uint64_t seed) {
    const loom_ep_zero *e = z->experts;
    for (int i = 0; i < e->n_own; i++)
        loom_params_init_range(e->table, shard + e->own[i].lo, e->own[i].lo, e->own[i].hi, seed);
}

loom_status loom_ep_zero_gather_range(loom_zero *z, float *shard, float *view, size_t begin,
                                      size_t end, loom_error *err) {
    loom_ep_zero *e = z->experts;
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        /* The range's elements of kind k are one piece [kb, ke) of the kind's sequence. */
        const loom_shard_layout *l = &e->seg[k];
        size_t kb, ke;
        kind_piece(e, k, begin, end, &kb, &ke);
        if (kb >= ke) continue; /* the same on every rank: equal layouts */
        loom_comm *g = l->group;
        loom_shard_layout_parts(l, kb, ke, e->gcounts, e->gdispls);
        const size_t a = (size_t)e->gdispls[g->rank] + kb;
        copy_segment(e, k, a, a + (size_t)e->gcounts[g->rank], shard, e->pack + (a - kb), 0);
        if (g->size > 1) st = loom_comm_allgatherv(g, e->pack, e->gcounts, e->gdispls, err);
        if (!st) copy_segment(e, k, kb, ke, view, e->pack, 1);
    }
    return st;
}

void loom_ep_zero_clear_state(loom_zero *z) {
    const loom_ep_zero *e = z->experts;
    for (int i = 0; i < e->n_own; i++) {
        const size_t lo = e->own[i].lo, n = e->own[i].hi - lo;
        memset(z->m + lo, 0, n * sizeof(float));
        memset(z->v + lo, 0, n * sizeof(float));
    }
}

loom_status loom_ep_zero_plan_written(const loom_zero *z, const loom_ckpt_descs *ct,
                                      loom_ckpt_plan *plan, loom_ckpt_kind kind, loom_error *err) {
    const loom_ep_zero *e = z->experts;
    loom_status st = LOOM_OK;
    for (int i = 0; i < e->n_own && !st; i++)
        st = loom_ckpt_plan_range(plan, ct, kind, e->own[i].lo, e->own[i].hi, 1,
                                  LOOM_CKPT_CHUNK_FLOATS, err);
    return st;
}

loom_status loom_ep_zero_load(const loom_zero *z, const loom_ckpt_descs *ct, const char *dir,
                              const loom_ckpt_manifest *m, float *params, int with_ema,
                              loom_ckpt_load_stats *stats, loom_error *err) {
    const loom_ep_zero *e = z->experts;
    loom_ckpt_buffer b[LOOM_CKPT_KINDS] = {{params, 0, 0, z->total}, {0}, {0}};
    loom_ckpt_load_stats s = {0}, sum = {0};
    loom_status st = e->stage == 3 ? LOOM_OK : loom_ckpt_load(dir, m, ct, b, &s, err);
    sum = s;
    b[0].data = NULL;
    for (int i = 0; i < e->n_own && !st; i++) {
        /* ZeRO-3: the parameters are a shard too */
        if (e->stage == 3) b[0] = (loom_ckpt_buffer){params, 0, e->own[i].lo, e->own[i].hi};
        b[1] = (loom_ckpt_buffer){z->m, 0, e->own[i].lo, e->own[i].hi};
        b[2] = (loom_ckpt_buffer){z->v, 0, e->own[i].lo, e->own[i].hi};
        if (with_ema && z->ema) b[3] = (loom_ckpt_buffer){z->ema, 0, e->own[i].lo, e->own[i].hi};
        s = (loom_ckpt_load_stats){0};
        st = loom_ckpt_load(dir, m, ct, b, &s, err);
        sum.bytes_read += s.bytes_read;
        sum.chunks_read += s.chunks_read;
    }
    if (stats) *stats = sum;
    return st;
}

loom_status loom_ep_zero_ema_enable(loom_zero *z, float decay, loom_error *err) {
    const loom_ep_zero *e = z->experts;
    void *p = mmap(NULL, e->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return loom_error_set(err, LOOM_ERR_NOMEM, "--ema-decay with --ep: out of memory");
    z->ema = p;
    z->ema_decay = decay;
    return LOOM_OK;
}

void loom_ep_zero_ema_reset(loom_zero *z, const float *params, const float *shard) {
    const loom_ep_zero *e = z->experts;
    if (!z->ema) return;
    const float *w = shard ? shard : params;
    for (int i = 0; i < e->n_own; i++)
        memcpy(z->ema + e->own[i].lo, w + e->own[i].lo,
               (e->own[i].hi - e->own[i].lo) * sizeof(float));
}

void loom_ep_zero_ema_update(loom_zero *z, const float *params, const float *shard) {
    const loom_ep_zero *e = z->experts;
    if (!z->ema) return; /* no --ema-decay */
    const float *w = shard ? shard : params;
    const float d = z->ema_decay, c = 1.0f - d;
    for (int i = 0; i < e->n_own; i++)
        for (size_t j = e->own[i].lo; j < e->own[i].hi; j++) z->ema[j] = d * z->ema[j] + c * w[j];
}

loom_status loom_ep_zero_ema_gather(loom_zero *z, float *full, loom_error *err) {
    const loom_ep_zero *e = z->experts;
    for (int i = 0; i < e->n_own; i++)
        memcpy(full + e->own[i].lo, z->ema + e->own[i].lo,
               (e->own[i].hi - e->own[i].lo) * sizeof(float));
    return loom_ep_zero_gather(z, full, err);
}
