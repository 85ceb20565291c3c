/* Pipeline stages: the layer split, the stage's model slots and buffers, the gradient
 * norm over stages and the gathering of the whole model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ep.h"
#include "parallel/ep_zero.h"
#include "model/vlm_parts.h"
#include "pipeline/pipeline.h"

/* Multiply-adds per token of a block's forward and of the head's (final norm, logits and
 * loss), the model's compute the partition balances (backward scales the same way). */
static double block_cost(const loom_model_config *mc) {
    const double C = mc->d_model, hd = C / mc->n_head, T = mc->seq_len;
    const double qkv = C * (mc->n_head + 2.0 * mc->n_kv_head) * hd;
    const double mlp = (mc->family == LOOM_FAMILY_GPT2 ? 2.0 : 3.0) * C * mc->d_ff;
    return qkv + C * C + T * C /* causal attention: QK^T and PV over T/2 keys */ + mlp;
}
static double head_cost(const loom_model_config *mc) {
    return (double)mc->d_model * mc->vocab_size + 4.0 * mc->vocab_size; /* logits, softmax */
}

/* The default split without --pp-layers and interleaving: one layer per stage, then each further
 * layer to the stage with the least work after taking it (the first on ties), counting the head's
 * work on the last stage (as Megatron's --account-for-loss-in-pipeline-split does; the
 * embedding is a lookup and counts nothing). Minimises the slowest stage; even when the
 * layers divide evenly and the head is cheaper than one layer. */
static void balance_layers(const loom_model_config *mc, int S, int *counts) {
    const double layer = block_cost(mc), head = head_cost(mc) / layer; /* in layers */
    for (int s = 0; s < S; s++) counts[s] = 1;
    for (int left = mc->n_layer - S; left > 0; left--) {
        int best = 0;
        double best_load = 0;
        for (int s = 0; s < S; s++) {
            const double load = counts[s] + 1 + (s == S - 1 ? head : 0.0);
            if (s == 0 || load < best_load - 1e-9) {
                best = s;
                best_load = load;
            }
        }
        counts[best]++;
    }
}

/* Layers per virtual stage from --pp-layers, the balanced split (v = 1) or an even one
 * (interleaved). */
static loom_status split_layers(const loom_model_config *mc, const loom_pp_config *pc, int pp,
                                int v, int *counts, loom_error *err) {
    const int S = pp * v, L = mc->n_layer;
    if (S > L)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp %d x --virtual-stages %d = %d stages: more than --n-layer %d "
                              "(each stage needs at least one layer)",
                              pp, v, S, L);
    if (!pc->layers[0] && v == 1) {
        balance_layers(mc, S, counts);
        return LOOM_OK;
    }
    if (!pc->layers[0]) { /* interleaved: equal chunks, as Megatron's */
        if (L % S != 0)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--n-layer %d: not divisible by --pp %d x --virtual-stages %d = "
                                  "%d model chunks (interleaved splits evenly; give --pp-layers "
                                  "with %d counts)",
                                  L, pp, v, S, S);
        for (int s = 0; s < S; s++) counts[s] = L / S;
        return LOOM_OK;
    }
    int n = 0, sum = 0;
    const char *c = pc->layers;
    while (*c) {
        char *end;
        long x = strtol(c, &end, 10);
        if (end == c || x < 1 || n == S || (*end && *end != ','))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--pp-layers '%s': expected %d positive counts separated by "
                                  "commas (one per stage: --pp %d x --virtual-stages %d)",
                                  pc->layers, S, pp, v);
        counts[n++] = (int)x;
        sum += (int)x;
        c = *end ? end + 1 : end;
    }
    if (n != S || sum != L)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp-layers '%s': %d count(s) summing to %d; expected %d counts "
                              "(--pp %d x --virtual-stages %d) summing to --n-layer %d",
                              pc->layers, n, sum, S, pp, v, L);
    return LOOM_OK;
}

loom_status loom_pipeline_split_layers(const loom_model_config *mc, const loom_pp_config *pc,
                                       int *counts, loom_error *err) {
    return split_layers(mc, pc, pc->pp, pc->virtual_stages, counts, err);
}

loom_status loom_pipeline_validate(const loom_model_config *mc, const loom_pp_config *pc, int dp,
                                   loom_error *err) {
    const int pp = pc->pp, v = pc->virtual_stages;
    loom_pp_kind kind;
    loom_status st = loom_pp_kind_parse(pc->schedule, &kind, err);
    if (st || pp <= 1) {
        if (!st && v != 1)
            return loom_error_set(err, LOOM_ERR_INPUT, "--virtual-stages %d: needs --pp > 1", v);
        return st;
    }
    if (v < 1 || v > LOOM_MAX_CHUNKS)
        return loom_error_set(err, LOOM_ERR_INPUT, "--virtual-stages %d: expected 1..%d", v,
                              LOOM_MAX_CHUNKS);
    int counts[LOOM_PP_MAX_STAGES * LOOM_MAX_CHUNKS];
    if (pp > LOOM_PP_MAX_STAGES)
        return loom_error_set(err, LOOM_ERR_INPUT, "--pp %d: at most %d", pp, LOOM_PP_MAX_STAGES);
    if ((st = split_layers(mc, pc, pp, v, counts, err))) return st;
    const int m = dp >= 1 ? pc->global_batch / dp / pc->micro_batch : 0;
    return loom_pp_schedule_check(kind, pp, m, v, err);
}

void loom_pipeline_layers_of(const loom_pipeline *pl, int rank, loom_layer_set *out) {
    memset(out, 0, sizeof *out);
    out->n_chunks = pl->v;
    out->first = rank == 0;
    out->last = rank == pl->pp - 1;
    for (int c = 0; c < pl->v; c++) {
        const int vs = c * pl->pp + rank;
        int lo = 0;
        for (int s = 0; s < vs; s++) lo += pl->counts[s];
        out->lo[c] = lo;
        out->hi[c] = lo + pl->counts[vs];
    }
}

/* Slot of each micro-batch: taken at its first F, given back after its last B (W);
 * post_after: the index of the action that gave that slot back (-1: never used). */
static int assign_slots(const loom_pp_schedule *s, int rank, int *slot_of, int *post_after) {
    const int last_op = s->kind == LOOM_PP_FORWARD_ONLY ? LOOM_PP_F
                        : s->split                      ? LOOM_PP_W
                                                        : LOOM_PP_B;
    /* at most m slots (one per micro-batch) */
    int *left = calloc((size_t)s->m, sizeof *left), *busy = calloc((size_t)s->m, sizeof *busy);
    int *freed = malloc((size_t)s->m * sizeof *freed), most = 0;
    if (!left || !busy || !freed) {
        free(left);
        free(busy);
        free(freed);
        return -1;
    }
    for (int k = 0; k < s->m; k++) freed[k] = -1;
    for (int i = 0; i < s->m; i++) slot_of[i] = -1;
    for (int j = 0; j < s->n[rank]; j++) {
        const loom_pp_action *a = &s->acts[rank][j];
        if (a->op == LOOM_PP_F && slot_of[a->mb] < 0) {
            int k = 0;
            while (busy[k]) k++;
            busy[k] = 1;
            slot_of[a->mb] = k;
            post_after[a->mb] = freed[k];
            left[a->mb] = s->v;
            if (k + 1 > most) most = k + 1;
        }
        if ((int)a->op == last_op && --left[a->mb] == 0) {
            busy[slot_of[a->mb]] = 0;
            freed[slot_of[a->mb]] = j;
        }
    }
    free(left);
    free(busy);
    free(freed);
    return most;
}

/* --precision bf16: the messages between stages travel as bf16 (docs/precision.md). */
static int bf16_messages(const loom_pipeline *pl) {
    return pl->cfg.bf16_messages;
}

size_t loom_pipeline_message_bytes(const loom_pipeline *pl) {
    const size_t one = (size_t)pl->n_slots * pl->v * pl->act_floats; /* a kind, one direction */
    if (!bf16_messages(pl)) return 4 * one * sizeof(float);
    return 4 * one * sizeof(uint16_t) + one * sizeof(float) + pl->act_floats * sizeof(float);
}

/* The model's arena flags for --recompute (a loom_recompute). */
static int recompute_flags(int mode) {
    return mode == LOOM_RECOMPUTE_FULL        ? LOOM_MODEL_RECOMPUTE
           : mode == LOOM_RECOMPUTE_SELECTIVE ? LOOM_MODEL_RECOMPUTE_SELECTIVE
                                              : 0;
}

/* Split backward for the schedules that run W apart (zb); a frozen decoder (--freeze llm)
 * runs B only under every schedule, and W (zb) keeps only its embedding's part. */
static int backward_flags(const loom_model_config *mc, int split) {
    if (mc->freeze & LOOM_VLM_PART_LLM)
        return LOOM_MODEL_SPLIT_BACKWARD | LOOM_MODEL_NO_WEIGHT_GRADS;
    return split ? LOOM_MODEL_SPLIT_BACKWARD : 0;
}

loom_status loom_pipeline_create(loom_pipeline *pl, const loom_model_config *mc,
                                 const loom_pp_config *pc, loom_mesh *mesh, loom_tp *tp,
                                 loom_cp *cp, loom_model *model, loom_error *err) {
    memset(pl, 0, sizeof *pl);
    pl->mc = mc;
    pl->cfg = *pc;
    pl->mesh = mesh;
    pl->comm = &mesh->pp;
    pl->pp = mesh->layout.pp;
    pl->rank = mesh->pp_rank;
    pl->v = pc->virtual_stages;
    pl->S = pl->pp * pl->v;
    pl->m = pc->global_batch / mesh->layout.dp / pc->micro_batch;
    pl->tied_peer = -1;
    loom_pp_kind kind;
    loom_status st;
    if ((st = loom_pipeline_validate(mc, pc, mesh->layout.dp, err)) ||
        (st = loom_pp_kind_parse(pc->schedule, &kind, err)) ||
        (st = split_layers(mc, pc, pl->pp, pl->v, pl->counts, err)) ||
        (st = loom_pp_schedule_build(&pl->train, kind, pl->pp, pl->m, pl->v, err)) ||
        (st = loom_pp_schedule_build(&pl->eval, LOOM_PP_FORWARD_ONLY, pl->pp, pl->m, pl->v, err)))
        return st;
    loom_pipeline_layers_of(pl, pl->rank, &pl->layers);
    for (int c = 0, lo = 0; c < pl->v; c++) {
        pl->chunk_lo[c] = lo;
        lo += pl->layers.hi[c] - pl->layers.lo[c];
        pl->chunk_hi[c] = lo;
    }
    pl->slot_train = malloc(sizeof(int) * (size_t)pl->m);
    pl->slot_eval = malloc(sizeof(int) * (size_t)pl->m);
    pl->post_train = malloc(sizeof(int) * (size_t)pl->m);
    pl->post_eval = malloc(sizeof(int) * (size_t)pl->m);
    if (!pl->slot_train || !pl->slot_eval || !pl->post_train || !pl->post_eval) goto nomem;
    int n_train = assign_slots(&pl->train, pl->rank, pl->slot_train, pl->post_train);
    int n_eval = assign_slots(&pl->eval, pl->rank, pl->slot_eval, pl->post_eval);
    if (n_train < 0 || n_eval < 0) goto nomem;
    pl->n_slots = n_train > n_eval ? n_train : n_eval;
    pl->slots = calloc((size_t)pl->n_slots, sizeof *pl->slots);
    if (!pl->slots) goto nomem;
    pl->slots[0] = model;
    /* Sizing only (loom plan): the slots are one model's copies, slot 0 says their size. */
    const int built = pc->size_only ? 1 : pl->n_slots;
    for (int k = 1; k < built; k++)
        if (!(pl->slots[k] = calloc(1, sizeof(loom_model)))) goto nomem;
    for (int k = 0; k < built; k++)
        if ((st = loom_model_create(
                 pl->slots[k],
                 &(loom_model_options){.cfg = mc,
                                       .B = pc->micro_batch,
                                       .T = mc->seq_len,
                                       .tp = tp,
                                       .cp = cp,
                                       .ep = &mesh->ep,
                                       .layers = &pl->layers,
                                       .backend = pc->backend,
                                       .flags = backward_flags(mc, pl->train.split) |
                                                recompute_flags(pc->recompute) |
                                                (pc->size_only ? LOOM_MODEL_SIZE_ONLY : 0)},
                 err)))
            return st;
    pl->act_floats = loom_model_stream_floats(model);
    if (pc->vision_bubbles && (st = loom_pp_vision_setup(pl, tp, cp, err)))
        return st; /* the message buffers' size is act_floats'; sizing: sized only */
    if (pc->size_only) return LOOM_OK;
    const size_t msgs = 2 * (size_t)pl->n_slots * pl->v;
    if (bf16_messages(pl)) { /* the wire in bf16; fp32: the activation half and one scratch */
        pl->wire_send = malloc(msgs * pl->act_floats * sizeof(uint16_t));
        pl->wire_recv = malloc(msgs * pl->act_floats * sizeof(uint16_t));
        pl->recv_buf = malloc(msgs / 2 * pl->act_floats * sizeof(float));
        pl->send_buf = malloc(pl->act_floats * sizeof(float));
        if (!pl->wire_send || !pl->wire_recv) goto nomem;
    } else {
        pl->recv_buf = malloc(msgs * pl->act_floats * sizeof(float));
        pl->send_buf = malloc(msgs * pl->act_floats * sizeof(float));
    }
    pl->recv_h = calloc(msgs, sizeof *pl->recv_h);
    pl->send_h = calloc(msgs, sizeof *pl->send_h);
    pl->act_cpu_ms = calloc((size_t)pl->train.n[pl->rank] + 1, sizeof(double));
    if (!pl->recv_buf || !pl->send_buf || !pl->recv_h || !pl->send_h || !pl->act_cpu_ms) goto nomem;
    const loom_param_table *t = &model->table;
    if (mc->family == LOOM_FAMILY_GPT2 && pl->pp > 1 && (pl->layers.first || pl->layers.last)) {
        pl->tied_peer = pl->layers.first ? pl->pp - 1 : 0;
        pl->tied = malloc(t->params[0].numel * sizeof(float));
        if (!pl->tied) goto nomem;
    }
    if (pc->stats[0]) {
        char path[sizeof pc->stats + 32];
        snprintf(path, sizeof path, "%s.rank%d", pc->stats, mesh->rank);
        if (!(pl->stats = fopen(path, "w")))
            return loom_error_set(err, LOOM_ERR_INPUT, "--pp-stats '%s': cannot create", path);
    }
    return LOOM_OK;
nomem:
    return loom_error_set(err, LOOM_ERR_NOMEM, "pipeline: out of memory for buffers");
}

void loom_pipeline_free(loom_pipeline *pl) {
    loom_pp_vision_teardown(pl);
    for (int k = 1; k < pl->n_slots && pl->slots; k++)
        if (pl->slots[k]) {
            loom_model_destroy(pl->slots[k]);
            free(pl->slots[k]);
        }
    free(pl->slots);
    free(pl->slot_train);
    free(pl->slot_eval);
    free(pl->post_train);
    free(pl->post_eval);
    free(pl->recv_buf);
    free(pl->send_buf);
    free(pl->recv_h);
    free(pl->send_h);
    free(pl->wire_send);
    free(pl->wire_recv);
    free(pl->act_cpu_ms);
    free(pl->tied);
    free(pl->full_flat);
    loom_params_free(&pl->full_table);
    loom_pp_schedule_free(&pl->train);
    loom_pp_schedule_free(&pl->eval);
    if (pl->stats) fclose(pl->stats);
    memset(pl, 0, sizeof *pl);
}

void loom_pipeline_report(const loom_pipeline *pl, FILE *f) {
    const double MiB = 1 << 20;
    const double one = (double)loom_model_activation_bytes(pl->slots[0]);
    fprintf(f,
            "loom: pipeline %d stages x %d chunk(s), schedule %s, %d micro-batches per step; "
            "layers per stage %s",
            pl->pp, pl->v, loom_pp_kind_name(pl->train.kind), pl->m,
            pl->cfg.layers[0] ? "(--pp-layers)" : "(balanced, head counted)");
    for (int s = 0; s < pl->S; s++) fprintf(f, "%s%d", s ? "," : " ", pl->counts[s]);
    fprintf(f, "; stage 0: layers");
    for (int c = 0; c < pl->layers.n_chunks; c++)
        fprintf(f, " [%d, %d)", pl->layers.lo[c], pl->layers.hi[c]);
    fprintf(f,
            ", %d micro-batch(es) in flight (activations%s %d x %.3f MiB = %.3f MiB; "
            "message buffers %.1f MiB%s)\n",
            pl->n_slots,
            pl->slots[0]->recompute             ? " with recomputation"
            : pl->slots[0]->recompute_selective ? " with selective recomputation"
                                                : "",
            pl->n_slots, one / MiB, pl->n_slots * one / MiB, loom_pipeline_message_bytes(pl) / MiB,
            bf16_messages(pl) ? ", sent as bf16" : "");
    const loom_pp_vision *vp = loom_pp_vision_plan(pl);
    if (!vp) return;
    fprintf(f, "loom: --vision-schedule bubbles: micro-batches encoded per stage");
    for (int r = 0; r < pl->pp; r++) fprintf(f, "%s%d", r ? "," : " ", vp->pieces[r]);
    fprintf(f,
            " (encoder forward %.2f x stage 0's forward); simulated step %.3g -> %.3g (%.1f%% "
            "shorter)\n",
            vp->fwd[0] > 0 ? vp->enc / vp->fwd[0] : 0.0, vp->span_first, vp->span,
            vp->span_first > 0 ? 100.0 * (1.0 - vp->span / vp->span_first) : 0.0);
    fprintf(f, "loom: --vision-schedule bubbles: simulated idle share per stage");
    for (int r = 0; r < pl->pp; r++) fprintf(f, "%s%.3f", r ? "," : " ", vp->idle_first[r]);
    fprintf(f, " -> ");
    for (int r = 0; r < pl->pp; r++) fprintf(f, "%s%.3f", r ? "," : "", vp->idle[r]);
    fprintf(f, "\n");
}

/* Copies every tensor of (t, flat) that the whole model `full` has into full_flat (the
 * replica is skipped: its owner's copy is the same). */
static void copy_by_name(const loom_param_table *t, const float *flat, const loom_param_table *full,
                         float *full_flat) {
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        int j = loom_params_find(full, p->name);
        if (j >= 0 && !p->replica)
            memcpy(full_flat + full->params[j].offset, flat + p->offset, p->numel * sizeof(float));
    }
}

loom_status loom_pipeline_export(loom_pipeline *pl, const loom_param_table *st_table,
                                 const float *sflat, const loom_param_table **out_t,
                                 const float **out_f, loom_error *err) {
    *out_t = st_table;
    *out_f = NULL;
    loom_mesh *mesh = pl->mesh;
    if (mesh->dp_rank != 0 || mesh->tp_rank != 0) return LOOM_OK;
    loom_status st = LOOM_OK;
    if (pl->rank != 0) { /* one message with the stage's flat buffer */
        loom_comm_handle h;
        if (!(st = loom_comm_isend(pl->comm, sflat, st_table->total, 0, 9001, &h, err)))
            st = loom_comm_wait(&h, err);
        return st;
    }
    if (!pl->full_flat) {
        if ((st = loom_params_build(&pl->full_table, pl->mc, NULL, err))) return st;
        if (!(pl->full_flat = malloc(pl->full_table.total * sizeof(float))))
            return loom_error_set(err, LOOM_ERR_NOMEM, "pipeline: cannot gather the weights");
    }
    copy_by_name(st_table, sflat, &pl->full_table, pl->full_flat);
    for (int r = 1; r < pl->pp && !st; r++) {
        loom_layer_set set;
        loom_param_table t;
        loom_pipeline_layers_of(pl, r, &set);
        if ((st = loom_params_build(&t, pl->mc, &(loom_params_options){.layers = &set}, err)))
            break;
        float *buf = malloc(t.total * sizeof(float));
        loom_comm_handle h;
        if (!buf) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "pipeline: cannot gather the weights");
        } else if (!(st = loom_comm_irecv(pl->comm, buf, t.total, r, 9001, &h, err)) &&
                   !(st = loom_comm_wait(&h, err))) {
            copy_by_name(&t, buf, &pl->full_table, pl->full_flat);
        }
        free(buf);
        loom_params_free(&t);
    }
    *out_t = &pl->full_table;
    *out_f = pl->full_flat;
    return st;
}
