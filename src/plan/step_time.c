/* loom plan's step-time model (plan/plan.h, docs/PLAN.md "Step time"): one training step
 * of a layout, rebuilt from the step's real structure and priced from a machine profile.
 *
 * The pieces (plan/step_time_impl.h): every kernel of forward and backward at its shape on
 * this rank (step_compute.c: the transformer's GEMMs, attention, norms, activations,
 * memsets, the loss; MoE's router, dispatch and experts; tensor parallelism's
 * collectives, blocking on the critical path), then the communication engine as one FIFO
 * queue beside the compute timeline (step_comm.c: gradient buckets posted as backward
 * finishes each layer, ZeRO-3's all-gathers prefetched one block ahead, here), the
 * pipeline's actions replayed by the schedule simulator (step_pipeline.c), and the step's
 * tail (step_comm.c: norm, clipping, AdamW, ZeRO's all-gather).
 *
 * The CPU-sharing rule: on a CPU node (machine.memory_shared) R ranks of t threads share
 * c cores; the compute of a step takes max(base, R (t base + engine) / c) (engine: the
 * engine thread's CPU for the step's collectives), and a collective's profile time,
 * measured with its group alone on the node, is scaled by max(1, R/c) / max(1, G/c). In
 * a pipeline a stage waiting for its input yields its core: the ranks computing at each
 * moment share them (the schedule simulator shares them: step_pipeline.c). And the
 * kernels themselves slow down with min(c, R t) cores busy at once, the cores sharing the
 * memory bandwidth and the last-level cache (the profile's machine.corun: GEMMs and
 * attention by one factor, memory-bound kernels by another). */
#include "plan/step_time_impl.h"

#include <stdlib.h>
#include <string.h>

#include "model/vlm.h"
#include "pipeline/pipeline.h"

/* ---- the whole model on this rank (pp 1) ---- */

/* One piece on the timeline at time t: its wall time (its compute slowed by the sharing,
 * its blocking collectives as priced) added to `phase` (less the recomputation `rc`,
 * counted apart) and to the collectives' parts; returns when it ends. */
static double run_piece(step_pricing *x, double t, cost c, double *phase, double rc) {
    *phase += c.compute * x->share - rc;
    x->P.recompute_share += rc;
    x->P.tp += c.tp, x->P.cp += c.cp, x->P.moe += c.moe;
    x->compute_base += c.compute;
    return t + (c.compute * x->share + c.tp + c.cp + c.moe);
}

/* ZeRO-3: range i (0 the embedding, 1..L the blocks, L + 1 the head) all-gathered from
 * time `at`, and forward or backward waiting for it at *t. */
static void gather(step_pricing *x, const double *back, double *done, int i, double at) {
    done[i] = engine_post(&x->eng, at, loom_price_gather_ms(x->q, x->replicas, x->g[i], back[i]));
}
static void ensure(const double *done, double *t, double *wait, int i) {
    if (done[i] > *t) *wait += done[i] - *t, *t = done[i];
}

/* accum micro-batches, block by block: ZeRO-3's gathers (the next block's prefetched) and
 * the gradient buckets on the way. */
static loom_status price_whole(step_pricing *x) {
    pricer *q = x->q;
    const shapes *d = x->d;
    const loom_param_table *table = x->table;
    parts *P = &x->P;
    const int L = table->n_layer, z3 = x->zero == 3, reduce = !x->ep_sync;
    const cost emb_f = loom_price_embed_fwd(q, d), emb_b = loom_price_embed_bwd(q, d);
    const cost head_f = loom_price_head_fwd(q, d), head_b = loom_price_head_bwd(q, d, 0);
    cost *bf = calloc((size_t)(L ? L : 1), sizeof *bf);
    cost *bb = calloc((size_t)(L ? L : 1), sizeof *bb);
    /* per range: its bytes, handed back, when forward first reads it, its gather's end */
    x->n_ranges = L + 2;
    x->g = calloc((size_t)L + 2, sizeof *x->g), x->need = calloc((size_t)L + 2, sizeof *x->need);
    double *back = calloc((size_t)L + 2, sizeof *back), *done = calloc((size_t)L + 2, sizeof *done);
    if (!bf || !bb || !x->g || !x->need || !back || !done) {
        free(bf), free(bb), free(back), free(done);
        return loom_error_set(q->err, LOOM_ERR_NOMEM, "plan: out of memory");
    }
    for (int i = 0; i < L; i++) {
        bf[i] = loom_price_block_fwd(q, d, table->blocks[i].moe);
        bb[i] = loom_price_block_bwd(q, d, table->blocks[i].moe, 0);
    }
    for (int i = 0; i < L + 2; i++) {
        const size_t lo = i == 0 ? 0 : i <= L ? table->blocks[i - 1].begin : table->head_begin;
        const size_t hi = i == 0   ? (L ? table->blocks[0].begin : table->head_begin)
                          : i < L  ? table->blocks[i].begin
                          : i == L ? table->head_begin
                                   : table->total;
        x->g[i] = 4.0 * (double)(hi - lo);
        back[i] = loom_price_handed_back(lo, hi);
    }
    double t = 0;
    int resident0 = 0, resident_tail = 0;
    for (int k = 0; k < x->accum; k++) {
        const int final = k + 1 == x->accum;
        /* forward */
        if (z3) {
            if (!resident0) gather(x, back, done, 0, t);
            if (L > 0) gather(x, back, done, 1, t);
            if (!resident0) ensure(done, &t, &P->zero3_wait, 0);
            resident0 = 1;
            if (L == 0 && !resident_tail) {
                gather(x, back, done, 1, t);
                ensure(done, &t, &P->zero3_wait, 1);
                resident_tail = 1;
            }
        }
        if (k == 0) x->need[0] = t;
        t = run_piece(x, t, emb_f, &P->forward, 0);
        for (int i = 0; i < L; i++) {
            if (z3) {
                ensure(done, &t, &P->zero3_wait, i + 1);
                if (i + 2 <= L + 1 && !(i + 2 == L + 1 && resident_tail))
                    gather(x, back, done, i + 2, t);
            }
            if (k == 0) x->need[i + 1] = t;
            t = run_piece(x, t, bf[i], &P->forward, 0);
            if (z3 && i == L - 1 && !resident_tail) {
                ensure(done, &t, &P->zero3_wait, L + 1);
                resident_tail = 1;
            }
        }
        if (k == 0) x->need[L + 1] = t;
        t = run_piece(x, t, head_f, &P->forward, 0);
        /* backward (sharded accumulation: every micro-batch's ranges reduced) */
        const int post = reduce && (final || x->bk.sharded);
        t = run_piece(x, t, head_b, &P->backward, 0);
        if (post) t = loom_price_range_ready(&x->bk, t, table->head_begin, table->total);
        for (int i = L - 1; i >= 0; i--) {
            if (z3) {
                /* released after forward: gathered again, prefetched by the block above
                 * (the last block's is started here) */
                if (i == L - 1) gather(x, back, done, i + 1, t);
                ensure(done, &t, &P->zero3_wait, i + 1);
                if (i >= 1) gather(x, back, done, i, t);
            }
            const double rc =
                loom_price_block_recompute(q, d, table->blocks[i].moe).compute * x->share;
            t = run_piece(x, t, bb[i], &P->backward, rc);
            const size_t hi = i + 1 < L ? table->blocks[i + 1].begin : table->head_begin;
            if (post) t = loom_price_range_ready(&x->bk, t, table->blocks[i].begin, hi);
        }
        t = run_piece(x, t, emb_b, &P->backward, 0);
        if (post)
            t = loom_price_range_ready(&x->bk, t, 0,
                                       L ? table->blocks[0].begin : table->head_begin);
        /* sharded: the micro-batch's reduction finished before the next one's forward (the
         * step's last: price_reduction's) */
        if (!final && x->bk.sharded) t = loom_price_reduction_wait(&x->bk, t);
    }
    x->t_backward_end = t;
    free(bf), free(bb), free(back), free(done);
    return LOOM_OK;
}

/* ---- the step's terms, FLOPs and MFU ---- */

static void term(loom_plan_time *out, const char *name, const char *metric, double ms) {
    if (out->n_terms >= LOOM_PLAN_MAX_TERMS || !(ms > 0)) return;
    out->terms[out->n_terms++] = (loom_plan_term){name, metric, ms};
}

static void write_terms(const parts *P, loom_plan_time *out) {
    term(out, "forward", "dp.compute_ms", P->forward);
    term(out, "backward", "dp.compute_ms", P->backward);
    term(out, "recompute", "dp.compute_ms", P->recompute_share);
    term(out, "tp comm", "dp.compute_ms", P->tp);
    term(out, "cp comm", "dp.compute_ms", P->cp);
    term(out, "moe all-to-all", "dp.compute_ms", P->moe);
    term(out, "zero-3 gather", "dp.compute_ms", P->zero3_wait);
    term(out, "pp sends", "dp.compute_ms", P->pp_send);
    term(out, "pp bubble", "dp.compute_ms", P->pp_bubble);
    term(out, "vision messages", "dp.compute_ms", P->vision_msgs);
    term(out, "engine cpu", "dp.compute_ms", P->engine_share);
    term(out, "grad clear", "dp.compute_ms", P->clear);
    term(out, "dp sharded accum", "dp.compute_ms", P->sharded);
    term(out, "dp exposed", "grad_wait_ms", P->dp_exposed);
    term(out, "ep reduce", "grad_wait_ms", P->ep_reduce);
    term(out, "norm", NULL, P->norm);
    term(out, "optimizer", "dp.optimizer_ms", P->optimizer);
    term(out, "bf16 weights copy", NULL, P->weights_copy);
    term(out, "param gather", "dp.param_gather_ms", P->param_gather);
    term(out, "param wait", "dp.param_wait_ms", P->param_wait);
    double step = 0;
    for (int i = 0; i < out->n_terms; i++) {
        step += out->terms[i].ms;
        if (out->terms[i].ms > out->terms[out->dominant].ms) out->dominant = i;
    }
    out->step_ms = step;
}

/* PaLM's model FLOPs of a step: 6 N per token (N the non-embedding parameters plus the
 * head) and the attention's 12 L C T per token; a vlm's encoder per image. */
static double model_flops(const loom_model_config *mc, const loom_train_config *tc,
                          loom_error *err) {
    const double tokens = (double)tc->global_batch * mc->seq_len;
    loom_param_table whole;
    const loom_params_options po_whole = {0, 1, 0, 1, NULL};
    double n_params = 0;
    if (loom_params_build(&whole, mc, &po_whole, err) == LOOM_OK) {
        n_params = (double)whole.total;
        if (mc->n_experts > 0) { /* active parameters: K of E experts per token */
            const double ex = (double)loom_price_expert_floats(&whole);
            n_params = n_params - ex + ex * mc->top_k / mc->n_experts;
        }
        if (mc->family == LOOM_FAMILY_VLM) /* the encoder's and projector's: per image */
            for (int i = 0; i < whole.n_params; i++)
                if (loom_vlm_param_part(whole.params[i].name) != LOOM_VLM_PART_LLM)
                    n_params -= (double)whole.params[i].numel;
        loom_params_free(&whole);
    }
    double flops =
        tokens * (6.0 * n_params + 12.0 * mc->n_layer * (double)mc->d_model * mc->seq_len);
    if (mc->family == LOOM_FAMILY_VLM)
        flops += (double)tc->global_batch * mc->max_images * loom_vlm_image_flops(mc);
    return flops;
}

/* ---- the driver ---- */

/* This rank's tensors: pipeline stage 0 (its first chunk), tp/ep rank 0; counts the layers
 * of each pipeline stage (the split loom_pipeline_create uses). */
static loom_status stage_params(const loom_model_config *mc, const loom_train_config *tc, int pp,
                                int v, int *counts, loom_param_table *table, loom_error *err) {
    const loom_layout l = tc->layout;
    if (pp > 1) {
        loom_pp_config pc;
        loom_train_config_pipeline(tc, &pc);
        loom_status st = loom_pipeline_split_layers(mc, &pc, counts, err);
        if (st) return st;
    }
    loom_layer_set set;
    memset(&set, 0, sizeof set);
    set.n_chunks = v, set.first = 1, set.last = pp == 1;
    for (int c = 0, lo = 0; c < v && pp > 1; c++) {
        lo = 0;
        for (int s = 0; s < c * pp; s++) lo += counts[s];
        set.lo[c] = lo, set.hi[c] = lo + counts[c * pp];
    }
    const loom_params_options po = {0, l.tp > 0 ? l.tp : 1, 0, l.ep > 0 ? l.ep : 1,
                                    pp > 1 ? &set : NULL};
    return loom_params_build(table, mc, &po, err);
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
                cpu, LOOM_OK, err,   0,  strcmp(tc->precision, "bf16") == 0,
                1.0, 1.0};
    if (cpu) { /* the cores busy at once, against the threads the kernels were timed on */
        const double busy = ranks * threads < cores ? ranks * threads : cores;
        double g, m, g1, m1;
        loom_profile_corun(p, busy, &g, &m);
        loom_profile_corun(p, threads, &g1, &m1);
        q.corun_gemm = g / g1, q.corun_mem = m / m1;
    }
    if (tc->micro_batch < 1 || tc->global_batch % (tc->micro_batch * dp) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "plan: --global-batch %d is not a multiple of --micro-batch %d x "
                              "--dp %d",
                              tc->global_batch, tc->micro_batch, dp);
    const int accum = tc->global_batch / dp / tc->micro_batch;

    /* the pipeline's schedule */
    loom_pp_kind kind = LOOM_PP_1F1B;
    const int v = pp > 1 && tc->virtual_stages > 1 ? tc->virtual_stages : 1;
    loom_pp_schedule sched;
    memset(&sched, 0, sizeof sched);
    if (pp > 1) {
        loom_status st = loom_pp_kind_parse(tc->pp_schedule, &kind, err);
        if (!st) st = loom_pp_schedule_build(&sched, kind, pp, accum, v, err);
        if (st) return st;
    }
    const shapes d = loom_price_shapes(mc, tc, pp > 1 && sched.split, place->moe_load_max);
    int counts[LOOM_PP_MAX_STAGES * LOOM_MAX_CHUNKS];
    loom_param_table table;
    loom_status st = stage_params(mc, tc, pp, v, counts, &table, err);
    if (st) {
        loom_pp_schedule_free(&sched);
        return st;
    }

    step_pricing x;
    memset(&x, 0, sizeof x);
    x.mc = mc, x.tc = tc, x.q = &q, x.d = &d, x.table = &table, x.sched = &sched;
    x.counts = counts;
    x.pp = pp, x.ep = ep, x.world = world, x.replicas = replicas, x.accum = accum, x.v = v;
    x.zero = replicas > 1 ? tc->zero : 0;
    x.ep_sync = ep > 1;
    x.bubbles =
        pp > 1 && mc->family == LOOM_FAMILY_VLM && strcmp(tc->vision_schedule, "bubbles") == 0;
    x.share = cpu && (double)ranks * threads > cores ? (double)ranks * threads / cores : 1.0;
    x.sharded = loom_train_config_sharded_accum(tc, x.zero);
    loom_price_buckets_init(&x);
    st = q.st ? q.st : pp == 1 ? price_whole(&x) : loom_price_stage(&x);
    if (!st) loom_price_after_backward(&x);
    x.P.sharded += x.bk.waited;
    free(x.g), free(x.need);
    loom_params_free(&table);
    loom_pp_schedule_free(&sched);
    if (st) return st;
    if (q.st) return q.st;

    write_terms(&x.P, out);
    out->grad_sharded = x.sharded;
    out->grad_reductions = replicas < 2 ? 0 : x.sharded ? accum : 1;
    out->grad_bytes = x.bk.wire_bytes;
    if (pp > 1) memcpy(out->pp_action_ms, x.stage_ms, sizeof out->pp_action_ms);
    if (x.bubbles) {
        memcpy(out->vision_pieces, x.vis.pieces, sizeof out->vision_pieces);
        out->vision_ratio = x.vis.span / x.vis.span_first;
        out->vision_messages_ms = x.P.vision_msgs;
    }
    const double step = out->step_ms, tokens = (double)tc->global_batch * mc->seq_len;
    out->tokens_per_s = step > 0 ? tokens / (step * 1e-3) : 0;
    out->model_flops = model_flops(mc, tc, err);
    /* MFU as the papers define it: against the peak (the datasheet's in a published
     * profile), not the rate GEMMs achieve. Per rank on a CPU node: its share of the cores
     * (8 ranks on 2 cores: a quarter of one thread's peak). */
    const double peak = loom_profile_gemm_peak_gflops(p, LOOM_GEMM_NT, threads) * 1e9 / x.share;
    if (peak > 0 && step > 0) out->mfu = out->model_flops / (step * 1e-3 * world * peak);
    return LOOM_OK;
}
