#include "parallel/shard_geometry.h"

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

void loom_shard_split_rows(const loom_param_table *t, const size_t *start, loom_shard_kind kind,
                           size_t total, int R, int *counts, int *displs) {
    size_t prev = 0;
    for (int r = 0; r < R; r++) {
        size_t end = r + 1 == R ? total : snap_to_row(t, start, kind, total, total * (r + 1) / R);
        if (end < prev) end = prev;
        displs[r] = (int)prev;
        counts[r] = (int)(end - prev);
        prev = end;
    }
}

void loom_shard_range_parts(const int *shard_counts, const int *shard_displs, int R, size_t begin,
                            size_t end, int *counts, int *displs) {
    for (int q = 0; q < R; q++) {
        size_t lo = (size_t)shard_displs[q], hi = lo + (size_t)shard_counts[q];
        size_t a = lo > begin ? lo : begin, e = hi < end ? hi : end;
        counts[q] = a < e ? (int)(e - a) : 0;
        displs[q] = a < e ? (int)(a - begin) : 0;
    }
}
