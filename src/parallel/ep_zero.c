#include "parallel/ep_zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/ckpt_writer.h"
#include "kernels/kernels.h"
#include "parallel/ep.h"

static int kind_of(const loom_param *p) {
    return p->expert >= 0;
}

/* Copies [a, b) of kind k's sequence between the flat buffer and buf (buf[0] = element
 * a): to_flat 0 packs, 1 unpacks. */
static void copy_segment(const loom_ep_zero *e, int k, size_t a, size_t b, float *flat, float *buf,
                         int to_flat) {
    const loom_param_table *t = e->table;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        const size_t s = e->kind_start[i];
        if (kind_of(p) != k) continue;
        const size_t lo = s > a ? s : a, hi = s + p->numel < b ? s + p->numel : b;
        if (lo >= hi) continue;
        float *f = flat + p->offset + (lo - s), *q = buf + (lo - a);
        memcpy(to_flat ? f : q, to_flat ? q : f, (hi - lo) * sizeof(float));
    }
}

static size_t seg_lo(const loom_ep_zero *e, int k) {
    return (size_t)e->displs[k][e->group[k]->rank];
}

static size_t seg_hi(const loom_ep_zero *e, int k) {
    return seg_lo(e, k) + (size_t)e->counts[k][e->group[k]->rank];
}

static void ep_free(loom_ep_zero *e) {
    if (!e) return;
    free(e->kind_start);
    for (int k = 0; k < 2; k++) free(e->counts[k]), free(e->displs[k]);
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
        const size_t s = e->kind_start[i], a = seg_lo(e, k), b = seg_hi(e, k);
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

loom_status loom_ep_zero_attach(loom_zero *z, loom_comm *edp, loom_error *err) {
    const loom_param_table *t = z->table;
    loom_ep_zero *e = calloc(1, sizeof *e);
    if (!e) return loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO with --ep: out of memory");
    e->table = t;
    e->group[0] = z->dp;
    e->group[1] = edp;
    e->stage = z->stage;
    e->kind_start = calloc((size_t)t->n_params + 1, sizeof(size_t));
    int ok = e->kind_start != NULL;
    for (int i = 0; ok && i < t->n_params; i++) {
        const int k = kind_of(&t->params[i]);
        e->kind_start[i] = e->kind_total[k];
        e->kind_total[k] += t->params[i].numel;
    }
    for (int k = 0; ok && k < 2; k++) {
        const int R = e->group[k]->size;
        e->counts[k] = calloc((size_t)R, sizeof(int));
        e->displs[k] = calloc((size_t)R, sizeof(int));
        ok = e->counts[k] && e->displs[k];
        if (ok)
            loom_zero_split_rows(t, e->kind_start, k, e->kind_total[k], R, e->counts[k],
                                 e->displs[k]);
    }
    const size_t most = e->kind_total[0] > e->kind_total[1] ? e->kind_total[0] : e->kind_total[1];
    ok = ok && build_own(e) && (e->pack = malloc((most ? most : 1) * sizeof(float))) &&
         (e->gcounts = calloc((size_t)z->dp->size, sizeof(int))) &&
         (e->gdispls = calloc((size_t)z->dp->size, sizeof(int)));
    if (ok && e->stage >= 2) {
        size_t mine = 0;
        for (int k = 0; k < 2; k++)
            mine = seg_hi(e, k) - seg_lo(e, k) > mine ? seg_hi(e, k) - seg_lo(e, k) : mine;
        ok = (e->recv = malloc((mine ? mine : 1) * sizeof(float))) != NULL;
    }
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
    z->experts = e;
    return LOOM_OK;
}

void loom_ep_zero_detach(loom_zero *z) {
    loom_ep_zero *e = z->experts;
    if (!e) return;
    if (z->m) munmap(z->m, e->map_bytes);
    if (z->v) munmap(z->v, e->map_bytes);
    z->m = z->v = NULL;
    ep_free(e);
    z->experts = NULL;
}

loom_status loom_ep_zero_reduce(loom_zero *z, float *grads, loom_error *err) {
    loom_ep_zero *e = z->experts;
    if (e->stage < 2) return loom_ep_reduce_grads(e->table, grads, e->group[0], e->group[1], err);
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        loom_comm *g = e->group[k];
        if (g->size == 1 || e->kind_total[k] == 0) continue;
        loom_comm_handle h;
        copy_segment(e, k, 0, e->kind_total[k], grads, e->pack, 0);
        if (!(st = loom_comm_ireduce_scatter_sum(g, e->pack, e->recv, e->counts[k], &h, err)) &&
            !(st = loom_comm_wait(&h, err)))
            copy_segment(e, k, seg_lo(e, k), seg_hi(e, k), grads, e->recv, 1);
    }
    return st;
}

double loom_ep_zero_sum_squares(const loom_zero *z, const float *grads, size_t lo, size_t hi,
                                const loom_comm *tp) {
    const loom_ep_zero *e = z->experts;
    const loom_param_table *t = e->table;
    double sq = 0.0;
    int i = 0;
    for (int r = 0; r < e->n_own; r++) { /* both in flat order */
        const size_t rlo = e->own[r].lo > lo ? e->own[r].lo : lo;
        const size_t rhi = e->own[r].hi < hi ? e->own[r].hi : hi;
        if (rlo >= rhi) continue;
        while (i < t->n_params && t->params[i].offset + t->params[i].numel <= rlo) i++;
        for (int j = i; j < t->n_params && t->params[j].offset < rhi; j++) {
            const loom_param *p = &t->params[j];
            const size_t a = p->offset > rlo ? p->offset : rlo;
            const size_t b = p->offset + p->numel < rhi ? p->offset + p->numel : rhi;
            if (a < b && loom_ep_counted_here(p, tp)) sq += loom_sum_squares(grads + a, b - a);
        }
    }
    return sq;
}

loom_status loom_ep_zero_grad_norm(loom_zero *z, const float *grads, loom_comm *tp, double *norm,
                                   loom_error *err) {
    double sq = loom_ep_zero_sum_squares(z, grads, 0, z->total, tp);
    loom_status st = loom_comm_allreduce_sum_f64(z->dp, &sq, 1, err);
    if (!st && tp && tp->size > 1) st = loom_comm_allreduce_sum_f64(tp, &sq, 1, err);
    *norm = sqrt(sq);
    return st;
}

loom_status loom_ep_zero_gather(loom_zero *z, float *flat, loom_error *err) {
    loom_ep_zero *e = z->experts;
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        loom_comm *g = e->group[k];
        if (g->size == 1 || e->kind_total[k] == 0) continue;
        const size_t a = seg_lo(e, k);
        copy_segment(e, k, a, seg_hi(e, k), flat, e->pack + a, 0);
        if (!(st = loom_comm_allgatherv(g, e->pack, e->counts[k], e->displs[k], err)))
            copy_segment(e, k, 0, e->kind_total[k], flat, e->pack, 1);
    }
    return st;
}

loom_status loom_ep_zero_step(loom_zero *z, float *params, float *shard, float *grads, double norm,
                              float lr, const loom_adamw_config *cfg, int step, loom_error *err) {
    const loom_ep_zero *e = z->experts;
    float *w = shard ? shard : params;
    for (int i = 0; i < e->n_own; i++) {
        const size_t lo = e->own[i].lo, hi = e->own[i].hi;
        loom_grad_clip(grads + lo, hi - lo, norm, cfg->grad_clip);
        loom_adamw_step(e->table, w + lo, grads + lo, z->m + lo, z->v + lo, lo, hi, lr, cfg, step);
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
    const loom_param_table *t = e->table;
    loom_status st = LOOM_OK;
    for (int k = 0; k < 2 && !st; k++) {
        /* The range's elements of kind k are one piece [kb, ke) of the kind's sequence. */
        size_t kb = e->kind_total[k], ke = 0;
        for (int i = 0; i < t->n_params; i++) {
            const loom_param *p = &t->params[i];
            if (kind_of(p) != k || p->offset < begin || p->offset >= end) continue;
            kb = e->kind_start[i] < kb ? e->kind_start[i] : kb;
            ke = e->kind_start[i] + p->numel > ke ? e->kind_start[i] + p->numel : ke;
        }
        if (kb >= ke) continue; /* the same on every rank: equal layouts */
        loom_comm *g = e->group[k];
        for (int r = 0; r < g->size; r++) {
            const size_t lo = (size_t)e->displs[k][r], hi = lo + (size_t)e->counts[k][r];
            const size_t a = lo > kb ? lo : kb, b = hi < ke ? hi : ke;
            e->gcounts[r] = a < b ? (int)(b - a) : 0;
            e->gdispls[r] = a < b ? (int)(a - kb) : 0;
        }
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
                              const loom_ckpt_manifest *m, float *params,
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
        s = (loom_ckpt_load_stats){0};
        st = loom_ckpt_load(dir, m, ct, b, &s, err);
        sum.bytes_read += s.bytes_read;
        sum.chunks_read += s.chunks_read;
    }
    if (stats) *stats = sum;
    return st;
}
