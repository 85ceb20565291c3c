/* --vision-schedule bubbles at run time (pipeline/vision_plan.h): the encoder's replicas
 * on the stages that run pieces, the image rows and their gradients between them and the
 * first stage, and the replicas' gradients added into the first stage's. */
#include <stdlib.h>
#include <string.h>

#include "model/vlm.h"
#include "model/vlm_pieces.h"
#include "pipeline/pipeline.h"

struct loom_pp_vision_state {
    loom_pp_vision plan;
    loom_model **enc; /* a later stage: its encoder models (one per piece in flight) */
    int n_enc;
    size_t E;      /* floats of the encoder and projector: [0, E) of the first stage's flat */
    size_t ga, gb; /* --freeze: the trainable part of [0, E), the only gradients sent back */
    size_t rows;   /* floats of one micro-batch's image rows */
    float *wparams, *wgrads;          /* a later stage: the replica (the encoder models' table) */
    float *emb, *demb;                /* [m][rows] */
    float *gsum;                      /* the first stage: [pp][E], each stage's replica gradients */
    loom_comm_handle *emb_h, *demb_h; /* [m] */
    loom_comm_handle w_h[LOOM_PP_MAX_STAGES], g_h[LOOM_PP_MAX_STAGES];
    int eb_left, tag0;
    size_t bytes; /* what the above holds (loom_pp_vision_bytes) */
};

static float *rows_of(const loom_pp_vision_state *vs, float *base, int mb) {
    return base + (size_t)mb * vs->rows;
}

/* The part of [0, E) whose gradients the replicas send back: the trainable span's
 * (model/params.h; all of it without --freeze, nothing with encoder and projector frozen). */
static void grad_range(loom_pp_vision_state *vs, const loom_param_table *t) {
    loom_params_train_span(t, &vs->ga, &vs->gb);
    if (vs->gb > vs->E) vs->gb = vs->E;
    if (vs->ga > vs->gb) vs->ga = vs->gb;
}

loom_status loom_pp_vision_setup(loom_pipeline *pl, loom_tp *tp, loom_cp *cp, loom_error *err) {
    loom_pp_vision_state *vs = calloc(1, sizeof *vs);
    if (!vs) return loom_error_set(err, LOOM_ERR_NOMEM, "--vision-schedule: out of memory");
    pl->vision = vs;
    double fwd[LOOM_PP_MAX_STAGES], enc;
    loom_pp_vision_durations(pl->mc, pl->counts, pl->pp, pl->v, pl->cfg.micro_batch, fwd, &enc);
    loom_status st = loom_pp_vision_build(&vs->plan, &pl->train, fwd, enc, err);
    if (st) return st;
    const int m = pl->m, r = pl->rank;
    const loom_pp_vision *vp = &vs->plan;
    vs->tag0 = (2 * pl->S + 1) * m + 16;     /* after the pipeline's own tags */
    const int size_only = pl->cfg.size_only; /* loom plan: one replica sized, nothing held */
    if (r > 0 && vp->pieces[r] > 0) {
        const loom_layer_set set = {.n_chunks = 1, .first = 1}; /* the embedding, no block */
        vs->n_enc = vp->slots[r];
        if (!(vs->enc = calloc((size_t)vs->n_enc, sizeof *vs->enc))) goto nomem;
        for (int k = 0; k < (size_only ? 1 : vs->n_enc); k++) {
            if (!(vs->enc[k] = calloc(1, sizeof(loom_model)))) goto nomem;
            if ((st = loom_model_create(
                     vs->enc[k],
                     &(loom_model_options){.cfg = pl->mc,
                                           .B = pl->cfg.micro_batch,
                                           .T = pl->mc->seq_len,
                                           .tp = tp,
                                           .cp = cp,
                                           .ep = &pl->mesh->ep,
                                           .layers = &set,
                                           .backend = pl->cfg.backend,
                                           .flags = size_only ? LOOM_MODEL_SIZE_ONLY : 0},
                     err)))
                return st;
        }
        const loom_param_table *t = &vs->enc[0]->table;
        vs->E = (size_t)t->wte;
        grad_range(vs, t);
        vs->rows = loom_vlm_image_rows_floats(vs->enc[0]);
        vs->bytes = (size_t)vs->n_enc * loom_model_activation_bytes(vs->enc[0]) +
                    2 * t->total * sizeof(float) + 2 * (size_t)m * vs->rows * sizeof(float);
        if (size_only) return LOOM_OK;
        vs->wparams = calloc(t->total, sizeof(float));
        vs->wgrads = calloc(t->total, sizeof(float));
        if (!vs->wparams || !vs->wgrads) goto nomem;
    } else if (r == 0) {
        vs->E = (size_t)pl->slots[0]->table.wte;
        grad_range(vs, &pl->slots[0]->table);
        const size_t G = vs->gb - vs->ga;
        vs->rows = loom_vlm_image_rows_floats(pl->slots[0]);
        vs->bytes = ((size_t)pl->pp * G + 2 * (size_t)m * vs->rows) * sizeof(float);
        if (size_only) return LOOM_OK;
        vs->gsum = calloc((size_t)pl->pp * G + 1, sizeof(float));
        if (!vs->gsum) goto nomem;
    }
    if (vs->rows) {
        vs->emb = calloc((size_t)m * vs->rows, sizeof(float));
        vs->demb = calloc((size_t)m * vs->rows, sizeof(float));
        vs->emb_h = calloc((size_t)m, sizeof *vs->emb_h);
        vs->demb_h = calloc((size_t)m, sizeof *vs->demb_h);
        if (!vs->emb || !vs->demb || !vs->emb_h || !vs->demb_h) goto nomem;
    }
    return LOOM_OK;
nomem:
    return loom_error_set(err, LOOM_ERR_NOMEM, "--vision-schedule bubbles: out of memory");
}

void loom_pp_vision_teardown(loom_pipeline *pl) {
    loom_pp_vision_state *vs = pl->vision;
    if (!vs) return;
    for (int k = 0; k < vs->n_enc && vs->enc; k++)
        if (vs->enc[k]) {
            loom_model_destroy(vs->enc[k]);
            free(vs->enc[k]);
        }
    free(vs->enc);
    free(vs->wparams);
    free(vs->wgrads);
    free(vs->emb);
    free(vs->demb);
    free(vs->gsum);
    free(vs->emb_h);
    free(vs->demb_h);
    loom_pp_vision_free(&vs->plan);
    free(vs);
    pl->vision = NULL;
}

size_t loom_pp_vision_bytes(const loom_pipeline *pl) {
    return pl->vision ? pl->vision->bytes : 0;
}

const loom_pp_vision *loom_pp_vision_plan(const loom_pipeline *pl) {
    return pl->vision ? &pl->vision->plan : NULL;
}

loom_status loom_pp_vision_step_begin(loom_pipeline *pl, const float *params, loom_error *err) {
    loom_pp_vision_state *vs = pl->vision;
    const loom_pp_vision *vp = &vs->plan;
    const int r = pl->rank, W = vs->tag0, G = vs->tag0 + 1, EMB = vs->tag0 + 2, DEMB = EMB + pl->m;
    loom_status st = LOOM_OK;
    if (r == 0) {
        for (int q = 1; q < pl->pp && !st; q++) {
            if (vp->pieces[q] == 0) continue;
            st = loom_comm_isend(pl->comm, params, vs->E, q, W, &vs->w_h[q], err);
            if (!st && vs->gb > vs->ga)
                st = loom_comm_irecv(pl->comm, vs->gsum + (size_t)q * (vs->gb - vs->ga),
                                     vs->gb - vs->ga, q, G, &vs->g_h[q], err);
        }
        for (int i = 0; i < pl->m && !st; i++)
            if (vp->owner[i] != 0)
                st = loom_comm_irecv(pl->comm, rows_of(vs, vs->emb, i), vs->rows, vp->owner[i],
                                     EMB + i, &vs->emb_h[i], err);
        return st;
    }
    if (vp->pieces[r] == 0) return LOOM_OK;
    /* the replica: this step's weights from the first stage, gradients from zero */
    if (!(st = loom_comm_irecv(pl->comm, vs->wparams, vs->E, 0, W, &vs->w_h[0], err)))
        st = loom_comm_wait(&vs->w_h[0], err);
    memset(vs->wgrads + vs->ga, 0, (vs->gb - vs->ga) * sizeof(float)); /* the rest stays 0 */
    vs->eb_left = vp->pieces[r];
    for (int i = 0; i < pl->m && !st; i++)
        if (vp->owner[i] == r)
            st = loom_comm_irecv(pl->comm, rows_of(vs, vs->demb, i), vs->rows, 0, DEMB + i,
                                 &vs->demb_h[i], err);
    return st;
}

loom_status loom_pp_vision_pieces(loom_pipeline *pl, int j, const int32_t *batch, loom_error *err) {
    loom_pp_vision_state *vs = pl->vision;
    const loom_pp_vision *vp = &vs->plan;
    const int r = pl->rank, G = vs->tag0 + 1, EMB = vs->tag0 + 2;
    loom_status st = LOOM_OK;
    if (r == 0) return LOOM_OK;
    for (int i = 0; i < pl->m && !st; i++) { /* the backwards placed here */
        if (vp->owner[i] != r || vp->eb_at[i] != j) continue;
        loom_model *e = vs->enc[vp->enc_slot[i]];
        if ((st = loom_comm_wait(&vs->demb_h[i], err))) break;
        loom_trace_begin(pl->slots[0]->trace, "pp vision backward", "compute");
        loom_vlm_encode_backward(e, vs->wparams, vs->wgrads, rows_of(vs, vs->demb, i));
        loom_trace_end(pl->slots[0]->trace);
        if (--vs->eb_left == 0 && vs->gb > vs->ga)
            st = loom_comm_isend(pl->comm, vs->wgrads + vs->ga, vs->gb - vs->ga, 0, G, &vs->g_h[0],
                                 err);
    }
    for (int i = 0; i < pl->m && !st; i++) { /* then the forwards */
        if (vp->owner[i] != r || vp->ef_at[i] != j) continue;
        loom_model *e = vs->enc[vp->enc_slot[i]];
        loom_trace_begin(pl->slots[0]->trace, "pp vision forward", "compute");
        loom_model_load_batch(e, batch, i * pl->cfg.micro_batch);
        loom_vlm_encode(e, vs->wparams, rows_of(vs, vs->emb, i));
        loom_trace_end(pl->slots[0]->trace);
        st = loom_comm_isend(pl->comm, rows_of(vs, vs->emb, i), vs->rows, 0, EMB + i, &vs->emb_h[i],
                             err);
    }
    return st;
}

loom_status loom_pp_vision_before_embed(loom_pipeline *pl, loom_model *mod, int mb, int training,
                                        loom_error *err) {
    loom_pp_vision_state *vs = pl->vision;
    if (!vs || !training || vs->plan.owner[mb] == 0) {
        loom_vlm_set_remote(mod, NULL, NULL);
        return LOOM_OK;
    }
    loom_status st = loom_comm_wait(&vs->emb_h[mb], err);
    loom_vlm_set_remote(mod, rows_of(vs, vs->emb, mb), rows_of(vs, vs->demb, mb));
    return st;
}

loom_status loom_pp_vision_after_embed_backward(loom_pipeline *pl, int mb, loom_error *err) {
    loom_pp_vision_state *vs = pl->vision;
    if (!vs || vs->plan.owner[mb] == 0) return LOOM_OK;
    const int DEMB = vs->tag0 + 2 + pl->m;
    return loom_comm_isend(pl->comm, rows_of(vs, vs->demb, mb), vs->rows, vs->plan.owner[mb],
                           DEMB + mb, &vs->demb_h[mb], err);
}

loom_status loom_pp_vision_add_grads(loom_pipeline *pl, float *grads, loom_error *err) {
    loom_pp_vision_state *vs = pl->vision;
    loom_status st = LOOM_OK;
    if (pl->rank != 0) return LOOM_OK;
    for (int q = 1; q < pl->pp && !st; q++) { /* in stage order: the same sum every run */
        if (vs->plan.pieces[q] == 0 || vs->gb == vs->ga) continue;
        if ((st = loom_comm_wait(&vs->g_h[q], err))) break;
        const float *g = vs->gsum + (size_t)q * (vs->gb - vs->ga);
        for (size_t k = vs->ga; k < vs->gb; k++) grads[k] += g[k - vs->ga];
    }
    return st;
}

loom_status loom_pp_vision_step_end(loom_pipeline *pl, loom_error *err) {
    loom_pp_vision_state *vs = pl->vision;
    loom_status st = LOOM_OK;
    for (int q = 0; q < pl->pp && !st; q++) st = loom_comm_wait(&vs->w_h[q], err);
    for (int q = 0; q < pl->pp && !st && pl->rank > 0; q++) st = loom_comm_wait(&vs->g_h[q], err);
    for (int i = 0; i < pl->m && !st && vs->rows; i++) {
        if (pl->rank > 0 && !(st = loom_comm_wait(&vs->emb_h[i], err))) continue;
        if (pl->rank == 0) st = loom_comm_wait(&vs->demb_h[i], err);
    }
    return st;
}
