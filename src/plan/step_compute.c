/* loom plan's step-time model, the compute pricers (plan/step_time_impl.h): the shapes on
 * one rank, and the kernels of every piece of forward and backward at their shapes (the
 * transformer's GEMMs, attention, norms, activations, memsets, the loss; MoE's router,
 * dispatch and experts; tensor and context parallelism's collectives, blocking on the
 * critical path; a vlm's encoder and projector). */
#include "plan/step_time_impl.h"

#include <math.h>
#include <string.h>

#include "model/vlm.h"

shapes loom_price_shapes(const loom_model_config *mc, const loom_train_config *tc, int split,
                         double moe_load_max) {
    shapes d;
    memset(&d, 0, sizeof d);
    const loom_layout l = tc->layout;
    d.gpt2 = mc->family == LOOM_FAMILY_GPT2;
    d.tp = l.tp > 1 ? l.tp : 1;
    d.cp = l.cp > 1 ? l.cp : 1;
    d.ep = l.ep > 1 ? l.ep : 1;
    d.sp = d.tp > 1 && tc->sequence_parallel;
    d.recompute = tc->recompute;
    d.split = split;
    d.B = tc->micro_batch;
    d.T = (double)mc->seq_len / d.cp;
    d.N = d.B * d.T;
    d.Ns = d.sp ? d.N / d.tp : d.N;
    d.C = mc->d_model;
    d.hd = (double)mc->d_model / mc->n_head;
    d.H = (double)mc->n_head / d.tp;
    d.KV = (double)mc->n_kv_head / d.tp;
    d.A = d.H * d.hd;
    d.QKV = (d.H + 2 * d.KV) * d.hd;
    d.F = (double)mc->d_ff / d.tp;
    d.FC = d.gpt2 ? d.F : 2 * d.F;
    d.V = (double)mc->vocab_size / d.tp;
    if (mc->n_experts > 0) {
        d.E = mc->n_experts;
        d.K = mc->top_k;
        d.EL = d.E / d.ep;
        /* Routing: the busiest expert gets R times the mean N K / E rows from each ep
         * rank, the other E - 1 share the rest evenly (R = 1: balanced); at most the
         * capacity from each. The all-to-all makes every ep rank wait for the one holding
         * the busiest expert, so that rank's experts are the step's. */
        double R = moe_load_max > 1 ? moe_load_max : 1;
        if (R > d.E / d.K) R = d.E / d.K; /* an expert takes at most every token */
        const double mean = d.N * d.K / d.E;
        double busiest = R * mean, other = d.E > 1 ? (d.E - R) / (d.E - 1) * mean : mean;
        if (mc->capacity_factor > 0) {
            const double cap = ceil(mc->capacity_factor * d.N * d.K / d.E);
            if (cap < busiest) busiest = cap;
            if (cap < other) other = cap;
        }
        d.rows_busiest = busiest * d.ep;
        d.rows_other = other * d.ep;
        d.shared_expert = mc->shared_expert;
        d.chunks = tc->moe_chunks > 1 ? tc->moe_chunks : 1;
        d.moe_bf16 = strcmp(tc->precision, "bf16") == 0;
    }
    if (d.cp > 1) {
        d.cp_ring = strcmp(tc->cp_mode, "ulysses") != 0;
        d.cp_chunks = d.cp_ring ? 2 : 1; /* the ring's zigzag split */
        d.cp_chunk = d.T / d.cp_chunks;
        d.cp_bf16 = strcmp(tc->precision, "bf16") == 0;
    }
    if (mc->family == LOOM_FAMILY_VLM) {
        d.vlm = 1;
        d.freeze = mc->freeze;
        /* every sample holds max_images images; with context parallelism an image's rows
         * span the ranks and each rank holding some encodes it (model/vlm.c) */
        d.NI = d.B * mc->max_images;
        d.P = loom_vlm_image_tokens(mc);
        d.Pin = (double)mc->channels * mc->patch * mc->patch;
        d.VL = mc->vit_layers;
        d.Dv = mc->vit_d_model;
        d.Fv = mc->vit_d_ff;
        d.Hv = mc->vit_n_head;
        d.vhd = mc->vit_n_head > 0 ? d.Dv / mc->vit_n_head : 0;
        /* --freeze llm: the decoder's backward runs its input-gradient half only */
        if (mc->freeze & LOOM_VLM_PART_LLM) d.split = 1;
    }
    return d;
}

/* ---- the kernels of the pieces ---- */

static double norm_fwd(pricer *q, const shapes *d) {
    return ew(q, d->gpt2 ? LOOM_EW_LAYERNORM_FWD : LOOM_EW_RMSNORM_FWD, d->Ns, d->C);
}
static double norm_bwd(pricer *q, const shapes *d) {
    return ew(q, d->gpt2 ? LOOM_EW_LAYERNORM_BWD : LOOM_EW_RMSNORM_BWD, d->Ns, d->C);
}
/* sequence parallelism's all-gather of the residual stream (before a column linear) */
static double sp_gather(pricer *q, const shapes *d) {
    return d->sp ? coll(q, LOOM_COLL_ALLGATHER, d->tp, 1, 4 * d->N * d->C) : 0;
}
/* the row-parallel linears' sum: all-reduce, or reduce-scatter with sequence parallelism */
static double tp_reduce(pricer *q, const shapes *d) {
    if (d->tp < 2) return 0;
    return coll(q, d->sp ? LOOM_COLL_REDUCE_SCATTER : LOOM_COLL_ALLREDUCE, d->tp, 1,
                4 * d->N * d->C);
}

/* The linears' messages under --precision bf16 (tp/tp.h's _linear calls): sequence
 * parallelism's all-gather of a bf16 GEMM's input in bf16 (d(out) of a biased linear stays
 * fp32: its bias gradient reads it), and the sums as a bf16 all-to-all, plus a bf16
 * all-gather of the summed rows without sequence parallelism. */
static double sp_gather_gemm(pricer *q, const shapes *d, int bias) {
    if (!q->bf16 || bias) return sp_gather(q, d);
    return d->sp ? coll(q, LOOM_COLL_ALLGATHER, d->tp, 1, 2 * d->N * d->C) : 0;
}
static double tp_reduce_linear(pricer *q, const shapes *d) {
    if (d->tp < 2 || !q->bf16) return tp_reduce(q, d);
    const double bytes = 2 * d->N * d->C;
    return coll(q, LOOM_COLL_ALLTOALL, d->tp, 1, bytes) +
           (d->sp ? 0 : coll(q, LOOM_COLL_ALLGATHER, d->tp, 1, bytes));
}

static double rope(pricer *q, const shapes *d) {
    return d->gpt2 ? 0 : bytes_ms(q, 8 * d->N * (d->H + d->KV) * d->hd);
}

/* Bytes an element of the cp messages that carry bf16 values (the ring's K/V blocks,
 * Ulysses' qkv and output all-to-alls, and its d(out) and dqkv: the language models' blocks
 * round them, cp/cp.h's bf16_grads): 2 under --precision bf16 on the CPU's bf16 backend
 * (the one that rounds qkv: cp/cp.h's bf16_qkv), 4 otherwise; the ring's dK/dV are fp32. */
static double cp_wire(const pricer *q, const shapes *d) {
    return d->cp_bf16 && q->cpu ? 2 : 4;
}

/* Attention on this rank: the causal kernel, or context parallelism's (ring: the zigzag
 * blocks, each step's key/value transfer hidden behind the block it overlaps; Ulysses:
 * all-to-alls around the whole-sequence kernel on H/cp heads). */
static cost attention_cost(pricer *q, const shapes *d, int backward) {
    cost c = {0, 0, 0, 0};
    const double heads = d->B * d->H;
    if (d->cp < 2) {
        c.compute =
            attention(q, backward ? LOOM_ATT_CAUSAL_BWD : LOOM_ATT_CAUSAL_FWD, heads, d->T, d->hd);
        return c;
    }
    if (!d->cp_ring) {
        const double T = d->T * d->cp, h = d->B * d->H / d->cp;
        c.compute = attention(q, backward ? LOOM_ATT_CAUSAL_BWD : LOOM_ATT_CAUSAL_FWD, h, T, d->hd);
        /* qkv to heads, the output back (backward: the gradients the same way); bf16 under
         * --precision bf16, but dqkv with key/value heads replicated (fewer than cp):
         * partial sums, fp32 */
        const double w = cp_wire(q, d), wq = backward && d->KV < d->cp ? 4 : w;
        c.cp = coll(q, LOOM_COLL_ALLTOALL, d->cp, d->tp, wq * d->N * d->QKV) +
               coll(q, LOOM_COLL_ALLTOALL, d->cp, d->tp, w * d->N * d->A);
        return c;
    }
    /* The ring's zigzag: of the 2cp chunks' causal (chunk x chunk) blocks, each rank holds
     * 2cp - 1 full ones and two diagonal ones, over cp steps. */
    const double ch = d->cp_chunk, n = d->cp, full_blocks = 2 * n - 1;
    const double block =
        attention(q, backward ? LOOM_ATT_BLOCK_BWD : LOOM_ATT_BLOCK_FWD, heads, ch, d->hd);
    const double diag =
        attention(q, backward ? LOOM_ATT_CAUSAL_BWD : LOOM_ATT_CAUSAL_FWD, heads, ch, d->hd);
    const double merge = backward ? 0 : ew(q, LOOM_EW_BLOCK_MERGE, d->N, d->H * d->hd);
    c.compute = full_blocks * block + 2 * diag + (n - 1) * merge;
    /* per step: the next key/value block (backward: and the dK/dV share) in flight */
    const double kv = d->N * 2 * d->KV * d->hd;
    const double xfer = coll(q, LOOM_COLL_SENDRECV, d->cp, d->tp, cp_wire(q, d) * kv) +
                        (backward ? coll(q, LOOM_COLL_SENDRECV, d->cp, d->tp, 4 * kv) : 0);
    const double step_compute = c.compute / n;
    c.cp = (n - 1) * (xfer > step_compute ? xfer - step_compute : 0);
    if (backward) c.cp += xfer; /* the last dK/dV share to its owner */
    return c;
}

/* ---- MoE (model/moe.c) ---- */

static double ffn_fwd(pricer *q, const shapes *d, double n) {
    const double F = d->F * d->tp, FC = d->gpt2 ? F : 2 * F; /* experts are not split by tp */
    return gemm(q, LOOM_GEMM_NT, n, FC, d->C) +
           (d->gpt2 ? ew(q, LOOM_EW_GELU_FWD, n, F) : ew(q, LOOM_EW_SWIGLU_FWD, n, F)) +
           gemm(q, LOOM_GEMM_NT, n, d->C, F);
}
static double ffn_bwd_input(pricer *q, const shapes *d, double n) {
    const double F = d->F * d->tp, FC = d->gpt2 ? F : 2 * F;
    return memset_ms(q, n * F) + gemm(q, LOOM_GEMM_NN, n, F, d->C) + memset_ms(q, n * FC) +
           (d->gpt2 ? ew(q, LOOM_EW_GELU_BWD, n, F) : ew(q, LOOM_EW_SWIGLU_BWD, n, F)) +
           gemm(q, LOOM_GEMM_NN, n, d->C, FC);
}
static double ffn_bwd_weight(pricer *q, const shapes *d, double n) {
    const double F = d->F * d->tp, FC = d->gpt2 ? F : 2 * F;
    return gemm(q, LOOM_GEMM_TN, d->C, F, n) + gemm(q, LOOM_GEMM_TN, FC, d->C, n);
}

/* The chunked dispatch / experts / combine pipeline: chunk c + 1's dispatch and c - 1's
 * combine in flight while chunk c's experts run. dispatch_bytes, combine_bytes: of an
 * element of the rows each exchange moves (model/moe_dispatch.c: 2 for every dispatch and
 * combine under --precision bf16 on the CPU's bf16 backend; else 4). */
static double moe_exchange(pricer *q, const shapes *d, double experts_ms, double dispatch_bytes,
                           double combine_bytes) {
    if (d->ep < 2) return 0;
    const double rows = d->N * d->K; /* one rank's send buffer: its tokens' K rows */
    const double chunk = rows * d->C / d->chunks;
    const double a2a = coll(q, LOOM_COLL_ALLTOALL, d->ep, d->tp, dispatch_bytes * chunk) +
                       coll(q, LOOM_COLL_ALLTOALL, d->ep, d->tp, combine_bytes * chunk);
    const double counts = coll(q, LOOM_COLL_ALLTOALL, d->ep, d->tp, 4 * d->E);
    const double per_chunk = experts_ms / d->chunks, hidden = a2a - per_chunk;
    return counts + a2a + (d->chunks - 1) * (hidden > 0 ? hidden : 0);
}

static cost moe_fwd(pricer *q, const shapes *d) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, C = d->C, NK = d->N * d->K;
    const double experts =
        ffn_fwd(q, d, d->rows_busiest) + (d->EL - 1) * ffn_fwd(q, d, d->rows_other);
    c.compute = gemm(q, LOOM_GEMM_NT, N, d->E, C) + ew(q, LOOM_EW_CROSSENTROPY, N, d->E) +
                copy_ms(q, NK * C) /* permute */ + experts + copy_ms(q, NK * C) /* combine */;
    if (d->ep < 2) c.compute += 2 * copy_ms(q, NK * C); /* dispatch and combine in place */
    if (d->shared_expert) c.compute += ffn_fwd(q, d, N) + ew(q, LOOM_EW_ADD, N, C);
    const double wire = d->moe_bf16 && q->cpu ? 2 : 4;
    c.moe = moe_exchange(q, d, experts, wire, wire);
    return c;
}

static cost moe_bwd(pricer *q, const shapes *d, int weight_part) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, C = d->C, NK = d->N * d->K;
    const double nb = d->rows_busiest, no = d->rows_other, others = d->EL - 1;
    const double weights = ffn_bwd_weight(q, d, nb) + others * ffn_bwd_weight(q, d, no);
    if (weight_part) { /* W of split backward: the experts', router's, shared expert's */
        c.compute = weights + gemm(q, LOOM_GEMM_TN, d->E, C, N);
        if (d->shared_expert) c.compute += ffn_bwd_weight(q, d, N);
        return c;
    }
    double experts = ffn_bwd_input(q, d, nb) + others * ffn_bwd_input(q, d, no);
    if (!d->split) experts += weights;
    c.compute =
        2 * copy_ms(q, NK * C) /* combine backward */ + memset_ms(q, (nb + others * no) * C) +
        experts + memset_ms(q, N * C) + copy_ms(q, NK * C) /* unpermute */ +
        ew(q, LOOM_EW_CROSSENTROPY, N, d->E) /* router */ + gemm(q, LOOM_GEMM_NN, N, C, d->E) +
        (d->split ? 0 : gemm(q, LOOM_GEMM_TN, d->E, C, N));
    if (d->ep < 2) c.compute += 2 * copy_ms(q, NK * C);
    if (d->shared_expert)
        c.compute += ffn_bwd_input(q, d, N) + (d->split ? 0 : ffn_bwd_weight(q, d, N));
    /* the output gradients and the input gradients as bf16 (model/moe.c) */
    const double wire = d->moe_bf16 && q->cpu ? 2 : 4;
    c.moe = moe_exchange(q, d, experts, wire, wire);
    return c;
}

/* ---- a block, the embedding and the head (model/transformer.c, tp_linear.c) ---- */

cost loom_price_block_fwd(pricer *q, const shapes *d, int moe) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, Ns = d->Ns, C = d->C;
    c.compute = norm_fwd(q, d) + gemm(q, LOOM_GEMM_NT, N, d->QKV, C) + rope(q, d);
    c.tp = sp_gather_gemm(q, d, 0);
    add(&c, attention_cost(q, d, 0));
    c.compute += gemm(q, LOOM_GEMM_NT, N, C, d->A) + ew(q, LOOM_EW_ADD, Ns, C) + norm_fwd(q, d);
    c.tp += tp_reduce_linear(q, d) + (moe ? sp_gather(q, d) : sp_gather_gemm(q, d, 0));
    if (moe) {
        add(&c, moe_fwd(q, d));
        if (d->sp) c.compute += copy_ms(q, Ns * C);
    } else {
        c.compute +=
            gemm(q, LOOM_GEMM_NT, N, d->FC, C) +
            (d->gpt2 ? ew(q, LOOM_EW_GELU_FWD, N, d->F) : ew(q, LOOM_EW_SWIGLU_FWD, N, d->F)) +
            gemm(q, LOOM_GEMM_NT, N, C, d->F);
        c.tp += tp_reduce_linear(q, d);
    }
    c.compute += ew(q, LOOM_EW_ADD, Ns, C);
    return c;
}

/* What backward runs again before a block's backward (and before W): full recomputation
 * its whole forward, selective only attention (with context parallelism's passes) and
 * the MLP's activation (model/transformer.c's block_recompute_selective). */
cost loom_price_block_recompute(pricer *q, const shapes *d, int moe) {
    cost c = {0, 0, 0, 0};
    if (d->recompute == LOOM_RECOMPUTE_FULL) return loom_price_block_fwd(q, d, moe);
    if (d->recompute != LOOM_RECOMPUTE_SELECTIVE) return c;
    add(&c, attention_cost(q, d, 0));
    if (!moe)
        c.compute +=
            d->gpt2 ? ew(q, LOOM_EW_GELU_FWD, d->N, d->F) : ew(q, LOOM_EW_SWIGLU_FWD, d->N, d->F);
    return c;
}

/* A linear's weight gradient over `rows` input rows (TN: M = OC, N = IC, K = rows) and, for
 * a biased linear (GPT-2's, the vlm encoder's and projector's), the bias gradient's column
 * sums over d(out) (the profile's GEMM has none). */
static double weight_grad(pricer *q, double rows, double OC, double IC, int bias) {
    return gemm(q, LOOM_GEMM_TN, OC, IC, rows) + (bias ? bytes_ms(q, 4 * rows * OC) : 0);
}

/* A column-parallel linear's backward: input gradient (NN), weight gradient (TN, on the
 * gathered input), the input gradient's sum over tp. */
static cost column_bwd(pricer *q, const shapes *d, double OC, int input, int weight, int bias) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, C = d->C;
    if (input) {
        c.compute = memset_ms(q, N * C) + gemm(q, LOOM_GEMM_NN, N, C, OC);
        c.tp = tp_reduce_linear(q, d);
    }
    if (weight) {
        c.compute += weight_grad(q, N, OC, C, bias && d->gpt2);
        c.tp += sp_gather_gemm(q, d, 0);
    }
    return c;
}

/* Block backward: B (input gradients; with W inside unless split), or W alone. */
cost loom_price_block_bwd(pricer *q, const shapes *d, int moe, int weight_part) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, C = d->C;
    const int w = !d->split; /* weight gradients inside B */
    if (weight_part) {
        add(&c, loom_price_block_recompute(q, d, moe));
        if (moe) {
            c.tp += sp_gather(q, d);
            add(&c, moe_bwd(q, d, 1));
        } else {
            c.compute += weight_grad(q, N, C, d->F, d->gpt2);
            add(&c, column_bwd(q, d, d->FC, 0, 1, 1));
        }
        c.compute += weight_grad(q, N, C, d->A, d->gpt2);
        add(&c, column_bwd(q, d, d->QKV, 0, 1, 1));
        return c;
    }
    add(&c, loom_price_block_recompute(q, d, moe));
    if (moe) {
        if (d->sp) c.tp += 2 * sp_gather(q, d), c.compute += copy_ms(q, N * C);
        add(&c, moe_bwd(q, d, 0));
    } else {
        c.tp += sp_gather_gemm(q, d, d->gpt2);
        c.compute +=
            memset_ms(q, N * d->F) + gemm(q, LOOM_GEMM_NN, N, d->F, C) +
            (w ? weight_grad(q, N, C, d->F, d->gpt2) : copy_ms(q, N * C)) +
            memset_ms(q, N * d->FC) +
            (d->gpt2 ? ew(q, LOOM_EW_GELU_BWD, N, d->F) : ew(q, LOOM_EW_SWIGLU_BWD, N, d->F));
        add(&c, column_bwd(q, d, d->FC, 1, w, 1));
    }
    c.compute += norm_bwd(q, d);
    c.tp += sp_gather_gemm(q, d, d->gpt2);
    c.compute += memset_ms(q, N * d->A) + gemm(q, LOOM_GEMM_NN, N, d->A, C) +
                 (w ? weight_grad(q, N, C, d->A, d->gpt2) : copy_ms(q, N * C)) +
                 memset_ms(q, N * d->QKV);
    add(&c, attention_cost(q, d, 1));
    c.compute += rope(q, d);
    add(&c, column_bwd(q, d, d->QKV, 1, w, 1));
    c.compute += norm_bwd(q, d);
    return c;
}

/* ---- vlm: the encoder and projector (model/vlm.c's encoder_forward, _backward) ---- */

/* Patch embedding, positions, the blocks, the final LayerNorm, the projector, and the
 * image rows copied into the residual stream. */
double loom_price_vision_fwd(pricer *q, const shapes *d) {
    const double R = d->NI * d->P, Dv = d->Dv, Fv = d->Fv, C = d->C;
    if (R <= 0) return 0;
    const double block = ew(q, LOOM_EW_LAYERNORM_FWD, R, Dv) +
                         gemm(q, LOOM_GEMM_NT, R, 3 * Dv, Dv) +
                         attention(q, LOOM_ATT_BIDIR_FWD, d->NI * d->Hv, d->P, d->vhd) +
                         gemm(q, LOOM_GEMM_NT, R, Dv, Dv) + ew(q, LOOM_EW_ADD, R, Dv) +
                         ew(q, LOOM_EW_LAYERNORM_FWD, R, Dv) + gemm(q, LOOM_GEMM_NT, R, Fv, Dv) +
                         ew(q, LOOM_EW_GELU_FWD, R, Fv) + gemm(q, LOOM_GEMM_NT, R, Dv, Fv) +
                         ew(q, LOOM_EW_ADD, R, Dv);
    return gemm(q, LOOM_GEMM_NT, R, Dv, d->Pin) + ew(q, LOOM_EW_ADD, R, Dv) + d->VL * block +
           ew(q, LOOM_EW_LAYERNORM_FWD, R, Dv) + gemm(q, LOOM_GEMM_NT, R, C, Dv) +
           ew(q, LOOM_EW_GELU_FWD, R, C) + gemm(q, LOOM_GEMM_NT, R, C, C) + copy_ms(q, R * C);
}

/* The image rows' gradient to the projector, the slots' rows cleared, then the
 * projector's and the encoder's backward (their weight gradients unless frozen). */
double loom_price_vision_bwd(pricer *q, const shapes *d) {
    const double R = d->NI * d->P, Dv = d->Dv, Fv = d->Fv, C = d->C;
    if (R <= 0) return 0;
    double ms = 2 * copy_ms(q, R * C); /* gathered to dh, the slots' rows cleared */
    const int vision = !(d->freeze & LOOM_VLM_PART_VISION);
    const int projector = !(d->freeze & LOOM_VLM_PART_PROJECTOR);
    if (!vision && !projector) return ms;
    ms += memset_ms(q, R * C) + gemm(q, LOOM_GEMM_NN, R, C, C) + memset_ms(q, R * C) +
          ew(q, LOOM_EW_GELU_BWD, R, C);
    if (projector) ms += weight_grad(q, R, C, C, 1) + weight_grad(q, R, C, Dv, 1);
    if (!vision) return ms;
    const double block =
        memset_ms(q, R * Fv) + gemm(q, LOOM_GEMM_NN, R, Fv, Dv) + weight_grad(q, R, Dv, Fv, 1) +
        memset_ms(q, R * Fv) + ew(q, LOOM_EW_GELU_BWD, R, Fv) + memset_ms(q, R * Dv) +
        gemm(q, LOOM_GEMM_NN, R, Dv, Fv) + weight_grad(q, R, Fv, Dv, 1) +
        ew(q, LOOM_EW_LAYERNORM_BWD, R, Dv) + memset_ms(q, R * Dv) +
        gemm(q, LOOM_GEMM_NN, R, Dv, Dv) + weight_grad(q, R, Dv, Dv, 1) + memset_ms(q, 3 * R * Dv) +
        attention(q, LOOM_ATT_BIDIR_BWD, d->NI * d->Hv, d->P, d->vhd) + memset_ms(q, R * Dv) +
        gemm(q, LOOM_GEMM_NN, R, Dv, 3 * Dv) + weight_grad(q, R, 3 * Dv, Dv, 1) +
        ew(q, LOOM_EW_LAYERNORM_BWD, R, Dv);
    return ms + memset_ms(q, R * Dv) + gemm(q, LOOM_GEMM_NN, R, Dv, C) + memset_ms(q, R * Dv) +
           ew(q, LOOM_EW_LAYERNORM_BWD, R, Dv) + d->VL * block + weight_grad(q, R, Dv, d->Pin, 1);
}

cost loom_price_embed_fwd(pricer *q, const shapes *d) {
    cost c = {ew(q, LOOM_EW_ADD, d->N, d->C), 0, 0, 0}; /* row lookup (+ positions) */
    c.tp = tp_reduce(q, d);
    if (d->vlm) c.compute += loom_price_vision_fwd(q, d);
    return c;
}
cost loom_price_embed_bwd(pricer *q, const shapes *d) {
    cost c = {ew(q, LOOM_EW_ADD, d->N, d->C), 0, 0, 0}; /* rows scatter-added */
    c.tp = sp_gather(q, d);
    if (!d->vlm) return c;
    if (d->freeze & LOOM_VLM_PART_LLM) c.compute = 0; /* no token-embedding gradient */
    c.compute += loom_price_vision_bwd(q, d);
    c.tp += sp_gather(q, d); /* the images' rows of d(embedding) gathered over tp */
    return c;
}

/* Final norm, logits and the loss (tensor parallel: the vocabulary-parallel
 * cross-entropy, its maxima all-gathered and sums all-reduced). */
cost loom_price_head_fwd(pricer *q, const shapes *d) {
    cost c = {0, 0, 0, 0};
    c.compute = norm_fwd(q, d) + gemm(q, LOOM_GEMM_NT, d->N, d->V, d->C) +
                ew(q, LOOM_EW_CROSSENTROPY, d->N, d->V) + bytes_ms(q, 8 * d->N);
    c.tp = sp_gather_gemm(q, d, 0);
    if (d->tp > 1) {
        /* the shard's maximum pass, then exp/sum and the gradient (a third pass) */
        c.compute += ew(q, LOOM_EW_CROSSENTROPY, d->N, d->V) / 2;
        c.tp += coll(q, LOOM_COLL_ALLGATHER, d->tp, 1, 4 * d->N * d->tp) +
                coll(q, LOOM_COLL_ALLREDUCE, d->tp, 1, 16 * d->N);
    }
    return c;
}
cost loom_price_head_bwd(pricer *q, const shapes *d, int weight_part) {
    cost c = {0, 0, 0, 0};
    if (weight_part) return column_bwd(q, d, d->V, 0, 1, 0);
    c = column_bwd(q, d, d->V, 1, !d->split, 0);
    c.compute += memset_ms(q, d->Ns * d->C) + norm_bwd(q, d);
    return c;
}

/* ---- one micro-batch of a stage's layers ---- */

fbw loom_price_chunk(pricer *q, const loom_model_config *mc, const shapes *d, int lo, int hi,
                     int first, int last) {
    fbw r;
    memset(&r, 0, sizeof r);
    const int split = d->split;
    if (first) {
        add(&r.f, loom_price_embed_fwd(q, d));
        add(split ? &r.w : &r.b, loom_price_embed_bwd(q, d));
    }
    for (int l = lo; l < hi; l++) {
        const int moe = loom_model_layer_is_moe(mc, l);
        add(&r.f, loom_price_block_fwd(q, d, moe));
        add(&r.b, loom_price_block_bwd(q, d, moe, 0));
        if (split) add(&r.w, loom_price_block_bwd(q, d, moe, 1));
    }
    if (last) {
        add(&r.f, loom_price_head_fwd(q, d));
        add(&r.b, loom_price_head_bwd(q, d, 0));
        if (split) add(&r.w, loom_price_head_bwd(q, d, 1));
    }
    return r;
}
