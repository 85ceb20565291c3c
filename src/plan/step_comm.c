/* loom plan's step-time model, the communication pricers (plan/step_time_impl.h): the
 * communication engine as one FIFO queue beside the compute timeline (gradient buckets
 * posted as backward finishes each layer, ZeRO-3's all-gathers), and the step's tail after
 * backward (the rest of the reduction, the norm, clipping, AdamW, ZeRO's all-gather, and
 * the engine thread's CPU on a CPU node). */
#include "plan/step_time_impl.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/fsdp.h"
#include "parallel/shard_geometry.h"
#include "parallel/zero.h"

/* ---- gradient buckets (parallel/zero.c's rules) ---- */

/* The bytes the run counts for one partition [a, e) (parallel/zero.h's
 * loom_zero_wire_bytes), this rank owning its part inside the shard. */
static double wire_bytes(const buckets *b, size_t a, size_t e) {
    const size_t lo = a > b->shard_lo ? a : b->shard_lo, hi = e < b->shard_hi ? e : b->shard_hi;
    return loom_zero_wire_bytes(b->reduce_bf16, e - a, hi > lo ? hi - lo : 0);
}

static void post_range(buckets *b, double t, size_t lo, size_t hi) {
    if (hi <= lo || b->group < 2) return;
    pricer *q = b->q;
    const size_t n = hi - lo, parts = (n + b->bucket - 1) / b->bucket;
    for (size_t k = parts; k-- > 0;) {
        const size_t a = lo + n * k / parts, e = lo + n * (k + 1) / parts;
        const double floats = (double)(e - a);
        b->wire_bytes += wire_bytes(b, a, e);
        double ms;
        if (!b->reduce_bf16) {
            ms = engine_coll(q, LOOM_COLL_ALLREDUCE, b->group, q->tp, 4.0 * floats);
        } else {
            /* bf16 (parallel/zero_bf16.c): an all-to-all of 2-byte values, and at ZeRO 0, 1
             * an all-gather of the sums (posted when backward ends: priced here, in the
             * queue) */
            ms = engine_coll(q, LOOM_COLL_ALLTOALL, b->group, q->tp, 2.0 * floats);
            if (b->reduce_bf16 == 2)
                ms += engine_coll(q, LOOM_COLL_ALLGATHER, b->group, q->tp, 2.0 * floats);
        }
        b->last_done = engine_post(b->e, t, ms);
    }
}

/* Sharded: the shard's part of [lo, hi) added to the sum (parallel/zero.c keep_shard),
 * on the training thread. */
static double add_shard_ms(buckets *b, size_t lo, size_t hi) {
    const size_t a = lo > b->shard_lo ? lo : b->shard_lo, e = hi < b->shard_hi ? hi : b->shard_hi;
    return e > a ? bytes_ms(b->q, 12.0 * (double)(e - a)) * b->share : 0;
}

double loom_price_range_ready(buckets *b, double t, size_t lo, size_t hi) {
    const int first = hi == b->total;
    if (lo < b->span_lo) lo = b->span_lo < hi ? b->span_lo : hi; /* --freeze: as zero.c */
    if (hi > b->span_hi) hi = b->span_hi > lo ? b->span_hi : lo;
    if (lo == hi && (b->span_lo > 0 || b->span_hi < b->total)) return t;
    if (b->sharded) {
        /* --grad-accum sharded (loom_zero_grads_ready): the range goes out at once, alone
         * (FSDP's reduce-scatter per block), then backward waits for the ranges posted
         * before it (one in flight while the next is computed) and adds their shard's part
         * to the sum */
        if (b->group < 2 || hi <= lo) return t;
        const double before = b->last_done;
        post_range(b, t, lo, hi);
        const double go = (before > t ? before : t) + add_shard_ms(b, lo, hi);
        b->waited += go - t;
        return go;
    }
    if (b->embed_rows && lo == 0) {
        engine_post(b->e, t,
                    engine_coll(b->q, LOOM_COLL_ALLGATHER, b->group, b->q->tp, b->rows_bytes));
        lo = b->wte_end;
    }
    b->pending_begin = lo;
    if (b->pending_end - b->pending_begin >= b->bucket) {
        post_range(b, t, b->pending_begin, b->pending_end);
        b->pending_end = b->pending_begin;
    }
    if (b->embed_rows && first) post_range(b, t, 0, b->wte_end);
    return t;
}

double loom_price_reduction_wait(buckets *b, double t) {
    const double go = b->last_done > t ? b->last_done : t;
    b->waited += go - t;
    return go;
}

/* Whether the embedding's gradient rows are gathered as data (parallel/embed_grad.h). */
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

void loom_price_buckets_init(step_pricing *x) {
    const loom_param_table *table = x->table;
    buckets *bk = &x->bk;
    memset(bk, 0, sizeof *bk);
    const size_t raw = (size_t)(x->tc->bucket_mb * (1 << 20) / sizeof(float));
    size_t bucket = raw < 1 ? 1 : raw;
    if (bucket > table->total) bucket = table->total ? table->total : 1;
    bk->total = table->total, bk->bucket = bucket, bk->q = x->q, bk->e = &x->eng;
    bk->span_lo = 0, bk->span_hi = table->total;
    if (!x->ep_sync && loom_price_expert_floats(table) == 0)
        loom_params_train_span(table, &bk->span_lo, &bk->span_hi);
    bk->pending_begin = bk->pending_end = bk->span_hi;
    bk->group = x->ep_sync ? 1 : x->replicas;
    if (strcmp(x->tc->grad_reduce_dtype, "bf16") == 0 && !x->ep_sync)
        bk->reduce_bf16 = x->zero >= 2 ? 1 : 2;
    bk->sharded = x->sharded && !x->ep_sync;
    bk->share = x->share;
    /* this rank's shard of the span (parallel/zero.c: the shard geometry over dp) */
    bk->shard_lo = bk->span_lo, bk->shard_hi = bk->span_hi;
    if (bk->group > 1) {
        size_t *counts = calloc((size_t)bk->group, sizeof *counts);
        size_t *displs = calloc((size_t)bk->group, sizeof *displs);
        if (counts && displs) {
            loom_shard_split_rows_span(table, NULL, LOOM_SHARD_ALL, bk->span_lo, bk->span_hi,
                                       bk->group, counts, displs);
            bk->shard_lo = displs[0], bk->shard_hi = displs[0] + counts[0];
        } else if (!x->q->st) {
            x->q->st = loom_error_set(x->q->err, LOOM_ERR_NOMEM, "plan: out of memory");
        }
        free(counts), free(displs);
    }
    /* the embedding's rows as data: not with sharded accumulation (parallel/zero.c) */
    bk->embed_rows = !bk->sharded && !x->ep_sync && !bk->reduce_bf16 && x->pp == 1 &&
                     bk->span_hi - bk->span_lo == table->total &&
                     wte_rows_enabled(table, x->replicas, bucket);
    bk->wte_end = wte_numel(table);
    bk->rows_bytes = 4.0 * x->replicas * x->d->N * (x->d->C + 1);
}

/* ---- ZeRO-3's all-gathers (parallel/fsdp.c) ---- */

/* One range's all-gather over the replicas, into the view: the copy faults in again the
 * `back` bytes of it handed back after their last use (loom_fsdp_release_span), on the
 * engine thread: its CPU counted. */
double loom_price_gather_ms(pricer *q, int group, double bytes, double back) {
    const double refault = loom_profile_refault_ms(q->p, back);
    q->engine_us += 1e3 * refault;
    return engine_coll(q, LOOM_COLL_ALLGATHER, group, q->tp, bytes) + refault;
}

double loom_price_handed_back(size_t lo, size_t hi) {
    size_t a, b;
    loom_fsdp_release_span(lo, hi, &a, &b);
    return 4.0 * (double)(b - a);
}

size_t loom_price_expert_floats(const loom_param_table *t) {
    size_t n = 0;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].expert >= 0) n += t->params[i].numel;
    return n;
}

/* ---- after backward ---- */

/* The gradients' reduction left when backward ends: the pending buckets (and the
 * embedding's rows added), or expert parallelism's all-reduces. Sequence parallelism
 * first sums each norm parameter's gradient over tp once final. */
static void price_reduction(step_pricing *x) {
    pricer *q = x->q;
    const loom_param_table *table = x->table;
    parts *P = &x->P;
    for (int i = 0; x->d->sp && i < table->n_params; i++)
        if (table->params[i].sp_partial)
            P->tp += coll(q, LOOM_COLL_ALLREDUCE, q->tp, 1, 4.0 * (double)table->params[i].numel);
    const double t = x->t_backward_end;
    if (!x->ep_sync && x->replicas > 1 && x->bk.sharded) {
        /* every range went out as backward finished it: the last ones are waited for */
        const double waited = x->bk.waited;
        P->dp_exposed = loom_price_reduction_wait(&x->bk, t) - t;
        x->bk.waited = waited;
    } else if (!x->ep_sync && x->replicas > 1) {
        buckets *bk = &x->bk;
        post_range(bk, t, bk->pending_begin, bk->pending_end);
        double end = x->eng.free_at > t ? x->eng.free_at : t;
        if (bk->embed_rows) /* the rows added */
            end += bytes_ms(q, 12.0 * x->replicas * x->d->N * x->d->C);
        P->dp_exposed = end - t;
    } else if (x->ep_sync) {
        /* the all-reduces of the dense part over the replicas and of the experts' over the
         * expert-data-parallel group (each rank's wire: 2 (n - n / G) x 4 bytes); sharded
         * accumulation (--grad-accum sharded --zero 2): one of each per micro-batch,
         * backward waiting for each (LOOM_ZERO_ACCUM_BLOCKING), the step's last one here */
        const size_t ex = loom_price_expert_floats(table), dense = table->total - ex;
        const int edp = x->replicas / x->ep;
        P->ep_reduce = coll(q, LOOM_COLL_ALLREDUCE, x->replicas, q->tp, 4.0 * (double)dense) +
                       coll(q, LOOM_COLL_ALLREDUCE, edp, x->ep * q->tp, 4.0 * (double)ex);
        const double per = 8.0 * ((double)dense - (double)dense / x->replicas) +
                           8.0 * ((double)ex - (double)ex / edp);
        const int m = x->sharded ? x->accum : 1;
        x->bk.wire_bytes += m * per;
        if (m > 1) P->sharded += (m - 1) * P->ep_reduce;
    }
}

/* --overlap-param-gather: each range's gather posted once AdamW has updated it, waited for
 * by the next step's forward right before the range is read. */
static void price_overlapped_gathers(step_pricing *x) {
    pricer *q = x->q;
    parts *P = &x->P;
    const double whole = 4.0 * (double)x->table->total;
    double at = 0, free_at = 0, cum = 0, late = 0;
    const double start = P->optimizer + P->clear; /* the next forward, after the optimizer */
    for (int i = 0; i < x->n_ranges; i++) {
        cum += x->g[i] / whole;
        at = P->optimizer * cum;
        const double ms = engine_coll(q, LOOM_COLL_ALLGATHER, x->replicas, q->tp, x->g[i]);
        free_at = (free_at > at ? free_at : at) + ms;
        const double use = start + x->need[i] + late;
        if (free_at > use) late += free_at - use;
    }
    P->param_gather = x->n_ranges * loom_profile_engine_post_us(q->p) / 1e3;
    P->param_wait = late;
}

void loom_price_after_backward(step_pricing *x) {
    pricer *q = x->q;
    const loom_param_table *table = x->table;
    parts *P = &x->P;
    const double share = x->share;
    const int zero = x->zero, replicas = x->replicas;
    price_reduction(x);
    /* the loss over dp, MoE statistics, the norm (sum of squares, all-reduce over the world) */
    /* --freeze: only the trainable span (parallel/zero.h) */
    const size_t span = x->bk.span_hi - x->bk.span_lo;
    const size_t shard = zero >= 1 ? (span + replicas - 1) / replicas : span;
    /* the norm's runs: the shard (stages 2, 3), else all of it on the first replica */
    const size_t owned = zero >= 2 ? shard : span;
    P->norm = coll(q, LOOM_COLL_ALLREDUCE, replicas, q->tp, 8) +
              bytes_ms(q, 4.0 * (double)owned) * share +
              coll(q, LOOM_COLL_ALLREDUCE, x->world, 1, 8);
    if (x->mc->n_experts > 0)
        P->norm += coll(q, LOOM_COLL_ALLREDUCE, replicas, q->tp, 8.0 * (x->d->E + 4));
    /* the step's start: the local gradients cleared (stages 0, 1: a memset; 2, 3: pages
     * handed back, zero-filled by the kernel as backward touches them again: whole huge
     * pages, as cheap as the memset; counted here: llama 6M dp 2 ZeRO-2 faults ~270 times a
     * step and rank, not the 5,900 4 KiB pages of its 23 MiB) */
    P->clear = memset_ms(q, (double)span) * share;
    /* sharded accumulation hands the pages back after every micro-batch's reduction: each
     * micro-batch's backward faults them in again */
    if (x->sharded) P->clear *= x->accum;
    /* clipping and AdamW on this rank's part */
    double adam = 0;
    double updated = (double)shard;
    if (x->mc->freeze && span > 0) { /* --freeze: AdamW skips the frozen tensors */
        size_t frozen = 0;
        for (int i = 0; i < table->n_params; i++)
            if (table->params[i].frozen) frozen += table->params[i].numel;
        updated = (double)shard * (1.0 - (double)(frozen - (table->total - span)) / (double)span);
    }
    if (!q->st && updated > 0)
        q->st = loom_profile_adamw_ms(q->p, updated, q->threads, &adam, q->err);
    P->optimizer = (bytes_ms(q, 8.0 * (double)shard) + adam * q->corun_mem) * share;
    /* --precision bf16: the weights' bf16 copy rounded again from the updated weights, this
     * rank's tensors (train/compute_weights.c: 4 bytes read and 2 written a parameter; at
     * ZeRO-3 each gathered range as it lands) */
    if (q->bf16) P->weights_copy = bytes_ms(q, 6.0 * (double)table->total) * share;
    if ((zero == 1 || zero == 2) && x->tc->overlap_param_gather && x->g)
        price_overlapped_gathers(x);
    else if (zero == 1 || zero == 2) /* the updated shards to every replica */
        P->param_gather = coll(q, LOOM_COLL_ALLGATHER, replicas, q->tp, 4.0 * (double)span);
    else if (zero == 3 && span < table->total) /* --freeze: AdamW's weights fetched, sent back */
        P->param_gather = 2.0 * coll(q, LOOM_COLL_ALLTOALL, replicas, q->tp, 4.0 * (double)shard);

    /* the engine thread's CPU competes with compute on a CPU node */
    if (q->cpu) {
        const double base = x->compute_base, rt = (double)q->ranks * q->threads;
        const double demand = (rt * base + q->ranks * q->engine_us / 1e3) / q->cores;
        const double wall = rt > q->cores ? rt * base / q->cores : base;
        if (demand > wall) P->engine_share = demand - wall;
    }
}
