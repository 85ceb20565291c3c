#include "parallel/zero.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/pages.h"
#include "model/model.h"
#include "parallel/shard_geometry.h"

/* --grad-accum sharded: the pieces an untied head is handed over in, so that none is
 * larger than the largest block (1 without blocks or an untied head). */
static int head_pieces_of(const loom_param_table *t) {
    size_t block = 0;
    for (int l = 0; l < t->n_layer; l++) {
        const size_t e = l + 1 < t->n_layer ? t->blocks[l + 1].begin : t->head_begin;
        if (e - t->blocks[l].begin > block) block = e - t->blocks[l].begin;
    }
    if (!block || !t->has_head || t->lm_head == LOOM_NO_PARAM || t->lm_head == t->wte) return 1;
    const size_t head = t->total - t->head_begin;
    const size_t k = (head + block - 1) / block;
    return k > 1024 ? 1024 : (int)k;
}

/* The shape: stage, buckets' size, this rank's shard; no buffers, no engine. */
static loom_status shape(loom_zero *z, loom_comm *dp, int stage, const loom_param_table *table,
                         double bucket_mb, loom_error *err) {
    memset(z, 0, sizeof *z);
    z->dp = dp;
    z->be = loom_backend_cpu();          /* the flat buffers and optimizer state live on the host */
    z->stage = dp->size > 1 ? stage : 0; /* one replica: nothing to shard */
    z->table = table;
    z->total = table->total;
    z->bucket_floats = (size_t)(bucket_mb * (1 << 20) / sizeof(float));
    if (z->bucket_floats < 1) z->bucket_floats = 1;
    if (z->bucket_floats > z->total) z->bucket_floats = z->total ? z->total : 1;
    /* Each posted range (at most one per layer, plus tail, wte and the rest of the
     * head) splits into partitions of at most bucket_floats. */
    const size_t max_buckets =
        z->total / z->bucket_floats + (size_t)table->n_layer + 4 + (size_t)head_pieces_of(table);
    if (max_buckets > (size_t)INT_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--bucket-mb %g: %zu buckets for %zu parameters (expected fewer "
                              "than 2^31: a larger --bucket-mb)",
                              bucket_mb, max_buckets, z->total);
    z->max_buckets = (int)max_buckets;
    /* --freeze: only the trainable span is sharded (not with experts; ZeRO-3's parameter
     * shards stay the whole buffer's, param_counts: parallel/fsdp.h) */
    int experts = 0;
    for (int i = 0; i < table->n_params; i++) experts |= table->params[i].expert >= 0;
    z->span_on = loom_params_train_span(table, &z->span_lo, &z->span_hi) && !experts;
    if (!z->span_on) z->span_lo = 0, z->span_hi = z->total;
    loom_status st =
        z->span_on ? loom_shard_layout_init_span(&z->shards, table, dp, z->span_lo, z->span_hi, err)
                   : loom_shard_layout_init(&z->shards, table, LOOM_SHARD_ALL, dp, err);
    if (!st && z->span_on) {
        z->param_counts = calloc((size_t)dp->size, sizeof(size_t));
        z->param_displs = calloc((size_t)dp->size, sizeof(size_t));
        if (z->param_counts && z->param_displs)
            loom_shard_split_rows(table, NULL, LOOM_SHARD_ALL, z->total, dp->size, z->param_counts,
                                  z->param_displs);
        else
            st = LOOM_ERR_NOMEM;
    }
    if (st) {
        loom_zero_free(z);
        return loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO: out of memory for the shards");
    }
    z->lo = z->shards.lo;
    z->hi = z->shards.hi;
    if (z->stage == 0) {
        z->lo = z->span_lo;
        z->hi = z->span_hi;
    }
    z->shard_floats = z->hi - z->lo;
    return LOOM_OK;
}

loom_status loom_zero_size(loom_zero *z, loom_comm *dp, int stage, const loom_param_table *table,
                           double bucket_mb, loom_error *err) {
    return shape(z, dp, stage, table, bucket_mb, err);
}

loom_status loom_zero_create(loom_zero *z, loom_comm *dp, int stage, const loom_param_table *table,
                             double bucket_mb, loom_error *err) {
    loom_status st = shape(z, dp, stage, table, bucket_mb, err);
    if (st) return st;
    const size_t n = z->shard_floats;
    const size_t R = (size_t)dp->size;
    z->buckets = calloc((size_t)z->max_buckets, sizeof *z->buckets);
    z->parts = calloc((size_t)z->max_buckets * 4 * R, sizeof *z->parts);
    z->m = calloc(n ? n : 1, sizeof(float));
    z->v = calloc(n ? n : 1, sizeof(float));
    for (int b = 0; z->buckets && z->parts && b < z->max_buckets; b++) {
        int *p = z->parts + (size_t)b * 4 * R;
        z->buckets[b].counts = p;
        z->buckets[b].displs = p + R;
        z->buckets[b].rcounts = p + 2 * R;
        z->buckets[b].rdispls = p + 3 * R;
    }
    /* stage >= 2: grad_shard is set by grads_alloc */
    if (!z->buckets || !z->parts || !z->m || !z->v) {
        loom_zero_free(z);
        return loom_error_set(err, LOOM_ERR_NOMEM, "ZeRO: out of memory for optimizer state");
    }
    /* Queue room: every bucket of a step (twice: --grad-reduce-dtype bf16's all-to-all and
     * all-gather), the embedding rows' all-gather, and ZeRO-3's gathers (head, blocks, tail). */
    st = loom_comm_engine_start(&z->engine, dp, 2 * z->max_buckets + 1 + table->n_layer + 2, err);
    if (st) loom_zero_free(z);
    return st;
}

loom_status loom_zero_plan_embedding(loom_zero *z, int n_tokens, int seq_len, loom_error *err) {
    /* One bucket for the whole model asks for no overlap: everything after backward.
     * --grad-accum sharded reduces every micro-batch's head range as it comes, like any
     * other range: a dense wte range posted early would be a third range in flight.
     * bf16 reduction: the embedding rows go through the buckets like every gradient. */
    if (z->bucket_floats >= z->total || z->accum_resident || z->reduce_bf16 || z->span_on)
        return LOOM_OK;
    return loom_embed_grad_plan(&z->embed, z->table, z->dp->size, n_tokens, seq_len, err);
}

static int on_device(const loom_zero *z) {
    return z->be && z->be->device != LOOM_DEVICE_CPU;
}

/* `bytes` of be's memory, zeroed; NULL when out of memory. */
static float *device_zeros(const loom_backend *be, size_t bytes) {
    float *p = loom_backend_alloc(be, bytes);
    if (p) loom_backend_memset(be, p, 0, bytes);
    return p;
}

loom_status loom_zero_place_on(loom_zero *z, const loom_backend *be, loom_error *err) {
    if (z->stage != 0 || z->dp->size != 1 || z->ema || z->embed.enabled)
        return loom_error_set(err, LOOM_ERR_STATE,
                              "ZeRO on %s: only one replica at stage 0 (no moving average)",
                              be->name);
    const size_t bytes = (z->shard_floats ? z->shard_floats : 1) * sizeof(float);
    float *m = device_zeros(be, bytes), *v = device_zeros(be, bytes);
    if (!m || !v) {
        loom_backend_free(be, m);
        loom_backend_free(be, v);
        return loom_error_set(err, LOOM_ERR_NOMEM, "AdamW state on %s: out of memory (%.1f MiB)",
                              be->name, 2.0 * (double)bytes / (1 << 20));
    }
    free(z->m);
    free(z->v);
    z->m = m;
    z->v = v;
    z->be = be;
    return loom_backend_status(be, err);
}

void loom_zero_free(loom_zero *z) {
    loom_comm_engine_stop(&z->engine);
    loom_embed_grad_free(&z->embed);
    free(z->buckets);
    free(z->parts);
    loom_zero_bf16_free(z);
    loom_shard_layout_free(&z->shards);
    free(z->param_counts);
    free(z->param_displs);
    if (on_device(z)) {
        loom_backend_free(z->be, z->m);
        loom_backend_free(z->be, z->v);
        z->m = z->v = NULL;
    }
    free(z->m);
    free(z->v);
    free(z->ema);
    free(z->accum);
    memset(z, 0, sizeof *z);
}

void loom_zero_memory_of(const loom_zero *z, loom_zero_memory *m) {
    const size_t n = z->shard_floats, f = sizeof(float);
    m->shard_floats = n;
    size_t plo, phi; /* ZeRO-3 with --freeze: the parameter shard, and AdamW's copy of the
                      * span shard's weights held by other ranks */
    loom_zero_own_param_shard(z, &plo, &phi);
    const size_t a = plo > z->lo ? plo : z->lo, e = phi < z->hi ? phi : z->hi;
    const size_t fetched = n - (a < e ? e - a : 0); /* not in the parameter shard */
    m->params = (z->stage < 3 ? z->total : z->span_on ? phi - plo + fetched : n) * f;
    m->grads_local = (z->span_hi - z->span_lo) * f; /* --freeze: the trainable span */
    /* stages 2, 3: the shard's reduced gradient, kept inside the local buffer (--ep: in
     * place as well, counted with the optimizer's shard) */
    m->grads_shard = z->stage >= 2 && !z->experts ? n * f : 0;
    if (z->accum_resident) { /* --grad-accum sharded: two ranges in flight, and the shard's sum */
        m->grads_local = z->accum_resident + n * f;
        m->grads_shard = n * f;
    }
    m->optimizer = 2 * n * f;
}

/* Transparent huge pages where the kernel allows them: the buffer's pages are handed back
 * and faulted in again (zero-filled) every step, and 4 KiB faults over 500 MB cost ~0.3 s
 * of CPU per step on GPT-2 124M; 2 MiB faults cost a small fraction of that. */
float *loom_zero_map_huge(size_t bytes) {
    /* Over-map by one huge page and trim, so the mapping starts on a 2 MiB boundary. */
    size_t span = bytes + LOOM_HUGE_PAGE_BYTES;
    char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)p + LOOM_HUGE_PAGE_BYTES - 1) / LOOM_HUGE_PAGE_BYTES *
                       LOOM_HUGE_PAGE_BYTES);
    if (a > p) munmap(p, (size_t)(a - p));
    if (p + span > a + bytes) munmap(a + bytes, (size_t)(p + span - (a + bytes)));
#ifdef MADV_HUGEPAGE
    madvise(a, bytes, MADV_HUGEPAGE); /* a hint: without it, plain pages */
#endif
    return (float *)a;
}

float *loom_zero_grads_alloc(loom_zero *z) {
    if (on_device(z)) /* stage 0 (loom_zero_place_on) */
        return device_zeros(z->be, (z->total ? z->total : 1) * sizeof(float));
    if (z->stage < 2 && !z->span_on) return calloc(z->total ? z->total : 1, sizeof(float));
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    z->grads_bytes = (z->total * sizeof(float) + page - 1) / page * page;
    z->page_map = malloc(z->grads_bytes / page);
    float *grads = z->page_map ? loom_zero_map_huge(z->grads_bytes) : NULL;
#ifdef MADV_NOHUGEPAGE
    /* --freeze: the frozen tensors' part of the mapping is address space only (nothing
     * clears, reduces or reads it); 4 KiB pages there, so that a stray write (a frozen
     * decoder's norm gradients, cleared by model/vlm.c) never makes 2 MiB resident */
    if (grads && z->span_on) {
        const size_t lo = z->span_lo * sizeof(float) / page * page;
        const size_t hi = (z->span_hi * sizeof(float) + page - 1) / page * page;
        if (lo > 0) madvise(grads, lo, MADV_NOHUGEPAGE);
        if (hi < z->grads_bytes) madvise((char *)grads + hi, z->grads_bytes - hi, MADV_NOHUGEPAGE);
    }
#endif
    /* The shard's reduced gradient stays where the in-place all-reduce leaves it (its
     * pages are never handed back): no copy, no second buffer. --ep keeps its own. */
    if (grads && !z->experts) z->grad_shard = z->accum ? z->accum : grads + z->lo;
#ifdef MADV_NOHUGEPAGE
    /* --grad-accum sharded, an untied embedding: 4 KiB pages, so that its gradient's
     * scatter makes only the micro-batch's rows resident (loom_zero_accum_enable) */
    if (grads && z->accum && z->emb_nohuge)
        madvise(grads, z->emb_nohuge * sizeof(float), MADV_NOHUGEPAGE);
    if (grads && z->accum && z->norms_nohuge) loom_zero_norm_pages(z, grads);
#endif
    return grads;
}

void loom_zero_grads_free(loom_zero *z, float *grads) {
    free(z->page_map);
    z->page_map = NULL;
    if (!z->experts) z->grad_shard = NULL;
    if (!grads) return;
    if (on_device(z))
        loom_backend_free(z->be, grads);
    else if (z->stage < 2 && !z->span_on)
        free(grads);
    else
        munmap(grads, z->grads_bytes);
}

void loom_zero_release_pages(float *base, size_t begin, size_t end) {
    loom_pages_release(base, begin * sizeof(float), end * sizeof(float));
}

void loom_zero_grads_clear(loom_zero *z, float *grads) {
    if (on_device(z))
        loom_backend_memset(z->be, grads, 0, z->total * sizeof(float));
    else if (z->stage < 2) /* --freeze: the trainable span only */
        memset(grads + z->span_lo, 0, (z->span_hi - z->span_lo) * sizeof(float));
    else
        madvise(grads, z->grads_bytes, MADV_DONTNEED);
}

size_t loom_zero_grads_resident(const loom_zero *z, const float *grads) {
    if (z->stage < 2 || !z->page_map) return (z->span_hi - z->span_lo) * sizeof(float);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = z->grads_bytes / page, resident = 0;
    if (mincore((void *)grads, z->grads_bytes, z->page_map) != 0) return z->grads_bytes;
    for (size_t i = 0; i < n; i++) resident += z->page_map[i] & 1;
    return resident * page;
}

/* The local gradient pages resident now, kept as the step's high-water mark. */
static void sample_resident(loom_zero *z, const float *grads) {
    if (z->stage < 2) return;
    size_t r = loom_zero_grads_resident(z, grads);
    if (r > z->grads_peak) z->grads_peak = r;
}

/* --grad-accum sharded: the buckets reduced and added to the sum form a run down from the
 * top of the buffer ([consumed_from, total): buckets are posted from the top down and
 * usually complete in that order); every page above the run's lowest page is handed
 * back, also the pages two buckets share, which neither could hand back alone. */
static void release_consumed(loom_zero *z, float *grads) {
    for (int moved = 1; moved;) {
        moved = 0;
        for (int b = 0; b < z->n_buckets; b++) {
            loom_zero_bucket *k = &z->buckets[b];
            if (!k->reduced || k->released || k->end != z->consumed_from) continue;
            z->consumed_from = k->begin;
            k->released = moved = 1;
        }
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float);
    const size_t from = (z->consumed_from + page - 1) / page * page;
    if (from < z->released_from) loom_zero_release_pages(grads, from, z->released_from);
    if (from < z->released_from) z->released_from = from;
}

/* Stage >= 2: bucket b is reduced; its local pages outside this rank's shard can go
 * (--grad-accum sharded: all of them, its shard's part was added to the sum). */
static void release_bucket(loom_zero *z, float *grads, int b) {
    loom_zero_bucket *k = &z->buckets[b];
    if (z->stage < 2 || k->released) return;
    if (z->accum) { /* and the ranges above it have to be done with too */
        release_consumed(z, grads);
        return;
    }
    const size_t a = k->begin, e = k->end; /* [a, e) less [lo, hi) */
    if (a < z->lo) loom_zero_release_pages(grads, a, e < z->lo ? e : z->lo);
    if (e > z->hi) loom_zero_release_pages(grads, a > z->hi ? a : z->hi, e);
    k->released = 1;
}

void loom_zero_step_begin(loom_zero *z) {
    z->accum_n = 0;
    memset(&z->times, 0, sizeof z->times);
    z->step_t0_ms = loom_now_ms();
    z->step_cpu0_ms = loom_thread_cpu_ms();
    z->engine_cpu0_ms = loom_comm_engine_cpu_ms(&z->engine);
}

void loom_zero_step_end(loom_zero *z) {
    z->times.engine_cpu_ms = loom_comm_engine_cpu_ms(&z->engine) - z->engine_cpu0_ms;
}

void loom_zero_begin_reduction(loom_zero *z) {
    z->n_buckets = 0;
    z->consumed_from = z->span_hi;
    z->released_from = z->grads_bytes / sizeof(float); /* the mapping's end */
    z->recv_used = 0;
    z->pending_begin = z->pending_end = z->span_hi;
    z->step_wait_ms = 0.0;
}

/* Posts the collective of one partition [begin, end): an in-place all-reduce at every
 * stage. Stages >= 2 then keep only their shard's part of it (keep_shard) rather than
 * asking MPI for a reduce-scatter: OpenMPI's MPI_Ireduce_scatter (coll/libnbc) reduces
 * the whole partition on rank 0 and scatters it from there, which measured twice the
 * communication CPU of the all-reduce on rank 0 (GPT-2 124M, 2 ranks: 235 vs 116 ms a
 * step), while the all-reduce's reduce-scatter + all-gather schedule (comm/world.c)
 * shares the summing evenly; its all-gather half is one extra copy. */
static loom_status post_partition(loom_zero *z, float *grads, size_t begin, size_t end,
                                  loom_error *err) {
    if (z->n_buckets == z->max_buckets)
        return loom_error_set(err, LOOM_ERR_STATE, "ZeRO: more buckets than planned");
    loom_zero_bucket *b = &z->buckets[z->n_buckets++];
    b->begin = begin;
    b->end = end;
    b->released = b->reduced = 0;
    b->bf16_phase = LOOM_ZERO_BF16_IDLE;
    loom_shard_layout_parts(&z->shards, begin, end, b->counts, b->displs);
    z->times.grad_bytes +=
        loom_zero_bf16_wire_bytes(z, end - begin, (size_t)b->counts[z->dp->rank]);
    if (z->reduce_bf16) return loom_zero_bf16_post(z, grads, b, err);
    loom_comm_op *op = &b->op;
    op->kind = LOOM_OP_ALLREDUCE;
    op->buf = grads + begin;
    op->count = end - begin;
    return loom_comm_engine_post(&z->engine, op, err);
}

/* Bucket b's collective complete. bf16 reduction: the received pieces are summed first
 * (stages 0, 1: and the sums gathered). Stage >= 2: the part inside this rank's shard is
 * where grad_shard points (the embedding rows are added there next), the rest can go.
 * --grad-accum sharded: that part is added to the shard's sum now (the step's first
 * micro-batch: copied), so that every page of the bucket can go. */
static loom_status keep_shard(loom_zero *z, float *grads, int b, loom_error *err) {
    loom_zero_bucket *k = &z->buckets[b];
    loom_status st = z->reduce_bf16 ? loom_zero_bf16_received(z, grads, k, err) : LOOM_OK;
    if (st || z->stage < 2 || k->reduced) return st;
    k->reduced = 1;
    if (!z->accum) return LOOM_OK;
    const size_t a = k->begin > z->lo ? k->begin : z->lo, e = k->end < z->hi ? k->end : z->hi;
    if (a >= e) return LOOM_OK;
    float *dst = z->accum + (a - z->lo);
    const float *src = grads + a;
    const size_t n = e - a;
    if (z->accum_n == 0)
        memcpy(dst, src, n * sizeof(float));
    else
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    return LOOM_OK;
}

size_t loom_zero_backward_range_begin(const loom_param_table *t, int i, int n_head,
                                      size_t tail_begin) {
    const int L = t->n_layer;
    size_t b, e;
    if (i < n_head && n_head > 1)
        loom_model_head_piece(t, n_head - 1 - i, n_head, &b, &e);
    else if (i < n_head)
        b = t->head_begin;
    else if (i < n_head + L)
        b = t->blocks[L - 1 - (i - n_head)].begin;
    else
        b = tail_begin;
    return b;
}

/* The largest part send_bucket cuts [begin, begin + n) into. */
static size_t largest_part(size_t n, size_t bucket) {
    if (n == 0) return 0;
    const size_t parts = (n + bucket - 1) / bucket;
    return (n + parts - 1) / parts;
}

size_t loom_zero_largest_partition(const loom_zero *z, size_t wte_end) {
    if (z->dp->size == 1 || z->reduce_bf16) return 0;
    const loom_param_table *t = z->table;
    const int L = t->n_layer;
    const int n_head = t->head_begin < t->total ? (z->head_pieces > 1 ? z->head_pieces : 1) : 0;
    /* as loom_zero_grads_ready: the dense wte range first, on its own; then the ranges in
     * backward's order (head or its pieces, blocks L-1 .. 0, the embedding down to wte_end
     * or 0), merged until a run reaches bucket_floats (--grad-accum sharded: each alone),
     * the rest at loom_zero_finish_reduction */
    size_t most = largest_part(wte_end, z->bucket_floats), end = z->total;
    for (int i = 0; i <= n_head + L; i++) {
        const size_t b = loom_zero_backward_range_begin(t, i, n_head, wte_end);
        if (b > end) continue;
        if (i == n_head + L || end - b >= z->bucket_floats || z->accum_resident) {
            const size_t p = largest_part(end - b, z->bucket_floats);
            if (p > most) most = p;
            end = b;
        }
    }
    return most;
}

/* Posts [begin, end) as partitions of at most bucket_floats, highest offsets first (the
 * order backward finishes them in), so partitions are posted in one order everywhere. */
static loom_status send_bucket(loom_zero *z, float *grads, size_t begin, size_t end,
                               loom_error *err) {
    if (begin == end || z->dp->size == 1) return LOOM_OK;
    size_t n = end - begin, parts = (n + z->bucket_floats - 1) / z->bucket_floats;
    loom_status st = LOOM_OK;
    for (size_t k = parts; k-- > 0 && !st;)
        st = post_partition(z, grads, begin + n * k / parts, begin + n * (k + 1) / parts, err);
    return st;
}

loom_status loom_zero_grads_ready(void *ctx, size_t begin, size_t end) {
    loom_zero_ready_ctx *c = ctx;
    loom_zero *z = c->zero;
    /* --freeze: only the trainable span is reduced; a frozen range has nothing to send */
    if (begin < z->span_lo) begin = z->span_lo < end ? z->span_lo : end;
    if (end > z->span_hi) end = z->span_hi > begin ? z->span_hi : begin;
    if (begin == end && z->span_on) return LOOM_OK;
    /* Ranges arrive in decreasing order: extend the pending run downwards. */
    if (end != z->pending_begin)
        return loom_error_set(c->err, LOOM_ERR_STATE, "ZeRO: gradient ranges out of order");
    const int first = end == z->total, embed = z->embed.enabled;
    loom_status st = LOOM_OK;
    sample_resident(z, c->grads);
    if (embed && begin == 0) {
        /* The embedding backward is left to us: d(wpe) here, the wte rows as data. The
         * dense wte range went out at the start of backward. */
        st = loom_embed_grad_post(&z->embed, &z->engine, z->dp->rank, c->grads, c->d_embed,
                                  c->tokens, c->err);
        if (st) return st;
        begin = z->embed.wte_end;
    }
    z->pending_begin = begin;
    /* Posting is cheap with the engine thread; without one (no MPI_THREAD_MULTIPLE) it
     * starts the collective here, which can itself take long: that blocks backward, so
     * the time counts as exposed either way. */
    double t0 = loom_comm_now_ms();
    const int posted_before = z->n_buckets;
    /* --grad-accum sharded: every range goes out at once (FSDP's reduce-scatter per block) */
    if (z->pending_end - z->pending_begin >= z->bucket_floats || z->accum) {
        st = send_bucket(z, c->grads, z->pending_begin, z->pending_end, c->err);
        z->pending_end = z->pending_begin;
    }
    /* The dense wte range is final once the head's backward is done (the first call). */
    if (!st && embed && first) st = send_bucket(z, c->grads, 0, z->embed.wte_end, c->err);
    /* --grad-reduce-dtype bf16 at stages 0-1, when this call posted a bucket: the buckets
     * posted before it are summed and their all-gathers posted now, behind it in the
     * queue, so the gathers overlap the rest of backward instead of all waiting for its
     * end. It waits for their all-to-alls (the new bucket's keeps the link busy): every
     * rank must post its collectives in the same order, which acting on whichever test
     * for completion came back done would not give. */
    const int gather_earlier = z->reduce_bf16 && z->stage < 2 && z->n_buckets > posted_before;
    for (int b = 0; gather_earlier && b < posted_before && !st; b++) {
        if (z->buckets[b].bf16_phase != LOOM_ZERO_BF16_SCATTER) continue;
        st = loom_comm_engine_wait(&z->engine, &z->buckets[b].op, c->err);
        if (!st) st = keep_shard(z, c->grads, b, c->err);
    }
    /* Without a thread, give MPI a chance to move the buckets while backward goes on;
     * stage >= 2 notes the buckets already reduced. */
    int reduced = 0;
    for (int b = 0; b < z->n_buckets && !st; b++) {
        if (z->engine.threaded && (z->stage < 2 || z->buckets[b].released)) continue;
        int done;
        st = loom_comm_engine_test(&z->engine, &z->buckets[b].op, &done, c->err);
        if (!st && done && z->stage >= 2) {
            st = loom_comm_engine_wait(&z->engine, &z->buckets[b].op, c->err); /* no wait */
            if (!st) st = keep_shard(z, c->grads, b, c->err);
            reduced = 1;
        }
    }
    /* --grad-accum sharded: the ranges posted before this one are waited for, so that
     * while the next range's backward runs only this one is in flight: two ranges of
     * local gradient resident at most, whatever the network's speed (the price: backward
     * waits when a range's reduction takes longer than the next range's backward). */
    for (int b = 0; b < posted_before && z->accum && !st; b++) {
        if (z->buckets[b].reduced) continue;
        st = loom_comm_engine_wait(&z->engine, &z->buckets[b].op, c->err);
        if (!st) st = keep_shard(z, c->grads, b, c->err);
        reduced = 1;
    }
    z->step_wait_ms += loom_comm_now_ms() - t0;
    /* Handing pages back is memory work, not communication: outside the wait timer. */
    for (int b = 0; b < z->n_buckets && reduced; b++)
        if (z->buckets[b].reduced) release_bucket(z, c->grads, b);
    return st;
}

loom_status loom_zero_finish_reduction(loom_zero *z, float *grads, loom_error *err) {
    z->times.compute_ms = loom_now_ms() - z->step_t0_ms;
    z->times.compute_cpu_ms = loom_thread_cpu_ms() - z->step_cpu0_ms;
    sample_resident(z, grads);
    double t0 = loom_comm_now_ms();
    loom_status st = send_bucket(z, grads, z->pending_begin, z->pending_end, err);
    z->pending_end = z->pending_begin;
    for (int b = 0; b < z->n_buckets; b++) {
        loom_status w = loom_comm_engine_wait(&z->engine, &z->buckets[b].op, err);
        if (!w && !st) w = keep_shard(z, grads, b, err); /* bf16, stages 0-1: posts a gather */
        if (!st) st = w; /* wait for all, so no buffer stays in MPI's hands */
    }
    for (int b = 0; b < z->n_buckets && z->reduce_bf16 && z->stage < 2; b++) {
        loom_status w = loom_comm_engine_wait(&z->engine, &z->buckets[b].op, err);
        if (!w && !st) loom_zero_bf16_gathered(z, grads, &z->buckets[b]);
        if (!st) st = w;
    }
    if (z->embed.enabled) { /* the rows go on top of the reduced dense part */
        loom_status w =
            z->stage >= 2
                ? loom_embed_grad_apply(&z->embed, &z->engine, z->grad_shard, z->lo, z->hi, err)
                : loom_embed_grad_apply(&z->embed, &z->engine, grads, 0, z->total, err);
        if (!st) st = w;
    }
    z->step_wait_ms += loom_comm_now_ms() - t0;
    for (int b = 0; b < z->n_buckets; b++) release_bucket(z, grads, b); /* untimed */
    if (z->stage >= 2) z->grads_after = loom_zero_grads_resident(z, grads);
    return st;
}

/* Pages (floats, whole 4 KiB pages) a range [b, e) of the local buffer may hold once
 * written: from the huge page below b where one fits, else from b's page, to e's page
 * end; the embedding's rows with 4 KiB pages only where backward scattered them. */
typedef struct {
    size_t pg, H, M;    /* a page, a huge page, the mapping: floats */
    size_t emb_end;     /* [0, emb_end): 4 KiB pages (loom_zero_grads_alloc), else 0 */
    size_t emb_touched; /* ... of which a micro-batch's tokens touch at most this */
} span_rules;

static size_t range_low(const span_rules *r, size_t b) {
    size_t lo = b / r->H * r->H;
    if (lo + r->H > r->M || lo < r->emb_end) lo = b / r->pg * r->pg; /* no huge page there */
    return lo;
}

/* The resident floats of ranges [b, e) (the one being written) and [e, u) (in flight). */
static size_t pair_floats(const span_rules *r, size_t b, size_t u) {
    size_t hi = (u + r->pg - 1) / r->pg * r->pg;
    if (hi > r->M) hi = r->M;
    const size_t lo = range_low(r, b);
    if (b == 0 && r->emb_end) { /* the embedding: its rows' pages, then the rest */
        const size_t rest = hi > r->emb_end ? hi - r->emb_end : 0;
        return rest + (r->emb_touched < r->emb_end ? r->emb_touched : r->emb_end);
    }
    return hi - lo;
}

loom_status loom_zero_accum_enable(loom_zero *z, int split_head, int flags, int n_tokens,
                                   int size_only, loom_error *err) {
    if (z->stage < 2)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "--grad-accum sharded: needs --zero 2 or 3 over --dp > 1 (got ZeRO-%d)", z->stage);
    /* The local bytes a micro-batch holds at most (loom_zero_grads_ready): one range in
     * flight and the one below it being written, backward's order being the head (in
     * head_pieces pieces of vocabulary rows, model/model.h), blocks L-1 .. 0, the
     * embedding. Everything above the range in flight is handed back (the page it shares
     * with the one above it stays: release_consumed); below the one being written nothing
     * is touched, except that a transparent huge page faulted in for its lowest page spans
     * down to a 2 MiB boundary. The embedding (untied) has 4 KiB pages, so only the rows
     * of the micro-batch's tokens are resident; a tied one is written whole by the head's
     * backward and stays resident beside every pair. */
    const loom_param_table *t = z->table;
    const int L = t->n_layer;
    z->head_pieces = split_head ? head_pieces_of(t) : 1;
    span_rules r = {.pg = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float),
                    .H = LOOM_HUGE_PAGE_BYTES / sizeof(float)};
    r.M = (t->total + r.pg - 1) / r.pg * r.pg;
    const size_t emb_end = L > 0 ? t->blocks[0].begin : t->head_begin;
    /* a pipeline stage's tied embedding (GPT-2's first and last stage) is summed locally
     * over the step and reduced once after the stages' swap: resident all step */
    const int keep_embed = (flags & LOOM_ZERO_ACCUM_KEEP_EMBED) && emb_end > 0;
    const int tied = keep_embed || (t->lm_head != LOOM_NO_PARAM && t->lm_head == t->wte);
    const loom_param *wte = NULL;
    for (int i = 0; i < t->n_params && t->wte != LOOM_NO_PARAM; i++)
        if (t->params[i].offset == t->wte) wte = &t->params[i];
    if (!tied && wte && wte->offset == 0 && wte->shape[0] > 0 && wte->numel <= emb_end) {
        r.emb_end = emb_end / r.pg * r.pg; /* whole pages below block 0 */
        const size_t row = wte->numel / (size_t)wte->shape[0];
        const size_t row_pages = (row + r.pg - 1) / r.pg + 1; /* a row spans at most this */
        /* the rows of n_tokens tokens, and the rest of the range (wpe) written whole */
        r.emb_touched = (size_t)n_tokens * row_pages * r.pg + (emb_end - wte->numel) + r.pg;
    }
    size_t tied_floats = tied ? (emb_end + r.pg - 1) / r.pg * r.pg : 0;
    if (tied && r.H <= r.M) tied_floats = (emb_end + r.H - 1) / r.H * r.H; /* huge pages */
    if (tied_floats > r.M) tied_floats = r.M;
    /* The ranges in backward order, range i = [b_i, b_{i-1}) (b_{-1} = total) written
     * while range i - 1 is in flight: resident [low(b_i), b_{i-2}). */
    size_t most = 0, b = t->total, prev_b = t->total, prev_prev_b = t->total;
    const int n_head = t->head_begin < t->total ? z->head_pieces : 0;
    for (int i = 0; i < n_head + L + (emb_end > 0 && !keep_embed); i++) {
        b = loom_zero_backward_range_begin(t, i, n_head, 0);
        /* --ep (LOOM_ZERO_ACCUM_BLOCKING): the range being written alone */
        const size_t top = flags & LOOM_ZERO_ACCUM_BLOCKING ? prev_b : prev_prev_b;
        const size_t f = pair_floats(&r, b, top) + (b > 0 ? tied_floats : 0);
        if (f > most) most = f;
        prev_prev_b = prev_b;
        prev_b = b;
    }
    if (keep_embed && tied_floats > most) most = tied_floats; /* the swap's own reduction */
    if (flags & LOOM_ZERO_ACCUM_SPLIT) most += loom_zero_norm_pages(z, 0) * r.pg;
    z->norms_nohuge = (flags & LOOM_ZERO_ACCUM_SPLIT) != 0;
    z->accum_resident = most * sizeof(float);
    z->emb_nohuge = r.emb_end;
    if (size_only) return LOOM_OK;
    if (z->experts) { /* --ep: laid out as the moments (parallel/ep_zero.h), which unmaps it */
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *p = mmap(NULL, (z->total * sizeof(float) + page - 1) / page * page,
                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        z->accum = p == MAP_FAILED ? NULL : p;
        return z->accum ? LOOM_OK
                        : loom_error_set(err, LOOM_ERR_NOMEM,
                                         "--grad-accum sharded with --ep: out of memory");
    }
    z->accum = calloc(z->shard_floats ? z->shard_floats : 1, sizeof(float));
    return z->accum ? LOOM_OK
                    : loom_error_set(err, LOOM_ERR_NOMEM, "--grad-accum sharded: out of memory");
}

void loom_zero_accum_micro_batch(loom_zero *z, float *grads) {
    z->accum_n++; /* its shard was added bucket by bucket (keep_shard) */
    loom_zero_grads_clear(z, grads);
}

void loom_zero_accum_finish(loom_zero *z) {
    z->accum_n = 0; /* the sum is where grad_shard points: nothing left to add */
}

float *loom_zero_reduced_grads(loom_zero *z, float *grads) {
    return z->stage >= 2 ? z->grad_shard : grads + z->lo;
}

loom_status loom_zero_optimizer_step(loom_zero *z, float *params, float *shard, float *grads,
                                     double norm, float lr, const loom_adamw_config *cfg, int step,
                                     loom_error *err) {
    float *g = loom_zero_reduced_grads(z, grads);
    double t0 = loom_now_ms(), c0 = loom_thread_cpu_ms();
    loom_grad_clip(z->be, g, z->hi - z->lo, norm, cfg->grad_clip);
    loom_adamw_step(z->be, z->table, shard ? shard : params + z->lo, g, z->m, z->v, z->lo, z->hi,
                    lr, cfg, step);
    double t1 = loom_now_ms();
    z->times.optimizer_ms = t1 - t0;
    z->times.optimizer_cpu_ms = loom_thread_cpu_ms() - c0;
    if (z->stage == 0 || shard) return LOOM_OK; /* stage 3 gathers before the next use */
    loom_status st =
        loom_comm_allgatherv_large(z->dp, params, z->shards.counts, z->shards.displs, 0, err);
    z->times.param_gather_ms = loom_now_ms() - t1;
    return st;
}

loom_status loom_zero_gather_grads(loom_zero *z, float *grads, loom_error *err) {
    if (z->stage < 2) return LOOM_OK;
    if (z->accum) memcpy(grads + z->lo, z->accum, (z->hi - z->lo) * sizeof(float));
    return loom_comm_allgatherv_large(z->dp, grads, z->shards.counts, z->shards.displs, 0, err);
}

void loom_zero_held_buffers(const loom_zero *z, float *params, float *param_shard,
                            loom_ckpt_buffer b[LOOM_CKPT_KINDS]) {
    size_t plo, phi; /* ZeRO-3: the parameter shard (--freeze: not the state's) */
    loom_zero_own_param_shard(z, &plo, &phi);
    if (param_shard)
        b[0] = (loom_ckpt_buffer){param_shard, plo, plo, phi};
    else
        b[0] = (loom_ckpt_buffer){params, 0, 0, z->total};
    const size_t base = z->lo; /* stage 0: [span_lo, span_hi), else the shard */
    b[1] = (loom_ckpt_buffer){z->m, base, z->lo, z->hi};
    b[2] = (loom_ckpt_buffer){z->v, base, z->lo, z->hi};
    b[3] = (loom_ckpt_buffer){z->ema, base, z->lo, z->hi};
}

void loom_zero_shard_of(const loom_zero *z, int r, size_t *lo, size_t *hi) {
    *lo = z->shards.displs[r];
    *hi = *lo + z->shards.counts[r];
}

void loom_zero_param_shard_of(const loom_zero *z, int r, size_t *lo, size_t *hi) {
    if (!z->span_on) {
        loom_zero_shard_of(z, r, lo, hi);
        return;
    }
    *lo = z->param_displs[r];
    *hi = *lo + z->param_counts[r];
}

void loom_zero_own_param_shard(const loom_zero *z, size_t *lo, size_t *hi) {
    if (z->span_on) {
        loom_zero_param_shard_of(z, z->dp->rank, lo, hi);
    } else { /* the state's (--ep: the full-layout range its segments lie in) */
        *lo = z->lo;
        *hi = z->hi;
    }
}

void loom_zero_clear_state(loom_zero *z) {
    const size_t n = z->hi - z->lo; /* stage 0: the whole trainable span */
    memset(z->m, 0, n * sizeof(float));
    memset(z->v, 0, n * sizeof(float));
}
