/* The CPU backend with bf16 GEMMs (kernels/backend.h: loom_backend_cpu_bf16_open): the CPU
 * table, whose linear ops are replaced by oneDNN bf16 matmuls (kernels/cpu/gemm_bf16.c).
 * The fp32-signature linear ops round their operands to bf16 (nearest even) into this
 * backend's buffers and call the bf16 ones, so rounding happens exactly at the GEMM
 * inputs: the activations and weights of the forward, the output gradient and the weight
 * (input gradient), the output gradient and the saved input (weight gradient). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/backend.h"
#include "kernels/backend_bf16.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/kernels.h"

typedef struct {
    loom_gemm_bf16 *gemm;
    loom_bf16 *a, *b; /* rounded operands: the GEMM's A and B */
    size_t a_cap, b_cap;
    /* the weights' compute copy (loom_backend_cpu_bf16_weight_copy), and how often the
     * linear ops read it or rounded a weight per call while it existed */
    const float *w_base;
    loom_bf16 *w_copy;
    size_t w_n, w_copied, w_rounded;
    size_t w_bytes, w_resident; /* its mapping; the elements expected resident */
    int w_valid;
} bf16_ctx;

static bf16_ctx *ctx_of(const loom_backend *be) {
    return (bf16_ctx *)be->ctx;
}

/* Grows a conversion buffer. Set-up (linear_prepare) sizes both for every prepared shape,
 * so in a step this only allocates for shapes nobody prepared (MoE experts' counts). */
static loom_bf16 *ensure(loom_bf16 **buf, size_t *cap, size_t n) {
    if (n <= *cap) return *buf;
    size_t bytes = (n * sizeof(loom_bf16) + 63) / 64 * 64;
    loom_bf16 *p = aligned_alloc(64, bytes);
    if (!p) return NULL;
    free(*buf);
    *buf = p, *cap = n;
    return p;
}

static void seed_rows(float *out, const float *bias, int N, int OC) {
    if (!bias) {
        memset(out, 0, sizeof(float) * (size_t)N * OC);
        return;
    }
#pragma omp parallel for
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
}

static void linear_forward_bf16(const loom_backend *be, float *out, const loom_bf16 *inp,
                                const loom_bf16 *weight, const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    seed_rows(out, bias, N, OC);
    loom_gemm_bf16_run(ctx_of(be)->gemm, LOOM_GEMM_NT, N, OC, IC, out, inp, weight);
}

/* dout rounded into buffer a */
static const loom_bf16 *round_dout(bf16_ctx *c, const float *dout, size_t n) {
    loom_bf16 *a = ensure(&c->a, &c->a_cap, n);
    if (a) loom_bf16_from_f32_n(a, dout, n);
    return a;
}

static void linear_backward_input_bf16(const loom_backend *be, float *dinp, const float *dout,
                                       const loom_bf16 *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    const loom_bf16 *d = round_dout(c, dout, (size_t)N * OC);
    if (d) loom_gemm_bf16_run(c->gemm, LOOM_GEMM_NN, N, IC, OC, dinp, d, weight);
}

static void linear_backward_weight_bf16(const loom_backend *be, float *dweight, float *dbias,
                                        const float *dout, const loom_bf16 *inp, int N, int IC,
                                        int OC) {
    if (N <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    if (IC > 0) {
        const loom_bf16 *d = round_dout(c, dout, (size_t)N * OC);
        if (d) loom_gemm_bf16_run(c->gemm, LOOM_GEMM_TN, OC, IC, N, dweight, d, inp);
    }
    /* the bias gradient is the fp32 kernel's (column sums of fp32 dout, in double) */
    if (dbias) loom_linear_backward_weight(NULL, dbias, dout, NULL, N, 0, OC);
}

/* ---- the fp32 signatures: round, then the bf16 ops ---- */
static const loom_bf16 *round_into(loom_bf16 **buf, size_t *cap, const float *x, size_t n) {
    loom_bf16 *p = ensure(buf, cap, n);
    if (p) loom_bf16_from_f32_n(p, x, n);
    return p;
}

/* A weight operand: its slice of the compute copy, or rounded now into buffer b. */
static const loom_bf16 *weight_operand(bf16_ctx *c, const float *w, size_t n) {
    if (c->w_copy && c->w_valid && w >= c->w_base && w + n <= c->w_base + c->w_n) {
        c->w_copied++;
        return c->w_copy + (w - c->w_base);
    }
    if (c->w_copy) c->w_rounded++;
    return round_into(&c->b, &c->b_cap, w, n);
}

static void linear_forward(const loom_backend *be, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    if (IC <= 0) {
        seed_rows(out, bias, N, OC);
        return;
    }
    const loom_bf16 *a = round_into(&c->a, &c->a_cap, inp, (size_t)N * IC);
    const loom_bf16 *b = weight_operand(c, weight, (size_t)OC * IC);
    if (a && b) linear_forward_bf16(be, out, a, b, bias, N, IC, OC);
}

/* A bf16 activation (kept by the model, rounded by round_bf16 below) as the input: the
 * same GEMM on the same bits as linear_forward on its fp32 value. */
static void linear_forward_in_bf16(const loom_backend *be, float *out, const loom_bf16 *inp,
                                   const float *weight, const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC <= 0) {
        seed_rows(out, bias, N, OC);
        return;
    }
    const loom_bf16 *b = weight_operand(ctx_of(be), weight, (size_t)OC * IC);
    if (b) linear_forward_bf16(be, out, inp, b, bias, N, IC, OC);
}

static void round_bf16(const loom_backend *be, loom_bf16 *dst, const float *src, size_t n) {
    (void)be;
    loom_bf16_from_f32_n(dst, src, n);
}

static void linear_backward_input(const loom_backend *be, float *dinp, const float *dout,
                                  const float *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    const loom_bf16 *b = weight_operand(c, weight, (size_t)OC * IC);
    if (b) linear_backward_input_bf16(be, dinp, dout, b, N, IC, OC);
}

static void linear_backward_weight(const loom_backend *be, float *dweight, float *dbias,
                                   const float *dout, const float *inp, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    const loom_bf16 *b = IC > 0 ? round_into(&c->b, &c->b_cap, inp, (size_t)N * IC) : NULL;
    if (IC <= 0 || b) linear_backward_weight_bf16(be, dweight, dbias, dout, b, N, IC, OC);
}

/* ---- the LM head's logits in bf16 (docs/precision.md) ---- */
static void linear_forward_out_bf16(const loom_backend *be, loom_bf16 *out, const float *inp,
                                    const loom_bf16 *inp16, const float *weight, int N, int IC,
                                    int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    const loom_bf16 *a = inp16 ? inp16 : round_into(&c->a, &c->a_cap, inp, (size_t)N * IC);
    const loom_bf16 *b = weight_operand(c, weight, (size_t)OC * IC);
    if (a && b) loom_gemm_bf16_run(c->gemm, LOOM_GEMM_NT_OUT_BF16, N, OC, IC, out, a, b);
}

static void linear_backward_input_dbf16(const loom_backend *be, float *dinp, const loom_bf16 *dout,
                                        const float *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    const loom_bf16 *b = weight_operand(c, weight, (size_t)OC * IC);
    if (b) loom_gemm_bf16_run(c->gemm, LOOM_GEMM_NN, N, IC, OC, dinp, dout, b);
}

static void linear_backward_weight_dbf16(const loom_backend *be, float *dweight,
                                         const loom_bf16 *dout, const float *inp,
                                         const loom_bf16 *inp16, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    bf16_ctx *c = ctx_of(be);
    const loom_bf16 *b = inp16 ? inp16 : round_into(&c->b, &c->b_cap, inp, (size_t)N * IC);
    if (b) loom_gemm_bf16_run(c->gemm, LOOM_GEMM_TN, OC, IC, N, dweight, dout, b);
}

/* The head's three GEMMs; its operand buffers hold only the input and the weight (the
 * logits and dlogits are bf16 already: nothing of N x OC is rounded per call). */
static loom_status linear_prepare_out_bf16(const loom_backend *be, int N, int IC, int OC,
                                           loom_error *err) {
    if (N <= 0 || IC <= 0 || OC <= 0) return LOOM_OK;
    bf16_ctx *c = ctx_of(be);
    loom_status st;
    if ((st = loom_gemm_bf16_prepare(c->gemm, LOOM_GEMM_NT_OUT_BF16, N, OC, IC, err)) ||
        (st = loom_gemm_bf16_prepare(c->gemm, LOOM_GEMM_NN, N, IC, OC, err)) ||
        (st = loom_gemm_bf16_prepare(c->gemm, LOOM_GEMM_TN, OC, IC, N, err)))
        return st;
    size_t nw = (size_t)OC * IC, nb = (size_t)N * IC;
    if (!ensure(&c->a, &c->a_cap, nb) || !ensure(&c->b, &c->b_cap, nw > nb ? nw : nb))
        return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 operand buffers: out of memory");
    return LOOM_OK;
}

static void crossentropy_forward_bf16(const loom_backend *be, float *losses,
                                      const loom_bf16 *logits, const int32_t *targets, int N,
                                      int V) {
    (void)be;
    loom_crossentropy_forward_bf16(losses, logits, targets, N, V);
}

static void crossentropy_forward_backward_bf16(const loom_backend *be, float *losses,
                                               loom_bf16 *logits, const int32_t *targets, int N,
                                               int V, float dloss) {
    (void)be;
    loom_crossentropy_forward_backward_bf16(losses, logits, targets, N, V, dloss);
}

static loom_status linear_prepare(const loom_backend *be, int N, int IC, int OC, loom_error *err) {
    if (N <= 0 || IC <= 0 || OC <= 0) return LOOM_OK;
    bf16_ctx *c = ctx_of(be);
    loom_status st;
    if ((st = loom_gemm_bf16_prepare(c->gemm, LOOM_GEMM_NT, N, OC, IC, err)) ||
        (st = loom_gemm_bf16_prepare(c->gemm, LOOM_GEMM_NN, N, IC, OC, err)) ||
        (st = loom_gemm_bf16_prepare(c->gemm, LOOM_GEMM_TN, OC, IC, N, err)))
        return st;
    size_t na = (size_t)N * (IC > OC ? IC : OC), nw = (size_t)OC * IC, nb = (size_t)N * IC;
    if (!ensure(&c->a, &c->a_cap, na) || !ensure(&c->b, &c->b_cap, nw > nb ? nw : nb))
        return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 operand buffers: out of memory");
    return LOOM_OK;
}

static loom_status bf16_status(const loom_backend *be, loom_error *err) {
    return loom_gemm_bf16_status(ctx_of(be)->gemm, err);
}

static void round_bf16_values(const loom_backend *be, float *x, size_t n) {
    (void)be;
#pragma omp parallel for
    for (size_t i0 = 0; i0 < n; i0 += 1024) {
        loom_bf16 h[1024];
        const size_t k = n - i0 < 1024 ? n - i0 : 1024;
        loom_bf16_from_f32_n(h, x + i0, k);
        loom_bf16_to_f32_n(x + i0, h, k);
    }
}

/* ---- the MLP's pre-activation and attention's qkv in bf16 (docs/precision.md) ---- */
static void gelu_forward_in_bf16(const loom_backend *be, float *out, const loom_bf16 *inp,
                                 size_t n) {
    (void)be;
    loom_gelu_forward_bf16(out, inp, n);
}

static void gelu_backward_in_bf16(const loom_backend *be, float *dinp, const loom_bf16 *inp,
                                  const float *dout, size_t n) {
    (void)be;
    loom_gelu_backward_bf16(dinp, inp, dout, n);
}

static void swiglu_forward_in_bf16(const loom_backend *be, float *out, const loom_bf16 *inp, int N,
                                   int F) {
    (void)be;
    loom_swiglu_forward_bf16(out, inp, N, F);
}

static void swiglu_backward_in_bf16(const loom_backend *be, float *dinp, const float *dout,
                                    const loom_bf16 *inp, int N, int F) {
    (void)be;
    loom_swiglu_backward_bf16(dinp, dout, inp, N, F);
}

static void widen_bf16(const loom_backend *be, float *dst, const loom_bf16 *src, size_t n) {
    (void)be;
    loom_bf16_to_f32_n(dst, src, n);
}

static void gelu_backward_in_bf16_inplace(const loom_backend *be, float *d, const loom_bf16 *inp,
                                          size_t n) {
    (void)be;
    loom_gelu_backward_bf16_inplace(d, inp, n);
}

static size_t attention_scratch_floats_bf16(const loom_backend *be, int T, int hd) {
    (void)be;
    return loom_attention_scratch_floats_bf16(T, hd);
}

static void attention_backward_in_bf16(const loom_backend *be, float *dqkv, float *scratch,
                                       const float *dout, const loom_bf16 *qkv,
                                       const loom_bf16 *out, const float *lse, int B, int T, int H,
                                       int KV, int hd) {
    (void)be;
    loom_attention_backward_bf16(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, hd);
}

static loom_backend_ops bf16_ops;

/* The ops that decide which activations the model keeps in bf16 (loom_backend_bf16_
 * activations, loom_backend_bf16_logits): LOOM_BF16_FP32_ACTIVATIONS=1 in the environment
 * keeps the GEMM-only activations in fp32 as before they were bf16 (the tests' reference:
 * the same bits, twice the bytes; docs/precision.md); the logits are bf16 either way. */
static void set_activation_ops(loom_backend_ops *o) {
    const char *fp32_acts = getenv("LOOM_BF16_FP32_ACTIVATIONS");
    const int keep_fp32 = fp32_acts && fp32_acts[0] == '1';
    o->linear_forward_in_bf16 = keep_fp32 ? NULL : linear_forward_in_bf16;
    o->round_bf16 = keep_fp32 ? NULL : round_bf16;
    o->gelu_forward_in_bf16 = keep_fp32 ? NULL : gelu_forward_in_bf16;
    o->gelu_backward_in_bf16 = keep_fp32 ? NULL : gelu_backward_in_bf16;
    o->swiglu_forward_in_bf16 = keep_fp32 ? NULL : swiglu_forward_in_bf16;
    o->swiglu_backward_in_bf16 = keep_fp32 ? NULL : swiglu_backward_in_bf16;
    o->widen_bf16 = keep_fp32 ? NULL : widen_bf16;
    o->gelu_backward_in_bf16_inplace = keep_fp32 ? NULL : gelu_backward_in_bf16_inplace;
    o->attention_scratch_floats_bf16 = keep_fp32 ? NULL : attention_scratch_floats_bf16;
    o->attention_backward_in_bf16 = keep_fp32 ? NULL : attention_backward_in_bf16;
    o->linear_forward_out_bf16 = linear_forward_out_bf16;
    o->linear_backward_input_dbf16 = linear_backward_input_dbf16;
    o->linear_backward_weight_dbf16 = linear_backward_weight_dbf16;
    o->linear_prepare_out_bf16 = linear_prepare_out_bf16;
    o->crossentropy_forward_bf16 = crossentropy_forward_bf16;
    o->crossentropy_forward_backward_bf16 = crossentropy_forward_backward_bf16;
    o->round_bf16_values = round_bf16_values;
}

loom_status loom_backend_cpu_bf16_open(const loom_backend **out, loom_error *err) {
    *out = NULL;
    loom_gemm_bf16 *gemm = NULL;
    loom_status st = loom_gemm_bf16_create(&gemm, err);
    if (st) return st;
    loom_backend *be = calloc(1, sizeof *be);
    bf16_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        loom_gemm_bf16_destroy(gemm);
        return loom_error_set(err, LOOM_ERR_NOMEM, "bf16 backend: out of memory");
    }
    const loom_backend *cpu = loom_backend_cpu();
    bf16_ops = *cpu->ops; /* the same table each time: every op the CPU's but these */
    bf16_ops.status = bf16_status;
    bf16_ops.linear_forward = linear_forward;
    bf16_ops.linear_backward_input = linear_backward_input;
    bf16_ops.linear_backward_weight = linear_backward_weight;
    bf16_ops.linear_backward_weight_ld = NULL; /* fp32 only: bf16 computes it whole */
    bf16_ops.linear_forward_bf16 = linear_forward_bf16;
    bf16_ops.linear_backward_input_bf16 = linear_backward_input_bf16;
    bf16_ops.linear_backward_weight_bf16 = linear_backward_weight_bf16;
    set_activation_ops(&bf16_ops);
    bf16_ops.linear_prepare = linear_prepare;
    bf16_ops.linear_precision = LOOM_PRECISION_BF16;
    c->gemm = gemm;
    *be = *cpu;
    be->ops = &bf16_ops;
    be->ctx = c;
    *out = be;
    return LOOM_OK;
}

static loom_backend_ops sizing_ops;
static loom_backend sizing_backend;

const loom_backend *loom_backend_cpu_bf16_sizing(void) {
    const loom_backend *cpu = loom_backend_cpu();
    sizing_ops = *cpu->ops; /* never run: the model only asks which activations are bf16 */
    set_activation_ops(&sizing_ops);
    sizing_ops.linear_precision = LOOM_PRECISION_BF16;
    sizing_backend = *cpu;
    sizing_backend.ops = &sizing_ops;
    sizing_backend.ctx = NULL;
    return &sizing_backend;
}

void loom_backend_cpu_bf16_close(const loom_backend *be) {
    if (!be || loom_backend_precision(be) != LOOM_PRECISION_BF16 || be->device != LOOM_DEVICE_CPU ||
        !be->ctx) /* the sizing table: static, nothing to free */
        return;
    bf16_ctx *c = ctx_of(be);
    loom_gemm_bf16_destroy(c->gemm);
    if (c->w_copy) munmap(c->w_copy, c->w_bytes);
    free(c->a), free(c->b), free(c);
    free((loom_backend *)be);
}

void loom_backend_cpu_bf16_describe(const loom_backend *be, char *buf, size_t size) {
    bf16_ctx *c = ctx_of(be);
    int k =
        loom_gemm_bf16_is_widened(c->gemm)
            ? snprintf(buf, size,
                       "bf16 matmul widened to fp32 for OpenBLAS sgemm (this CPU has no "
                       "AVX512-BF16 or AMX-BF16: bf16's numerics and bytes at fp32's speed), "
                       "%zu shapes prepared, %zu calls unprepared",
                       loom_gemm_bf16_prepared(c->gemm), loom_gemm_bf16_unprepared_calls(c->gemm))
            : snprintf(buf, size,
                       "oneDNN %d.%d bf16 matmul %s, %zu shapes prepared, %zu calls unprepared",
                       (int)dnnl_version()->major, (int)dnnl_version()->minor,
                       loom_gemm_bf16_impl(c->gemm), loom_gemm_bf16_prepared(c->gemm),
                       loom_gemm_bf16_unprepared_calls(c->gemm));
    if (c->w_copy && k > 0 && (size_t)k < size)
        snprintf(buf + k, size - (size_t)k,
                 "; weights: %zu reads of the step's bf16 copy, %zu rounded per call", c->w_copied,
                 c->w_rounded);
}

loom_bf16 *loom_backend_cpu_bf16_weight_copy(const loom_backend *be, const float *base, size_t n) {
    bf16_ctx *c = ctx_of(be);
    if (!c->w_copy) {
        /* anonymous pages: zero, and resident only where written (ZeRO-3 writes the
         * gathered blocks' part and hands it back with them: train/compute_weights.h) */
        const size_t bytes = (n ? n : 1) * sizeof(loom_bf16);
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        c->w_copy = p;
        c->w_bytes = bytes;
        c->w_base = base;
        c->w_n = c->w_resident = n;
        c->w_valid = 0;
    }
    return c->w_copy;
}

const loom_bf16 *loom_backend_cpu_bf16_weight_copy_of(const loom_backend *be, const float *w,
                                                      size_t n) {
    const bf16_ctx *c = ctx_of(be);
    if (!c || !c->w_copy || !c->w_valid || w < c->w_base || w + n > c->w_base + c->w_n) return NULL;
    return c->w_copy + (w - c->w_base);
}

void loom_backend_cpu_bf16_weight_copy_valid(const loom_backend *be, int valid) {
    ctx_of(be)->w_valid = valid;
}

void loom_backend_cpu_bf16_weight_copy_resident(const loom_backend *be, size_t n) {
    ctx_of(be)->w_resident = n;
}

size_t loom_backend_cpu_bf16_bytes(const loom_backend *be) {
    bf16_ctx *c = ctx_of(be);
    return (c->a_cap + c->b_cap + (c->w_copy ? c->w_resident : 0)) * sizeof(loom_bf16);
}
