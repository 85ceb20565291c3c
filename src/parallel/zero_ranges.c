/* --grad-accum sharded in a pipeline stage: each backward action that completes a
 * micro-batch's gradients of a chunk reduces that chunk's ranges on its own
 * (pipeline/executor.c), and split backward's norm gradients get 4 KiB pages. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "parallel/zero.h"

void loom_zero_begin_ranges(loom_zero *z, size_t top, int first) {
    const double waited = z->step_wait_ms; /* the step's, over all its actions */
    loom_zero_begin_reduction(z);
    z->step_wait_ms = waited;
    /* --freeze: ranges are reduced only inside the trainable span (loom_zero_grads_ready
     * clips them), so the first one ends at the span's end where top is above it (a vlm
     * stage whose decoder is frozen) */
    const size_t end = top < z->span_hi ? top : z->span_hi;
    z->pending_begin = z->pending_end = z->consumed_from = end;
    /* the page that top shares with the ranges above stays (they may hold a later
     * micro-batch's part: split backward's norms) */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float);
    if (top < z->total) z->released_from = top / pg * pg;
    z->accum_n = first ? 0 : 1;
}

loom_status loom_zero_finish_ranges(loom_zero *z, float *grads, size_t bottom, size_t top,
                                    loom_error *err) {
    loom_status st = loom_zero_finish_reduction(z, grads, err);
    if (st || bottom >= top) return st;
    /* Every value of [bottom, top) was added to the sum: zero for the next micro-batch
     * (backward adds into it), whole pages handed back, the edges shared with the ranges
     * around it cleared by hand. */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float);
    const size_t a = (bottom + pg - 1) / pg * pg, e = top / pg * pg;
    if (a >= e) {
        memset(grads + bottom, 0, (top - bottom) * sizeof(float));
        return LOOM_OK;
    }
    memset(grads + bottom, 0, (a - bottom) * sizeof(float));
    memset(grads + e, 0, (top - e) * sizeof(float));
    loom_zero_release_pages(grads, a, e);
    return LOOM_OK;
}

/* Split backward (zero-bubble W): B writes each block's norm gradients (a by-product of
 * their input gradients) for micro-batches whose W comes later, so the pages holding the
 * norms (every block's and the final one's) are resident beside the ranges in flight.
 * With 4 KiB pages there (MADV_NOHUGEPAGE when grads is given) that is a few pages a block,
 * not a 2 MiB huge page each. Returns the 4 KiB pages (page size) they span. */
size_t loom_zero_norm_pages(const loom_zero *z, float *grads) {
    const loom_param_table *t = z->table;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float);
    size_t pages = 0, last = (size_t)-1;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        int norm = p->offset == t->normf_w || p->offset == t->normf_b;
        for (int l = 0; l < t->n_layer && !norm; l++) {
            const loom_block_params *k = &t->blocks[l];
            norm = p->offset == k->norm1_w || p->offset == k->norm1_b || p->offset == k->norm2_w ||
                   p->offset == k->norm2_b;
        }
        if (!norm || p->numel == 0) continue;
        const size_t first = p->offset / pg, e = (p->offset + p->numel - 1) / pg;
        const size_t a = first == last ? first + 1 : first; /* a page two norms share: once */
        if (a <= e) pages += e - a + 1;
        last = e;
#ifdef MADV_NOHUGEPAGE
        if (grads)
            madvise(grads + first * pg, (e - first + 1) * pg * sizeof(float), MADV_NOHUGEPAGE);
#endif
    }
    return pages;
}
