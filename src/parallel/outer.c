/* DiLoCo's outer optimizer and streaming DiLoCo (parallel/outer.h). */
#include "parallel/outer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/outer_impl.h"

struct loom_outer_engine {
    loom_comm_engine e;
};

/* ---- the flags ---- */

void loom_outer_config_defaults(loom_outer_config *c) {
    memset(c, 0, sizeof *c);
    c->workers = 1;
    c->inner_steps = 50;
    c->lr = 0.7f; /* the DiLoCo paper's outer Nesterov learning rate and momentum */
    c->momentum = 0.9f;
    c->fragments = 1;
    snprintf(c->dtype, sizeof c->dtype, "fp32");
    c->block = 64;
    c->merge = 0.5f;
    c->inner_lr_scale = 1.0f;
    c->elastic_worker = -1;
    c->elastic_timeout = 10.0f;
}

int loom_outer_enabled(const loom_outer_config *c) {
    return strcmp(c->kind, "diloco") == 0;
}

loom_status loom_outer_dtype_parse(const char *s, loom_outer_dtype *out, loom_error *err) {
    static const char *names[] = {"fp32", "bf16", "int8", "int4"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (loom_outer_dtype)i;
            return LOOM_OK;
        }
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "--outer-dtype %s: expected fp32, bf16, int8 or int4", s);
}

/* --elastic-worker and its companions (parallel/outer_elastic.h). */
static loom_status validate_elastic(const loom_outer_config *c, int on, loom_error *err) {
    if (c->elastic_join && c->elastic_worker < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--elastic-join: needs --elastic-worker I");
    if (c->elastic_worker == -1) return LOOM_OK;
    if (!on)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--elastic-worker %d: needs --outer diloco --workers W",
                              c->elastic_worker);
    if (c->elastic_worker < 0 || c->elastic_worker >= c->workers)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--elastic-worker %d: expected 0..%d (this job's worker of "
                              "--workers %d)",
                              c->elastic_worker, c->workers - 1, c->workers);
    if (c->workers > LOOM_OUTER_MAX_FRAGMENTS)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--workers %d: expected <= %d with --elastic-worker", c->workers,
                              LOOM_OUTER_MAX_FRAGMENTS);
    if (!(c->elastic_timeout > 0.0f) || !isfinite(c->elastic_timeout))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--elastic-timeout %g: expected > 0 (seconds an outer exchange may "
                              "take)",
                              (double)c->elastic_timeout);
    return LOOM_OK;
}

loom_status loom_outer_config_validate(const loom_outer_config *c, int n_layer, loom_error *err) {
    const int on = loom_outer_enabled(c);
    if (c->kind[0] && !on && strcmp(c->kind, "none") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--outer %s: expected none or diloco", c->kind);
    loom_status est = validate_elastic(c, on, err);
    if (est) return est;
    if (!on) {
        if (c->start_step != 0)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--outer-start-step %d: needs --outer diloco (the step where "
                                  "DiLoCo's rounds start)",
                                  c->start_step);
        if (c->workers != 1)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--workers %d: needs --outer diloco (worker groups)", c->workers);
        if (c->inner_lr_scale != 1.0f)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--inner-lr-scale %g: needs --outer diloco (it scales the inner "
                                  "steps' learning rate in DiLoCo's rounds)",
                                  (double)c->inner_lr_scale);
        return LOOM_OK;
    }
    loom_outer_dtype dt = LOOM_OUTER_FP32;
    loom_status st = loom_outer_dtype_parse(c->dtype, &dt, err);
    if (st) return st;
    if (c->workers < 1)
        return loom_error_set(err, LOOM_ERR_INPUT, "--workers %d: expected >= 1", c->workers);
    if (c->inner_steps < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--inner-steps %d: expected >= 1 (inner steps between outer syncs)",
                              c->inner_steps);
    if (!(c->lr > 0.0f) || !isfinite(c->lr))
        return loom_error_set(err, LOOM_ERR_INPUT, "--outer-lr %g: expected > 0", (double)c->lr);
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--outer-momentum %g: expected in [0, 1)",
                              (double)c->momentum);
    if (c->warmup < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--outer-warmup %d: expected >= 0 (outer syncs that only average)",
                              c->warmup);
    if (c->start_step < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--outer-start-step %d: expected >= 0 (synchronous dp steps before "
                              "DiLoCo's rounds)",
                              c->start_step);
    if (!(c->inner_lr_scale > 0.0f) || !isfinite(c->inner_lr_scale))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--inner-lr-scale %g: expected > 0 (the factor on the learning rate "
                              "schedule after --outer-start-step)",
                              (double)c->inner_lr_scale);
    if (!(c->merge >= 0.0f && c->merge < 1.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--outer-merge %g: expected in [0, 1)",
                              (double)c->merge);
    if (c->block < 1 || (dt == LOOM_OUTER_INT4 && c->block % 2))
        return loom_error_set(
            err, LOOM_ERR_INPUT, "--outer-block %d: expected %s (values per scale%s)", c->block,
            dt == LOOM_OUTER_INT4 ? "an even number >= 2" : ">= 1",
            dt == LOOM_OUTER_INT4 ? "; --outer-dtype int4 packs two per byte" : "");
    if (c->fragments < 1 || c->fragments > LOOM_OUTER_MAX_FRAGMENTS)
        return loom_error_set(err, LOOM_ERR_INPUT, "--outer-fragments %d: expected 1..%d",
                              c->fragments, LOOM_OUTER_MAX_FRAGMENTS);
    if (n_layer > 0 && c->fragments > n_layer)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--outer-fragments %d: larger than the model's %d blocks (a fragment "
                              "is one or more consecutive blocks)",
                              c->fragments, n_layer);
    if (c->fragments > 1 && c->inner_steps < 3 * c->fragments)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--inner-steps %d with --outer-fragments %d: expected >= 3 x "
                              "fragments (each fragment's sync overlaps the 2 inner steps after "
                              "it is sent, before its next send)",
                              c->inner_steps, c->fragments);
    return LOOM_OK;
}

/* ---- fragments ---- */

static int words_of(const loom_outer *o, size_t n) {
    return (int)((loom_outer_wire_bytes(o->dtype, n, o->cfg.block) + 3) / 4);
}

/* Fragment of the tensor at flat offset `at`: by its block's global layer; the embedding
 * (before the first block) goes with fragment 0, the head (after the last) with F - 1. */
static int fragment_of(const loom_param_table *t, size_t at, int F, int L) {
    int best = -1;
    size_t best_begin = 0;
    for (int i = 0; i < t->n_layer; i++)
        if (t->blocks[i].begin <= at && (best < 0 || t->blocks[i].begin >= best_begin))
            best = i, best_begin = t->blocks[i].begin;
    if (at >= t->head_begin && t->head_begin < t->total) return F - 1;
    if (best < 0) return 0;
    const int layer = t->layer_ids ? t->layer_ids[best] : best;
    return (int)((long)layer * F / L);
}

static int by_offset(const void *a, const void *b) {
    const loom_outer_run *x = a, *y = b;
    return x->flat < y->flat ? -1 : x->flat > y->flat;
}

/* Adds tensor p's part [a, e) of the flat buffer to its fragment (by where the tensor
 * starts: the same on every rank); its round-start values go at *packed in o->start. */
static loom_status add_run(loom_outer *o, const loom_param_table *t, const loom_param *p, size_t a,
                           size_t e, size_t *packed, int L, loom_error *err) {
    /* with --ep below ZeRO-3 the expert tensors of a fragment go to a fragment of their own */
    const int k = fragment_of(t, p->offset, o->cfg.fragments, L) * o->kinds +
                  (o->kinds == 2 && p->expert >= 0);
    loom_outer_fragment *f = &o->frag[k];
    loom_outer_run *grown = realloc(f->runs, (size_t)(f->n_runs + 1) * sizeof *grown);
    if (!grown) return loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
    f->runs = grown;
    /* the whole range [lo, hi): start mirrors params; own ranges: start packs them */
    const size_t at = o->own ? *packed : a - o->lo;
    f->runs[f->n_runs++] =
        (loom_outer_run){a - o->lo, e - a, at, p->counted_in_norm && !p->replica};
    *packed += e - a;
    return LOOM_OK;
}

/* Every tensor's part in this rank's range (ZeRO-3: its shard; with --ep only the shard's
 * own ranges, in flat order like the tensors) as runs of the fragments; o->n_start: the
 * round-start values they need. */
static loom_status collect_runs(loom_outer *o, const loom_param_table *t, int L, loom_error *err) {
    const size_t lo = o->lo, hi = o->lo + o->total;
    size_t packed = 0;
    int k = 0;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        const size_t pa = p->offset > lo ? p->offset : lo;
        const size_t pe = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (pe <= pa) continue;
        if (!o->own) {
            loom_status st = add_run(o, t, p, pa, pe, &packed, L, err);
            if (st) return st;
            continue;
        }
        while (k < o->n_own && o->own[k].hi <= pa) k++;
        for (int j = k; j < o->n_own && o->own[j].lo < pe; j++) {
            const size_t a = o->own[j].lo > pa ? o->own[j].lo : pa;
            const size_t e = o->own[j].hi < pe ? o->own[j].hi : pe;
            loom_status st = e > a ? add_run(o, t, p, a, e, &packed, L, err) : LOOM_OK;
            if (st) return st;
        }
    }
    o->n_start = o->own ? packed : o->total;
    return LOOM_OK;
}

void loom_outer_params_pack(const loom_outer *o, float *out) {
    for (int k = 0; k < o->n_own; k++, out += o->own[k - 1].hi - o->own[k - 1].lo)
        memcpy(out, o->params + (o->own[k].lo - o->lo),
               (o->own[k].hi - o->own[k].lo) * sizeof(float));
}

void loom_outer_params_unpack(loom_outer *o, const float *in) {
    for (int k = 0; k < o->n_own; k++, in += o->own[k - 1].hi - o->own[k - 1].lo)
        memcpy(o->params + (o->own[k].lo - o->lo), in,
               (o->own[k].hi - o->own[k].lo) * sizeof(float));
}

/* The round-start values become the parameters now, over every run. */
static void start_from_params(loom_outer *o) {
    if (!o->own) { /* start mirrors [lo, hi) */
        memcpy(o->start, o->params, o->total * sizeof(float));
        return;
    }
    for (int k = 0; k < o->n_frag; k++)
        for (int r = 0; r < o->frag[k].n_runs; r++) {
            const loom_outer_run *u = &o->frag[k].runs[r];
            memcpy(o->start + u->packed, o->params + u->flat, u->numel * sizeof(float));
        }
}

/* Every fragment's runs (in flat order), floats and offset (its first send). */
static loom_status fragment_runs(loom_outer *o, const loom_param_table *t, int L, loom_error *err) {
    const int F = o->cfg.fragments, H = o->cfg.inner_steps;
    loom_status st = collect_runs(o, t, L, err);
    for (int k = 0; !st && k < o->n_frag; k++) {
        loom_outer_fragment *f = &o->frag[k];
        const int user = k / o->kinds; /* the --outer-fragments fragment it is (part of) */
        /* --outer-start-step: the rounds count from the end of the synchronous steps */
        f->offset = o->cfg.start_step + (F == 1 ? H : (user + 1) * H / F);
        if (f->n_runs) qsort(f->runs, (size_t)f->n_runs, sizeof *f->runs, by_offset);
        for (int r = 0; r < f->n_runs; r++) f->n += f->runs[r].numel;
    }
    return st;
}

static loom_status build_fragments(loom_outer *o, const loom_param_table *t, int L,
                                   loom_error *err) {
    const int W = o->comm->size, me = o->comm->rank;
    loom_status st = fragment_runs(o, t, L, err);
    if (st) return st;
    for (int k = 0; k < o->n_frag; k++) {
        loom_outer_fragment *f = &o->frag[k];
        /* the replicas of its values inside the group each sync 1/shards of it (ZeRO-3:
         * the shard is the rank's alone) */
        f->reps = o->kinds == 2 && k % 2 ? o->edp : o->dp;
        f->shards = o->owned ? 1 : f->reps->size;
        f->shard = f->shards > 1 ? f->reps->rank : 0;
        const size_t b = (size_t)o->cfg.block, R = (size_t)f->shards;
        const size_t pn = ((f->n + R - 1) / R + b - 1) / b * b; /* a replica's part */
        f->part_lo = (size_t)f->shard * pn < f->n ? (size_t)f->shard * pn : f->n;
        f->part_n = f->part_lo + pn < f->n ? pn : f->n - f->part_lo;
        const size_t per = (f->part_n + W - 1) / W;
        f->chunk = (per + b - 1) / b * b;
        if (f->chunk == 0) f->chunk = b;
        const size_t own = loom_outer_chunk_len(f, me), n1 = f->n ? f->n : 1, o1 = own ? own : 1;
        f->delta = malloc(n1 * sizeof(float));
        f->counted = malloc(n1);
        f->mom = calloc(o1, sizeof(float));
        f->acc = malloc(o1 * sizeof(float));
        int *ints = calloc((size_t)6 * W + 2 * R, sizeof(int));
        if (!f->delta || !f->counted || !f->mom || !f->acc || !ints)
            return loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
        f->scounts = ints, f->sdispls = ints + W, f->rcounts = ints + 2 * W;
        f->rdispls = ints + 3 * W, f->gcounts = ints + 4 * W, f->gdispls = ints + 5 * W;
        f->dcounts = ints + 6 * W, f->ddispls = f->dcounts + R;
        for (size_t r = 0; r < R; r++) {
            const size_t lo = r * pn < f->n ? r * pn : f->n;
            f->ddispls[r] = (int)lo;
            f->dcounts[r] = (int)((lo + pn < f->n ? lo + pn : f->n) - lo);
        }
        size_t s = 0, rr = 0;
        for (int j = 0; j < W; j++) {
            f->scounts[j] = f->gcounts[j] = words_of(o, loom_outer_chunk_len(f, j));
            f->sdispls[j] = f->gdispls[j] = (int)s;
            s += (size_t)f->scounts[j];
            f->rcounts[j] = words_of(o, own);
            f->rdispls[j] = (int)rr;
            rr += (size_t)f->rcounts[j];
        }
        f->send = malloc((s ? s : 1) * sizeof(float));
        f->gather = malloc((s ? s : 1) * sizeof(float));
        f->recv = malloc((rr ? rr : 1) * sizeof(float));
        if (!f->send || !f->gather || !f->recv)
            return loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
        size_t at = 0;
        for (int r = 0; r < f->n_runs; r++) {
            memset(f->counted + at, f->runs[r].counted, f->runs[r].numel);
            at += f->runs[r].numel;
        }
    }
    return LOOM_OK;
}

loom_status loom_outer_create(loom_outer *o, const loom_outer_config *cfg, loom_mesh *mesh,
                              const loom_param_table *table, int n_layer_global,
                              const loom_outer_buffer *buf, int steps, loom_error *err) {
    memset(o, 0, sizeof *o);
    if (buf->lo > buf->hi || buf->hi > table->total)
        return loom_error_set(err, LOOM_ERR_STATE, "--outer: range [%zu, %zu) of %zu parameters",
                              buf->lo, buf->hi, table->total);
    o->cfg = *cfg;
    loom_status st = loom_outer_dtype_parse(cfg->dtype, &o->dtype, err);
    if (st) return st;
    o->comm = &mesh->outer;
    o->group = &mesh->world;
    o->replicas = loom_layout_replicas(mesh->layout);
    o->dp = &mesh->dp;
    o->owned = buf->owned;
    o->shards = !o->owned && o->replicas > 1 && mesh->layout.ep == 1 ? o->replicas : 1;
    o->shard = o->shards > 1 ? mesh->dp.rank : 0;
    o->kinds = !o->owned && mesh->layout.ep > 1 ? 2 : 1;
    o->edp = &mesh->edp;
    o->params = buf->params;
    o->lo = buf->lo;
    o->total = buf->hi - buf->lo;
    o->n_start = o->total;
    o->own = buf->own, o->n_own = buf->n_own;
    o->steps = steps;
    if (cfg->elastic_worker >= 0) { /* its own exchanges, no engine */
        if (o->own) {               /* its view packs the own ranges whole (outer_elastic.c) */
            o->n_start = 0;
            for (int k = 0; k < o->n_own; k++) o->n_start += o->own[k].hi - o->own[k].lo;
        }
        /* streaming: the fragments' runs and offsets (no wire buffers: the lead exchanges) */
        if (cfg->fragments > 1 &&
            !(o->frag = calloc((size_t)(o->n_frag = cfg->fragments * o->kinds), sizeof *o->frag)))
            st = loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
        if (!st && o->frag) st = fragment_runs(o, table, n_layer_global, err);
        if (st || (st = loom_outer_elastic_create(o, err))) loom_outer_free(o);
        return st;
    }
    o->n_frag = cfg->fragments * o->kinds;
    if (!(o->engine = calloc(1, sizeof *o->engine)))
        return loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
    /* its own thread drives the transfers while the inner steps compute (MPI's
     * non-blocking collectives move only inside MPI calls) */
    if ((st = loom_comm_engine_start(&o->engine->e, o->comm, 2 * o->n_frag + 2, err))) {
        free(o->engine);
        o->engine = NULL;
        return st;
    }
    o->frag = calloc((size_t)o->n_frag, sizeof *o->frag);
    if (!o->frag) {
        loom_outer_free(o);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
    }
    if ((st = build_fragments(o, table, n_layer_global, err))) {
        loom_outer_free(o);
        return st;
    }
    if (!(o->start = malloc((o->n_start ? o->n_start : 1) * sizeof(float)))) {
        loom_outer_free(o);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--outer: out of memory");
    }
    start_from_params(o);
    return LOOM_OK;
}

void loom_outer_free(loom_outer *o) {
    if (o->elastic) loom_outer_elastic_free(o);
    if (o->engine) loom_comm_engine_stop(&o->engine->e);
    free(o->engine);
    for (int k = 0; o->frag && k < o->n_frag; k++) {
        loom_outer_fragment *f = &o->frag[k];
        free(f->runs), free(f->delta), free(f->counted), free(f->mom), free(f->acc);
        free(f->send), free(f->recv), free(f->gather), free(f->scounts);
    }
    free(o->frag);
    free(o->start);
    free(o->grads), free(o->grads_pack);
    memset(o, 0, sizeof *o);
}

/* ---- one fragment's sync: send, reduce + outer step, land ---- */

static double sent_bytes(int W, int me, const int *counts) {
    double b = 0;
    for (int j = 0; j < W; j++)
        if (j != me) b += 4.0 * counts[j];
    return b;
}

void loom_outer_fragment_delta(const loom_outer *o, const loom_outer_fragment *f, float *out) {
    size_t at = 0;
    for (int r = 0; r < f->n_runs; r++) {
        const loom_outer_run *u = &f->runs[r];
        for (size_t i = 0; i < u->numel; i++)
            out[at + i] = o->start[u->packed + i] - o->params[u->flat + i];
        at += u->numel;
    }
}

/* The outer gradient start - params into the all-to-all. */
static loom_status send(loom_outer *o, loom_outer_fragment *f, int step, loom_error *err) {
    const int W = o->comm->size;
    loom_outer_fragment_delta(o, f, f->delta);
    for (int j = 0; j < W; j++)
        loom_outer_quantize(o->dtype, f->delta + f->part_lo + (size_t)j * f->chunk,
                            loom_outer_chunk_len(f, j), o->cfg.block,
                            (uint8_t *)(f->send + f->sdispls[j]));
    f->last_sent = step;
    f->ph = LOOM_OUTER_SCATTER;
    f->t_start = loom_now_ms();
    f->wait_ms = 0;
    o->stats.bytes_step += sent_bytes(W, o->comm->rank, f->scounts);
    memset(&f->op, 0, sizeof f->op);
    f->op.kind = LOOM_OP_ALLTOALLV;
    f->op.send = f->send, f->op.recv = f->recv;
    f->op.counts = f->scounts, f->op.displs = f->sdispls;
    f->op.rcounts = f->rcounts, f->op.rdispls = f->rdispls;
    return loom_comm_engine_post(&o->engine->e, &f->op, err);
}

static loom_status wait(loom_outer *o, loom_outer_fragment *f, loom_error *err) {
    const double t0 = loom_now_ms();
    loom_status st = loom_comm_engine_wait(&o->engine->e, &f->op, err);
    const double t1 = loom_now_ms();
    f->wait_ms += t1 - t0;
    o->stats.hidden_ms += (t1 - f->t_start) - (t1 - t0);
    f->t_start = t1;
    return st;
}

/* The all-to-all arrived: this worker's chunk of the mean outer gradient (contributions
 * added in worker order), the outer SGD step on it, its update into the all-gather. */
static loom_status reduce_and_step(loom_outer *o, loom_outer_fragment *f, loom_error *err) {
    const int W = o->comm->size, me = o->comm->rank;
    const size_t own = loom_outer_chunk_len(f, me), base = f->part_lo + (size_t)me * f->chunk;
    /* --outer-warmup: the fragment's first syncs (by the round of the send) only average */
    const int warm = loom_outer_warm(&o->cfg, f->last_sent, f->offset);
    float *g = f->delta + base; /* scratch: this chunk of delta is rewritten below */
    for (int i = 0; i < W; i++) {
        loom_outer_dequantize(o->dtype, (const uint8_t *)(f->recv + f->rdispls[i]), own,
                              o->cfg.block, g);
        for (size_t k = 0; k < own; k++) f->acc[k] = i == 0 ? g[k] : f->acc[k] + g[k];
    }
    double sq = 0.0;
    for (size_t k = 0; k < own; k++) {
        const float gk = f->acc[k] / (float)W;
        if (f->counted[base + k]) sq += (double)gk * gk;
        g[k] = loom_outer_update(&o->cfg, warm, &f->mom[k], gk); /* of the round-start value */
    }
    f->norm_sq = sq;
    f->landed = 1;
    loom_outer_quantize(o->dtype, g, own, o->cfg.block, (uint8_t *)(f->gather + f->gdispls[me]));
    f->ph = LOOM_OUTER_GATHER;
    o->stats.bytes_step += (double)(W - 1) * 4.0 * f->gcounts[me];
    memset(&f->op, 0, sizeof f->op);
    f->op.kind = LOOM_OP_ALLGATHERV;
    f->op.buf = f->gather, f->op.counts = f->gcounts, f->op.displs = f->gdispls;
    return loom_comm_engine_post(&o->engine->e, &f->op, err);
}

/* Every worker's update arrived: start += update; the parameters become the new start
 * (replace), or are mixed with it (streaming). */
static loom_status land(loom_outer *o, loom_outer_fragment *f, int replace, loom_error *err) {
    const int W = o->comm->size;
    for (int j = 0; j < W; j++)
        loom_outer_dequantize(o->dtype, (const uint8_t *)(f->gather + f->gdispls[j]),
                              loom_outer_chunk_len(f, j), o->cfg.block,
                              f->delta + f->part_lo + (size_t)j * f->chunk);
    /* the replicas' parts to every replica (inside the group: fast links, fp32) */
    loom_status st;
    if (f->shards > 1 &&
        (st = loom_comm_allgatherv(f->reps, f->delta, f->dcounts, f->ddispls, err)))
        return st;
    const float a = o->cfg.merge, b = 1.0f - a;
    size_t at = 0;
    for (int r = 0; r < f->n_runs; r++) {
        const loom_outer_run *u = &f->runs[r];
        float *s = o->start + u->packed, *p = o->params + u->flat;
        const float *d = f->delta + at;
        for (size_t i = 0; i < u->numel; i++) {
            s[i] += d[i];
            p[i] = replace ? s[i] : a * p[i] + b * s[i];
        }
        at += u->numel;
    }
    o->moved |= f->n_runs > 0;
    f->ph = LOOM_OUTER_IDLE;
    return LOOM_OK;
}

/* Completes the fragment's current phase (waiting) and, from the all-to-all, runs the
 * rest too when `through` (a blocking sync). */
static loom_status advance(loom_outer *o, loom_outer_fragment *f, int through, int replace,
                           loom_error *err) {
    loom_status st;
    if (f->ph == LOOM_OUTER_SCATTER) {
        if ((st = wait(o, f, err)) || (st = reduce_and_step(o, f, err))) return st;
        if (!through) return LOOM_OK;
    }
    if (f->ph == LOOM_OUTER_GATHER) {
        if ((st = wait(o, f, err)) || (st = land(o, f, replace, err))) return st;
    }
    return LOOM_OK;
}

/* Elastic streaming: a fragment is synced (its outer gradient read) or lands (its
 * parameters written) after `step`. */
static int elastic_fragment_at(const loom_outer *o, int step, int lands) {
    for (int k = 0; k < o->n_frag; k++)
        if (loom_outer_sends_at(o, &o->frag[k], step - 2) ||
            (!lands && loom_outer_sends_at(o, &o->frag[k], step)))
            return 1;
    return 0;
}

int loom_outer_touches_params(const loom_outer *o, int step) {
    if (o->elastic && o->n_frag && step > o->cfg.start_step)
        return step == o->steps || elastic_fragment_at(o, step, 0);
    if (o->elastic)
        return step <= o->cfg.start_step
                   ? step == o->cfg.start_step
                   : (step - o->cfg.start_step) % o->cfg.inner_steps == 0 || step == o->steps;
    if (step <= o->cfg.start_step) return step == o->cfg.start_step;
    if (step == o->steps) return 1;
    for (int k = 0; k < o->n_frag; k++)
        if (o->frag[k].ph != LOOM_OUTER_IDLE || loom_outer_sends_at(o, &o->frag[k], step)) return 1;
    return 0;
}

loom_status loom_outer_begin(loom_outer *o, int *step, loom_outer_reload_fn reload, void *ctx,
                             loom_error *err) {
    return o->elastic ? loom_outer_elastic_begin(o, step, reload, ctx, err) : LOOM_OK;
}

loom_status loom_outer_after_step(loom_outer *o, int step, loom_error *err) {
    if (o->elastic) { /* its outer steps move the parameters (streaming: its landings) */
        o->moved =
            step > o->cfg.start_step &&
            (o->n_frag ? step == o->steps || elastic_fragment_at(o, step, 1)
                       : (step - o->cfg.start_step) % o->cfg.inner_steps == 0 || step == o->steps);
        return loom_outer_elastic_after_step(o, step, err);
    }
    const double t0 = loom_now_ms();
    const int streaming = o->cfg.fragments > 1;
    loom_status st = LOOM_OK;
    o->stats.bytes_step = 0.0;
    o->stats.hidden_ms = 0.0;
    o->stats.syncs = 0;
    o->moved = 0;
    if (step <= o->cfg.start_step) { /* a synchronous step (loom_outer_sync_grads) */
        for (int k = 0; k < o->n_frag; k++) o->frag[k].landed = 0;
        o->stats.bytes_step = o->sync_bytes;
        o->stats.exposed_ms = o->sync_ms;
        o->sync_bytes = o->sync_ms = 0.0;
        /* the workers hold the same parameters: DiLoCo's first round starts from them */
        if (step == o->cfg.start_step) start_from_params(o);
        return LOOM_OK;
    }
    for (int k = 0; k < o->n_frag; k++) o->frag[k].landed = 0;
    /* fragments in flight move one phase (one inner step of overlap per phase) */
    for (int k = 0; k < o->n_frag && !st; k++)
        if (o->frag[k].ph != LOOM_OUTER_IDLE) st = advance(o, &o->frag[k], 0, 0, err);
    for (int k = 0; k < o->n_frag && !st; k++) {
        loom_outer_fragment *f = &o->frag[k];
        if (!loom_outer_sends_at(o, f, step)) continue;
        if ((st = send(o, f, step, err))) break;
        if (!streaming) st = advance(o, f, 1, 1, err); /* plain DiLoCo: blocking */
    }
    /* the last step: whatever is in flight lands, then every fragment that trained since
     * its last send is synced at once and replaces the local parameters (one model) */
    for (int k = 0; step == o->steps && k < o->n_frag && !st; k++) {
        loom_outer_fragment *f = &o->frag[k];
        if (f->ph != LOOM_OUTER_IDLE && (st = advance(o, f, 1, 0, err))) break;
        if (f->last_sent == step && !streaming) continue;
        if (!(st = send(o, f, step, err))) st = advance(o, f, 1, 1, err);
    }
    for (int k = 0; k < o->n_frag; k += o->kinds) o->stats.syncs += o->frag[k].landed;
    o->stats.exposed_ms = loom_now_ms() - t0;
    return st;
}

loom_status loom_outer_wait_in_flight(loom_outer *o, loom_error *err) {
    loom_status st = LOOM_OK;
    for (int k = 0; k < o->n_frag && !st; k++)
        if (o->frag[k].ph != LOOM_OUTER_IDLE) st = wait(o, &o->frag[k], err);
    return st;
}

loom_status loom_outer_set_grads(loom_outer *o, loom_flat_piece *pieces, int n, loom_error *err) {
    free(o->grads), free(o->grads_pack);
    o->grads = pieces, o->n_grads = n, o->grads_pack = NULL, o->grads_n = 0;
    for (int i = 0; i < n; i++) o->grads_n += pieces[i].n;
    if (n > 1 && o->cfg.start_step > 0 &&
        !(o->grads_pack = malloc((o->grads_n ? o->grads_n : 1) * sizeof(float))))
        return loom_error_set(err, LOOM_ERR_NOMEM, "--outer-start-step: out of memory");
    return LOOM_OK;
}

/* The workers' mean of grads[0..n) (one all-reduce). */
static loom_status mean_over_workers(loom_outer *o, float *grads, size_t n, loom_error *err) {
    const double t0 = loom_now_ms();
    const int W = o->comm->size;
    loom_status st = loom_comm_allreduce_sum(o->comm, grads, n, err);
    if (st) return st;
    const float inv = 1.0f / (float)W; /* each group's gradient is the mean of its 1/W */
    for (size_t i = 0; i < n; i++) grads[i] *= inv;
    /* what a ring all-reduce sends per rank: 2 (W - 1) / W of the buffer */
    o->sync_bytes = 2.0 * (W - 1) / W * 4.0 * (double)n;
    o->sync_ms = loom_now_ms() - t0;
    return LOOM_OK;
}

loom_status loom_outer_sync_grads(loom_outer *o, int step, loom_error *err) {
    if (step > o->cfg.start_step) return LOOM_OK;
    const int packed = o->n_grads > 1;
    float *g = packed ? o->grads_pack : o->n_grads ? o->grads[0].at : NULL;
    size_t at = 0;
    for (int i = 0; packed && i < o->n_grads; i++, at += o->grads[i - 1].n)
        memcpy(g + at, o->grads[i].at, o->grads[i].n * sizeof(float));
    loom_status st = o->elastic ? loom_outer_elastic_sync_grads(o, g, o->grads_n, step, err)
                                : mean_over_workers(o, g, o->grads_n, err);
    at = 0;
    for (int i = 0; !st && packed && i < o->n_grads; i++, at += o->grads[i - 1].n)
        memcpy(o->grads[i].at, g + at, o->grads[i].n * sizeof(float));
    return st;
}

loom_status loom_outer_mean(loom_outer *o, double *v, int n, loom_error *err) {
    /* [v..., bytes, landed norms...] over the workers, then bytes and norms over the group */
    double buf[8 + 4 * LOOM_OUTER_MAX_FRAGMENTS]; /* n_frag <= 2 x the flag's maximum */
    const int F = o->n_frag;
    if (o->elastic) { /* no per-step exchange between workers: this worker's own numbers */
        o->stats.bytes_total += o->stats.bytes_step;
        return LOOM_OK;
    }
    if (n > 8) return loom_error_set(err, LOOM_ERR_STATE, "outer: too many values");
    for (int i = 0; i < n; i++) buf[i] = v[i];
    buf[n] = o->stats.bytes_step;
    for (int k = 0; k < F; k++) {
        buf[n + 1 + k] = o->frag[k].landed ? o->frag[k].norm_sq : 0.0;
        buf[n + 1 + F + k] = o->frag[k].landed;
    }
    const int m = n + 1 + 2 * F;
    loom_status st = loom_comm_allreduce_sum_f64(o->comm, buf, m, err);
    if (st || (st = loom_comm_allreduce_sum_f64(o->group, buf + n, 1 + F, err))) return st;
    for (int i = 0; i < n; i++) v[i] = buf[i] / o->comm->size;
    o->stats.bytes_step = buf[n]; /* every rank of every worker, this step */
    o->stats.bytes_total += buf[n];
    double sq = 0.0;
    for (int k = 0; k < F; k++) {
        if (buf[n + 1 + F + k] > 0)
            o->norm_sq[k] = buf[n + 1 + k]; /* every value synced by one rank of the group */
        sq += o->norm_sq[k];
    }
    o->stats.grad_norm = sqrt(sq);
    return LOOM_OK;
}
