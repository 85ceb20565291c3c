/* loom plan's step-time model, a pipeline stage (plan/step_time_impl.h): the pipeline's
 * actions replayed by the schedule simulator (pipeline/schedule.h) with every stage's own
 * costs (the last stage's head makes them uneven), the terms the slowest stage's and the
 * bubble what the span holds beyond them; the gradients' buckets during the last
 * backward, ZeRO-3's gathers kept for the step, and --vision-schedule bubbles
 * (plan/vision_time.h). In a pipeline a stage waiting for its input yields its core: on a
 * CPU node the computing ranks share the cores, as the simulator shares them. */
#include "plan/step_time_impl.h"

#include <stdlib.h>
#include <string.h>

/* One micro-batch's actions on the slowest stage (its chunks' mean: interleaved ranks
 * alternate), and which stage that is. */
typedef struct {
    cost f, b, w;
    int rank;
} stage_actions;

static stage_actions slowest_stage(const step_pricing *x, const fbw *chunk) {
    stage_actions a;
    memset(&a, 0, sizeof a);
    const int pp = x->pp, v = x->v;
    double slowest = -1;
    for (int r = 0; r < pp; r++) {
        cost f = {0, 0, 0, 0}, b = {0, 0, 0, 0}, w = {0, 0, 0, 0};
        for (int c = 0; c < v; c++) {
            const fbw k = chunk[c * pp + r];
            add(&f, k.f), add(&b, k.b), add(&w, k.w);
        }
        const double busy_r = total(f) + total(b) + total(w);
        if (busy_r > slowest) {
            slowest = busy_r;
            a.rank = r;
            a.f = (cost){f.compute / v, f.tp / v, f.cp / v, f.moe / v};
            a.b = (cost){b.compute / v, b.tp / v, b.cp / v, b.moe / v};
            a.w = (cost){w.compute / v, w.tp / v, w.cp / v, w.moe / v};
        }
    }
    return a;
}

static double busy_ms(const parts *P) {
    return P->forward + P->backward + P->recompute_share + P->tp + P->cp + P->moe + P->pp_send +
           P->sharded;
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
    parts *P = &x->P;
    shapes dn = *d;
    dn.vlm = 0;
    loom_plan_vision_costs c;
    memset(&c, 0, sizeof c);
    const int S = x->pp * x->v;
    for (int r = 0; r < x->pp; r++) /* one model chunk's: the mean of the rank's chunks */
        for (int ch = 0; ch < x->v; ch++) {
            const int vs = ch * x->pp + r;
            int lo = 0;
            for (int k = 0; k < vs; k++) lo += x->counts[k];
            const fbw k =
                loom_price_chunk(q, x->mc, &dn, lo, lo + x->counts[vs], vs == 0, vs == S - 1);
            c.stage_ms[r] += (total(k.f) + total(k.b) + total(k.w) + 2 * send) * s / x->v;
        }
    const double ef = loom_price_vision_fwd(q, d) * s, eb = loom_price_vision_bwd(q, d) * s;
    c.enc_ms = ef + eb;
    loom_status st =
        loom_plan_vision_price(x->mc, x->sched, x->counts, x->tc->micro_batch, &c, &x->vis, q->err);
    if (st) return st;
    *span *= x->vis.span / x->vis.span_first;
    const int moved = x->accum - x->vis.pieces[0];
    if (slow_r == 0) P->forward -= moved * ef, P->backward -= moved * eb;
    P->pp_bubble = *span - busy_ms(P) > 0 ? *span - busy_ms(P) : 0;
    const double E = (double)x->table->wte, rows = d->NI * d->P * d->C;
    for (int r = 1; r < x->pp; r++)
        if (x->vis.pieces[r] > 0)
            P->vision_msgs += 2 * coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, 4 * E) +
                              bytes_ms(q, 12 * E) * x->share;
    P->vision_msgs += 2.0 * moved * coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, 4 * rows);
    return LOOM_OK;
}

/* The gradients of this stage become final during its last backward(s): their buckets
 * overlap the last B (W) action, layer by layer. */
static void stage_buckets(step_pricing *x, double last_bwd_start, double span) {
    const loom_param_table *table = x->table;
    const int L = table->n_layer;
    const double per_layer = (span - last_bwd_start) / (L + 2);
    double t = last_bwd_start + per_layer;
    loom_price_range_ready(&x->bk, t, table->head_begin, table->total);
    for (int i = L - 1; i >= 0; i--) {
        t += per_layer;
        const size_t hi = i + 1 < L ? table->blocks[i + 1].begin : table->head_begin;
        loom_price_range_ready(&x->bk, t, table->blocks[i].begin, hi);
    }
    loom_price_range_ready(&x->bk, span, 0, L ? table->blocks[0].begin : table->head_begin);
}

/* --grad-accum sharded in a pipeline (pipeline/executor.c): every backward action that
 * completes a micro-batch's gradients of a chunk (B, or W under split backward: `bwd` its
 * duration) reduces the chunk's ranges, each posted as the layers finish (spread evenly
 * over the action), backward waiting for the ones posted before it, and waits for all of
 * them at its end: returns that action's extra time, the mean over this rank's chunks.
 * The embedding's range goes with the first chunk, but GPT-2's tied copy once a step
 * (LOOM_ZERO_ACCUM_KEEP_EMBED: after the last action). Counts the engine thread's CPU and
 * the bytes of every micro-batch's. */
static double stage_sharded_action(step_pricing *x, double bwd) {
    const loom_param_table *table = x->table;
    engine e = {0};
    buckets b = x->bk;
    b.e = &e, b.last_done = 0, b.waited = 0, b.wire_bytes = 0;
    const double us0 = x->q->engine_us;
    double extra = 0;
    for (int c = 0, first = 0; c < x->v; first += x->counts[c * x->pp], c++) {
        const int n = x->counts[c * x->pp], last = first + n;
        const int head = c == x->v - 1 && table->head_begin < table->total;
        const int emb = c == 0 && !x->d->gpt2 && n > 0 && table->blocks[0].begin > 0;
        const double per = bwd / (n + head + emb > 0 ? n + head + emb : 1);
        double t = 0;
        e.free_at = b.last_done = 0;
        if (head) t = loom_price_range_ready(&b, t + per, table->head_begin, table->total);
        for (int i = last - 1; i >= first; i--) {
            const size_t hi =
                i + 1 < table->n_layer ? table->blocks[i + 1].begin : table->head_begin;
            t = loom_price_range_ready(&b, t + per, table->blocks[i].begin, hi);
        }
        if (emb) t = loom_price_range_ready(&b, t + per, 0, table->blocks[0].begin);
        t = loom_price_reduction_wait(&b, t);
        extra += (t > bwd ? t - bwd : 0) / x->v;
    }
    x->q->engine_us += (x->accum - 1) * (x->q->engine_us - us0);
    x->bk.wire_bytes += x->accum * b.wire_bytes;
    return extra;
}

/* ZeRO-3 in a pipeline keeps the gathered blocks for the step (fsdp keep_blocks): each
 * range is gathered once, during the first forward, the next block's prefetched while one
 * computes (fb: one block's forward). */
static void stage_zero3(step_pricing *x, double fb) {
    const loom_param_table *table = x->table;
    const int L = table->n_layer;
    for (int i = 0; i <= L; i++) {
        const size_t lo = i == 0 ? 0 : table->blocks[i - 1].begin;
        const size_t hi = i < L ? table->blocks[i].begin : table->total;
        /* the last one: the last block's range and the tail's, handed back apart */
        const size_t mid = i == L ? table->head_begin : hi;
        const double g =
            loom_price_gather_ms(x->q, x->replicas, 4.0 * (double)(hi - lo),
                                 loom_price_handed_back(lo, mid) + loom_price_handed_back(mid, hi));
        x->P.zero3_wait += i <= 1 ? g : (g > fb ? g - fb : 0);
    }
}

loom_status loom_price_stage(step_pricing *x) {
    pricer *q = x->q;
    const shapes *d = x->d;
    parts *P = &x->P;
    const int pp = x->pp, S = pp * x->v;
    /* every virtual stage's one micro-batch, priced once: the last stage's head (and the
     * first's embedding) make the stages uneven, and the even ones wait for the slow one */
    fbw *chunk = malloc(sizeof *chunk * (size_t)S);
    double(*each)[3] = malloc(sizeof(double[3]) * (size_t)S);
    if (!chunk || !each) {
        free(chunk), free(each);
        return loom_error_set(q->err, LOOM_ERR_NOMEM, "plan: out of memory");
    }
    for (int vs = 0, lo = 0; vs < S; lo += x->counts[vs], vs++)
        chunk[vs] = loom_price_chunk(q, x->mc, d, lo, lo + x->counts[vs], vs == 0, vs == S - 1);
    const stage_actions a = slowest_stage(x, chunk);
    /* each F and B sends its output to the next stage (the activations, the gradient):
     * bf16 under --precision bf16 (pipeline/executor.c), 2 bytes an element */
    const double msg = (q->bf16 ? 2.0 : 4.0) * d->Ns * d->C;
    /* neighbouring stages: a pair of the pipeline group (stride replicas x tp) */
    const loom_placement pp_place = place_of(q, pp, x->replicas * q->tp);
    const double send = coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, msg);
    double dur[3]; /* the slowest stage's actions, one of each kind (pipeline/schedule.h) */
    dur[LOOM_PP_F] = total(a.f) + send, dur[LOOM_PP_B] = total(a.b) + send;
    dur[LOOM_PP_W] = total(a.w);
    /* --grad-accum sharded: each backward action waits for its chunk's reduction (not
     * slowed by the cores' sharing: it is the network's) */
    const int bwd_kind = x->sched->split ? LOOM_PP_W : LOOM_PP_B;
    const double extra = x->bk.sharded ? stage_sharded_action(x, dur[bwd_kind]) : 0;
    dur[bwd_kind] += extra;
    for (int vs = 0; vs < S; vs++) { /* every virtual stage's own actions */
        const fbw k = chunk[vs];
        each[vs][LOOM_PP_F] = total(k.f) + send, each[vs][LOOM_PP_B] = total(k.b) + send;
        each[vs][LOOM_PP_W] = total(k.w);
        each[vs][bwd_kind] += extra;
        for (int o = 0; o < 3; o++) x->stage_ms[vs % pp][o] += each[vs][o] / x->v;
    }
    /* on a CPU node the computing ranks share the cores (a waiting stage yields its core):
     * this pipeline's share is the cores over the node's copies of it */
    const double copies = (double)q->ranks / pp;
    const double slots = q->cpu ? q->cores / (q->threads * (copies > 1 ? copies : 1.0)) : 0;
    double busy[LOOM_PP_MAX_STAGES];
    double span = loom_pp_schedule_simulate_shared(x->sched, (const double(*)[3])each, slots, NULL,
                                                   busy, NULL);
    double work = 0; /* the slowest rank's actions unshared */
    for (int c = 0; c < x->v; c++) {
        const double *e = each[c * pp + a.rank];
        work += x->accum * (e[LOOM_PP_F] + e[LOOM_PP_B] + e[LOOM_PP_W]);
    }
    free(each), free(chunk);
    if (span < 0)
        return loom_error_set(q->err, LOOM_ERR_STATE, "plan: the pipeline schedule deadlocks");
    /* that rank's slowdown by the sharing, over its whole step */
    double s = work > 0 ? busy[a.rank] / work : 1.0;
    if (s < 1) s = 1;
    const double n_act = (double)x->accum * x->v;
    const double fw = a.f.compute * s, bw = (a.b.compute + a.w.compute) * s;
    P->forward = n_act * fw;
    P->backward = n_act * bw;
    if (d->recompute) { /* the share of backward that is the forward again */
        /* selective: a dense block's recomputed part of its forward */
        const double part = d->recompute == LOOM_RECOMPUTE_FULL
                                ? 1.0
                                : loom_price_block_recompute(q, d, 0).compute /
                                      loom_price_block_fwd(q, d, 0).compute;
        P->recompute_share = n_act * fw * part < P->backward ? n_act * fw * part : 0;
        P->backward -= P->recompute_share;
    }
    P->tp = n_act * (a.f.tp + a.b.tp + a.w.tp);
    P->cp = n_act * (a.f.cp + a.b.cp + a.w.cp);
    P->moe = n_act * (a.f.moe + a.b.moe + a.w.moe);
    P->pp_send = n_act * 2 * send;
    P->sharded = n_act * extra;
    double scaled[3] = {dur[0] * s, dur[1] * s, dur[2] * s};
    scaled[bwd_kind] -= extra * (s - 1);
    P->pp_bubble = span - busy_ms(P) > 0 ? span - busy_ms(P) : 0;
    if (x->bubbles) {
        loom_status st = price_bubbles(x, s, send, pp_place, a.rank, &span);
        if (st) return st;
    }
    x->compute_base = n_act * (a.f.compute + a.b.compute + a.w.compute);
    x->t_backward_end = span;
    if (!x->ep_sync && !x->bk.sharded) /* the last B (and W) action's start */
        stage_buckets(x, span - scaled[LOOM_PP_B] - (x->sched->split ? scaled[LOOM_PP_W] : 0),
                      span);
    else if (x->bk.sharded && x->d->gpt2 && x->table->n_layer > 0) /* the tied copy */
        loom_price_range_ready(&x->bk, span, 0, x->table->blocks[0].begin);
    if (x->zero == 3) {
        const int L = x->table->n_layer;
        stage_zero3(x, L > 0 ? a.f.compute * s / (L + 1) : 0);
    }
    /* GPT-2's tied embedding: the first and last stage swap its gradient */
    if (d->gpt2)
        P->pp_send +=
            coll_placed(q, LOOM_COLL_SENDRECV, 2, pp_place, 4.0 * x->mc->vocab_size / q->tp * d->C);
    /* the pipeline group's loss sum */
    P->pp_send += coll(q, LOOM_COLL_ALLREDUCE, pp, x->replicas * q->tp, 8);
    return LOOM_OK;
}
