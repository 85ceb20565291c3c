/* ZeRO-2/3 with local accumulation and one micro-batch a step: the local gradient bytes
 * resident at their peak (the start-up report's and loom plan's "grads" figure).
 *
 * The last (here: only) micro-batch's backward writes the local gradient from the top of
 * the flat buffer down; ranges are merged into buckets and posted as partitions
 * (loom_zero_grads_ready), and at every layer boundary each partition found reduced hands
 * its pages outside the rank's shard back (release_bucket in zero.c). So the buffer never
 * holds the whole gradient at once: at a layer boundary it holds the rank's shard (as far
 * as backward has written it), the ranges written since the last bucket was posted, and
 * the partitions posted but not yet reduced. How many of those are still in the engine
 * depends on how fast the reductions run beside backward, which no shape says; the figure
 * assumes the last LOOM_ZERO_LAG_PARTITIONS partitions posted (one being reduced, one
 * queued behind it: the engine runs a partition above 4 MiB alone, comm/engine.h). That
 * is a measured lag, not a bound: llama 512x8 at dp 4 ZeRO-2 (25 MiB buckets cut in two
 * partitions each), rank 0 held 58.7, 68.7 and 78.7 MiB at its worst layer boundary in
 * three runs at load 10-25 (mincore, loom's end line), where this count says 62.8 MiB
 * with one partition not yet reduced, 78.4 with two and 91.6 with three. The maximum is
 * taken over every layer boundary and every data-parallel rank (the shards sit at
 * different heights of the buffer, so the ranks peak at different moments; the report
 * and loom plan then say the same for every rank). */
#include <stdlib.h>

#include "parallel/zero.h"

enum { LAG_MAX = 8 };

typedef struct {
    size_t a, e;
} span;

static int span_cmp(const void *x, const void *y) {
    const span *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* Floats covered by the union of n spans (sorted in place). */
static size_t union_floats(span *s, int n) {
    qsort(s, (size_t)n, sizeof *s, span_cmp);
    size_t covered = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].e <= s[i].a) continue;
        const size_t a = s[i].a > hi ? s[i].a : hi;
        if (s[i].e > a) covered += s[i].e - a;
        if (s[i].e > hi) hi = s[i].e;
    }
    return covered;
}

typedef struct {
    span posted[LAG_MAX]; /* the last partitions posted, a ring */
    int n_posted, lag;
    size_t bucket;
} post_state;

/* send_bucket's partitions of [begin, end), highest first. */
static void post_range(post_state *p, size_t begin, size_t end) {
    if (begin >= end) return;
    const size_t n = end - begin, parts = (n + p->bucket - 1) / p->bucket;
    for (size_t k = parts; k-- > 0;)
        p->posted[p->n_posted++ % p->lag] =
            (span){begin + n * k / parts, begin + n * (k + 1) / parts};
}

/* The most floats of rank r's local buffer resident at a layer boundary where the ranges
 * from `written` up are written, [written, pend) not yet posted. */
static size_t resident_at(const loom_zero *z, const post_state *p, size_t written, size_t pend,
                          size_t wte_end, int wte_posted, int r) {
    span s[LAG_MAX + 3];
    int n = 0;
    s[n++] = (span){written, pend};
    for (int k = 0; k < p->lag && k < p->n_posted; k++) s[n++] = p->posted[k];
    const size_t lo = z->shards.displs[r], hi = lo + z->shards.counts[r];
    s[n++] = (span){lo > written ? lo : written, hi}; /* the shard, as far as written */
    if (wte_posted) s[n++] = (span){lo, hi < wte_end ? hi : wte_end}; /* reduced in place */
    return union_floats(s, n);
}

size_t loom_zero_grads_peak_local(const loom_zero *z, size_t wte_end) {
    const loom_param_table *t = z->table;
    const size_t whole = z->total * sizeof(float);
    if (z->stage < 2 || z->dp->size == 1 || z->experts || z->span_on || z->accum_resident ||
        !z->shards.counts)
        return 0;
    const int L = t->n_layer;
    const int n_head = t->head_begin < t->total ? 1 : 0;
    post_state p = {.lag = LOOM_ZERO_LAG_PARTITIONS, .bucket = z->bucket_floats};
    size_t most = 0, pend = z->total;
    int wte_posted = 0;
    for (int i = 0; i <= n_head + L; i++) {
        const size_t b = loom_zero_backward_range_begin(t, i, n_head, wte_end);
        if (b > pend) continue;
        for (int r = 0; r < z->dp->size; r++) {
            const size_t f = resident_at(z, &p, b, pend, wte_end, wte_posted, r);
            if (f > most) most = f;
        }
        /* as loom_zero_grads_ready: a run of at least a bucket goes out, the dense wte
         * range right after the first range (the embedding split), the rest at the end */
        if (i == n_head + L || pend - b >= z->bucket_floats) {
            post_range(&p, b, pend);
            pend = b;
        }
        if (i == 0 && wte_end > 0) post_range(&p, 0, wte_end), wte_posted = 1;
    }
    const size_t bytes = most * sizeof(float);
    return bytes < whole ? bytes : whole;
}
