/* LOOM_BF16_ROUND_TP (model.h's round_tp): one bf16 process that rounds what tensor
 * parallelism over R ranks sends under --precision bf16 (tp/tp.h's loom_tp_reduce_linear),
 * the tests' reference for it. Each row-parallel linear's output and each column-parallel
 * linear's input gradient is computed as R partial GEMMs over the pieces rank r would hold
 * (row-parallel: its contiguous columns of the input and the weight; column-parallel: its
 * slice of each of the output's sections, i.e. its rows of the weight), each partial sum
 * rounded to bf16 and the pieces added in fp32 in rank order; `R,sum` also rounds the sum
 * (tp without sequence parallelism all-gathers it in bf16). The partial GEMMs' shapes are
 * prepared on first use, so they run the primitives the tp ranks run. Every family whose
 * blocks use model/tp_linear.c's linears: gpt2 and the dit (qkv as three sections of
 * d_model, one fc), llama and the vlm's Llama decoder (q, k, v sections, gate and up); the
 * dit's other linears and the vlm's encoder and projector are replicated over tp (no
 * message), and a dit has no vocabulary-parallel head. */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_bf16.h"
#include "kernels/bf16.h"
#include "model/model_impl.h"

/* gpt2 and the dit: qkv as three sections of d_model and one fc; llama and the vlm: q, k, v
 * sections of heads and the fc's gate and up */
static int fused_qkv(const loom_model_config *c) {
    return c->family == LOOM_FAMILY_GPT2 || c->family == LOOM_FAMILY_DIT;
}

loom_status loom_model_round_tp_open(loom_model *m, loom_error *err) {
    const char *s = getenv("LOOM_BF16_ROUND_TP");
    if (!s || loom_backend_precision(m->be) != LOOM_PRECISION_BF16) return LOOM_OK;
    char *end;
    const long R = strtol(s, &end, 10);
    const loom_model_config *c = &m->cfg;
    const int hd = c->d_model / c->n_head, gpt2 = fused_qkv(c);
    const int A = c->n_head * hd, QKV = gpt2 ? 3 * c->d_model : (c->n_head + 2 * c->n_kv_head) * hd;
    const int FC = gpt2 ? c->d_ff : 2 * c->d_ff;
    const int V = c->family == LOOM_FAMILY_DIT ? 0 : c->vocab_size; /* the head's width */
    if (end == s || R < 2 || (*end && strcmp(end, ",sum")) || m->be->device != LOOM_DEVICE_CPU ||
        c->n_experts > 0 || (m->tp && m->tp->size > 1) || c->n_head % R || c->n_kv_head % R ||
        c->d_ff % R || V % R || QKV == FC || QKV == V || FC == V)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "LOOM_BF16_ROUND_TP '%s': expected R or R,sum (R >= 2 dividing the heads, d_ff and "
            "the vocabulary), one CPU process, a model without experts (gpt2, llama, dit or "
            "vlm) with distinct qkv, fc and vocabulary widths",
            s);
    m->round_tp = (int)R;
    m->round_tp_sum = *end != 0;
    int widest = A > FC ? A : FC;
    if (QKV > widest) widest = QKV;
    if (V > widest) widest = V;
    const size_t N = (size_t)m->B * m->T, C = (size_t)c->d_model, W = (size_t)widest;
    /* a partial input [N, W] (fp32 or bf16), a partial weight [W, C], a partial sum [N, C] */
    m->round_tp_scratch = malloc((N * W + W * C + N * C) * sizeof(float));
    if (!m->round_tp_scratch)
        return loom_error_set(err, LOOM_ERR_NOMEM, "LOOM_BF16_ROUND_TP: out of memory");
    return LOOM_OK;
}

void loom_model_round_tp_close(loom_model *m) {
    free(m->round_tp_scratch);
    m->round_tp_scratch = NULL;
    m->round_tp = 0;
}

/* dst = src's n weights as the linear ops read them: from the step's bf16 copy when it holds
 * them (--bf16-rounding stochastic rounds there; a slice copied here would be rounded per
 * call, to nearest), else the fp32 master (rounded per call, as the whole weight is). */
static void weight_slice(const loom_model *m, float *dst, const float *src, size_t n) {
    const loom_bf16 *copy = loom_backend_cpu_bf16_weight_copy_of(m->be, src, n);
    if (!copy) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_to_f32(copy[i]);
}

/* sum (+)= round(part): the rank-order sum of the rounded partial sums */
static void add_rounded(float *sum, float *part, size_t n, int first) {
    for (size_t i = 0; i < n; i++) {
        const float r = loom_bf16_to_f32(loom_bf16_from_f32(part[i]));
        sum[i] = first ? r : sum[i] + r;
    }
}

static void finish(const loom_model *m, float *sum, size_t n) {
    if (m->round_tp_sum)
        for (size_t i = 0; i < n; i++) sum[i] = loom_bf16_to_f32(loom_bf16_from_f32(sum[i]));
}

loom_status loom_model_round_tp_row_forward(loom_model *m, float *out, loom_act inp, const float *w,
                                            const float *b, int IC) {
    const int R = m->round_tp, N = m->B * m->T, C = m->cfg.d_model, K = IC / R;
    float *xs = m->round_tp_scratch, *ws = xs + (size_t)N * IC, *part = ws + (size_t)IC * C;
    loom_status st = loom_backend_linear_prepare(m->be, N, K, C, m->tp ? m->tp->err : NULL);
    for (int r = 0; r < R && !st; r++) {
        for (int n = 0; n < N; n++) {
            if (inp.bf16)
                memcpy((loom_bf16 *)xs + (size_t)n * K, inp.bf16 + (size_t)n * IC + (size_t)r * K,
                       (size_t)K * sizeof(loom_bf16));
            else
                memcpy(xs + (size_t)n * K, inp.f32 + (size_t)n * IC + (size_t)r * K,
                       (size_t)K * sizeof(float));
        }
        for (int o = 0; o < C; o++)
            weight_slice(m, ws + (size_t)o * K, w + (size_t)o * IC + (size_t)r * K, (size_t)K);
        const float *bias = r == 0 ? b : NULL;
        if (inp.bf16)
            loom_backend_linear_forward_in_bf16(m->be, part, (const loom_bf16 *)xs, ws, bias, N, K,
                                                C);
        else
            loom_backend_linear_forward(m->be, part, xs, ws, bias, N, K, C);
        add_rounded(out, part, (size_t)N * C, r == 0);
    }
    finish(m, out, (size_t)N * C);
    return st;
}

/* The output's sections of a column-parallel linear of width OC (each split over the ranks). */
static int sections(const loom_model *m, int OC, int sec[3]) {
    const loom_model_config *c = &m->cfg;
    const int hd = c->d_model / c->n_head, gpt2 = fused_qkv(c);
    if (OC == (gpt2 ? 3 * c->d_model : (c->n_head + 2 * c->n_kv_head) * hd)) {
        sec[0] = gpt2 ? c->d_model : c->n_head * hd;
        sec[1] = sec[2] = gpt2 ? c->d_model : c->n_kv_head * hd;
        return 3;
    }
    if (!gpt2 && OC == 2 * c->d_ff) { /* gate, up */
        sec[0] = sec[1] = c->d_ff;
        return 2;
    }
    sec[0] = OC; /* gpt2's and the dit's fc, the head */
    return 1;
}

loom_status loom_model_round_tp_column_input(loom_model *m, float *dx, loom_act dy, const float *w,
                                             int OC) {
    const int R = m->round_tp, N = m->B * m->T, C = m->cfg.d_model, K = OC / R;
    int sec[3];
    const int S = sections(m, OC, sec);
    float *ys = m->round_tp_scratch, *ws = ys + (size_t)N * OC, *part = ws + (size_t)OC * C;
    loom_status st = loom_backend_linear_prepare(m->be, N, C, K, m->tp ? m->tp->err : NULL);
    for (int r = 0; r < R && !st; r++) {
        /* rank r's columns of dy and rows of w: its slice of each section, back to back */
        for (int s = 0, at = 0, col = 0; s < S; at += sec[s], s++) {
            const int k = sec[s] / R, from = at + r * k;
            for (int n = 0; n < N; n++) {
                if (dy.bf16)
                    memcpy((loom_bf16 *)ys + (size_t)n * K + col, dy.bf16 + (size_t)n * OC + from,
                           (size_t)k * sizeof(loom_bf16));
                else
                    memcpy(ys + (size_t)n * K + col, dy.f32 + (size_t)n * OC + from,
                           (size_t)k * sizeof(float));
            }
            weight_slice(m, ws + (size_t)col * C, w + (size_t)from * C, (size_t)k * C);
            col += k;
        }
        loom_backend_memset(m->be, part, 0, (size_t)N * C * sizeof(float));
        if (dy.bf16) /* the one-rank head's bf16 d(logits): the same bits as fp32 ones */
            loom_backend_linear_backward_input_dbf16(m->be, part, (const loom_bf16 *)ys, ws, N, C,
                                                     K);
        else
            loom_backend_linear_backward_input(m->be, part, ys, ws, N, C, K);
        add_rounded(dx, part, (size_t)N * C, r == 0);
    }
    finish(m, dx, (size_t)N * C);
    return st;
}
