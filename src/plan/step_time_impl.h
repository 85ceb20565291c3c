/* Inside loom plan's step-time model (plan/step_time.c, the driver): what its pricers
 * share. The pieces, one file each:
 *   step_time.c      loom_plan_step_time: the layout's set-up, the whole model's timeline
 *                    (pp 1), the terms, FLOPs and MFU;
 *   step_compute.c   the shapes on one rank and the kernels of every piece (blocks, MoE,
 *                    attention with context parallelism, the encoder, embedding, head);
 *   step_comm.c      the communication engine's queue: gradient buckets, ZeRO-3's gathers,
 *                    and everything after backward (reduction, norm, optimizer, gathers);
 *   step_pipeline.c  a pipeline stage through the schedule simulator, and
 *                    --vision-schedule bubbles.
 * The primitives below price one kernel or collective through the profile; each returns 0
 * once a lookup has failed (the first failure is kept in the pricer). */
#ifndef LOOM_PLAN_STEP_TIME_IMPL_H
#define LOOM_PLAN_STEP_TIME_IMPL_H

#include "model/params.h"
#include "pipeline/schedule.h"
#include "plan/plan.h"
#include "plan/vision_time.h"

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
    /* the kernels' slowdown with the node's other ranks computing at once (the cores share
     * the memory bandwidth and the last-level cache: loom_profile_corun): GEMMs and
     * attention, memory-bound kernels */
    double corun_gemm, corun_mem;
} pricer;

static inline double gemm(pricer *q, loom_gemm_op op, double M, double N, double K) {
    double ms = 0;
    if (q->st || M <= 0 || N <= 0 || K <= 0) return 0;
    q->st = q->bf16 ? loom_profile_gemm_bf16_ms(q->p, op, M, N, K, q->threads, &ms, q->err)
                    : loom_profile_gemm_ms(q->p, op, M, N, K, q->threads, &ms, q->err);
    return q->st ? 0 : ms * q->corun_gemm;
}

static inline double attention(pricer *q, loom_attention_kind k, double heads, double T,
                               double hd) {
    double ms = 0;
    if (q->st || heads <= 0 || T <= 0) return 0;
    q->st = loom_profile_attention_ms(q->p, k, heads, T, hd, q->threads, &ms, q->err);
    return q->st ? 0 : ms * q->corun_gemm;
}

/* A memory-bound kernel over rows x width fp32 values (its nominal bytes). */
static inline double ew(pricer *q, loom_elementwise_kind k, double rows, double width) {
    double ms = 0;
    if (q->st || rows <= 0 || width <= 0) return 0;
    q->st = loom_profile_elementwise_ms(q->p, k, loom_profile_elementwise_bytes(k, rows, width),
                                        q->threads, &ms, q->err);
    return q->st ? 0 : ms * q->corun_mem;
}

/* Memory traffic of kernels the profile has no entry of their own for (memset, copy,
 * RoPE, the MoE permutations, sums of squares): their bytes at the add kernel's rate. */
static inline double bytes_ms(pricer *q, double bytes) {
    double ms = 0;
    if (q->st || bytes <= 0) return 0;
    q->st = loom_profile_elementwise_ms(q->p, LOOM_EW_ADD, bytes, q->threads, &ms, q->err);
    return q->st ? 0 : ms * q->corun_mem;
}
static inline double memset_ms(pricer *q, double floats) {
    return bytes_ms(q, 4 * floats);
}
static inline double copy_ms(pricer *q, double floats) {
    return bytes_ms(q, 8 * floats);
}

/* Where a group of `members` ranks `stride` apart in the mesh lies (world rank =
 * ((pp_i dp + dp_i) cp + cp_i) tp + tp_i, nodes holding consecutive ranks): inside one
 * node when its span members x stride fits a node and the nodes' boundaries fall between
 * groups; else across nodes (the slowest link decides). */
static inline loom_placement place_of(const pricer *q, int members, int stride) {
    const long span = (long)members * stride;
    return span <= q->ranks && q->ranks % span == 0 ? LOOM_PLACE_INTRA : LOOM_PLACE_INTER;
}

/* One collective of `bytes` over `group` ranks placed as `place`, with the CPU-sharing
 * rule (step_time.c). */
static inline double coll_placed(pricer *q, loom_collective_kind k, int group, loom_placement place,
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
static inline double coll(pricer *q, loom_collective_kind k, int group, int stride, double bytes) {
    return coll_placed(q, k, group, place_of(q, group, stride), bytes);
}

/* A collective the communication engine's thread drives (its CPU counted). */
static inline double engine_coll(pricer *q, loom_collective_kind k, int group, int stride,
                                 double bytes) {
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
    int moe_bf16; /* --precision bf16: the forward dispatch sent as bf16 (on the CPU) */
    /* context parallelism */
    int cp_ring, cp_chunks;
    int cp_bf16; /* --precision bf16: K/V blocks, qkv and out sent as bf16 */
    double cp_chunk;
    /* vlm (model/vlm.c): the encoder and projector run in the first stage's embedding,
     * whole on every tp rank, over NI images of P patch tokens; `freeze` its parts */
    int vlm, freeze;
    double NI, P, Pin, VL, Dv, Fv, Hv, vhd;
} shapes;

shapes loom_price_shapes(const loom_model_config *mc, const loom_train_config *tc, int split,
                         double moe_load_max);

/* ---- the pieces' costs (step_compute.c) ---- */

/* One piece of the step on this rank: compute, and what it spends in blocking
 * collectives (tensor parallelism's, context parallelism's and MoE's). */
typedef struct {
    double compute, tp, cp, moe;
} cost;

static inline void add(cost *a, cost b) {
    a->compute += b.compute, a->tp += b.tp, a->cp += b.cp, a->moe += b.moe;
}
static inline double total(cost c) {
    return c.compute + c.tp + c.cp + c.moe;
}

cost loom_price_block_fwd(pricer *q, const shapes *d, int moe);
/* Block backward: B (input gradients; with W inside unless split), or W alone. */
cost loom_price_block_bwd(pricer *q, const shapes *d, int moe, int weight_part);
/* What backward runs again before a block's backward (--recompute). */
cost loom_price_block_recompute(pricer *q, const shapes *d, int moe);
cost loom_price_embed_fwd(pricer *q, const shapes *d);
cost loom_price_embed_bwd(pricer *q, const shapes *d);
cost loom_price_head_fwd(pricer *q, const shapes *d);
cost loom_price_head_bwd(pricer *q, const shapes *d, int weight_part);
/* vlm: the encoder and projector, forward and backward (0 without images). */
double loom_price_vision_fwd(pricer *q, const shapes *d);
double loom_price_vision_bwd(pricer *q, const shapes *d);

/* What one micro-batch of layers [lo, hi) costs (forward, B, W), the embedding when
 * first, the head and loss when last. */
typedef struct {
    cost f, b, w;
} fbw;

fbw loom_price_chunk(pricer *q, const loom_model_config *mc, const shapes *d, int lo, int hi,
                     int first, int last);

/* ---- the communication engine: one FIFO queue (step_comm.c) ---- */

typedef struct {
    double free_at; /* when the engine has finished everything posted so far */
} engine;

/* Posts an operation of `ms` at time t; returns its completion time. */
static inline double engine_post(engine *e, double t, double ms) {
    const double start = e->free_at > t ? e->free_at : t;
    e->free_at = start + ms;
    return e->free_at;
}

/* Gradient buckets (parallel/zero.c's rules). */
typedef struct {
    size_t total, bucket;
    size_t pending_begin, pending_end;
    size_t span_lo, span_hi; /* --freeze: the trainable span reduced (parallel/zero.h) */
    int embed_rows;          /* the embedding's rows gathered as data (embed_grad.h) */
    size_t wte_end;
    double rows_bytes; /* their all-gather */
    int group;         /* replicas */
    int reduce_bf16;   /* --grad-reduce-dtype bf16: 1 (ZeRO 2, 3: the all-to-all only), 2 (and
                          the all-gather of the sums) */
    /* --grad-accum sharded (train_config.h: loom_train_config_sharded_accum): every range
     * posted alone as backward finishes it, every micro-batch, backward waiting for the
     * ranges posted before it and adding its shard's part of each to the sum */
    int sharded;
    double share;              /* the compute slowdown (that sum is the training thread's work) */
    double last_done;          /* when the last reduction posted completes */
    double waited;             /* sharded: backward's time waiting for the ranges and adding them */
    size_t shard_lo, shard_hi; /* this rank's (data rank 0's) shard of the span */
    double wire_bytes;         /* the bytes this rank moves so far, as the run's grad_bytes */
    pricer *q;
    engine *e;
} buckets;

/* loom_zero_grads_ready: range [lo, hi) final at time t; returns when backward goes on
 * (sharded: after waiting for the ranges posted before it; else t). */
double loom_price_range_ready(buckets *b, double t, size_t lo, size_t hi);
/* Sharded: loom_zero_finish_reduction at time t, every range waited for; returns when. */
double loom_price_reduction_wait(buckets *b, double t);

/* ZeRO-3's all-gather of one range of `bytes` over `group` ranks, refaulting the `back`
 * bytes of it handed back after their last use (handed_back). */
double loom_price_gather_ms(pricer *q, int group, double bytes, double back);
/* The bytes of floats [lo, hi) of the view that are handed back after use. */
double loom_price_handed_back(size_t lo, size_t hi);
/* Flat floats of the expert tensors (reduced over the expert-data-parallel group). */
size_t loom_price_expert_floats(const loom_param_table *t);

/* ---- the step ---- */

typedef struct {
    double forward, backward, recompute_share, tp, cp, moe, zero3_wait, pp_bubble, pp_send;
    double dp_exposed, ep_reduce, norm, optimizer, param_gather, param_wait, clear, engine_share;
    double sharded;      /* --grad-accum sharded: the micro-batches' reductions, less what the
                            last one leaves after backward (dp_exposed) */
    double vision_msgs;  /* --vision-schedule bubbles: the replicas' messages */
    double weights_copy; /* --precision bf16: the weights' bf16 copy, once a step */
} parts;

/* One step's pricing: what each phase reads (above the line), and what it fills. */
typedef struct {
    const loom_model_config *mc;
    const loom_train_config *tc;
    pricer *q; /* also the profile, the error, tp and the node's ranks, cores and threads */
    const shapes *d;
    const loom_param_table *table; /* this rank's tensors */
    const loom_pp_schedule *sched;
    const int *counts; /* layers per pipeline stage (pp > 1) */
    int pp, ep, world, replicas, accum, v, zero;
    int sharded;  /* --grad-accum sharded: one reduction per micro-batch */
    int ep_sync;  /* expert parallelism: the gradients reduced after backward */
    int bubbles;  /* --vision-schedule bubbles (vlm, pp > 1) */
    double share; /* the compute slowdown when the node's cores are shared */
    /* ---- */
    engine eng;
    buckets bk;
    parts P;
    loom_plan_vision vis;  /* --vision-schedule bubbles: its placement on the plan's costs */
    double compute_base;   /* this rank's compute (unslowed), for the sharing rule */
    double t_backward_end; /* when this rank's backward ends */
    double stage_ms[LOOM_PP_MAX_STAGES][3]; /* pp > 1: each rank's F, B, W (its chunks' mean) */
    double *g, *need; /* pp 1: each range's bytes and forward's first use of it */
    int n_ranges;
} step_pricing;

/* The gradient buckets of the step (x->bk), from the fields above the line. */
void loom_price_buckets_init(step_pricing *x);
/* A pipeline: the schedule simulator over every stage's own actions, the terms the
 * slowest stage's (step_pipeline.c). */
loom_status loom_price_stage(step_pricing *x);
/* After backward: the rest of the gradients' reduction, the norm, the clearing, the
 * optimizer and the parameters' gathers, and the engine thread's CPU (step_comm.c). */
void loom_price_after_backward(step_pricing *x);

#endif
