#include "ckpt/ckpt_plan.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const KIND_PREFIX[LOOM_CKPT_KINDS] = {"", "optim.m/", "optim.v/", "ema/"};

void loom_ckpt_tensor_name(char *out, size_t size, loom_ckpt_kind kind, const char *param) {
    snprintf(out, size, "%s%s", KIND_PREFIX[kind], param);
}

int64_t loom_ckpt_box_volume(const loom_ckpt_box *b) {
    return b->len[0] * b->len[1];
}

int loom_ckpt_box_intersect(const loom_ckpt_box *a, const loom_ckpt_box *b, loom_ckpt_box *out) {
    for (int d = 0; d < 2; d++) {
        int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        int64_t ae = a->off[d] + a->len[d], be = b->off[d] + b->len[d];
        int64_t hi = ae < be ? ae : be;
        if (hi <= lo) return 0;
        out->off[d] = lo;
        out->len[d] = hi - lo;
    }
    return 1;
}

void loom_ckpt_descs_free(loom_ckpt_descs *d) {
    free(d->items);
    d->items = NULL;
    d->n = 0;
}

static loom_status push(loom_ckpt_plan *plan, const loom_ckpt_piece *piece, loom_error *err) {
    if (plan->n == plan->cap) {
        int cap = plan->cap ? 2 * plan->cap : 64;
        loom_ckpt_piece *items = realloc(plan->items, (size_t)cap * sizeof *items);
        if (!items) return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint plan: out of memory");
        plan->items = items;
        plan->cap = cap;
    }
    plan->items[plan->n++] = *piece;
    return LOOM_OK;
}

/* Splits a global box into row blocks of at most max_floats floats. */
static loom_status push_split(loom_ckpt_plan *plan, loom_ckpt_piece piece, size_t max_floats,
                              loom_error *err) {
    int64_t rows = piece.box.len[0], cols = piece.box.len[1];
    int64_t step = max_floats ? (int64_t)max_floats / cols : rows;
    if (step < 1) step = 1;
    loom_status st = LOOM_OK;
    for (int64_t r = 0; r < rows && !st; r += step) {
        loom_ckpt_piece q = piece;
        q.box.off[0] += r;
        q.box.len[0] = rows - r < step ? rows - r : step;
        q.local += (size_t)(r * piece.stride);
        st = push(plan, &q, err);
    }
    return st;
}

/* Local box rows [r0, r1) x columns [c0, c1) of d -> one global box per block. */
static loom_status push_local_box(loom_ckpt_plan *plan, int di, const loom_ckpt_desc *d,
                                  loom_ckpt_kind kind, int64_t r0, int64_t r1, int64_t c0,
                                  int64_t c1, size_t max_floats, loom_error *err) {
    const int64_t cols = d->local_shape[1];
    const int dim = d->dim, parts = d->parts;
    const int64_t lo[2] = {r0, c0}, hi[2] = {r1, c1};
    const int64_t part = d->local_shape[dim] / parts;
    loom_status st = LOOM_OK;
    for (int j = 0; j < parts && !st; j++) {
        int64_t a = lo[dim] > j * part ? lo[dim] : j * part;
        int64_t b = hi[dim] < (j + 1) * part ? hi[dim] : (j + 1) * part;
        if (a >= b) continue;
        loom_ckpt_piece q = {di, kind, {{r0, c0}, {r1 - r0, c1 - c0}}, 0, cols};
        for (int e = 0; e < 2; e++) q.box.off[e] += d->origin[e];
        q.box.off[dim] = d->origin[dim] + j * d->part_step + (a - j * part);
        q.box.len[dim] = b - a;
        int64_t lr = dim == 0 ? a : r0, lc = dim == 1 ? a : c0;
        q.local = d->offset + (size_t)(lr * cols + lc);
        st = push_split(plan, q, max_floats, err);
    }
    return st;
}

loom_status loom_ckpt_plan_range(loom_ckpt_plan *plan, const loom_ckpt_descs *d,
                                 loom_ckpt_kind kind, size_t lo, size_t hi, int written_only,
                                 size_t max_floats, loom_error *err) {
    loom_status st = LOOM_OK;
    for (int i = 0; i < d->n && !st; i++) {
        const loom_ckpt_desc *p = &d->items[i];
        if (written_only && !p->written) continue;
        const int64_t cols = p->local_shape[1];
        const size_t numel = (size_t)(p->local_shape[0] * cols);
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + numel < hi ? p->offset + numel : hi;
        if (a >= b) continue;
        int64_t e0 = (int64_t)(a - p->offset), e1 = (int64_t)(b - p->offset);
        int64_t r0 = e0 / cols, c0 = e0 % cols, r1 = e1 / cols, c1 = e1 % cols;
        if (r0 == r1) { /* inside one row */
            st = push_local_box(plan, i, p, kind, r0, r0 + 1, c0, c1, max_floats, err);
            continue;
        }
        if (c0 > 0) { /* the partial first row */
            st = push_local_box(plan, i, p, kind, r0, r0 + 1, c0, cols, max_floats, err);
            r0++;
        }
        if (!st && r1 > r0) st = push_local_box(plan, i, p, kind, r0, r1, 0, cols, max_floats, err);
        if (!st && c1 > 0) /* the partial last row */
            st = push_local_box(plan, i, p, kind, r1, r1 + 1, 0, c1, max_floats, err);
    }
    return st;
}

void loom_ckpt_plan_free(loom_ckpt_plan *plan) {
    free(plan->items);
    plan->items = NULL;
    plan->n = plan->cap = 0;
}
