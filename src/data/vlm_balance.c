/* --balance-dp's assignment of a step's samples to data-parallel ranks (vlm_balance.h). */
#include "data/vlm_balance.h"

#include <stdlib.h>
#include <string.h>

loom_status loom_vlm_balance_init(loom_vlm_balance *b, int parts, int per_part, int max_images,
                                  double image_cost, double sample_cost, int balanced,
                                  loom_error *err) {
    memset(b, 0, sizeof *b);
    if (parts < 1 || per_part < 1 || max_images < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--balance-dp: %d ranks of %d samples (expected positive numbers)",
                              parts, per_part);
    b->parts = parts;
    b->per_part = per_part;
    b->total = parts * per_part;
    b->balanced = balanced;
    b->max_images = max_images;
    b->image_cost = image_cost;
    b->sample_cost = sample_cost;
    b->idx = calloc((size_t)b->total, sizeof *b->idx);
    b->images = calloc((size_t)b->total, sizeof *b->images);
    b->owner = calloc((size_t)b->total, sizeof *b->owner);
    b->load = calloc((size_t)parts, sizeof *b->load);
    b->count = calloc((size_t)parts, sizeof *b->count);
    b->kcount = calloc(2 * ((size_t)max_images + 1), sizeof *b->kcount);
    if (!b->idx || !b->images || !b->owner || !b->load || !b->count || !b->kcount) {
        loom_vlm_balance_free(b);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--balance-dp: out of memory");
    }
    return LOOM_OK;
}

void loom_vlm_balance_free(loom_vlm_balance *b) {
    free(b->idx);
    free(b->images);
    free(b->owner);
    free(b->load);
    free(b->count);
    free(b->kcount);
    memset(b, 0, sizeof *b);
}

/* The part with the least load that still has room (the lowest of equals). */
static int lightest(const loom_vlm_balance *b) {
    int best = -1;
    for (int d = 0; d < b->parts; d++)
        if (b->count[d] < b->per_part && (best < 0 || b->load[d] < b->load[best])) best = d;
    return best;
}

/* The part with the most (hi 1) or least load, the lowest of equals. */
static int extreme(const loom_vlm_balance *b, int hi) {
    int best = 0;
    for (int d = 1; d < b->parts; d++)
        if (hi ? b->load[d] > b->load[best] : b->load[d] < b->load[best]) best = d;
    return best;
}

/* The first position of part d holding k images. */
static int first_of(const loom_vlm_balance *b, int d, int k) {
    for (int i = 0; i < b->total; i++)
        if (b->owner[i] == d && b->images[i] == k) return i;
    return -1;
}

/* Swaps a sample of the most loaded part with one holding fewer images on the least loaded
 * part while that lowers the larger of the two loads (the swap that lowers it most); at
 * most `total` swaps. */
static void refine(loom_vlm_balance *b) {
    const int K = b->max_images + 1;
    for (int it = 0; it < b->total && b->parts > 1; it++) {
        const int hi = extreme(b, 1), lo = extreme(b, 0);
        memset(b->kcount, 0, 2 * (size_t)K * sizeof *b->kcount);
        for (int i = 0; i < b->total; i++) {
            if (b->owner[i] == hi) b->kcount[b->images[i]]++;
            if (b->owner[i] == lo) b->kcount[K + b->images[i]]++;
        }
        double best = b->load[hi];
        int ka = -1, kb = -1;
        for (int a = 0; a < K; a++)
            for (int c = 0; c < a; c++) {
                if (!b->kcount[a] || !b->kcount[K + c]) continue;
                const double d = (a - c) * b->image_cost;
                const double hi_new = b->load[hi] - d, lo_new = b->load[lo] + d;
                const double m = hi_new > lo_new ? hi_new : lo_new;
                if (m < best) best = m, ka = a, kb = c;
            }
        if (ka < 0) return;
        const int ia = first_of(b, hi, ka), ib = first_of(b, lo, kb);
        b->owner[ia] = lo;
        b->owner[ib] = hi;
        b->load[hi] -= (ka - kb) * b->image_cost;
        b->load[lo] += (ka - kb) * b->image_cost;
    }
}

static double max_over_mean(const loom_vlm_balance *b) {
    double max = 0.0, sum = 0.0;
    for (int d = 0; d < b->parts; d++) {
        sum += b->load[d];
        if (b->load[d] > max) max = b->load[d];
    }
    return sum > 0.0 ? max * b->parts / sum : 1.0;
}

/* Every position to part `balanced` ? LPT : its slice; loads and counts from scratch. */
static void assign(loom_vlm_balance *b, int balanced) {
    memset(b->load, 0, (size_t)b->parts * sizeof *b->load);
    memset(b->count, 0, (size_t)b->parts * sizeof *b->count);
    /* costs differ only by the image count: decreasing cost is decreasing images */
    for (int k = b->max_images; k >= 0; k--)
        for (int i = 0; i < b->total; i++) {
            if (b->images[i] != k) continue;
            const int d = balanced ? lightest(b) : i / b->per_part;
            b->owner[i] = d;
            b->count[d]++;
            b->load[d] += b->sample_cost + k * b->image_cost;
        }
}

void loom_vlm_balance_plan(loom_vlm_balance *b, const loom_vlm_dataset *ds, uint64_t seed,
                           int64_t step) {
    for (int i = 0; i < b->total; i++) {
        b->idx[i] = loom_vlm_dataset_index(ds, seed, step, i);
        const int k = loom_vlm_dataset_images(ds, b->idx[i]);
        b->images[i] = k < b->max_images ? k : b->max_images; /* validated at open */
    }
    assign(b, 0);
    const double slices = max_over_mean(b);
    b->max_over_mean = b->slices_max_over_mean = slices;
    if (!b->balanced) return;
    assign(b, 1);
    refine(b);
    b->max_over_mean = max_over_mean(b);
    if (b->max_over_mean > slices) { /* the slices were better: keep them */
        assign(b, 0);
        b->max_over_mean = slices;
    }
}

void loom_vlm_balance_records(const loom_vlm_balance *b, const loom_vlm_dataset *ds, int part,
                              int32_t *out) {
    const size_t words = (size_t)loom_vlm_record_size(&ds->rec);
    int k = 0;
    for (int i = 0; i < b->total && k < b->per_part; i++)
        if (b->owner[i] == part) loom_vlm_dataset_record(ds, b->idx[i], out + (size_t)k++ * words);
}
