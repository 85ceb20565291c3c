/* Data parallelism with ZeRO stages 0-2 over the flat buffers.
 *
 * Every rank holds the full parameters and a full local gradient buffer (micro-batches
 * accumulate into it). Shards are ranges of the flat buffer, one per data-parallel rank,
 * with boundaries snapped to whole rows of the tensor they fall in.
 *   stage 0: gradients all-reduced; every rank runs AdamW on everything.
 *   stage 1: gradients all-reduced; AdamW state (m, v) only for the rank's shard; the
 *            updated shards are all-gathered into every rank's parameters.
 *   stage 2: gradients reduced per bucket, a rank keeping only its shard's summed part
 *            (an all-reduce, whose other part is dropped: see post_partition in zero.c);
 *            otherwise as stage 1.
 *   stage 3: as stage 2, and the parameters are sharded too (parallel/fsdp.h).
 * Overlap: during the last micro-batch's backward, model/transformer.c reports each flat
 * range whose gradients are final; ranges are merged until they reach --bucket-mb and
 * then posted to the communication engine (comm/engine.h), whose thread starts and
 * drives the collectives while backward goes on with earlier layers. A range larger
 * than a bucket (the embedding: 38M floats on GPT-2 124M) is split into partitions of
 * at most --bucket-mb, each its own collective: completions are finer-grained, MPI's
 * temporary buffers stay bucket-sized, and no single monolithic collective is left.
 * Issue order is the order gradients become final (output side first), the same on
 * every rank, as MPI requires for collectives on one communicator. */
#ifndef LOOM_PARALLEL_ZERO_H
#define LOOM_PARALLEL_ZERO_H

#include "ckpt/ckpt_plan.h"
#include "comm/comm.h"
#include "comm/engine.h"
#include "parallel/embed_grad.h"
#include "parallel/shard_geometry.h"
#include "model/params.h"
#include "optim/optimizer.h"

typedef struct {
    size_t begin, end;
    loom_comm_op op;
    int reduced;  /* stage >= 2: its all-reduce is complete, the shard's part kept */
    int released; /* ... and its local gradient pages went back to the kernel */
    /* every rank's part of [begin, end) (its ZeRO shard's), relative to begin; with
     * --grad-reduce-dtype bf16 also what this rank receives (R pieces of its part) */
    int *counts, *displs, *rcounts, *rdispls;
    size_t recv_at; /* bf16: where its pieces land in loom_zero.recv16 */
    int bf16_phase; /* bf16: a loom_zero_bf16_phase */
} loom_zero_bucket;

/* Where this rank's step time went (ms), for --metrics: what data parallelism costs
 * beyond the exposed wait (bench/bench_dp.py reports it). */
typedef struct {
    double compute_ms;       /* step start to the end of backward (forward, backward, posting) */
    double compute_cpu_ms;   /* ... the training thread's CPU time in it (less: it was
                                waiting for a core, or for a wait inside backward) */
    double optimizer_ms;     /* clipping and AdamW on this rank's part */
    double optimizer_cpu_ms; /* ... the training thread's CPU time in it */
    double param_gather_ms;  /* stages 1, 2: the all-gather of the updated parameters
                                (--overlap-param-gather: only posting the ranges) */
    double param_wait_ms;    /* --overlap-param-gather: this step's forward waiting for the
                                gather posted by the previous step's optimizer (exposed) */
    double engine_cpu_ms;    /* the communication engine thread's CPU time this step */
    double grad_bytes;       /* gradient bytes this rank moved over dp this step: out in the
                                reduce-scatter, in from the all-gather (parallel/zero_bf16.c) */
} loom_zero_step_times;

typedef struct {
    loom_comm *dp;
    const loom_backend *be;  /* where the buffers live and AdamW runs */
    loom_comm_engine engine; /* issues the non-blocking collectives (gradients, ZeRO-3 gathers) */
    int stage;
    const loom_param_table *table;
    size_t total;
    loom_shard_layout shards; /* every rank's shard of the flat buffer (over dp) */
    size_t lo, hi;            /* this rank's shard */
    /* --freeze (stages 0-2, no experts): the trainable span [span_lo, span_hi) of the
     * registry (loom_params_train_span). The shards, the optimizer state, the cleared,
     * reduced and clipped gradients and the gathered parameters cover only it: a frozen
     * tensor outside it has no gradient page touched, no AdamW state and no collective.
     * span_on 0: [0, total) (every run without --freeze, and ZeRO-3, whose parameter
     * shards must hold every tensor). param_counts/displs: the shards of [0, total) that
     * checkpoints write the parameters by (span_on only). */
    int span_on;
    size_t span_lo, span_hi;
    size_t *param_counts, *param_displs;
    size_t shard_floats; /* its optimizer state's floats (--ep: the segments') */
    float *m, *v;        /* AdamW state: whole buffer (stage 0) or the shard */
    float *ema;          /* --ema-decay: the weights' moving average, laid out as m */
    float ema_decay;
    int ema_frozen;    /* --freeze: some tensor is frozen (its average stays its weight) */
    float *grad_shard; /* stage >= 2: the shard's reduced gradient, [lo, hi) of the local
                          buffer (set by loom_zero_grads_alloc; --ep: its own buffer) */
    size_t bucket_floats;
    loom_zero_bucket *buckets;
    int n_buckets, max_buckets;
    size_t pending_begin, pending_end; /* final but not yet sent */
    loom_embed_grad embed;             /* the wte gradient's dense part early, rows at the end */
    size_t grads_bytes;                /* the local gradient buffer's mapping (stage >= 2) */
    unsigned char *page_map;           /* mincore's answer, one byte a page */
    size_t grads_peak;   /* most local gradient bytes resident at a layer boundary so far */
    size_t grads_after;  /* ... and once the last reduction was done (the shard + edge pages) */
    double step_wait_ms; /* this step: time spent inside gradient-communication calls
                            (starting, testing, waiting): the part not hidden */
    loom_zero_step_times times; /* this step so far */
    double step_t0_ms, step_cpu0_ms, engine_cpu0_ms;
    struct loom_ep_zero *experts;      /* stages 1-2 with --ep > 1 (parallel/ep_zero.h), or NULL */
    struct loom_param_gather *overlap; /* --overlap-param-gather (parallel/param_gather.h) */
    /* --grad-accum sharded (stages 2, 3; FSDP): every range (a block, the head, the tail)
     * is reduced as backward produces it, its shard's part added here ([lo, hi), fp32;
     * grad_shard points here) and all its local pages handed back; backward waits for a
     * range's reduction before it hands over the next one, so at most two ranges of the
     * local buffer are ever resident (it is address space, never a whole gradient).
     * NULL: local accumulation. */
    float *accum;
    int accum_n;           /* micro-batches summed into accum this step */
    size_t accum_resident; /* the local bytes such a step may hold: two adjacent ranges */
    int head_pieces;       /* an untied head handed over in this many ranges (model.h) */
    size_t emb_nohuge;     /* [0, emb_nohuge) of the local buffer: 4 KiB pages (embedding) */
    int norms_nohuge;      /* split backward: the norms' pages are 4 KiB (loom_zero_norm_pages) */
    size_t consumed_from;  /* this micro-batch: [consumed_from, total) reduced and summed */
    size_t released_from;  /* ... and its pages from here up handed back */
    /* --grad-reduce-dtype bf16 (parallel/zero_bf16.c): 0, or bf16 on the wire */
    int reduce_bf16;
    uint16_t *send16;           /* [total]: each bucket's rounded gradient, then its sums */
    uint16_t *recv16;           /* [R x this rank's shard]: the pieces received */
    size_t recv_cap, recv_used; /* elements of recv16; used by this reduction so far */
    int *parts;                 /* the buckets' count arrays, 4 R ints each */
} loom_zero;

loom_status loom_zero_create(loom_zero *z, loom_comm *dp, int stage, const loom_param_table *table,
                             double bucket_mb, loom_error *err);
/* Only the shape loom_zero_create gives (stage, shards, this rank's [lo, hi) and
 * shard_floats), no buffers or engine: what sizing a layout reads (loom plan). */
loom_status loom_zero_size(loom_zero *z, loom_comm *dp, int stage, const loom_param_table *table,
                           double bucket_mb, loom_error *err);
void loom_zero_free(loom_zero *z);
/* One replica whose buffers live on a device backend (--device cuda): the optimizer
 * state moves to the device (zeroed), and loom_zero_grads_alloc / _clear / _free use its
 * memory from then on. Only ZeRO-0 on one rank: else LOOM_ERR_STATE. */
loom_status loom_zero_place_on(loom_zero *z, const loom_backend *be, loom_error *err);

/* Bytes held per rank, by ZeRO's formulas (fp32; P parameters, N ranks, shard s ~ P/N
 * snapped to rows): stage 0: params 4P, grads 4P, optimizer 8P; stage 1: optimizer 8s;
 * stage 2: + a reduced gradient shard 4s; stage 3: params 4s (+ the gathered working
 * set, parallel/fsdp.h). Every stage also keeps the full local gradient buffer (4P):
 * backward accumulates into it across micro-batches and the bucket collectives read
 * their send data from it (see docs/parallelism.md, "Data parallelism"). */
typedef struct {
    size_t params;       /* persistent parameters: all (stages 0-2) or the shard (3) */
    size_t grads_local;  /* the local accumulation buffer */
    size_t grads_shard;  /* stage >= 2: the part of grads_local that stays (the shard) */
    size_t optimizer;    /* AdamW m and v */
    size_t shard_floats; /* this rank's shard (the whole buffer at stage 0) */
} loom_zero_memory;
void loom_zero_memory_of(const loom_zero *z, loom_zero_memory *m);
/* The largest gradient all-reduce a step posts (floats; 0 with one rank): what OpenMPI's
 * MPI_Iallreduce allocates a temporary of (comm/engine.c). wte_end: the embedding split's
 * dense range (parallel/embed_grad.h), 0 without it. Shapes only (loom plan too). */
size_t loom_zero_largest_partition(const loom_zero *z, size_t wte_end);

/* Where range i of backward's order begins: the head (or its n_head pieces, last first),
 * blocks L-1 .. 0, then the embedding's range from tail_begin. */
size_t loom_zero_backward_range_begin(const loom_param_table *t, int i, int n_head,
                                      size_t tail_begin);
/* ZeRO-2/3, local accumulation, one micro-batch a step (parallel/zero_resident.c): the
 * most local gradient bytes resident at once, over every layer boundary of backward and
 * every data-parallel rank, with the last LOOM_ZERO_LAG_PARTITIONS partitions posted not
 * yet reduced; wte_end as in loom_zero_largest_partition. 0 where this does not apply
 * (stages 0-1, --ep, --freeze, --grad-accum sharded: loom_zero_memory_of's figure holds).
 * Shapes only (loom plan too). */
#define LOOM_ZERO_LAG_PARTITIONS 2
size_t loom_zero_grads_peak_local(const loom_zero *z, size_t wte_end);

/* The local gradient buffer (total floats, zeroed). Stages 2, 3: an anonymous mapping
 * whose pages are handed back (madvise MADV_DONTNEED) as soon as their bucket's
 * reduction completes, except the shard's own [lo, hi), where the reduced values stay
 * (grad_shard points there); clearing it for
 * the next step hands back every page too (the kernel zero-fills a page on its next
 * touch). Resident local gradients are then what backward has written and not yet had
 * reduced; with accumulation the micro-batches before the last still fill all of it.
 * Stages 0, 1 read the all-reduced gradient back from it: a plain zeroed allocation. */
float *loom_zero_grads_alloc(loom_zero *z);
void loom_zero_grads_free(loom_zero *z, float *grads);
/* The transparent huge page of x86-64 (and arm64 with 4 KiB pages). */
#define LOOM_HUGE_PAGE_BYTES ((size_t)2 << 20)
/* An anonymous mapping of `bytes` (a multiple of the page size), starting on a huge-page
 * boundary, that asks for transparent huge pages; munmap(p, bytes) frees it. NULL when
 * out of memory. */
float *loom_zero_map_huge(size_t bytes);
void loom_zero_grads_clear(loom_zero *z, float *grads);
/* Bytes of the local gradient buffer resident now (mincore; stage >= 2), else all. The
 * high-water mark over the layer boundaries of every reduction is z->grads_peak. */
size_t loom_zero_grads_resident(const loom_zero *z, const float *grads);
/* Hands the whole pages inside [begin, end) of base back to the kernel. */
void loom_zero_release_pages(float *base, size_t begin, size_t end);

/* At a step's start and end: z->times covers what happened in between. */
void loom_zero_step_begin(loom_zero *z);
void loom_zero_step_end(loom_zero *z);

/* Before the last micro-batch's backward. */
void loom_zero_begin_reduction(loom_zero *z);
/* The loom_grads_ready_fn for model backward; ctx is a loom_zero_ready_ctx. */
typedef struct {
    loom_zero *zero;
    float *grads;
    loom_error *err;
    const float *d_embed;  /* with zero->embed.enabled: d(embedding output) [N, C] */
    const int32_t *tokens; /* and the micro-batch's tokens [N] */
} loom_zero_ready_ctx;
/* Plans the split reduction of the embedding gradient (parallel/embed_grad.h) for
 * micro-batches of n_tokens (not when one bucket holds the whole model: no overlap); when
 * zero->embed.enabled the model must leave the embedding backward of the last micro-batch to ZeRO
 * (loom_model.defer_embedding_grad). */
loom_status loom_zero_plan_embedding(loom_zero *z, int n_tokens, int seq_len, loom_error *err);
loom_status loom_zero_grads_ready(void *ctx, size_t begin, size_t end);
/* After backward: sends what is left and waits for every bucket. */
loom_status loom_zero_finish_reduction(loom_zero *z, float *grads, loom_error *err);
/* --grad-accum sharded: the shard's accumulator (stage >= 2; with --ep a full-layout
 * mapping of which only the rank's segments are touched, parallel/ep_zero.h), before
 * loom_zero_grads_alloc and loom_zero_plan_embedding (no embedding split then). Sized
 * only (size_only): the memory report's figures, no buffer. split_head: the model can
 * hand an untied head over in pieces (loom_model_head_can_split); z->head_pieces is how
 * many it should (model.head_pieces). n_tokens: a micro-batch's tokens on this rank.
 * flags: LOOM_ZERO_ACCUM_* below (0 without a pipeline). */
loom_status loom_zero_accum_enable(loom_zero *z, int split_head, int flags, int n_tokens,
                                   int size_only, loom_error *err);
/* loom_zero_accum_enable's flags, for pipeline stages: */
#define LOOM_ZERO_ACCUM_KEEP_EMBED 1 /* the embedding range reduced once a step (tied copy) */
#define LOOM_ZERO_ACCUM_SPLIT 2      /* split backward: B writes norms ahead of W */
#define LOOM_ZERO_ACCUM_BLOCKING 4   /* each range reduced before the next is written (--ep) */
/* After a micro-batch's reduction (not the step's last): counted (its buckets were added
 * to the accumulator as they completed, micro-batches in order: ((g1 + g2) + ...) + gM)
 * and the local buffer cleared (its last pages handed back). */
void loom_zero_accum_micro_batch(loom_zero *z, float *grads);
/* --grad-accum sharded in a pipeline (pipeline/executor.c): each backward action that
 * completes a micro-batch's gradients of a chunk (B, or W under split backward) reduces
 * that chunk's ranges on its own, from `top` down (first: the step's first micro-batch
 * of these ranges, whose shard part is copied into the sum, else added). Finishing waits
 * for every range, then zeroes [bottom, top) of the local buffer (pages handed back). */
void loom_zero_begin_ranges(loom_zero *z, size_t top, int first);
loom_status loom_zero_finish_ranges(loom_zero *z, float *grads, size_t bottom, size_t top,
                                    loom_error *err);
/* LOOM_ZERO_ACCUM_SPLIT: the 4 KiB pages the norms' gradients span (parallel/zero_ranges.c);
 * with grads, those pages of the mapping are also marked MADV_NOHUGEPAGE. */
size_t loom_zero_norm_pages(const loom_zero *z, float *grads);
/* After the step's last reduction: the sum is complete where grad_shard points. */
void loom_zero_accum_finish(loom_zero *z);

/* This rank's reduced gradients, element 0 = flat element lo: the shard (stage >= 2) or
 * the whole buffer's range. */
float *loom_zero_reduced_grads(loom_zero *z, float *grads);
/* Clipping, AdamW on this rank's part, and the all-gather of updated parameters into
 * params. With stage 3 pass the rank's parameter shard: it is updated and nothing is
 * gathered (parallel/fsdp.h gathers before the next use); else shard is NULL. (With
 * --ep: parallel/ep_zero.h's step; with --overlap-param-gather: parallel/param_gather.h's.) */
loom_status loom_zero_optimizer_step(loom_zero *z, float *params, float *shard, float *grads,
                                     double norm, float lr, const loom_adamw_config *cfg, int step,
                                     loom_error *err);
/* Makes `grads` hold the full reduced gradient on every rank (for dumps; stage 2 only
 * needs work; --ep: loom_ep_zero_gather). */
loom_status loom_zero_gather_grads(loom_zero *z, float *grads, loom_error *err);

/* ---- the exponential moving average of the weights (--ema-decay; DiT's EMA) ----
 * Held like AdamW's moments: the whole buffer (the trainable span with --freeze) at stage
 * 0, this rank's shard of it at 1-3, so checkpoints save and reshard it as they do m and
 * v (parallel/zero_ema.c). With --ep's expert segments (ZeRO 1-3) parallel/ep_zero.h's
 * functions of the same names hold it instead; the gradient-sync strategy
 * (parallel/grad_sync.h) picks the pair. */
loom_status loom_zero_ema_enable(loom_zero *z, float decay, loom_error *err);
/* Where this rank's weights of [lo, hi) are: piece k, [cut[k], cut[k + 1]), at at[k]
 * (cut[0] = lo, cut[n] = hi; one piece but at ZeRO-3 with --freeze: parallel/fsdp.h). */
typedef struct {
    const float *at[3];
    size_t cut[4];
    int n;
} loom_zero_weights;
/* ema = the weights this rank owns. */
void loom_zero_ema_reset(loom_zero *z, const loom_zero_weights *w);
/* After each optimizer step: ema = decay * ema + (1 - decay) * weights on the owned range
 * (--freeze: frozen tensors inside the span keep their average, their weight). */
void loom_zero_ema_update(loom_zero *z, const loom_zero_weights *w);
/* The whole average into full [total] on every data-parallel rank (collective over dp);
 * with --freeze the part outside the span is params' (the whole weights). */
loom_status loom_zero_ema_gather(loom_zero *z, float *full, const float *params, loom_error *err);

/* ---- what checkpoints see of ZeRO (train/checkpointing.c): accessors, not fields ---- */
/* The buffers this rank holds, each with the range it owns: the parameters (whole, or
 * with ZeRO-3 the rank's shard param_shard, else NULL), AdamW's m and v, and the moving
 * average (data NULL without --ema-decay). */
void loom_zero_held_buffers(const loom_zero *z, float *params, float *param_shard,
                            loom_ckpt_buffer b[LOOM_CKPT_KINDS]);
/* Data-parallel rank r's row-snapped shard [*lo, *hi) of the flat buffer (also at ZeRO-0,
 * where it balances the bytes replicas write): of the optimizer state's range, and with
 * loom_zero_param_shard_of of the whole parameters (the same unless --freeze). */
void loom_zero_shard_of(const loom_zero *z, int r, size_t *lo, size_t *hi);
void loom_zero_param_shard_of(const loom_zero *z, int r, size_t *lo, size_t *hi);
/* This rank's ZeRO-3 parameter shard (parallel/fsdp.h): [lo, hi) of the optimizer state, or
 * with --freeze its loom_zero_param_shard_of. */
void loom_zero_own_param_shard(const loom_zero *z, size_t *lo, size_t *hi);
/* Zero moments for a fresh start (the rank's part of m and v). */
void loom_zero_clear_state(loom_zero *z);
static inline int loom_zero_stage(const loom_zero *z) {
    return z->stage;
}
static inline const loom_param_table *loom_zero_table(const loom_zero *z) {
    return z->table;
}
/* 1 with ZeRO 1-3 and --ep: the state is the experts' segments (parallel/ep_zero.h). */
static inline int loom_zero_has_expert_segments(const loom_zero *z) {
    return z->experts != NULL;
}

/* ---- --grad-reduce-dtype bf16 (parallel/zero_bf16.c): bf16 on the wire ----
 *
 * Each bucket [begin, end) of the local fp32 gradient is rounded to bf16 (nearest even)
 * and reduce-scattered as one all-to-all of bf16 bit patterns: rank q receives every
 * rank's rounded values of its part of the bucket (its ZeRO shard's part; MPI moves
 * bytes, no arithmetic). The receiver sums the R pieces in fp32, in rank order 0..R-1,
 * whatever the timing: the reduction is fixed by (values, R), so a layout rerun is
 * bitwise the same. Stages >= 2 keep that fp32 sum as the shard's gradient (the rest of
 * the bucket is dropped, as with fp32). Stages 0 and 1 need the whole reduced gradient
 * on every rank: the owner rounds its sums to bf16 and they are all-gathered in bf16,
 * and every rank (the owner too) widens the same bits, so the replicas stay identical.
 *
 * The rounding: each rank's contribution is off by at most u |g| (u = 2^-9, the unit
 * roundoff of bf16's 8 significant bits), the fp32 sum adds R gamma_R-sized terms, and
 * stages 0-1 round the sum once more (u |sum|). Bytes: per bucket of n elements of which
 * this rank owns c, the reduce-scatter sends n - c elements and the all-gather receives
 * n - c: 2 (n - c) x 2 bytes at stages 0-1 and (n - c) x 2 at stages >= 2, against
 * 2 (n - c) x 4 for the fp32 all-reduce every stage runs (grad_bytes in the metrics).
 *
 * The all-gathers (stages 0, 1) are posted at the end of backward in bucket order (a
 * point every rank reaches in the same program order, so the collectives match); the
 * all-to-alls go out while backward runs, as the fp32 buckets do. */
typedef enum {
    LOOM_ZERO_BF16_IDLE,    /* nothing posted */
    LOOM_ZERO_BF16_SCATTER, /* the all-to-all of rounded contributions posted */
    LOOM_ZERO_BF16_SUMMED,  /* this rank's part summed in fp32 (stages >= 2: done) */
    LOOM_ZERO_BF16_GATHER,  /* stages 0, 1: the all-gather of the rounded sums posted */
    LOOM_ZERO_BF16_DONE     /* stages 0, 1: the whole bucket widened into the gradient */
} loom_zero_bf16_phase;

/* Turns bf16 reduction on (stages 0-3 over dp > 1, not with --ep's segments): the send
 * buffer [total] and the receive buffer [R x shard], both bf16. */
loom_status loom_zero_bf16_enable(loom_zero *z, loom_error *err);
void loom_zero_bf16_free(loom_zero *z);
/* Rounds bucket b's gradient and posts its all-to-all (b->counts etc. already set). */
loom_status loom_zero_bf16_post(loom_zero *z, const float *grads, loom_zero_bucket *b,
                                loom_error *err);
/* After b's all-to-all completed: its part summed into grads in fp32; stages 0, 1 then
 * post the all-gather of the rounded sums. Idempotent past SUMMED. */
loom_status loom_zero_bf16_received(loom_zero *z, float *grads, loom_zero_bucket *b,
                                    loom_error *err);
/* After b's all-gather completed (stages 0, 1): grads[begin, end) = the widened sums. */
void loom_zero_bf16_gathered(loom_zero *z, float *grads, loom_zero_bucket *b);
/* Bytes this rank moves for a bucket of n elements of which it owns c: out in the
 * reduce-scatter, in from the all-gather (the fp32 all-reduce: both at 4 bytes). */
double loom_zero_bf16_wire_bytes(const loom_zero *z, size_t n, size_t c);
/* The same from the count of bf16 collectives a bucket takes (0: the fp32 all-reduce,
 * 2 (n - c) x 4; 1: ZeRO 2-3's all-to-all, (n - c) x 2; 2: and ZeRO 0-1's all-gather):
 * what loom plan counts for the run (plan/step_comm.c). */
double loom_zero_wire_bytes(int bf16_collectives, size_t n, size_t c);

#endif
