#include "train/compute_weights.h"

#include <string.h>

#include "core/pages.h"
#include "core/philox.h"
#include "kernels/bf16.h"

/* Philox stream of the per-step seeds ("SR") */
#define SR_STREAM 0x5352u
/* elements per thread's share of a rounding */
#define CHUNK ((size_t)1 << 16)

loom_status loom_bf16_rounding_parse(const char *s, const char *flag, loom_bf16_rounding *out,
                                     loom_error *err) {
    if (strcmp(s, "nearest") == 0) {
        *out = LOOM_BF16_ROUND_NEAREST;
        return LOOM_OK;
    }
    if (strcmp(s, "stochastic") == 0) {
        *out = LOOM_BF16_ROUND_STOCHASTIC;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected nearest or stochastic", flag, s);
}

loom_status loom_compute_weights_open(loom_compute_weights *cw, const loom_backend *be,
                                      const loom_param_table *table, const float *params,
                                      loom_bf16_rounding rounding, uint64_t seed,
                                      const char *why_not, loom_error *err) {
    memset(cw, 0, sizeof *cw);
    if (loom_backend_precision(be) != LOOM_PRECISION_BF16) return LOOM_OK;
    if (why_not) {
        if (rounding == LOOM_BF16_ROUND_STOCHASTIC)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--bf16-rounding stochastic: not with %s yet (no bf16 copy "
                                  "of the weights there; docs/precision.md)",
                                  why_not);
        return LOOM_OK; /* nearest: the backend rounds per call, the same bits */
    }
    cw->copy = loom_backend_cpu_bf16_weight_copy(be, params, table->total);
    if (!cw->copy)
        return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 weights' copy: out of memory (%.1f MiB)",
                              (double)table->total * 2.0 / (1 << 20));
    cw->be = be;
    cw->table = table;
    cw->params = params;
    cw->rounding = rounding;
    cw->seed = seed;
    return LOOM_OK;
}

/* Elements [a, e) of tensor p stochastically, with the step's seed s (each element's bits
 * depend on its index only, so any cut of the tensor gives the whole's). */
static void round_tensor_sr(loom_bf16 *dst, const float *src, const loom_param *p, size_t a,
                            size_t e, uint64_t s) {
    const uint32_t stream = loom_hash_name(p->name);
    if (p->tp_dim < 0) { /* local index == global index */
#pragma omp parallel for schedule(static)
        for (size_t c = a; c < e; c += CHUNK)
            loom_bf16_from_f32_stochastic_n(dst + c, src + c, e - c < CHUNK ? e - c : CHUNK, s,
                                            stream, c);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t j = a; j < e; j++) {
        const uint64_t g = (uint64_t)loom_param_global_index(p, (int64_t)j);
        dst[j] = loom_bf16_from_f32_sr(src[j], loom_bf16_sr_bits(s, stream, g));
    }
}

/* [lo, hi) of the flat buffer into the copy, with step's key. */
static void round_range(loom_compute_weights *cw, int step, size_t lo, size_t hi) {
    if (cw->rounding == LOOM_BF16_ROUND_NEAREST) {
#pragma omp parallel for schedule(static)
        for (size_t c = lo; c < hi; c += CHUNK)
            loom_bf16_from_f32_n(cw->copy + c, cw->params + c, hi - c < CHUNK ? hi - c : CHUNK);
        return;
    }
    const uint64_t s = loom_philox_u64(cw->seed, SR_STREAM, (uint64_t)step, 0);
    for (int i = 0; i < cw->table->n_params; i++) {
        const loom_param *p = &cw->table->params[i];
        const size_t a = p->offset > lo ? p->offset : lo;
        const size_t e = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a < e)
            round_tensor_sr(cw->copy + p->offset, cw->params + p->offset, p, a - p->offset,
                            e - p->offset, s);
    }
}

void loom_compute_weights_refresh(loom_compute_weights *cw, int step) {
    if (!cw->copy) return;
    cw->step = step;
    /* ZeRO-3: the weights exist only while gathered; each gather rounds its range */
    if (cw->by_range != LOOM_CW_GATHERED) round_range(cw, step, 0, cw->table->total);
    loom_backend_cpu_bf16_weight_copy_valid(cw->be, 1);
}

void loom_compute_weights_after_update(loom_compute_weights *cw, int step) {
    if (cw->by_range)
        cw->step = step; /* each range rounds when its gather lands */
    else
        loom_compute_weights_refresh(cw, step);
}

void loom_compute_weights_by_range(loom_compute_weights *cw, loom_cw_ranges mode, size_t resident) {
    if (!cw->copy) return;
    cw->by_range = mode;
    if (mode == LOOM_CW_GATHERED) loom_backend_cpu_bf16_weight_copy_resident(cw->be, resident);
}

void loom_compute_weights_land(void *ctx, size_t begin, size_t end) {
    loom_compute_weights *cw = ctx;
    if (cw->copy) round_range(cw, cw->step, begin, end);
}

void loom_compute_weights_release(void *ctx, size_t begin, size_t end) {
    loom_compute_weights *cw = ctx;
    /* the pages read as zero until their range lands again */
    if (cw->copy) loom_pages_release(cw->copy, begin * sizeof(loom_bf16), end * sizeof(loom_bf16));
}
