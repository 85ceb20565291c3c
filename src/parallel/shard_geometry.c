#include "parallel/shard_geometry.h"

#include <stdlib.h>
#include <string.h>

int loom_shard_takes(loom_shard_kind kind, const loom_param *p) {
    switch (kind) {
    case LOOM_SHARD_DENSE:
        return p->expert < 0;
    case LOOM_SHARD_EXPERTS:
        return p->expert >= 0;
    case LOOM_SHARD_ALL:
        break;
    }
    return 1;
}

/* Shard boundary near `target`, snapped to a whole row of the tensor it falls in. */
static size_t snap_to_row(const loom_param_table *t, const size_t *start, loom_shard_kind kind,
                          size_t total, size_t target) {
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        const size_t s = start ? start[i] : p->offset;
        if (!loom_shard_takes(kind, p) || target < s || target >= s + p->numel) continue;
        const size_t row = p->ndim == 2 ? (size_t)p->shape[1] : p->numel;
        return s + (target - s + row / 2) / row * row;
    }
    return total;
}

void loom_shard_split_rows_span(const loom_param_table *t, const size_t *start,
                                loom_shard_kind kind, size_t a, size_t b, int R, size_t *counts,
                                size_t *displs) {
    size_t prev = a;
    for (int r = 0; r < R; r++) {
        size_t end = r + 1 == R ? b : snap_to_row(t, start, kind, b, a + (b - a) * (r + 1) / R);
        if (end > b) end = b;
        if (end < prev) end = prev;
        displs[r] = prev;
        counts[r] = end - prev;
        prev = end;
    }
}

void loom_shard_split_rows(const loom_param_table *t, const size_t *start, loom_shard_kind kind,
                           size_t total, int R, size_t *counts, size_t *displs) {
    loom_shard_split_rows_span(t, start, kind, 0, total, R, counts, displs);
}

void loom_shard_range_parts(const size_t *shard_counts, const size_t *shard_displs, int R,
                            size_t begin, size_t end, int *counts, int *displs) {
    for (int q = 0; q < R; q++) {
        size_t lo = shard_displs[q], hi = lo + shard_counts[q];
        size_t a = lo > begin ? lo : begin, e = hi < end ? hi : end;
        counts[q] = a < e ? (int)(e - a) : 0;
        displs[q] = a < e ? (int)(a - begin) : 0;
    }
}

loom_status loom_shard_layout_init(loom_shard_layout *l, const loom_param_table *t,
                                   loom_shard_kind kind, loom_comm *group, loom_error *err) {
    memset(l, 0, sizeof *l);
    l->table = t;
    l->kind = kind;
    l->group = group;
    const size_t R = (size_t)group->size;
    l->counts = calloc(R, sizeof(size_t));
    l->displs = calloc(R, sizeof(size_t));
    if (kind != LOOM_SHARD_ALL) l->start = calloc((size_t)t->n_params + 1, sizeof(size_t));
    if (!l->counts || !l->displs || (kind != LOOM_SHARD_ALL && !l->start)) {
        loom_shard_layout_free(l);
        return loom_error_set(err, LOOM_ERR_NOMEM, "shards: out of memory");
    }
    if (kind == LOOM_SHARD_ALL) {
        l->total = t->total;
    } else {
        for (int i = 0; i < t->n_params; i++) {
            if (!loom_shard_takes(kind, &t->params[i])) continue;
            l->start[i] = l->total;
            l->total += t->params[i].numel;
        }
    }
    loom_shard_split_rows(t, l->start, kind, l->total, group->size, l->counts, l->displs);
    l->lo = l->displs[group->rank];
    l->hi = l->lo + l->counts[group->rank];
    return LOOM_OK;
}

loom_status loom_shard_layout_init_span(loom_shard_layout *l, const loom_param_table *t,
                                        loom_comm *group, size_t a, size_t b, loom_error *err) {
    memset(l, 0, sizeof *l);
    l->table = t;
    l->kind = LOOM_SHARD_ALL;
    l->group = group;
    l->counts = calloc((size_t)group->size, sizeof(size_t));
    l->displs = calloc((size_t)group->size, sizeof(size_t));
    if (!l->counts || !l->displs) {
        loom_shard_layout_free(l);
        return loom_error_set(err, LOOM_ERR_NOMEM, "shards: out of memory");
    }
    l->total = t->total;
    loom_shard_split_rows_span(t, NULL, LOOM_SHARD_ALL, a, b, group->size, l->counts, l->displs);
    l->lo = l->displs[group->rank];
    l->hi = l->lo + l->counts[group->rank];
    return LOOM_OK;
}

void loom_shard_layout_free(loom_shard_layout *l) {
    free(l->counts);
    free(l->displs);
    free(l->start);
    memset(l, 0, sizeof *l);
}

void loom_shard_layout_parts(const loom_shard_layout *l, size_t begin, size_t end, int *counts,
                             int *displs) {
    loom_shard_range_parts(l->counts, l->displs, l->group->size, begin, end, counts, displs);
}

void loom_shard_layout_copy(const loom_shard_layout *l, size_t a, size_t b, float *flat, float *buf,
                            loom_shard_copy dir) {
    const loom_param_table *t = l->table;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        if (!loom_shard_takes(l->kind, p)) continue;
        const size_t s = loom_shard_layout_start(l, i);
        const size_t lo = s > a ? s : a, hi = s + p->numel < b ? s + p->numel : b;
        if (lo >= hi) continue;
        float *f = flat + p->offset + (lo - s), *q = buf + (lo - a);
        if (dir == LOOM_SHARD_UNPACK)
            memcpy(f, q, (hi - lo) * sizeof(float));
        else
            memcpy(q, f, (hi - lo) * sizeof(float));
    }
}
