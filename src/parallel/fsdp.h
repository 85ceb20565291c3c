/* ZeRO stage 3 (fully sharded data parallelism): each rank keeps only its shard of the
 * parameters (the same row-aligned ranges as the optimizer state, parallel/zero.h; with
 * --freeze the optimizer's shards cut the trainable span only: see `train` below).
 * The model still reads one flat parameter buffer, a *view* mapped at start-up whose
 * physical pages exist only while a range is gathered: a block's parameters are
 * all-gathered just before its forward or backward, the next block's gather is started
 * right away (prefetch, in flight while this block computes), and after use the whole
 * huge pages inside the range are handed back to the kernel (madvise MADV_DONTNEED), so
 * resident parameter memory is the shard plus about two blocks and the huge pages that
 * straddle two ranges (loom_fsdp_release_span says why). The embedding range (head) and what
 * follows the last block (tail) stay gathered for the whole step: GPT-2's tied head needs the
 * embedding again at the end (with release_ends, --grad-accum sharded, they are handed back
 * between their uses too).
 *
 * Gathers go through the ZeRO communication engine (comm/engine.h), in the order the
 * forward needs them, input first: head, block 0 (prefetched with the head), then each
 * block's successor while it computes, and the tail (final norm, an untied lm_head)
 * while the last block computes; backward prefetches blocks in reverse. */
#ifndef LOOM_PARALLEL_FSDP_H
#define LOOM_PARALLEL_FSDP_H

#include "parallel/zero.h"

typedef struct {
    size_t begin, end;
    loom_comm_op op;
    int *counts, *displs; /* per rank: its part of [begin, end), relative to begin */
    int state;            /* 0 released, 1 in flight, 2 resident */
} loom_fsdp_range;

typedef struct {
    loom_zero *zero;
    float *view; /* the flat parameter buffer the model reads (mmap'd) */
    size_t view_bytes;
    float *shard;  /* this rank's parameters [lo, hi) */
    size_t lo, hi; /* ... its parameter shard: zero->lo, zero->hi without --freeze */
    /* --freeze (zero->span_on): the optimizer's shard [zero->lo, zero->hi) is the trainable
     * span's (balanced over the replicas, as at ZeRO 1-2) while the parameter shards stay
     * those of the whole buffer (loom_zero_param_shard_of), so the frozen weights stay
     * sharded as before. AdamW updates the part of its span shard that its parameter
     * shard holds, [own_lo, own_hi), in place; the rest of the span shard's weights is
     * fetched from their owners into `train` (below own_lo, then above own_hi) and sent back
     * updated (one all-to-all each way). xfer: 4 R ints, what this rank's shard gives each
     * other rank's span shard (counts, displs) and what its span shard takes from each
     * other rank's (counts, displs). */
    float *train;
    int *xfer;
    size_t own_lo, own_hi;
    loom_fsdp_range *ranges; /* 0: head, 1..L: blocks, L+1: tail */
    int n_ranges;
    /* 1: a gathered block stays until loom_fsdp_invalidate (the optimizer step): pipeline
     * stages run every block once per micro-batch, so they gather each block once per
     * step instead of m times, holding the stage's whole parameters during the step */
    int keep_blocks;
    /* 1 (--grad-accum sharded, a language model's untied head): the embedding range is
     * handed back once block 0 starts (its backward reads no parameter) and the tail once
     * the head's backward is done (block L-1's backward starts), so the step never holds
     * both beside the blocks; both are gathered again by the next micro-batch */
    int release_ends;
    int armed; /* release_ends in effect: set by begin_micro_batch, cleared by gather_all */
    /* NULL, or called with a range's flat bounds once its gather is complete (landed), and
     * with the span whose pages are handed back (released): the weights' bf16 copy follows
     * the view (train/compute_weights.h) */
    void (*landed)(void *ctx, size_t begin, size_t end);
    void (*released)(void *ctx, size_t begin, size_t end);
    void *cb_ctx;
    loom_error *err; /* where hook failures are described */
} loom_fsdp;

/* Allocates the view and the shard and initialises the shard from the seed. */
loom_status loom_fsdp_create(loom_fsdp *f, loom_zero *zero, uint64_t seed, loom_error *err);
void loom_fsdp_free(loom_fsdp *f);

/* Clipping and AdamW on this rank's part of the reduced gradients, updating its shard
 * (with --freeze through `train`, above); nothing is gathered (the next use gathers). */
loom_status loom_fsdp_optimizer_step(loom_fsdp *f, float *grads, double norm, float lr,
                                     const loom_adamw_config *cfg, int step, loom_error *err);

/* --freeze: fetches the weights of this rank's span shard that other ranks' parameter
 * shards hold into `train` (the optimizer step's first exchange; collective over dp). */
loom_status loom_fsdp_fetch_span(loom_fsdp *f, loom_error *err);
/* Where this rank's weights of its optimizer range [zero->lo, zero->hi) are: the shard, or
 * with --freeze its three pieces (`train` valid after a fetch or an optimizer step). */
void loom_fsdp_span_weights(const loom_fsdp *f, loom_zero_weights *w);

/* Hooks for loom_model (ctx = the loom_fsdp). */
loom_status loom_fsdp_before_block(void *ctx, int layer, int backward);
loom_status loom_fsdp_after_block(void *ctx, int layer, int backward);
/* Before a micro-batch's forward: the head and tail ranges. */
loom_status loom_fsdp_begin_micro_batch(loom_fsdp *f, loom_error *err);
/* After the optimizer updated the shard: every gathered copy is stale. */
void loom_fsdp_invalidate(loom_fsdp *f);
/* Gathers everything into the view (dumps, checkpoints); loom_fsdp_invalidate after. */
loom_status loom_fsdp_gather_all(loom_fsdp *f, loom_error *err);
/* The part of range [begin, end) (floats of the view) that is handed back after its use:
 * [*lo, *hi), the whole huge pages inside it (*lo == *hi: none). Handing back part of a
 * huge page splits it, and the view's pages are then faulted in again 4 KiB at a time:
 * on this machine's VM ~0.3 GB/s against ~12 GB/s in whole huge pages, and GPT-2 with
 * 0.8 MB blocks at dp 4 took 777 ms a step instead of 436. The pages that straddle two
 * ranges stay resident. */
void loom_fsdp_release_span(size_t begin, size_t end, size_t *lo, size_t *hi);
/* Parameter bytes resident at most: the shard and every range, less the spans handed back
 * of the ranges not in use (all but two adjacent ones: one computing, the next
 * prefetched; the blocks', and with release_ends the embedding's and the tail's too);
 * with keep_blocks the shard and every range. */
size_t loom_fsdp_resident_bytes(const loom_fsdp *f);
/* The same for registry t and a shard of shard_floats, without a loom_fsdp (sizing). */
size_t loom_fsdp_resident_bytes_of(const loom_param_table *t, size_t shard_floats, int keep_blocks,
                                   int release_ends);

#endif
