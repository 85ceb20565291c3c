/* Runs a rank's action list: the pipelined forward/backward of one step (or forward only
 * for validation). */
#include <stdio.h>

#include "core/clock.h"
#include "kernels/bf16.h"
#include "pipeline/pipeline.h"

/* The message buffers of a slot: (gradient?, slot, chunk). */
static size_t msg_index(const loom_pipeline *pl, int grad, int slot, int chunk) {
    return ((size_t)grad * pl->n_slots + slot) * pl->v + chunk;
}
static float *buf_of(const loom_pipeline *pl, float *base, int grad, int slot, int chunk) {
    return base + msg_index(pl, grad, slot, chunk) * pl->act_floats;
}
/* --precision bf16: the message's bf16 bits on the wire (pipeline.h). */
static uint16_t *wire_of(const loom_pipeline *pl, uint16_t *base, int grad, int slot, int chunk) {
    return base + msg_index(pl, grad, slot, chunk) * pl->act_floats;
}

typedef struct {
    loom_pipeline *pl;
    const loom_pp_schedule *s;
    const int *slot_of, *post_after;
    const float *params;
    float *grads;
    const int32_t *batch;
    float dloss;
    int backward;
    int vision; /* --vision-schedule bubbles' pieces in this list (training) */
    double loss_sum;
    loom_pp_loss_fn loss_fn; /* NULL: the model's cross-entropy */
    void *loss_ctx;
    loom_pp_forward_fn forwarded; /* NULL, or called after each forward action */
    /* gradient readiness (training) */
    loom_grads_ready_fn ready;
    void *ready_ctx;
    int left[LOOM_MAX_CHUNKS];  /* final B/W still to run per chunk */
    int early[LOOM_MAX_CHUNKS]; /* head and layers reported during the chunk's last B/W */
    int next_report;            /* chunks report in decreasing order */
    /* --grad-accum sharded: every micro-batch's ranges reduced by the action completing
     * them (B, or W under split backward), each action on its own (run_compute) */
    loom_grad_sync *sync;
    int sharded;
    loom_error *err;
} step_ctx;

/* The tied embedding: the first and last stage swap their gradients and both add the
 * other's (a + b == b + a bitwise, so both copies stay identical). */
static loom_status reduce_tied(step_ctx *x) {
    loom_pipeline *pl = x->pl;
    const loom_param *p = &pl->slots[0]->table.params[0];
    loom_comm_handle hs, hr;
    float *g = x->grads + p->offset;
    loom_status st =
        loom_comm_irecv(pl->comm, pl->tied, p->numel, pl->tied_peer, 9000, &hr, x->err);
    if (!st) st = loom_comm_isend(pl->comm, g, p->numel, pl->tied_peer, 9000, &hs, x->err);
    if (!st) st = loom_comm_wait(&hr, x->err);
    if (!st) st = loom_comm_wait(&hs, x->err);
    for (size_t i = 0; i < p->numel && !st; i++) g[i] += pl->tied[i];
    return st;
}

/* --grad-accum sharded: the flat ranges [bottom, top) an action completing a micro-batch
 * of chunk c reports: its blocks, the head's with the last virtual stage, the embedding's
 * with the first (not a tied copy: it is summed over the step and reduced after the
 * stages' swap, report_chunk). */
static void chunk_span(const step_ctx *x, int c, size_t *bottom, size_t *top) {
    const loom_pipeline *pl = x->pl;
    const loom_param_table *t = &pl->slots[0]->table;
    const int lo = pl->chunk_lo[c], hi = pl->chunk_hi[c], vs = c * pl->pp + pl->rank;
    *top = c == pl->v - 1 && t->has_head ? t->total : loom_model_block_range_end(t, hi - 1);
    *bottom = lo > 0 || vs > 0 || pl->tied_peer >= 0 ? t->blocks[lo].begin : 0;
}

/* ... after the action: the embedding's range (first virtual stage), then every range is
 * reduced into the shard's sum and [bottom, top) cleared for the next micro-batch. */
static loom_status sharded_end(step_ctx *x, size_t bottom, size_t top) {
    const loom_param_table *t = &x->pl->slots[0]->table;
    loom_status st = LOOM_OK;
    if (bottom == 0 && t->blocks[0].begin > 0) st = x->ready(x->ready_ctx, 0, t->blocks[0].begin);
    return st ? st : loom_grad_sync_finish_ranges(x->sync, bottom, top, x->err);
}

/* Chunk c's gradients are final: its flat ranges, from the top down (the head's and the
 * layers' unless its last backward reported them already). */
static loom_status report_chunk(step_ctx *x, int c) {
    const loom_param_table *t = &x->pl->slots[0]->table;
    loom_status st = LOOM_OK;
    if (c == x->pl->v - 1 && t->has_head && !x->early[c])
        st = x->ready(x->ready_ctx, t->head_begin, t->total);
    for (int l = x->pl->chunk_hi[c] - 1; l >= x->pl->chunk_lo[c] && !st && !x->early[c]; l--)
        st = x->ready(x->ready_ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    if (c == 0 && !st) {
        if (x->pl->tied_peer >= 0) st = reduce_tied(x);
        if (!st && x->vision && !x->sharded) st = loom_pp_vision_add_grads(x->pl, x->grads, x->err);
        const size_t emb = t->blocks[0].begin; /* sharded: only a tied copy is left */
        if (!st && x->sharded && x->pl->tied_peer >= 0)
            loom_grad_sync_begin_ranges(x->sync, emb, 1);
        if (!st && (!x->sharded || x->pl->tied_peer >= 0)) st = x->ready(x->ready_ctx, 0, emb);
        if (!st && x->sharded && x->pl->tied_peer >= 0)
            st = loom_grad_sync_finish_ranges(x->sync, 0, emb, x->err);
    }
    return st;
}

/* --vision-schedule bubbles with --grad-accum sharded: the encoder replicas' gradients
 * join the first stage's in its action completing the step's last micro-batch of chunk 0
 * (after the embedding backward sent that micro-batch's image-row gradient), so they are
 * reduced with that micro-batch's embedding range; every message the first stage sends
 * the others is posted by then, so the owners' last pieces can run. */
static loom_status vision_grads_sharded(step_ctx *x, int vs, int chunk) {
    if (!x->vision || vs != 0 || x->left[chunk] != 1) return LOOM_OK;
    return loom_pp_vision_add_grads(x->pl, x->grads, x->err);
}

static loom_status chunk_done(step_ctx *x, int c) {
    x->left[c]--;
    return LOOM_OK;
}

/* Reports the chunks that are complete. Run before the next compute (never between a
 * backward and its send: the tied-embedding swap waits for the other end). */
static loom_status report_ready(step_ctx *x) {
    loom_status st = LOOM_OK;
    if (!x->ready) return LOOM_OK;
    while (x->next_report >= 0 && x->left[x->next_report] == 0 && !st)
        st = report_chunk(x, x->next_report--);
    return st;
}

/* The slot's outgoing buffer (gradient?, chunk), once its previous message has left:
 * that one belonged to the slot's previous micro-batch, whose receiver has (activations:
 * its backward came back) or has posted (gradients) the matching receive. */
static loom_status send_buffer(step_ctx *x, int grad, int slot, int chunk, float **buf) {
    loom_pipeline *pl = x->pl;
    *buf = pl->wire_send ? pl->send_buf : buf_of(pl, pl->send_buf, grad, slot, chunk);
    return loom_comm_wait(&pl->send_h[msg_index(pl, grad, slot, chunk)], x->err);
}
/* The outgoing message is written (into send_buffer's buf): bf16 rounds it onto the wire. */
static void send_written(step_ctx *x, int grad, int slot, int chunk) {
    loom_pipeline *pl = x->pl;
    if (pl->wire_send)
        loom_bf16_from_f32_n(wire_of(pl, pl->wire_send, grad, slot, chunk), pl->send_buf,
                             pl->act_floats);
}
/* A received message in fp32 (its receive completed): in place, or bf16 widened into `to`. */
static const float *received(step_ctx *x, int grad, int slot, int chunk, float *to) {
    loom_pipeline *pl = x->pl;
    if (!pl->wire_recv) return buf_of(pl, pl->recv_buf, grad, slot, chunk);
    loom_bf16_to_f32_n(to, wire_of(pl, pl->wire_recv, grad, slot, chunk), pl->act_floats);
    return to;
}

static loom_status run_compute(step_ctx *x, const loom_pp_action *a, int rank) {
    loom_pipeline *pl = x->pl;
    const int slot = x->slot_of[a->mb];
    loom_model *mod = pl->slots[slot];
    const int vs = a->chunk * pl->pp + rank, lo = pl->chunk_lo[a->chunk],
              hi = pl->chunk_hi[a->chunk];
    float *recv_in = vs == 0 ? NULL : buf_of(pl, pl->recv_buf, 0, slot, a->chunk);
    const float *in = vs == 0 ? mod->embed : recv_in; /* kept until the chunk's backward */
    float *send;
    const float *out = mod->blocks[hi - 1].res2;
    loom_status st = LOOM_OK;
    if (a->op == LOOM_PP_F) {
        if (a->chunk == 0) loom_model_load_batch(mod, x->batch, a->mb * pl->cfg.micro_batch);
        if (vs == 0 && mod->vlm)
            st = loom_pp_vision_before_embed(pl, mod, a->mb, x->vision, x->err);
        if (vs == 0 && !st) st = loom_model_embed_forward(mod, x->params);
        if (vs > 0) in = received(x, 0, slot, a->chunk, recv_in); /* bf16: widened */
        if (vs > 0) loom_model_stream_receive(mod, in);           /* a dit's conditioning */
        if (!st) st = loom_model_blocks_forward(mod, x->params, lo, hi, in, &out);
        if (!st && vs == pl->S - 1) {
            double s = 0;
            if (!(st = loom_model_head_forward(mod, x->params, out)))
                st = x->loss_fn ? x->loss_fn(x->loss_ctx, mod, a->mb, x->backward, &s, x->err)
                                : loom_model_loss_sum(mod, x->dloss, x->backward, &s);
            x->loss_sum += s;
        } else if (!st && !(st = send_buffer(x, 0, slot, a->chunk, &send))) {
            /* MoE layers of this chunk: their aux/z terms in training (the last stage's
             * come with the loss; evaluation is cross-entropy only); the sum over stages
             * is the pipeline group's all-reduce at the end. A custom loss is weighted:
             * the terms too (loom_pp_custom). */
            const double aux = loom_moe_loss_sum(mod->moe, x->dloss, x->backward);
            if (x->backward) x->loss_sum += x->loss_fn ? (double)x->dloss * aux : aux;
            loom_model_stream_send(mod, out, send);
            send_written(x, 0, slot, a->chunk);
        }
        if (!st && x->forwarded) x->forwarded(x->loss_ctx, mod, a->mb);
        return st;
    }
    const int split = x->s->split, completes = (a->op == LOOM_PP_W) == split;
    /* The chunk's last backward (W when split), every higher chunk reported: the head's
     * and each layer's range go to data parallelism as soon as they are final, so the
     * reduction overlaps the rest of this backward (the embedding's waits: the tied
     * swap blocks, never before a send). --grad-accum sharded: every micro-batch's. */
    const int final = x->ready && completes &&
                      (x->sharded || (x->left[a->chunk] == 1 && x->next_report == a->chunk));
    loom_grads_ready_fn ready = final ? x->ready : NULL;
    const loom_param_table *t = &mod->table;
    size_t bottom = 0, top = 0;
    if (final && x->sharded) {
        chunk_span(x, a->chunk, &bottom, &top);
        loom_grad_sync_begin_ranges(x->sync, top, x->left[a->chunk] == pl->m);
    }
    if (a->op == LOOM_PP_B) {
        if (vs == pl->S - 1)
            st = loom_model_head_backward(mod, x->params, x->grads, out);
        else
            loom_model_grad_stream_receive(mod, received(x, 1, slot, a->chunk, pl->send_buf));
        if (!st && ready && vs == pl->S - 1) st = ready(x->ready_ctx, t->head_begin, t->total);
        if (!st)
            st = loom_model_blocks_backward(mod, x->params, x->grads, lo, hi, in, ready,
                                            x->ready_ctx);
        if (!st && vs > 0 && !(st = send_buffer(x, 1, slot, a->chunk, &send))) {
            loom_model_grad_stream_send(mod, send);
            send_written(x, 1, slot, a->chunk);
        }
        if (!st && vs == 0 && !split) st = loom_model_embed_backward(mod, x->params, x->grads);
        if (!st && vs == 0 && !split && pl->vision)
            st = loom_pp_vision_after_embed_backward(pl, a->mb, x->err);
        if (!st && final && x->sharded && !(st = vision_grads_sharded(x, vs, a->chunk)))
            st = sharded_end(x, bottom, top);
        x->early[a->chunk] |= final;
        return st || split ? st : chunk_done(x, a->chunk);
    }
    /* W: the weight gradients B left for later, the head's first (ranges go top down) */
    if (vs == pl->S - 1) st = loom_model_head_backward_weight(mod, x->grads);
    if (!st && ready && vs == pl->S - 1) st = ready(x->ready_ctx, t->head_begin, t->total);
    if (!st)
        st = loom_model_blocks_backward_weight(mod, x->params, x->grads, lo, hi, in, ready,
                                               x->ready_ctx);
    if (!st && vs == 0) st = loom_model_embed_backward(mod, x->params, x->grads);
    if (!st && vs == 0 && pl->vision) st = loom_pp_vision_after_embed_backward(pl, a->mb, x->err);
    if (!st && final && x->sharded && !(st = vision_grads_sharded(x, vs, a->chunk)))
        st = sharded_end(x, bottom, top);
    x->early[a->chunk] |= final;
    return st ? st : chunk_done(x, a->chunk);
}

/* Posts every receive of micro-batch mb into its slot's buffers. */
static loom_status post_receives(step_ctx *x, int mb) {
    loom_pipeline *pl = x->pl;
    const loom_pp_schedule *s = x->s;
    const int r = pl->rank, slot = x->slot_of[mb];
    loom_status st = LOOM_OK;
    for (int j = 0; j < s->n[r] && !st; j++) {
        const loom_pp_action *a = &s->acts[r][j];
        if (a->mb != mb || (a->op != LOOM_PP_RECV_ACT && a->op != LOOM_PP_RECV_GRAD)) continue;
        const int grad = a->op == LOOM_PP_RECV_GRAD, tag = loom_pp_message_tag(s, r, a);
        loom_comm_handle *h = &pl->recv_h[msg_index(pl, grad, slot, a->chunk)];
        st = pl->wire_recv
                 ? loom_comm_irecv_bf16(pl->comm, wire_of(pl, pl->wire_recv, grad, slot, a->chunk),
                                        pl->act_floats, a->peer, tag, h, x->err)
                 : loom_comm_irecv(pl->comm, buf_of(pl, pl->recv_buf, grad, slot, a->chunk),
                                   pl->act_floats, a->peer, tag, h, x->err);
    }
    return st;
}

/* --vision-schedule bubbles: the encoder's pieces placed before action `upto` of this
 * rank's list (its length: those after the last), their time added to the busy times. */
static loom_status run_vision_pieces(step_ctx *x, int upto, double *busy_cpu, double *busy_wall) {
    const double w0 = loom_now_ms(), c0 = loom_thread_cpu_ms();
    const loom_status st = loom_pp_vision_pieces(x->pl, upto, x->batch, x->err);
    *busy_cpu += loom_thread_cpu_ms() - c0;
    *busy_wall += loom_now_ms() - w0;
    return st;
}

static loom_status run_list(step_ctx *x, loom_grad_sync *sync) {
    loom_pipeline *pl = x->pl;
    const loom_pp_schedule *s = x->s;
    const int r = pl->rank, n = s->n[r];
    const loom_pp_action *acts = s->acts[r];
    loom_error *err = x->err;
    loom_status st = LOOM_OK;
    for (int k = 1; k < pl->n_slots; k++) { /* hooks and trace are set after creation */
        pl->slots[k]->hooks = pl->slots[0]->hooks;
        pl->slots[k]->trace = pl->slots[0]->trace;
    }
    if ((st = loom_grad_sync_begin_micro_batch(sync, err))) return st;
    if (x->vision && (st = loom_pp_vision_step_begin(pl, x->params, err))) return st;
    /* The receives of the micro-batches whose slots are free at the start. */
    for (int i = 0; i < s->m && !st; i++)
        if (x->post_after[i] < 0) st = post_receives(x, i);
    const size_t n_msgs = 2 * (size_t)pl->n_slots * pl->v;
    double busy_wall = 0, busy_cpu = 0, t_start = loom_now_ms();
    const uint64_t sent0 = pl->sent_bytes;
    for (int j = 0; j < n && !st; j++) {
        const loom_pp_action *a = &acts[j];
        const int grad = a->op == LOOM_PP_RECV_GRAD || a->op == LOOM_PP_SEND_GRAD;
        const int slot = x->slot_of[a->mb];
        loom_comm_handle *h = NULL;
        if (x->vision && (st = run_vision_pieces(x, j, &busy_cpu, &busy_wall))) break;
        switch (a->op) {
        case LOOM_PP_RECV_ACT:
        case LOOM_PP_RECV_GRAD:
            st = loom_comm_wait(&pl->recv_h[msg_index(pl, grad, slot, a->chunk)], err);
            break;
        case LOOM_PP_SEND_ACT:
        case LOOM_PP_SEND_GRAD:
            h = &pl->send_h[msg_index(pl, grad, slot, a->chunk)];
            st = pl->wire_send
                     ? loom_comm_isend_bf16(
                           pl->comm, wire_of(pl, pl->wire_send, grad, slot, a->chunk),
                           pl->act_floats, a->peer, loom_pp_message_tag(s, r, a), h, err)
                     : loom_comm_isend(pl->comm, buf_of(pl, pl->send_buf, grad, slot, a->chunk),
                                       pl->act_floats, a->peer, loom_pp_message_tag(s, r, a), h,
                                       err);
            if (s == &pl->train)
                pl->sent_bytes +=
                    pl->act_floats * (pl->wire_send ? sizeof(uint16_t) : sizeof(float));
            break;
        default: {
            if ((st = report_ready(x))) break;
            double w0 = loom_now_ms(), c0 = loom_thread_cpu_ms();
            loom_trace_begin(pl->slots[0]->trace,
                             a->op == LOOM_PP_F   ? "pp forward"
                             : a->op == LOOM_PP_B ? "pp backward"
                                                  : "pp weight-grad",
                             "compute");
            st = run_compute(x, a, r);
            loom_trace_end(pl->slots[0]->trace);
            const double c = loom_thread_cpu_ms() - c0;
            busy_cpu += c;
            busy_wall += loom_now_ms() - w0;
            if (s == &pl->train) pl->act_cpu_ms[j] = c;
            /* a slot freed here: its next micro-batch's receives */
            for (int i = 0; i < s->m && !st; i++)
                if (x->post_after[i] == j) st = post_receives(x, i);
        }
        }
        /* let MPI move the sends in flight */
        for (size_t q = 0; q < n_msgs && !st && a->op <= LOOM_PP_W; q++) {
            int done;
            if (pl->send_h[q].active) st = loom_comm_test(&pl->send_h[q], &done, err);
        }
    }
    if (!st && x->vision) st = run_vision_pieces(x, n, &busy_cpu, &busy_wall);
    if (!st) st = report_ready(x);
    for (size_t q = 0; q < n_msgs && !st; q++) st = loom_comm_wait(&pl->send_h[q], err);
    if (!st && x->vision) st = loom_pp_vision_step_end(pl, err);
    const double span = loom_now_ms() - t_start;
    if (!st && pl->stats && s == &pl->train) {
        fprintf(pl->stats,
                "{\"step\": %d, \"stage\": %d, \"schedule\": \"%s\", \"pp\": %d, \"m\": %d, "
                "\"v\": %d, \"start_ms\": %.4f, \"span_ms\": %.4f, \"busy_wall_ms\": %.4f, "
                "\"busy_cpu_ms\": %.4f, \"sent_bytes\": %llu, \"cpu_ms\": [",
                pl->step, r, loom_pp_kind_name(s->kind), pl->pp, s->m, s->v, t_start, span,
                busy_wall, busy_cpu, (unsigned long long)(pl->sent_bytes - sent0));
        for (int j = 0; j < n; j++)
            fprintf(pl->stats, "%s%.4f", j ? ", " : "",
                    acts[j].op <= LOOM_PP_W ? pl->act_cpu_ms[j] : 0.0);
        fprintf(pl->stats, "]}\n");
        fflush(pl->stats);
    }
    return st;
}

static loom_status step_run(loom_pipeline *pl, const float *params, float *grads,
                            const int32_t *batch, float dloss, loom_grad_sync *sync,
                            const loom_pp_custom *c, double *loss_sum, loom_error *err) {
    /* Gradients go to the gradient sync as each chunk finishes (every chunk is reported,
     * also where the strategy reduces after backward: the tied-embedding swap). */
    step_ctx x = {.pl = pl,
                  .s = &pl->train,
                  .slot_of = pl->slot_train,
                  .post_after = pl->post_train,
                  .params = params,
                  .grads = grads,
                  .batch = batch,
                  .dloss = dloss,
                  .backward = 1,
                  .vision = pl->vision != NULL,
                  .loss_fn = c ? c->loss : NULL,
                  .loss_ctx = c ? c->ctx : NULL,
                  .forwarded = c ? c->forwarded : NULL,
                  .ready = loom_grad_sync_ready,
                  .ready_ctx = sync,
                  .sync = sync,
                  .sharded = loom_grad_sync_sharded_accum(sync),
                  .next_report = pl->v - 1,
                  .err = err};
    for (int c = 0; c < pl->v; c++) x.left[c] = pl->m;
    loom_grad_sync_begin(sync);
    loom_status st = LOOM_OK;
    if (pl->stats) st = loom_comm_barrier(&pl->mesh->world, err); /* a common start */
    if (!st) st = run_list(&x, sync);
    pl->step++;
    /* The loss lives on the last stage: sum over the pipeline group (others add 0). */
    if (!st) st = loom_comm_allreduce_sum_f64(pl->comm, &x.loss_sum, 1, err);
    *loss_sum = x.loss_sum;
    return st;
}

static loom_status forward_run(loom_pipeline *pl, const float *params, const int32_t *batch,
                               loom_grad_sync *sync, const loom_pp_custom *c, double *loss_sum,
                               loom_error *err) {
    step_ctx x = {.pl = pl,
                  .s = &pl->eval,
                  .slot_of = pl->slot_eval,
                  .post_after = pl->post_eval,
                  .params = params,
                  .batch = batch,
                  .loss_fn = c ? c->loss : NULL,
                  .loss_ctx = c ? c->ctx : NULL,
                  .forwarded = c ? c->forwarded : NULL,
                  .err = err};
    loom_status st = run_list(&x, sync);
    if (!st) st = loom_comm_allreduce_sum_f64(pl->comm, &x.loss_sum, 1, err);
    *loss_sum = x.loss_sum;
    return st;
}

loom_status loom_pipeline_step(loom_pipeline *pl, const float *params, float *grads,
                               const int32_t *batch, float dloss, loom_grad_sync *sync,
                               double *loss_sum, loom_error *err) {
    return step_run(pl, params, grads, batch, dloss, sync, NULL, loss_sum, err);
}

loom_status loom_pipeline_forward_loss(loom_pipeline *pl, const float *params, const int32_t *batch,
                                       loom_grad_sync *sync, double *loss_sum, loom_error *err) {
    return forward_run(pl, params, batch, sync, NULL, loss_sum, err);
}

loom_status loom_pipeline_step_custom(loom_pipeline *pl, const float *params, float *grads,
                                      const int32_t *batch, loom_grad_sync *sync,
                                      const loom_pp_custom *c, double *loss_sum, loom_error *err) {
    return step_run(pl, params, grads, batch, c->aux_dloss, sync, c, loss_sum, err);
}

loom_status loom_pipeline_forward_custom(loom_pipeline *pl, const float *params,
                                         const int32_t *batch, loom_grad_sync *sync,
                                         const loom_pp_custom *c, double *loss_sum,
                                         loom_error *err) {
    return forward_run(pl, params, batch, sync, c, loss_sum, err);
}
