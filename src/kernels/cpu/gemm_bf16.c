/* bf16 GEMMs on oneDNN's matmul, or widened to fp32 where the CPU has no bf16 GEMM
 * instructions (gemm_bf16.h). */
#include "kernels/cpu/gemm_bf16.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_widened.h"

typedef struct {
    loom_gemm_kind kind;
    int M, N, K; /* all -1: the run-time-shape primitive of this kind */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch; /* handles set per call (static shapes) */
    size_t flops_key;               /* M*N*K, to name the largest one's implementation */
    char impl[64];
} gemm_entry;

struct loom_gemm_bf16 {
    loom_gemm_widened *widened; /* non-NULL: no oneDNN, every call widened (gemm_widened.h) */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    gemm_entry *entries;
    size_t n, cap;
    gemm_entry dynamic[LOOM_GEMM_KINDS]; /* one per kind, run-time dimensions */
    void *scratch;                       /* the user scratchpad every static primitive shares */
    size_t scratch_bytes;
    size_t unprepared_calls;
    loom_status first_status;
    char first_error[160];
};

static loom_status dnnl_fail(loom_error *err, dnnl_status_t s, const char *what) {
    return loom_error_set(err, LOOM_ERR_STATE, "oneDNN %s failed (status %d)", what, (int)s);
}

/* The three memory descriptors of a kind; dims DNNL_RUNTIME_DIM_VAL when M < 0. */
static dnnl_status_t describe(loom_gemm_kind kind, int M, int N, int K, dnnl_memory_desc_t *a,
                              dnnl_memory_desc_t *b, dnnl_memory_desc_t *c) {
    const int64_t R = DNNL_RUNTIME_DIM_VAL;
    const int rt = M < 0;
    const int64_t m = rt ? R : M, n = rt ? R : N, k = rt ? R : K;
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n}, as, bs, cs = {n, 1};
    memset(as, 0, sizeof as), memset(bs, 0, sizeof bs);
    switch (kind) {
    case LOOM_GEMM_NT: /* A [M,K]; B stored [N,K] */
    case LOOM_GEMM_NT_OUT_BF16:
        as[0] = k, as[1] = 1, bs[0] = 1, bs[1] = k;
        break;
    case LOOM_GEMM_NN: /* A [M,K]; B [K,N] */
        as[0] = k, as[1] = 1, bs[0] = n, bs[1] = 1;
        break;
    case LOOM_GEMM_TN: /* A stored [K,M]; B [K,N] */
        as[0] = 1, as[1] = m, bs[0] = n, bs[1] = 1;
        break;
    }
    dnnl_status_t s;
    if ((s = dnnl_memory_desc_init_by_strides(a, 2, ad, dnnl_bf16, as))) return s;
    if ((s = dnnl_memory_desc_init_by_strides(b, 2, bd, dnnl_bf16, bs))) return s;
    const dnnl_data_type_t ct = kind == LOOM_GEMM_NT_OUT_BF16 ? dnnl_bf16 : dnnl_f32;
    return dnnl_memory_desc_init_by_strides(c, 2, cd, ct, cs);
}

static loom_status make_entry(loom_gemm_bf16 *g, gemm_entry *e, loom_gemm_kind kind, int M, int N,
                              int K, loom_error *err) {
    memset(e, 0, sizeof *e);
    e->kind = kind, e->M = M, e->N = N, e->K = K;
    e->flops_key = M < 0 ? 0 : (size_t)M * (size_t)N * (size_t)K;
    dnnl_memory_desc_t a, b, c;
    dnnl_status_t s = describe(kind, M, N, K, &a, &b, &c);
    if (s) return dnnl_fail(err, s, "memory descriptor");
    dnnl_matmul_desc_t md;
    if ((s = dnnl_matmul_desc_init(&md, &a, &b, NULL, &c))) return dnnl_fail(err, s, "matmul");
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    loom_status st = LOOM_OK;
    if ((s = dnnl_primitive_attr_create(&attr)) || (s = dnnl_post_ops_create(&po)) ||
        (kind != LOOM_GEMM_NT_OUT_BF16 && (s = dnnl_post_ops_append_sum(po, 1.0f))) ||
        (s = dnnl_primitive_attr_set_post_ops(attr, po)) ||
        (M >= 0 &&
         (s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user))) ||
        (s = dnnl_primitive_desc_create(&pd, &md, attr, g->engine, NULL))) {
        st = dnnl_fail(err, s, "matmul primitive descriptor (bf16)");
        goto out;
    }
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(e->impl, sizeof e->impl, "%s", impl);
    if ((s = dnnl_primitive_create(&e->prim, pd))) {
        st = dnnl_fail(err, s, "matmul primitive");
        goto out;
    }
    if (M >= 0) { /* memory objects once; their handles are set per call */
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        size_t spb = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (spb > g->scratch_bytes) {
            void *p = aligned_alloc(64, (spb + 63) / 64 * 64);
            if (!p) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "bf16 GEMM scratchpad: out of memory");
                goto out;
            }
            free(g->scratch);
            g->scratch = p, g->scratch_bytes = spb;
            /* earlier entries' scratch objects point at the old buffer: re-pointed per call */
        }
        if ((s = dnnl_memory_create(&e->a, &a, g->engine, DNNL_MEMORY_NONE)) ||
            (s = dnnl_memory_create(&e->b, &b, g->engine, DNNL_MEMORY_NONE)) ||
            (s = dnnl_memory_create(&e->c, &c, g->engine, DNNL_MEMORY_NONE)) ||
            (sp && spb && (s = dnnl_memory_create(&e->scratch, sp, g->engine, DNNL_MEMORY_NONE)))) {
            st = dnnl_fail(err, s, "memory object");
            goto out;
        }
    }
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static void free_entry(gemm_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->a) dnnl_memory_destroy(e->a);
    if (e->b) dnnl_memory_destroy(e->b);
    if (e->c) dnnl_memory_destroy(e->c);
    if (e->scratch) dnnl_memory_destroy(e->scratch);
    memset(e, 0, sizeof *e);
}

loom_status loom_gemm_bf16_create(loom_gemm_bf16 **out, loom_error *err) {
    *out = NULL;
    loom_gemm_bf16 *g = calloc(1, sizeof *g);
    if (!g) return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 GEMM: out of memory");
    loom_status st = LOOM_OK;
    if (!loom_cpu_has_avx512_bf16() && !loom_cpu_has_amx_bf16()) {
        if (!(st = loom_gemm_widened_create(&g->widened, LOOM_WIDEN_MB, LOOM_WIDEN_NB,
                                            LOOM_WIDEN_KB, err)))
            *out = g;
        else
            free(g);
        return st;
    }
    dnnl_status_t s;
    if ((s = dnnl_engine_create(&g->engine, dnnl_cpu, 0)) ||
        (s = dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags)))
        st = dnnl_fail(err, s, "CPU engine");
    for (int k = 0; !st && k < LOOM_GEMM_KINDS; k++)
        st = make_entry(g, &g->dynamic[k], (loom_gemm_kind)k, -1, -1, -1, err);
    if (st) {
        loom_gemm_bf16_destroy(g);
        return st;
    }
    *out = g;
    return LOOM_OK;
}

void loom_gemm_bf16_destroy(loom_gemm_bf16 *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n; i++) free_entry(&g->entries[i]);
    for (int k = 0; k < LOOM_GEMM_KINDS; k++) free_entry(&g->dynamic[k]);
    free(g->entries);
    free(g->scratch);
    loom_gemm_widened_destroy(g->widened);
    if (g->stream) dnnl_stream_destroy(g->stream);
    if (g->engine) dnnl_engine_destroy(g->engine);
    free(g);
}

static gemm_entry *find(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K) {
    for (size_t i = 0; i < g->n; i++) {
        gemm_entry *e = &g->entries[i];
        if (e->kind == kind && e->M == M && e->N == N && e->K == K) return e;
    }
    return NULL;
}

loom_status loom_gemm_bf16_prepare(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K,
                                   loom_error *err) {
    if (M <= 0 || N <= 0 || K <= 0 || find(g, kind, M, N, K)) return LOOM_OK;
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        gemm_entry *p = realloc(g->entries, cap * sizeof *p);
        if (!p) return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 GEMM cache: out of memory");
        g->entries = p, g->cap = cap;
    }
    if (g->widened) { /* nothing to make: the shape is only recorded */
        g->entries[g->n++] = (gemm_entry){.kind = kind, .M = M, .N = N, .K = K};
        return LOOM_OK;
    }
    loom_status st = make_entry(g, &g->entries[g->n], kind, M, N, K, err);
    if (st) {
        free_entry(&g->entries[g->n]);
        return st;
    }
    g->n++;
    return LOOM_OK;
}

static void note_failure(loom_gemm_bf16 *g, dnnl_status_t s, const char *what) {
    if (g->first_status) return;
    g->first_status = LOOM_ERR_STATE;
    snprintf(g->first_error, sizeof g->first_error, "oneDNN %s failed (status %d)", what, (int)s);
}

static void run_dynamic(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K, void *C,
                        const loom_bf16 *A, const loom_bf16 *B) {
    dnnl_memory_desc_t a, b, c;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    dnnl_status_t s = describe(kind, M, N, K, &a, &b, &c);
    if (!s) s = dnnl_memory_create(&ma, &a, g->engine, (void *)A);
    if (!s) s = dnnl_memory_create(&mb, &b, g->engine, (void *)B);
    if (!s) s = dnnl_memory_create(&mc, &c, g->engine, C);
    if (!s) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
        s = dnnl_primitive_execute(g->dynamic[kind].prim, g->stream, 3, args);
        if (!s) s = dnnl_stream_wait(g->stream);
    }
    if (s) note_failure(g, s, "matmul (run-time shape)");
    if (ma) dnnl_memory_destroy(ma);
    if (mb) dnnl_memory_destroy(mb);
    if (mc) dnnl_memory_destroy(mc);
    g->unprepared_calls++;
}

void loom_gemm_bf16_run(loom_gemm_bf16 *g, loom_gemm_kind kind, int M, int N, int K, void *C,
                        const loom_bf16 *A, const loom_bf16 *B) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    gemm_entry *e = find(g, kind, M, N, K);
    if (g->widened) {
        if (!e) g->unprepared_calls++;
        loom_gemm_widened_run(g->widened, kind, M, N, K, C, A, B);
        return;
    }
    if (!e) {
        run_dynamic(g, kind, M, N, K, C, A, B);
        return;
    }
    dnnl_status_t s;
    if ((s = dnnl_memory_set_data_handle(e->a, (void *)A)) ||
        (s = dnnl_memory_set_data_handle(e->b, (void *)B)) ||
        (s = dnnl_memory_set_data_handle(e->c, C)) ||
        (e->scratch && (s = dnnl_memory_set_data_handle(e->scratch, g->scratch)))) {
        note_failure(g, s, "memory handle");
        return;
    }
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
                               {DNNL_ARG_WEIGHTS, e->b},
                               {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_SCRATCHPAD, e->scratch}};
    s = dnnl_primitive_execute(e->prim, g->stream, e->scratch ? 4 : 3, args);
    if (!s) s = dnnl_stream_wait(g->stream);
    if (s) note_failure(g, s, "matmul");
}

const char *loom_gemm_bf16_impl(const loom_gemm_bf16 *g) {
    if (g->widened) return "widened to fp32 for OpenBLAS sgemm (no AVX512-BF16 or AMX-BF16)";
    const gemm_entry *best = &g->dynamic[0];
    for (size_t i = 0; i < g->n; i++)
        if (g->entries[i].flops_key > best->flops_key) best = &g->entries[i];
    return best->impl[0] ? best->impl : "unknown";
}

size_t loom_gemm_bf16_prepared(const loom_gemm_bf16 *g) {
    return g->n;
}

int loom_gemm_bf16_is_widened(const loom_gemm_bf16 *g) {
    return g->widened != NULL;
}

size_t loom_gemm_bf16_unprepared_calls(const loom_gemm_bf16 *g) {
    return g->unprepared_calls;
}

loom_status loom_gemm_bf16_status(const loom_gemm_bf16 *g, loom_error *err) {
    if (!g->first_status) return LOOM_OK;
    return loom_error_set(err, g->first_status, "%s", g->first_error);
}
