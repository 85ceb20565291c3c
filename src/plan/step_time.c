/* loom plan's step-time model (plan/plan.h, docs/PLAN.md "Step time"): one training step
 * of a layout, rebuilt from the step's real structure and priced from a machine profile.
 *
 * The pieces: every kernel of forward and backward at its shape on this rank (the
 * transformer's GEMMs, attention, norms, activations, memsets, the loss; MoE's router,
 * dispatch and experts; tensor parallelism's collectives, blocking on the critical path),
 * then the communication engine as one FIFO queue beside the compute timeline (gradient
 * buckets posted as backward finishes each layer, ZeRO-3's all-gathers prefetched one
 * block ahead), the pipeline's actions replayed by the schedule simulator
 * (pipeline/schedule.h), and the step's tail (norm, clipping, AdamW, ZeRO's all-gather).
 *
 * The CPU-sharing rule: on a CPU node (machine.memory_shared) R ranks of t threads share
 * c cores; the compute of a step takes max(base, R (t base + engine) / c) (engine: the
 * engine thread's CPU for the step's collectives), and a collective's profile time,
 * measured with its group alone on the node, is scaled by max(1, R/c) / max(1, G/c). In
 * a pipeline a stage waiting for its input yields its core: the busy ranks share them,
 * slowed by max(1, R t busy / c) with busy the simulated busy fraction. */
#include "plan/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/params.h"
#include "model/vlm.h"
#include "plan/vision_time.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule.h"

/* ---- pricing through the profile ---- */

typedef struct {
    const loom_profile *p;
    int threads;    /* per rank */
    int ranks;      /* ranks on the node */
    int tp;         /* the mesh's fastest dimension: the replicas' (and cp's, ep's) stride */
    int cores;      /* the node's cores (CPU) or devices (GPU) */
    int cpu;        /* the ranks share the node's cores (memory_shared) */
    loom_status st; /* the first failure */
    loom_error *err;
    double engine_us; /* the engine thread's CPU so far (collectives posted to it) */
    int bf16;         /* --precision bf16: the linear GEMMs from the profile's gemm_bf16 */
} pricer;

static double gemm(pricer *q, loom_gemm_op op, double M, double N, double K) {
    double ms = 0;
    if (q->st || M <= 0 || N <= 0 || K <= 0) return 0;
    q->st = q->bf16 ? loom_profile_gemm_bf16_ms(q->p, op, M, N, K, q->threads, &ms, q->err)
                    : loom_profile_gemm_ms(q->p, op, M, N, K, q->threads, &ms, q->err);
    return q->st ? 0 : ms;
}

static double attention(pricer *q, loom_attention_kind k, double heads, double T, double hd) {
    double ms = 0;
    if (q->st || heads <= 0 || T <= 0) return 0;
    q->st = loom_profile_attention_ms(q->p, k, heads, T, hd, q->threads, &ms, q->err);
    return q->st ? 0 : ms;
}

/* A memory-bound kernel over rows x width fp32 values (its nominal bytes). */
static double ew(pricer *q, loom_elementwise_kind k, double rows, double width) {
    double ms = 0;
    if (q->st || rows <= 0 || width <= 0) return 0;
    q->st = loom_profile_elementwise_ms(q->p, k, loom_profile_elementwise_bytes(k, rows, width),
                                        q->threads, &ms, q->err);
    return q->st ? 0 : ms;
}

/* Memory traffic of kernels the profile has no entry of their own for (memset, copy,
 * RoPE, the MoE permutations, sums of squares): their bytes at the add kernel's rate. */
static double bytes_ms(pricer *q, double bytes) {
    double ms = 0;
    if (q->st || bytes <= 0) return 0;
    q->st = loom_profile_elementwise_ms(q->p, LOOM_EW_ADD, bytes, q->threads, &ms, q->err);
    return q->st ? 0 : ms;
}
static double memset_ms(pricer *q, double floats) {
    return bytes_ms(q, 4 * floats);
}
static double copy_ms(pricer *q, double floats) {
    return bytes_ms(q, 8 * floats);
}

/* Where a group of `members` ranks `stride` apart in the mesh lies (world rank =
 * ((pp_i dp + dp_i) cp + cp_i) tp + tp_i, nodes holding consecutive ranks): inside one
 * node when its span members x stride fits a node and the nodes' boundaries fall between
 * groups; else across nodes (the slowest link decides). */
static loom_placement place_of(const pricer *q, int members, int stride) {
    const long span = (long)members * stride;
    return span <= q->ranks && q->ranks % span == 0 ? LOOM_PLACE_INTRA : LOOM_PLACE_INTER;
}

/* One collective of `bytes` over `group` ranks placed as `place`, with the CPU-sharing
 * rule. */
static double coll_placed(pricer *q, loom_collective_kind k, int group, loom_placement place,
                          double bytes) {
    double ms = 0;
    if (q->st || group < 2 || bytes <= 0) return 0;
    q->st = loom_profile_collective_ms(q->p, k, group, place, bytes, &ms, q->err);
    if (q->st) return 0;
    if (q->cpu) {
        const double now = q->ranks > q->cores ? (double)q->ranks / q->cores : 1.0;
        const double measured = group > q->cores ? (double)group / q->cores : 1.0;
        if (now > measured) ms *= now / measured;
    }
    return ms;
}

/* One collective over a group of `group` ranks `stride` apart. */
static double coll(pricer *q, loom_collective_kind k, int group, int stride, double bytes) {
    return coll_placed(q, k, group, place_of(q, group, stride), bytes);
}

/* A collective the communication engine's thread drives (its CPU counted). */
static double engine_coll(pricer *q, loom_collective_kind k, int group, int stride, double bytes) {
    if (group < 2 || bytes <= 0) return 0;
    q->engine_us += loom_profile_engine_cpu_us(q->p, bytes);
    return coll(q, k, group, stride, bytes);
}

/* ---- the shapes on one rank (model/transformer.c's dims) ---- */

typedef struct {
    int gpt2, tp, sp, cp, ep, recompute, split;
    double B, T, N, Ns, C, hd, H, KV, A, QKV, F, FC, V;
    /* MoE */
    double E, K, EL;
    /* rows per local expert on the rank the step waits for: the busiest expert's and
     * each of its EL - 1 others' (balanced routing: both N K / E from each ep rank) */
    double rows_busiest, rows_other;
    int shared_expert, chunks;
    /* context parallelism */
    int cp_ring, cp_chunks;
    double cp_chunk;
    /* vlm (model/vlm.c): the encoder and projector run in the first stage's embedding,
     * whole on every tp rank, over NI images of P patch tokens; `freeze` its parts */
    int vlm, freeze;
    double NI, P, Pin, VL, Dv, Fv, Hv, vhd;
} shapes;

static shapes shapes_of(const loom_model_config *mc, const loom_train_config *tc, int split,
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
    }
    if (d.cp > 1) {
        d.cp_ring = strcmp(tc->cp_mode, "ulysses") != 0;
        d.cp_chunks = d.cp_ring ? 2 : 1; /* the ring's zigzag split */
        d.cp_chunk = d.T / d.cp_chunks;
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

/* One piece of the step on this rank: compute, and what it spends in blocking
 * collectives (tensor parallelism's, context parallelism's and MoE's). */
typedef struct {
    double compute, tp, cp, moe;
} cost;

static void add(cost *a, cost b) {
    a->compute += b.compute, a->tp += b.tp, a->cp += b.cp, a->moe += b.moe;
}
static double total(cost c) {
    return c.compute + c.tp + c.cp + c.moe;
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

static double rope(pricer *q, const shapes *d) {
    return d->gpt2 ? 0 : bytes_ms(q, 8 * d->N * (d->H + d->KV) * d->hd);
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
        /* qkv to heads, the output back (backward: the gradients the same way) */
        c.cp = coll(q, LOOM_COLL_ALLTOALL, d->cp, d->tp, 4 * d->N * d->QKV) +
               coll(q, LOOM_COLL_ALLTOALL, d->cp, d->tp, 4 * d->N * d->A);
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
    const double kv = 4 * d->N * 2 * d->KV * d->hd;
    const double xfer = coll(q, LOOM_COLL_SENDRECV, d->cp, d->tp, kv) * (backward ? 2 : 1);
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
 * combine in flight while chunk c's experts run. */
static double moe_exchange(pricer *q, const shapes *d, double experts_ms) {
    if (d->ep < 2) return 0;
    const double rows = d->N * d->K; /* one rank's send buffer: its tokens' K rows */
    const double a2a = coll(q, LOOM_COLL_ALLTOALL, d->ep, d->tp, 4 * rows * d->C / d->chunks);
    const double counts = coll(q, LOOM_COLL_ALLTOALL, d->ep, d->tp, 4 * d->E);
    const double per_chunk = experts_ms / d->chunks, hidden = 2 * a2a - per_chunk;
    return counts + 2 * a2a + (d->chunks - 1) * (hidden > 0 ? hidden : 0);
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
    c.moe = moe_exchange(q, d, experts);
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
    c.moe = moe_exchange(q, d, experts);
    return c;
}

/* ---- a block, the embedding and the head (model/transformer.c, tp_linear.c) ---- */

static cost block_fwd(pricer *q, const shapes *d, int moe) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, Ns = d->Ns, C = d->C;
    c.compute = norm_fwd(q, d) + gemm(q, LOOM_GEMM_NT, N, d->QKV, C) + rope(q, d);
    c.tp = sp_gather(q, d);
    add(&c, attention_cost(q, d, 0));
    c.compute += gemm(q, LOOM_GEMM_NT, N, C, d->A) + ew(q, LOOM_EW_ADD, Ns, C) + norm_fwd(q, d);
    c.tp += tp_reduce(q, d) + sp_gather(q, d);
    if (moe) {
        add(&c, moe_fwd(q, d));
        if (d->sp) c.compute += copy_ms(q, Ns * C);
    } else {
        c.compute +=
            gemm(q, LOOM_GEMM_NT, N, d->FC, C) +
            (d->gpt2 ? ew(q, LOOM_EW_GELU_FWD, N, d->F) : ew(q, LOOM_EW_SWIGLU_FWD, N, d->F)) +
            gemm(q, LOOM_GEMM_NT, N, C, d->F);
        c.tp += tp_reduce(q, d);
    }
    c.compute += ew(q, LOOM_EW_ADD, Ns, C);
    return c;
}

/* What backward runs again before a block's backward (and before W): full recomputation
 * its whole forward, selective only attention (with context parallelism's passes) and
 * the MLP's activation (model/transformer.c's block_recompute_selective). */
static cost block_recompute(pricer *q, const shapes *d, int moe) {
    cost c = {0, 0, 0, 0};
    if (d->recompute == LOOM_RECOMPUTE_FULL) return block_fwd(q, d, moe);
    if (d->recompute != LOOM_RECOMPUTE_SELECTIVE) return c;
    add(&c, attention_cost(q, d, 0));
    if (!moe)
        c.compute +=
            d->gpt2 ? ew(q, LOOM_EW_GELU_FWD, d->N, d->F) : ew(q, LOOM_EW_SWIGLU_FWD, d->N, d->F);
    return c;
}

/* A linear's weight gradient (TN: M = OC, N = IC, K = tokens) and, for GPT-2's biased
 * linears, the bias gradient's column sums over d(out) (the profile's GEMM has none). */
static double weight_grad(pricer *q, const shapes *d, double OC, double IC, int bias) {
    return gemm(q, LOOM_GEMM_TN, OC, IC, d->N) + (bias && d->gpt2 ? bytes_ms(q, 4 * d->N * OC) : 0);
}

/* A column-parallel linear's backward: input gradient (NN), weight gradient (TN, on the
 * gathered input), the input gradient's sum over tp. */
static cost column_bwd(pricer *q, const shapes *d, double OC, int input, int weight, int bias) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, C = d->C;
    if (input) {
        c.compute = memset_ms(q, N * C) + gemm(q, LOOM_GEMM_NN, N, C, OC);
        c.tp = tp_reduce(q, d);
    }
    if (weight) {
        c.compute += weight_grad(q, d, OC, C, bias);
        c.tp += sp_gather(q, d);
    }
    return c;
}

/* Block backward: B (input gradients; with W inside unless split), or W alone. */
static cost block_bwd(pricer *q, const shapes *d, int moe, int weight_part) {
    cost c = {0, 0, 0, 0};
    const double N = d->N, C = d->C;
    const int w = !d->split; /* weight gradients inside B */
    if (weight_part) {
        add(&c, block_recompute(q, d, moe));
        if (moe) {
            c.tp += sp_gather(q, d);
            add(&c, moe_bwd(q, d, 1));
        } else {
            c.compute += weight_grad(q, d, C, d->F, 1);
            add(&c, column_bwd(q, d, d->FC, 0, 1, 1));
        }
        c.compute += weight_grad(q, d, C, d->A, 1);
        add(&c, column_bwd(q, d, d->QKV, 0, 1, 1));
        return c;
    }
    add(&c, block_recompute(q, d, moe));
    if (moe) {
        if (d->sp) c.tp += 2 * sp_gather(q, d), c.compute += copy_ms(q, N * C);
        add(&c, moe_bwd(q, d, 0));
    } else {
        c.tp += sp_gather(q, d);
        c.compute +=
            memset_ms(q, N * d->F) + gemm(q, LOOM_GEMM_NN, N, d->F, C) +
            (w ? weight_grad(q, d, C, d->F, 1) : copy_ms(q, N * C)) + memset_ms(q, N * d->FC) +
            (d->gpt2 ? ew(q, LOOM_EW_GELU_BWD, N, d->F) : ew(q, LOOM_EW_SWIGLU_BWD, N, d->F));
        add(&c, column_bwd(q, d, d->FC, 1, w, 1));
    }
    c.compute += norm_bwd(q, d);
    c.tp += sp_gather(q, d);
    c.compute += memset_ms(q, N * d->A) + gemm(q, LOOM_GEMM_NN, N, d->A, C) +
                 (w ? weight_grad(q, d, C, d->A, 1) : copy_ms(q, N * C)) + memset_ms(q, N * d->QKV);
    add(&c, attention_cost(q, d, 1));
    c.compute += rope(q, d);
    add(&c, column_bwd(q, d, d->QKV, 1, w, 1));
    c.compute += norm_bwd(q, d);
    return c;
}

/* ---- vlm: the encoder and projector (model/vlm.c's encoder_forward, _backward) ---- */

/* A biased linear's weight gradient over R rows: TN, and the bias's column sums. */
static double vision_weight_grad(pricer *q, double R, double OC, double IC) {
    return gemm(q, LOOM_GEMM_TN, OC, IC, R) + bytes_ms(q, 4 * R * OC);
}

/* Patch embedding, positions, the blocks, the final LayerNorm, the projector, and the
 * image rows copied into the residual stream. */
static double vision_fwd(pricer *q, const shapes *d) {
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
static double vision_bwd(pricer *q, const shapes *d) {
    const double R = d->NI * d->P, Dv = d->Dv, Fv = d->Fv, C = d->C;
    if (R <= 0) return 0;
    double ms = 2 * copy_ms(q, R * C); /* gathered to dh, the slots' rows cleared */
    const int vision = !(d->freeze & LOOM_VLM_PART_VISION);
    const int projector = !(d->freeze & LOOM_VLM_PART_PROJECTOR);
    if (!vision && !projector) return ms;
    ms += memset_ms(q, R * C) + gemm(q, LOOM_GEMM_NN, R, C, C) + memset_ms(q, R * C) +
          ew(q, LOOM_EW_GELU_BWD, R, C);
    if (projector) ms += vision_weight_grad(q, R, C, C) + vision_weight_grad(q, R, C, Dv);
    if (!vision) return ms;
    const double block =
        memset_ms(q, R * Fv) + gemm(q, LOOM_GEMM_NN, R, Fv, Dv) + vision_weight_grad(q, R, Dv, Fv) +
        memset_ms(q, R * Fv) + ew(q, LOOM_EW_GELU_BWD, R, Fv) + memset_ms(q, R * Dv) +
        gemm(q, LOOM_GEMM_NN, R, Dv, Fv) + vision_weight_grad(q, R, Fv, Dv) +
        ew(q, LOOM_EW_LAYERNORM_BWD, R, Dv) + memset_ms(q, R * Dv) +
        gemm(q, LOOM_GEMM_NN, R, Dv, Dv) + vision_weight_grad(q, R, Dv, Dv) +
        memset_ms(q, 3 * R * Dv) + attention(q, LOOM_ATT_BIDIR_BWD, d->NI * d->Hv, d->P, d->vhd) +
        memset_ms(q, R * Dv) + gemm(q, LOOM_GEMM_NN, R, Dv, 3 * Dv) +
        vision_weight_grad(q, R, 3 * Dv, Dv) + ew(q, LOOM_EW_LAYERNORM_BWD, R, Dv);
    return ms + memset_ms(q, R * Dv) + gemm(q, LOOM_GEMM_NN, R, Dv, C) + memset_ms(q, R * Dv) +
           ew(q, LOOM_EW_LAYERNORM_BWD, R, Dv) + d->VL * block +
           vision_weight_grad(q, R, Dv, d->Pin);
}

static cost embed_fwd(pricer *q, const shapes *d) {
    cost c = {ew(q, LOOM_EW_ADD, d->N, d->C), 0, 0, 0}; /* row lookup (+ positions) */
    c.tp = tp_reduce(q, d);
    if (d->vlm) c.compute += vision_fwd(q, d);
    return c;
}
static cost embed_bwd(pricer *q, const shapes *d) {
    cost c = {ew(q, LOOM_EW_ADD, d->N, d->C), 0, 0, 0}; /* rows scatter-added */
    c.tp = sp_gather(q, d);
    if (!d->vlm) return c;
    if (d->freeze & LOOM_VLM_PART_LLM) c.compute = 0; /* no token-embedding gradient */
    c.compute += vision_bwd(q, d);
    c.tp += sp_gather(q, d); /* the images' rows of d(embedding) gathered over tp */
    return c;
}

/* Final norm, logits and the loss (tensor parallel: the vocabulary-parallel
 * cross-entropy, its maxima all-gathered and sums all-reduced). */
static cost head_fwd(pricer *q, const shapes *d) {
    cost c = {0, 0, 0, 0};
    c.compute = norm_fwd(q, d) + gemm(q, LOOM_GEMM_NT, d->N, d->V, d->C) +
                ew(q, LOOM_EW_CROSSENTROPY, d->N, d->V) + bytes_ms(q, 8 * d->N);
    c.tp = sp_gather(q, d);
    if (d->tp > 1) {
        /* the shard's maximum pass, then exp/sum and the gradient (a third pass) */
        c.compute += ew(q, LOOM_EW_CROSSENTROPY, d->N, d->V) / 2;
        c.tp += coll(q, LOOM_COLL_ALLGATHER, d->tp, 1, 4 * d->N * d->tp) +
                coll(q, LOOM_COLL_ALLREDUCE, d->tp, 1, 16 * d->N);
    }
    return c;
}
static cost head_bwd(pricer *q, const shapes *d, int weight_part) {
    cost c = {0, 0, 0, 0};
    if (weight_part) return column_bwd(q, d, d->V, 0, 1, 0);
    c = column_bwd(q, d, d->V, 1, !d->split, 0);
    c.compute += memset_ms(q, d->Ns * d->C) + norm_bwd(q, d);
    return c;
}

/* ---- the communication engine: one FIFO queue ---- */

typedef struct {
    double free_at; /* when the engine has finished everything posted so far */
} engine;

/* Posts an operation of `ms` at time t; returns its completion time. */
static double engine_post(engine *e, double t, double ms) {
    const double start = e->free_at > t ? e->free_at : t;
    e->free_at = start + ms;
    return e->free_at;
}

/* What one micro-batch of layers [lo, hi) costs (forward, B, W), the embedding when
 * first, the head and loss when last. */
typedef struct {
    cost f, b, w;
} fbw;

static fbw chunk_cost(pricer *q, const loom_model_config *mc, const shapes *d, int lo, int hi,
                      int first, int last) {
    fbw r;
    memset(&r, 0, sizeof r);
    const int split = d->split;
    if (first) add(&r.f, embed_fwd(q, d)), add(split ? &r.w : &r.b, embed_bwd(q, d));
    for (int l = lo; l < hi; l++) {
        const int moe = loom_model_layer_is_moe(mc, l);
        add(&r.f, block_fwd(q, d, moe));
        add(&r.b, block_bwd(q, d, moe, 0));
        if (split) add(&r.w, block_bwd(q, d, moe, 1));
    }
    if (last) {
        add(&r.f, head_fwd(q, d));
        add(&r.b, head_bwd(q, d, 0));
        if (split) add(&r.w, head_bwd(q, d, 1));
    }
    return r;
}

/* ---- gradient buckets (parallel/zero.c's rules) ---- */

typedef struct {
    size_t lo, hi; /* flat range */
    double at;     /* wall time it becomes final (from the last backward's start) */
} ready_range;

typedef struct {
    size_t total, bucket;
    size_t pending_begin, pending_end;
    int embed_rows; /* the embedding's rows gathered as data (embed_grad.h) */
    size_t wte_end;
    double rows_bytes; /* their all-gather */
    int group;         /* replicas */
    int reduce_bf16;   /* --grad-reduce-dtype bf16: 1 (ZeRO 2, 3: the all-to-all only), 2 (and
                          the all-gather of the sums) */
    pricer *q;
    engine *e;
    double last_done;
    int posted;
} buckets;

static void post_range(buckets *b, double t, size_t lo, size_t hi) {
    if (hi <= lo || b->group < 2) return;
    const size_t n = hi - lo, parts = (n + b->bucket - 1) / b->bucket;
    for (size_t k = parts; k-- > 0;) {
        const size_t a = lo + n * k / parts, e = lo + n * (k + 1) / parts;
        /* bf16 (parallel/zero_bf16.c): an all-to-all of 2-byte values, and at ZeRO 0, 1 an
         * all-gather of the sums (posted when backward ends: priced here, in the queue) */
        const double ms =
            !b->reduce_bf16
                ? engine_coll(b->q, LOOM_COLL_ALLREDUCE, b->group, b->q->tp, 4.0 * (double)(e - a))
                : engine_coll(b->q, LOOM_COLL_ALLTOALL, b->group, b->q->tp, 2.0 * (double)(e - a)) +
                      (b->reduce_bf16 == 2 ? engine_coll(b->q, LOOM_COLL_ALLGATHER, b->group,
                                                         b->q->tp, 2.0 * (double)(e - a))
                                           : 0.0);
        b->last_done = engine_post(b->e, t, ms);
        b->posted++;
    }
}

/* loom_zero_grads_ready: range [lo, hi) final at time t. */
static void range_ready(buckets *b, double t, size_t lo, size_t hi) {
    const int first = hi == b->total;
    if (b->embed_rows && lo == 0) {
        const double ms = engine_coll(b->q, LOOM_COLL_ALLGATHER, b->group, b->q->tp, b->rows_bytes);
        b->last_done = engine_post(b->e, t, ms);
        lo = b->wte_end;
    }
    b->pending_begin = lo;
    if (b->pending_end - b->pending_begin >= b->bucket) {
        post_range(b, t, b->pending_begin, b->pending_end);
        b->pending_end = b->pending_begin;
    }
    if (b->embed_rows && first) post_range(b, t, 0, b->wte_end);
}

/* ---- ZeRO-3's all-gathers (parallel/fsdp.c): range i posted at `at`, waited for ---- */

/* One range's all-gather over the replicas, into the view: the copy faults in again the
 * `back` bytes of it handed back after their last use (loom_fsdp_release_span), on the
 * engine thread: its CPU counted. */
static double gather_ms(pricer *q, int group, double bytes, double back) {
    const double refault = loom_profile_refault_ms(q->p, back);
    q->engine_us += 1e3 * refault;
    return engine_coll(q, LOOM_COLL_ALLGATHER, group, q->tp, bytes) + refault;
}

/* The bytes of floats [lo, hi) of the view that are handed back after use. */
static double handed_back(size_t lo, size_t hi) {
    size_t a, b;
    loom_fsdp_release_span(lo, hi, &a, &b);
    return 4.0 * (double)(b - a);
}

static void gather(pricer *q, engine *e, int group, const double *bytes, const double *back,
                   double *done, int i, double at) {
    done[i] = engine_post(e, at, gather_ms(q, group, bytes[i], back[i]));
}

static void ensure(const double *done, double *t, double *wait, int i) {
    if (done[i] > *t) *wait += done[i] - *t, *t = done[i];
}

/* ---- the step ---- */

typedef struct {
    double forward, backward, recompute_share, tp, cp, moe, zero3_wait, pp_bubble, pp_send;
    double dp_exposed, ep_reduce, norm, optimizer, param_gather, param_wait, clear, engine_share;
    double vision_msgs; /* --vision-schedule bubbles: the replicas' messages */
} parts;

static void term(loom_plan_time *out, const char *name, const char *metric, double ms) {
    if (out->n_terms >= LOOM_PLAN_MAX_TERMS || !(ms > 0)) return;
    out->terms[out->n_terms++] = (loom_plan_term){name, metric, ms};
}

static int wte_rows_enabled(const loom_param_table *t, int ranks, size_t bucket) {
    if (bucket >= t->total || ranks < 2 || t->wte != 0 || !t->has_embed) return 0;
    const size_t head_end = t->n_layer > 0 ? t->blocks[0].begin : t->head_begin;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].offset == t->wte)
            return t->params[i].ndim == 2 && t->params[i].tp_size <= 1 &&
                   t->params[i].shape[0] < (1 << 24) && t->params[i].numel <= head_end;
    return 0;
}

static size_t wte_numel(const loom_param_table *t) {
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].offset == t->wte) return t->params[i].numel;
    return 0;
}

/* Flat floats of the expert tensors (reduced over the expert-data-parallel group). */
static size_t expert_floats(const loom_param_table *t) {
    size_t n = 0;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].expert >= 0) n += t->params[i].numel;
    return n;
}

/* One step's pricing: what each phase's pricer below reads, and what it adds to. */
typedef struct {
    const loom_model_config *mc;
    const loom_train_config *tc;
    const loom_profile *p;
    pricer *q;
    const shapes *d;
    engine *eng;
    buckets *bk;
    parts *P;
    loom_param_table *table;
    loom_pp_schedule *sched;
    const int *counts; /* layers per pipeline stage (pp > 1) */
    int dp, tp, pp, cp, ep, world, replicas, ranks, cores, threads, cpu, accum, v, S, split, zero;
    int ep_sync;
    int bubbles;          /* --vision-schedule bubbles (vlm, pp > 1) */
    loom_plan_vision vis; /* ... its placement on the plan's costs */
    double share;         /* the compute slowdown when the node's cores are shared */
    double compute_base, t_backward_end, last_bwd_start;
    double *g, *back, *need; /* whole model: the ranges' bytes, handed back, first use */
    int n_ranges;
    loom_error *err;
} step_pricing;

/* The whole model on this rank: accum micro-batches, block by block (ZeRO-3's gathers
 * and the gradient buckets on the way). */
static loom_status price_whole(step_pricing *x) {
    pricer *q = x->q;
    const shapes *d = x->d;
    engine *eng = x->eng;
    buckets *bk = x->bk;
    parts *P = x->P;
    loom_param_table *table = x->table;
    loom_error *err = x->err;
    const double share = x->share;
    const int replicas = x->replicas;
    const int accum = x->accum;
    const int zero = x->zero;
    const int ep_sync = x->ep_sync;
    double compute_base = x->compute_base;
    double t_backward_end = x->t_backward_end;
    double last_bwd_start = x->last_bwd_start;
    double *g = x->g;
    double *back = x->back;
    double *need = x->need;
    int n_ranges = x->n_ranges;
    /* ---- the whole model on this rank: accum micro-batches ---- */
    const int L = table->n_layer;
    cost emb_f = embed_fwd(q, d), emb_b = embed_bwd(q, d);
    cost head_f = head_fwd(q, d), head_b = head_bwd(q, d, 0);
    cost *bf = calloc((size_t)(L ? L : 1), sizeof *bf),
         *bb = calloc((size_t)(L ? L : 1), sizeof *bb);
    if (!bf || !bb) {
        free(bf), free(bb), loom_params_free(table);
        return loom_error_set(err, LOOM_ERR_NOMEM, "plan: out of memory");
    }
    for (int i = 0; i < L; i++) {
        const int moe = table->blocks[i].moe;
        bf[i] = block_fwd(q, d, moe);
        bb[i] = block_bwd(q, d, moe, 0);
    }
    /* wall time of a piece: its compute slowed by the sharing, its blocking
     * collectives as priced */
#define WALL(c) ((c).compute * share + (c).tp + (c).cp + (c).moe)
    /* ZeRO-3: ranges 0 (embedding), 1..L (blocks), L+1 (the head's); all-gathers */
    const int z3 = zero == 3;
    g = calloc((size_t)L + 2, sizeof *g), need = calloc((size_t)L + 2, sizeof *need);
    back = calloc((size_t)L + 2, sizeof *back);
    n_ranges = L + 2;
    double *done = calloc((size_t)L + 2, sizeof *done);
    if (!g || !back || !need || !done) {
        free(bf), free(bb), free(g), free(back), free(need), free(done);
        loom_params_free(table);
        return loom_error_set(err, LOOM_ERR_NOMEM, "plan: out of memory");
    }
    for (int i = 0; i < L + 2; i++) {
        const size_t lo = i == 0 ? 0 : i <= L ? table->blocks[i - 1].begin : table->head_begin;
        const size_t hi = i == 0   ? (L ? table->blocks[0].begin : table->head_begin)
                          : i < L  ? table->blocks[i].begin
                          : i == L ? table->head_begin
                                   : table->total;
        g[i] = 4.0 * (double)(hi - lo); /* the gathered range's bytes */
        back[i] = handed_back(lo, hi);
    }
    double t = 0;
    int resident0 = 0, resident_tail = 0;
    for (int k = 0; k < accum; k++) {
        const int final = k + 1 == accum;
        /* forward */
        if (z3) {
            if (!resident0) gather(q, eng, replicas, g, back, done, 0, t);
            if (L > 0) gather(q, eng, replicas, g, back, done, 1, t);
            if (!resident0) ensure(done, &t, &P->zero3_wait, 0);
            resident0 = 1;
            if (L == 0 && !resident_tail) {
                gather(q, eng, replicas, g, back, done, 1, t);
                ensure(done, &t, &P->zero3_wait, 1);
                resident_tail = 1;
            }
        }
        if (k == 0) need[0] = t;
        t += WALL(emb_f);
        P->forward += emb_f.compute * share, P->tp += emb_f.tp;
        compute_base += emb_f.compute;
        for (int i = 0; i < L; i++) {
            if (z3) {
                ensure(done, &t, &P->zero3_wait, i + 1);
                if (i + 2 <= L + 1 && !(i + 2 == L + 1 && resident_tail))
                    gather(q, eng, replicas, g, back, done, i + 2, t);
            }
            if (k == 0) need[i + 1] = t;
            t += WALL(bf[i]);
            P->forward += bf[i].compute * share, P->tp += bf[i].tp, P->cp += bf[i].cp;
            P->moe += bf[i].moe, compute_base += bf[i].compute;
            if (z3 && i == L - 1 && !resident_tail) {
                ensure(done, &t, &P->zero3_wait, L + 1);
                resident_tail = 1;
            }
        }
        if (k == 0) need[L + 1] = t;
        t += WALL(head_f);
        P->forward += head_f.compute * share, P->tp += head_f.tp;
        compute_base += head_f.compute;
        /* backward */
        if (final) last_bwd_start = t;
        t += WALL(head_b);
        P->backward += head_b.compute * share, P->tp += head_b.tp;
        compute_base += head_b.compute;
        if (final && !ep_sync) range_ready(bk, t, table->head_begin, table->total);
        for (int i = L - 1; i >= 0; i--) {
            if (z3) {
                /* released after forward: gathered again, prefetched by the block
                 * above (the last block's is started here) */
                if (i == L - 1) gather(q, eng, replicas, g, back, done, i + 1, t);
                ensure(done, &t, &P->zero3_wait, i + 1);
                if (i >= 1) gather(q, eng, replicas, g, back, done, i, t);
            }
            t += WALL(bb[i]);
            const double rc = block_recompute(q, d, table->blocks[i].moe).compute * share;
            P->backward += bb[i].compute * share - rc, P->recompute_share += rc;
            P->tp += bb[i].tp, P->cp += bb[i].cp, P->moe += bb[i].moe;
            compute_base += bb[i].compute;
            const size_t hi = i + 1 < L ? table->blocks[i + 1].begin : table->head_begin;
            if (final && !ep_sync) range_ready(bk, t, table->blocks[i].begin, hi);
        }
        t += WALL(emb_b);
        P->backward += emb_b.compute * share, P->tp += emb_b.tp;
        compute_base += emb_b.compute;
        if (final && !ep_sync)
            range_ready(bk, t, 0, L ? table->blocks[0].begin : table->head_begin);
    }
#undef WALL
    t_backward_end = t;
    free(bf), free(bb), free(done);
    x->compute_base = compute_base;
    x->t_backward_end = t_backward_end;
    x->last_bwd_start = last_bwd_start;
    x->g = g;
    x->back = back;
    x->need = need;
    x->n_ranges = n_ranges;
    return LOOM_OK;
}

/* --vision-schedule bubbles (plan/vision_time.h): the pipeline's span scaled by the
 * timeline's ratio (the plan's costs per stage, the encoder apart), the moved pieces off
 * the first stage's compute when its actions are the ones priced (slow_r 0), and the
 * replicas' messages: per owning stage the encoder's weights there and its gradients back
 * (added into the first stage's), per piece the image rows and their gradient. */
static loom_status price_bubbles(step_pricing *x, double s, double send, loom_placement pp_place,
                                 int slow_r, double *span) {
    pricer *q = x->q;
    const shapes *d = x->d;
    parts *P = x->P;
    shapes dn = *d;
    dn.vlm = 0;
    loom_plan_vision_costs c;
    memset(&c, 0, sizeof c);
    for (int r = 0, lo = 0; r < x->pp; lo += x->counts[r], r++) {
        const fbw k = chunk_cost(q, x->mc, &dn, lo, lo + x->counts[r], r == 0, r == x->pp - 1);
        c.stage_ms[r] = (total(k.f) + total(k.b) + total(k.w) + 2 * send) * s;
    }
    const double ef = vision_fwd(q, d) * s, eb = vision_bwd(q, d) * s;
    c.enc_ms = ef + eb;
    loom_status st =
        loom_plan_vision_price(x->mc, x->sched, x->counts, x->tc->micro_batch, &c, &x->vis, x->err);
    if (st) return st;
    *span *= x->vis.span / x->vis.span_first;
    const int moved = x->accum - x->vis.pieces[0];
    if (slow_r == 0) P->forward -= moved * ef, P->backward -= moved * eb;
    const double busy =
        P->forward + P->backward + P->recompute_share + P->tp + P->cp + P->moe + P->pp_send;
    P->pp_bubble = *span - busy > 0 ? *span - busy : 0;
    const double E = (double)x->table->wte, rows = d->NI * d->P * d->C;
    for (int r = 1; r < x->pp; r++)
        if (x->vis.pieces[r] > 0)
            P->vision_msgs += 2 * coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, 4 * E) +
                              bytes_ms(q, 12 * E) * x->share;
    P->vision_msgs += 2.0 * moved * coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, 4 * rows);
    return LOOM_OK;
}

/* A pipeline stage: the schedule simulator over the slowest stage's actions. */
static loom_status price_stage(step_pricing *x) {
    pricer *q = x->q;
    const shapes *d = x->d;
    buckets *bk = x->bk;
    parts *P = x->P;
    loom_param_table *table = x->table;
    loom_pp_schedule *sched = x->sched;
    const loom_model_config *mc = x->mc;
    const int *counts = x->counts;
    loom_error *err = x->err;
    const int tp = x->tp;
    const int pp = x->pp;
    const int replicas = x->replicas;
    const int ranks = x->ranks;
    const int cores = x->cores;
    const int threads = x->threads;
    const int cpu = x->cpu;
    const int accum = x->accum;
    const int v = x->v;
    const int S = x->S;
    const int split = x->split;
    const int zero = x->zero;
    const int ep_sync = x->ep_sync;
    double compute_base = x->compute_base;
    double t_backward_end = x->t_backward_end;
    double last_bwd_start = x->last_bwd_start;
    /* ---- a pipeline stage: the schedule simulator over the slowest stage's actions ---- */
    double dur[3] = {0, 0, 0}, busy = 0;
    cost sum_f = {0, 0, 0, 0}, sum_b = {0, 0, 0, 0}, sum_w = {0, 0, 0, 0};
    /* the slowest rank's actions (its chunks' mean: interleaved ranks alternate) */
    double slowest = -1;
    int slow_r = 0;
    for (int r = 0; r < pp; r++) {
        cost f = {0, 0, 0, 0}, b = {0, 0, 0, 0}, w = {0, 0, 0, 0};
        for (int c = 0; c < v; c++) {
            const int vs = c * pp + r;
            int lo = 0;
            for (int k = 0; k < vs; k++) lo += counts[k];
            const fbw x = chunk_cost(q, mc, d, lo, lo + counts[vs], vs == 0, vs == S - 1);
            add(&f, x.f), add(&b, x.b), add(&w, x.w);
        }
        const double busy_r = total(f) + total(b) + total(w);
        if (busy_r > slowest) {
            slowest = busy_r;
            slow_r = r;
            sum_f = (cost){f.compute / v, f.tp / v, f.cp / v, f.moe / v};
            sum_b = (cost){b.compute / v, b.tp / v, b.cp / v, b.moe / v};
            sum_w = (cost){w.compute / v, w.tp / v, w.cp / v, w.moe / v};
        }
    }
    dur[LOOM_PP_F] = total(sum_f), dur[LOOM_PP_B] = total(sum_b), dur[LOOM_PP_W] = total(sum_w);
    /* each F and B sends its output to the next stage (the activations, the gradient) */
    const double msg = 4.0 * d->Ns * d->C;
    /* neighbouring stages: a pair of the pipeline group (stride replicas x tp) */
    const loom_placement pp_place = place_of(q, pp, replicas * tp);
    const double send = coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, msg);
    dur[LOOM_PP_F] += send, dur[LOOM_PP_B] += send;
    double idle[LOOM_PP_MAX_STAGES];
    const double span1 = loom_pp_schedule_simulate(sched, dur, idle, NULL);
    if (span1 < 0) {
        loom_params_free(table), loom_pp_schedule_free(sched);
        return loom_error_set(err, LOOM_ERR_STATE, "plan: the pipeline schedule deadlocks");
    }
    double mean_idle = 0;
    for (int r = 0; r < pp; r++) mean_idle += idle[r] / pp;
    busy = 1 - mean_idle;
    /* idle stages yield their cores: the busy ones share them */
    double s = cpu ? (double)ranks * threads * busy / cores : 1.0;
    if (s < 1) s = 1;
    const double n_act = (double)accum * v;
    const double fw = sum_f.compute * s, bw = (sum_b.compute + sum_w.compute) * s;
    P->forward = n_act * fw;
    P->backward = n_act * bw;
    if (d->recompute) { /* the share of backward that is the forward again */
        /* selective: a dense block's recomputed part of its forward */
        const double part = d->recompute == LOOM_RECOMPUTE_FULL
                                ? 1.0
                                : block_recompute(q, d, 0).compute / block_fwd(q, d, 0).compute;
        P->recompute_share = n_act * fw * part < P->backward ? n_act * fw * part : 0;
        P->backward -= P->recompute_share;
    }
    P->tp = n_act * (sum_f.tp + sum_b.tp + sum_w.tp);
    P->cp = n_act * (sum_f.cp + sum_b.cp + sum_w.cp);
    P->moe = n_act * (sum_f.moe + sum_b.moe + sum_w.moe);
    P->pp_send = n_act * 2 * send;
    double scaled[3] = {dur[0] * s, dur[1] * s, dur[2] * s};
    double span_s = loom_pp_schedule_simulate(sched, scaled, NULL, NULL);
    const double busy_s =
        P->forward + P->backward + P->recompute_share + P->tp + P->cp + P->moe + P->pp_send;
    P->pp_bubble = span_s - busy_s > 0 ? span_s - busy_s : 0;
    if (x->bubbles) {
        loom_status st = price_bubbles(x, s, send, pp_place, slow_r, &span_s);
        if (st) {
            loom_params_free(table), loom_pp_schedule_free(sched);
            return st;
        }
    }
    compute_base = n_act * (sum_f.compute + sum_b.compute + sum_w.compute);
    t_backward_end = span_s;
    /* the gradients of this stage become final during its last backward(s): their
     * buckets overlap the last B (W) action */
    if (!ep_sync) {
        last_bwd_start = span_s - scaled[LOOM_PP_B] - (split ? scaled[LOOM_PP_W] : 0);
        const double per_layer = (span_s - last_bwd_start) / (table->n_layer + 2);
        double t = last_bwd_start + per_layer;
        range_ready(bk, t, table->head_begin, table->total);
        for (int i = table->n_layer - 1; i >= 0; i--) {
            t += per_layer;
            const size_t hi =
                i + 1 < table->n_layer ? table->blocks[i + 1].begin : table->head_begin;
            range_ready(bk, t, table->blocks[i].begin, hi);
        }
        range_ready(bk, span_s, 0, table->n_layer ? table->blocks[0].begin : table->head_begin);
    }
    /* ZeRO-3 in a pipeline keeps the gathered blocks for the step (fsdp keep_blocks):
     * each range is gathered once, during the first forward, the next block's
     * prefetched while one computes */
    if (zero == 3) {
        const int L = table->n_layer;
        const double fb = L > 0 ? sum_f.compute * s / (L + 1) : 0; /* one block's F */
        for (int i = 0; i <= L; i++) {
            const size_t lo = i == 0 ? 0 : table->blocks[i - 1].begin;
            const size_t hi = i < L ? table->blocks[i].begin : table->total;
            /* the last one: the last block's range and the tail's, handed back apart */
            const size_t mid = i == L ? table->head_begin : hi;
            const double g = gather_ms(q, replicas, 4.0 * (double)(hi - lo),
                                       handed_back(lo, mid) + handed_back(mid, hi));
            P->zero3_wait += i <= 1 ? g : (g > fb ? g - fb : 0);
        }
    }
    /* GPT-2's tied embedding: the first and last stage swap its gradient */
    if (d->gpt2)
        P->pp_send +=
            coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, 4.0 * mc->vocab_size / tp * d->C);
    /* the pipeline group's loss sum */
    P->pp_send += coll(q, LOOM_COLL_ALLREDUCE, pp, replicas * tp, 8);
    x->compute_base = compute_base;
    x->t_backward_end = t_backward_end;
    x->last_bwd_start = last_bwd_start;
    return LOOM_OK;
}

/* After backward: the rest of the gradients' reduction, the norm, the clearing, the
 * optimizer and the parameters' gathers, and the engine thread's CPU. */
static void price_after_backward(step_pricing *x) {
    pricer *q = x->q;
    const shapes *d = x->d;
    engine *eng = x->eng;
    buckets *bk = x->bk;
    parts *P = x->P;
    loom_param_table *table = x->table;
    const loom_model_config *mc = x->mc;
    const loom_train_config *tc = x->tc;
    const loom_profile *p = x->p;
    loom_error *err = x->err;
    const double share = x->share;
    const int tp = x->tp;
    const int ep = x->ep;
    const int world = x->world;
    const int replicas = x->replicas;
    const int ranks = x->ranks;
    const int cores = x->cores;
    const int threads = x->threads;
    const int cpu = x->cpu;
    const int zero = x->zero;
    const int ep_sync = x->ep_sync;
    double compute_base = x->compute_base;
    double t_backward_end = x->t_backward_end;
    double last_bwd_start = x->last_bwd_start;
    double *g = x->g;
    double *back = x->back;
    double *need = x->need;
    int n_ranges = x->n_ranges;
    /* sequence parallelism: each norm parameter's gradient summed over tp once final */
    for (int i = 0; d->sp && i < table->n_params; i++)
        if (table->params[i].sp_partial)
            P->tp += coll(q, LOOM_COLL_ALLREDUCE, tp, 1, 4.0 * (double)table->params[i].numel);

    /* ---- after backward: the rest of the gradients' reduction ---- */
    double t = t_backward_end;
    if (!ep_sync && replicas > 1) {
        post_range(bk, t, bk->pending_begin, bk->pending_end);
        double end = eng->free_at > t ? eng->free_at : t;
        if (bk->embed_rows) end += bytes_ms(q, 12.0 * replicas * d->N * d->C); /* rows added */
        P->dp_exposed = end - t;
    } else if (ep_sync) {
        const size_t ex = expert_floats(table), dense = table->total - ex;
        const int edp = replicas / ep;
        P->ep_reduce = coll(q, LOOM_COLL_ALLREDUCE, replicas, tp, 4.0 * (double)dense) +
                       coll(q, LOOM_COLL_ALLREDUCE, edp, ep * tp, 4.0 * (double)ex);
    }
    (void)last_bwd_start;
    /* the loss over dp, MoE statistics, the norm (sum of squares, all-reduce over the world) */
    const size_t shard = zero >= 1 ? (table->total + replicas - 1) / replicas : table->total;
    /* the norm's runs: the shard (stages 2, 3), else all of it on the first replica */
    const size_t owned = zero >= 2 ? shard : table->total;
    P->norm = coll(q, LOOM_COLL_ALLREDUCE, replicas, tp, 8) +
              bytes_ms(q, 4.0 * (double)owned) * share + coll(q, LOOM_COLL_ALLREDUCE, world, 1, 8);
    if (mc->n_experts > 0) P->norm += coll(q, LOOM_COLL_ALLREDUCE, replicas, tp, 8.0 * (d->E + 4));
    /* the step's start: the local gradients cleared (stages 0, 1: a memset; 2, 3: pages
     * handed back, zero-filled by the kernel as backward touches them again: whole huge
     * pages, as cheap as the memset; counted here: llama 6M dp 2 ZeRO-2 faults ~270 times a
     * step and rank, not the 5,900 4 KiB pages of its 23 MiB) */
    P->clear = memset_ms(q, (double)table->total) * share;
    /* clipping and AdamW on this rank's part */
    double adam = 0;
    double updated = (double)shard;
    if (mc->freeze && table->total > 0) { /* --freeze: AdamW skips the frozen tensors */
        size_t frozen = 0;
        for (int i = 0; i < table->n_params; i++)
            if (table->params[i].frozen) frozen += table->params[i].numel;
        updated *= 1.0 - (double)frozen / (double)table->total;
    }
    if (!q->st && updated > 0) q->st = loom_profile_adamw_ms(p, updated, threads, &adam, err);
    P->optimizer = (bytes_ms(q, 8.0 * (double)shard) + adam) * share;
    if ((zero == 1 || zero == 2) && tc->overlap_param_gather && g) {
        /* --overlap-param-gather: each range's gather posted once AdamW has updated it,
         * waited for by the next step's forward right before the range is read */
        double at = 0, free_at = 0, cum = 0, late = 0;
        const double start = P->optimizer + P->clear; /* the next forward, after the optimizer */
        for (int i = 0; i < n_ranges; i++) {
            cum += g[i] / (4.0 * (double)table->total);
            at = P->optimizer * cum;
            const double ms = engine_coll(q, LOOM_COLL_ALLGATHER, replicas, tp, g[i]);
            free_at = (free_at > at ? free_at : at) + ms;
            const double use = start + need[i] + late;
            if (free_at > use) late += free_at - use;
        }
        P->param_gather = n_ranges * loom_profile_engine_post_us(p) / 1e3;
        P->param_wait = late;
    } else if (zero == 1 || zero == 2) { /* the updated shards to every replica */
        P->param_gather = coll(q, LOOM_COLL_ALLGATHER, replicas, tp, 4.0 * (double)table->total);
    }
    free(g), free(back), free(need);

    /* the engine thread's CPU competes with compute on a CPU node */
    if (cpu) {
        const double base = compute_base, rt = (double)ranks * threads;
        const double demand = (rt * base + ranks * q->engine_us / 1e3) / cores;
        const double wall = rt > cores ? rt * base / cores : base;
        if (demand > wall) P->engine_share = demand - wall;
    }
}

loom_status loom_plan_step_time(const loom_model_config *mc, const loom_train_config *tc,
                                const loom_profile *p, const loom_plan_placement *place,
                                loom_plan_time *out, loom_error *err) {
    memset(out, 0, sizeof *out);
    if (!mc || !tc || !p || !place || mc->family == LOOM_FAMILY_DIT)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              mc && mc->family == LOOM_FAMILY_DIT
                                  ? "plan: the step-time model covers the language models "
                                    "(gpt2, llama), not dit"
                                  : "plan: step time needs a model, a layout and a profile");
    const loom_layout l = tc->layout;
    const int dp = l.dp > 0 ? l.dp : 1, tp = l.tp > 0 ? l.tp : 1, pp = l.pp > 0 ? l.pp : 1;
    const int cp = l.cp > 0 ? l.cp : 1, ep = l.ep > 0 ? l.ep : 1;
    const int world = dp * tp * pp * cp, replicas = dp * cp;
    const int rpn = place->ranks_per_node >= 1 ? place->ranks_per_node : 1;
    const int ranks = rpn < world ? rpn : world;
    int cores = loom_profile_devices_per_node(p);
    if (cores < 1) cores = 1;
    int threads = place->threads > 0 ? place->threads : cores / ranks;
    if (threads < 1) threads = 1;
    const int cpu = loom_profile_memory_bytes(p, 2) < loom_profile_memory_bytes(p, 1);
    pricer q = {p,   threads, ranks, tp, cores,
                cpu, LOOM_OK, err,   0,  strcmp(tc->precision, "bf16") == 0};
    if (tc->micro_batch < 1 || tc->global_batch % (tc->micro_batch * dp) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "plan: --global-batch %d is not a multiple of --micro-batch %d x "
                              "--dp %d",
                              tc->global_batch, tc->micro_batch, dp);
    const int accum = tc->global_batch / dp / tc->micro_batch;

    /* the pipeline's schedule */
    loom_pp_kind kind = LOOM_PP_1F1B;
    int v = pp > 1 && tc->virtual_stages > 1 ? tc->virtual_stages : 1;
    loom_pp_schedule sched;
    memset(&sched, 0, sizeof sched);
    if (pp > 1) {
        loom_status st = loom_pp_kind_parse(tc->pp_schedule, &kind, err);
        if (!st) st = loom_pp_schedule_build(&sched, kind, pp, accum, v, err);
        if (st) return st;
    }
    const int split = pp > 1 && sched.split;
    const shapes d = shapes_of(mc, tc, split, place->moe_load_max);

    /* this rank's tensors: pipeline stage 0 (the first chunk), tp/ep rank 0 */
    const int S = pp * v;
    int counts[LOOM_PP_MAX_STAGES * LOOM_MAX_CHUNKS];
    if (pp > 1) { /* the split loom_pipeline_create uses */
        loom_pp_config pc;
        loom_train_config_pipeline(tc, &pc);
        loom_status st = loom_pipeline_split_layers(mc, &pc, counts, err);
        if (st) {
            loom_pp_schedule_free(&sched);
            return st;
        }
    }
    loom_layer_set set;
    memset(&set, 0, sizeof set);
    set.n_chunks = v, set.first = 1, set.last = pp == 1;
    for (int c = 0, lo = 0; c < v && pp > 1; c++) {
        lo = 0;
        for (int s = 0; s < c * pp; s++) lo += counts[s];
        set.lo[c] = lo, set.hi[c] = lo + counts[c * pp];
    }
    loom_param_table table;
    const loom_params_options po = {0, tp, 0, ep, pp > 1 ? &set : NULL};
    loom_status st = loom_params_build(&table, mc, &po, err);
    if (st) {
        loom_pp_schedule_free(&sched);
        return st;
    }

    parts P;
    memset(&P, 0, sizeof P);
    engine eng = {0};
    double compute_base = 0; /* this rank's compute (unslowed), for the sharing rule */
    double t_backward_end = 0, last_bwd_start = 0;
    /* whole model: the ranges' bytes, their handed-back bytes, forward's first use */
    double *g = NULL, *back = NULL, *need = NULL;
    int n_ranges = 0;
    const size_t bucket_floats_raw = (size_t)(tc->bucket_mb * (1 << 20) / sizeof(float));
    size_t bucket = bucket_floats_raw < 1 ? 1 : bucket_floats_raw;
    if (bucket > table.total) bucket = table.total ? table.total : 1;
    const int zero = replicas > 1 ? tc->zero : 0;
    const int ep_sync = ep > 1; /* expert parallelism reduces after backward */
    buckets bk;
    memset(&bk, 0, sizeof bk);
    bk.total = table.total, bk.bucket = bucket, bk.q = &q, bk.e = &eng;
    bk.pending_begin = bk.pending_end = table.total;
    bk.group = ep_sync ? 1 : replicas;
    if (strcmp(tc->grad_reduce_dtype, "bf16") == 0 && !ep_sync) bk.reduce_bf16 = zero >= 2 ? 1 : 2;
    bk.embed_rows =
        !ep_sync && !bk.reduce_bf16 && pp == 1 && wte_rows_enabled(&table, replicas, bucket);
    bk.wte_end = wte_numel(&table);
    bk.rows_bytes = 4.0 * replicas * d.N * (d.C + 1);

    /* The compute slowdown when the node's cores are shared (engine CPU added later). */
    const double share =
        cpu && (double)ranks * threads > cores ? (double)ranks * threads / cores : 1.0;
    step_pricing x = {mc,
                      tc,
                      p,
                      &q,
                      &d,
                      &eng,
                      &bk,
                      &P,
                      &table,
                      &sched,
                      counts,
                      dp,
                      tp,
                      pp,
                      cp,
                      ep,
                      world,
                      replicas,
                      ranks,
                      cores,
                      threads,
                      cpu,
                      accum,
                      v,
                      S,
                      split,
                      zero,
                      ep_sync,
                      pp > 1 && mc->family == LOOM_FAMILY_VLM &&
                          strcmp(tc->vision_schedule, "bubbles") == 0,
                      {{0}, 0, 0, {0}, {0}},
                      share,
                      compute_base,
                      t_backward_end,
                      last_bwd_start,
                      g,
                      back,
                      need,
                      n_ranges,
                      err};
    st = pp == 1 ? price_whole(&x) : price_stage(&x);
    if (st) return st; /* each phase frees the table and the schedule on its failure */
    price_after_backward(&x);

    const int failed = q.st != LOOM_OK;
    loom_params_free(&table);
    loom_pp_schedule_free(&sched);
    if (failed) return q.st;

    term(out, "forward", "dp.compute_ms", P.forward);
    term(out, "backward", "dp.compute_ms", P.backward);
    term(out, "recompute", "dp.compute_ms", P.recompute_share);
    term(out, "tp comm", "dp.compute_ms", P.tp);
    term(out, "cp comm", "dp.compute_ms", P.cp);
    term(out, "moe all-to-all", "dp.compute_ms", P.moe);
    term(out, "zero-3 gather", "dp.compute_ms", P.zero3_wait);
    term(out, "pp sends", "dp.compute_ms", P.pp_send);
    term(out, "pp bubble", "dp.compute_ms", P.pp_bubble);
    term(out, "vision messages", "dp.compute_ms", P.vision_msgs);
    term(out, "engine cpu", "dp.compute_ms", P.engine_share);
    term(out, "grad clear", "dp.compute_ms", P.clear);
    term(out, "dp exposed", "grad_wait_ms", P.dp_exposed);
    term(out, "ep reduce", "grad_wait_ms", P.ep_reduce);
    term(out, "norm", NULL, P.norm);
    term(out, "optimizer", "dp.optimizer_ms", P.optimizer);
    term(out, "param gather", "dp.param_gather_ms", P.param_gather);
    term(out, "param wait", "dp.param_wait_ms", P.param_wait);
    double step = 0;
    for (int i = 0; i < out->n_terms; i++) {
        step += out->terms[i].ms;
        if (out->terms[i].ms > out->terms[out->dominant].ms) out->dominant = i;
    }
    out->step_ms = step;
    if (x.bubbles) {
        memcpy(out->vision_pieces, x.vis.pieces, sizeof out->vision_pieces);
        out->vision_ratio = x.vis.span / x.vis.span_first;
        out->vision_messages_ms = P.vision_msgs;
    }
    const double tokens = (double)tc->global_batch * mc->seq_len;
    out->tokens_per_s = step > 0 ? tokens / (step * 1e-3) : 0;
    /* PaLM's model FLOPs: 6 N per token (N the non-embedding parameters plus the head)
     * and the attention's 12 L C T per token */
    loom_param_table whole;
    const loom_params_options po_whole = {0, 1, 0, 1, NULL};
    double n_params = 0;
    if (loom_params_build(&whole, mc, &po_whole, err) == LOOM_OK) {
        n_params = (double)whole.total;
        if (mc->n_experts > 0) { /* active parameters: K of E experts per token */
            const double ex = (double)expert_floats(&whole);
            n_params = n_params - ex + ex * mc->top_k / mc->n_experts;
        }
        if (mc->family == LOOM_FAMILY_VLM) /* the encoder's and projector's: per image */
            for (int i = 0; i < whole.n_params; i++)
                if (loom_vlm_param_part(whole.params[i].name) != LOOM_VLM_PART_LLM)
                    n_params -= (double)whole.params[i].numel;
        loom_params_free(&whole);
    }
    out->model_flops =
        tokens * (6.0 * n_params + 12.0 * mc->n_layer * (double)mc->d_model * mc->seq_len);
    if (mc->family == LOOM_FAMILY_VLM)
        out->model_flops += (double)tc->global_batch * mc->max_images * loom_vlm_image_flops(mc);
    /* MFU as the papers define it: against the peak (the datasheet's in a published
     * profile), not the rate GEMMs achieve. Per rank on a CPU node: its share of the cores
     * (8 ranks on 2 cores: a quarter of one thread's peak). */
    const double peak = loom_profile_gemm_peak_gflops(p, LOOM_GEMM_NT, threads) * 1e9 / share;
    if (peak > 0 && step > 0) out->mfu = out->model_flops / (step * 1e-3 * world * peak);
    return LOOM_OK;
}
