/* What context parallelism sends per step (plan/plan.h, docs/PLAN.md): the bytes rank 0
 * puts on the wire, counted as cp/ring.c and cp/ulysses.c count them for the run's end
 * line (`loom: context-parallel messages: ...`). */
#include <string.h>

#include "pipeline/pipeline.h"
#include "plan/plan.h"

loom_status loom_plan_cp_messages(const loom_model_config *mc, const loom_train_config *tc, int gpu,
                                  double *bf16, double *fp32, loom_error *err) {
    *bf16 = *fp32 = 0;
    const loom_layout l = tc->layout;
    const int n = l.cp > 1 ? l.cp : 1, tp = l.tp > 1 ? l.tp : 1, pp = l.pp > 1 ? l.pp : 1;
    const int dp = l.dp > 1 ? l.dp : 1;
    if (n < 2 || tc->micro_batch < 1) return LOOM_OK;
    /* rank 0's layers: pipeline stage 0's (its chunk of each virtual stage) */
    double layers = mc->n_layer;
    if (pp > 1) {
        int counts[LOOM_PP_MAX_STAGES * LOOM_MAX_CHUNKS];
        loom_pp_config pc;
        loom_train_config_pipeline(tc, &pc);
        loom_status st = loom_pipeline_split_layers(mc, &pc, counts, err);
        if (st) return st;
        const int v = tc->virtual_stages > 1 ? tc->virtual_stages : 1;
        layers = 0;
        for (int c = 0; c < v; c++) layers += counts[c * pp];
    }
    const double micro = (double)tc->global_batch / dp / tc->micro_batch;
    /* cp/cp.h's options: whole sequences of seq_len rows, B T / cp of them on each rank */
    const double rows = (double)tc->micro_batch * mc->seq_len / n;
    const double H = mc->n_head / tp, KV = mc->n_kv_head / tp, hd = mc->d_model / mc->n_head;
    /* bf16_qkv: every family on the CPU's bf16 backend (the one rounding qkv); bf16_grads:
     * the language models there (their blocks round attention's gradients) */
    const int wire16 = strcmp(tc->precision, "bf16") == 0 && !gpu;
    const int grads16 = wire16 && mc->family != LOOM_FAMILY_DIT;
    double fwd, bwd16, bwd32; /* elements of one layer's attention, one micro-batch */
    if (strcmp(tc->cp_mode, "ulysses") != 0) {
        /* the ring: cp - 1 key/value blocks forward and again backward, and cp dK/dV shares */
        const double kv = rows * 2 * KV * hd;
        fwd = (n - 1) * kv, bwd16 = (n - 1) * kv, bwd32 = n * kv;
    } else {
        /* Ulysses: each all-to-all keeps 1/cp of its message; qkv (KV heads replicated
         * when fewer than cp) and the output forward; backward qkv and the output again
         * (bf16), d(out) (bf16 with grads16) and dqkv (bf16 with grads16 and no replicated
         * head, else fp32 sums) */
        const double Hn = H / n, KVr = KV >= n ? KV / n : 1;
        const double qkv = (n - 1) * rows * (Hn + 2 * KVr) * hd, out = (n - 1) * rows * Hn * hd;
        const int dqkv16 = grads16 && KV >= n;
        fwd = qkv + out, bwd16 = qkv + out + (grads16 ? out : 0) + (dqkv16 ? qkv : 0);
        bwd32 = (grads16 ? 0 : out) + (dqkv16 ? 0 : qkv);
    }
    if (tc->recompute) fwd *= 2; /* full and selective recomputation rerun attention */
    const double each = layers * micro;
    if (wire16) {
        *bf16 = each * 2 * (fwd + bwd16);
        *fp32 = each * 4 * bwd32;
    } else {
        *fp32 = each * 4 * (fwd + bwd16 + bwd32);
    }
    return LOOM_OK;
}
