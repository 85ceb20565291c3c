/* The model, every family (model/model.h): creating it, and its public functions run
 * through the family's table of pieces (transformer.c, dit.c, vlm.c). */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "model/model_impl.h"

/* LOOM_BF16_ROUND_STREAM (model.h's round_stream): the layers, comma-separated, 1..63. */
static uint64_t round_stream_layers(const loom_backend *be) {
    const char *s = getenv("LOOM_BF16_ROUND_STREAM");
    uint64_t mask = 0;
    if (!s || loom_backend_precision(be) != LOOM_PRECISION_BF16) return 0;
    while (*s) {
        char *end;
        const long l = strtol(s, &end, 10);
        if (end == s) break;
        if (l > 0 && l < 64) mask |= (uint64_t)1 << l;
        s = *end ? end + 1 : end;
    }
    return mask;
}

/* x rounded to bf16 in place: what a bf16 pipeline message does to it. */
static void round_stream(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = loom_bf16_to_f32(loom_bf16_from_f32(x[i]));
}

size_t loom_model_plan_bytes(const loom_model *m, int sequence_parallel) {
    return m->ops->plan_bytes(m, sequence_parallel);
}

size_t loom_model_plan_bytes_whole(const loom_model *m, int sequence_parallel) {
    loom_model whole = *m; /* plan_bytes reads the shape and writes nothing */
    whole.cp = NULL;
    whole.T = m->T_seq;
    return m->ops->plan_bytes(&whole, sequence_parallel);
}
loom_status loom_model_create(loom_model *m, const loom_model_options *o, loom_error *err) {
    memset(m, 0, sizeof *m);
    m->be = o->backend ? o->backend : loom_backend_cpu();
    m->arena.be = m->be;
    if (!o->cfg) return loom_error_set(err, LOOM_ERR_INPUT, "model: no configuration");
    const loom_model_config *cfg = o->cfg;
    const int B = o->B, T = o->T;
    loom_tp *tp = o->tp;
    loom_comm *ep = o->ep;
    m->split_backward = (o->flags & LOOM_MODEL_SPLIT_BACKWARD) != 0;
    m->no_weight_grads = m->split_backward && (o->flags & LOOM_MODEL_NO_WEIGHT_GRADS) != 0;
    m->recompute = (o->flags & LOOM_MODEL_RECOMPUTE) != 0;
    m->recompute_selective = (o->flags & LOOM_MODEL_RECOMPUTE_SELECTIVE) != 0;
    m->size_only = (o->flags & LOOM_MODEL_SIZE_ONLY) != 0;
    m->round_stream = round_stream_layers(m->be);
    m->cfg = *cfg;
    m->tp = tp;
    m->cp = o->cp;
    m->B = B;
    m->T_seq = T;
    loom_status st = loom_model_config_validate(cfg, err);
    if (st) return st;
    if (T > cfg->seq_len)
        return loom_error_set(err, LOOM_ERR_INPUT, "sequence length %d exceeds --seq-len %d", T,
                              cfg->seq_len);
    if (loom_model_cp_on(m) && (m->cp->o.B != B || m->cp->o.T != T))
        return loom_error_set(err, LOOM_ERR_STATE,
                              "context parallelism planned for %d x %d tokens, not %d x %d",
                              m->cp->o.B, m->cp->o.T, B, T);
    m->T = loom_model_cp_on(m) ? m->cp->Tl : T; /* this rank's tokens of every sample */
    if (tp && tp->size > 1 && (tp->rows != B * m->T || tp->width != cfg->d_model))
        return loom_error_set(err, LOOM_ERR_STATE, "tensor parallelism planned for %d x %d rows",
                              tp->rows, tp->width);
    /* MoE with --tp: the block is replicated, every tp rank runs it on the whole
     * micro-batch (with sequence parallelism on the gathered input, keeping its slice). */
    const loom_params_options po = {.tp_rank = tp ? tp->rank : 0,
                                    .tp_size = tp ? tp->size : 1,
                                    .ep_rank = ep ? ep->rank : 0,
                                    .ep_size = ep ? ep->size : 1,
                                    .layers = o->layers};
    st = loom_params_build(&m->table, cfg, &po, err);
    if (st || (st = loom_moe_create(&m->moe, cfg, &m->table, B * m->T, ep, m->be, err)) ||
        (loom_model_cp_on(m) && (st = loom_moe_set_cp(m->moe, m->cp->comm, err))) ||
        (m->split_backward && (st = loom_moe_set_split(m->moe, err)))) {
        loom_model_destroy(m);
        return st;
    }
    m->ops = loom_lm_ops(); /* a dit or vlm puts its own in below */
    m->Ns = loom_model_seq_parallel(m) ? B * m->T / tp->size : B * m->T;
    /* host metadata: the per-layer activation pointers and the host copy of the losses */
    m->blocks = calloc((size_t)cfg->n_layer, sizeof *m->blocks);
    const size_t N = (size_t)B * m->T;
    m->losses_host = malloc(N * sizeof *m->losses_host);
    /* tokens the embedding and the loss read: backend memory */
    m->inputs = loom_backend_alloc(m->be, N * sizeof *m->inputs);
    m->targets = loom_backend_alloc(m->be, N * sizeof *m->targets);
    if (!m->blocks || !m->losses_host || !m->inputs || !m->targets) {
        loom_model_destroy(m);
        return loom_error_set(err, LOOM_ERR_NOMEM, "model: out of memory");
    }
    /* a dit brings its own table, conditioning and arena plan (model/dit.c) */
    st = cfg->family == LOOM_FAMILY_DIT   ? loom_dit_attach(m, err)
         : cfg->family == LOOM_FAMILY_VLM ? loom_vlm_attach(m, err)
                                          : loom_model_arena_allocate(m, m->ops->plan, err);
    if (!st) st = loom_model_round_tp_open(m, err);
    if (st) loom_model_destroy(m);
    return st;
}

const char *loom_recompute_name(int mode) {
    return mode == LOOM_RECOMPUTE_FULL        ? "full"
           : mode == LOOM_RECOMPUTE_SELECTIVE ? "selective"
                                              : "none";
}

loom_status loom_model_set_recompute(loom_model *m, int mode, loom_error *err) {
    const int full = mode == LOOM_RECOMPUTE_FULL, selective = mode == LOOM_RECOMPUTE_SELECTIVE;
    if (m->recompute == full && m->recompute_selective == selective) return LOOM_OK;
    m->recompute = full;
    m->recompute_selective = selective;
    loom_backend_arena_destroy(&m->arena);
    return loom_model_arena_allocate(m, m->ops->plan, err);
}

void loom_model_destroy(loom_model *m) {
    loom_moe_destroy(m->moe);
    loom_dit_detach(m);
    loom_vlm_detach(m);
    if (m->be) {
        loom_backend_arena_destroy(&m->arena);
        loom_backend_free(m->be, m->inputs);
        loom_backend_free(m->be, m->targets);
    }
    free(m->blocks);
    free(m->losses_host);
    loom_model_round_tp_close(m);
    loom_params_free(&m->table);
    memset(m, 0, sizeof *m);
}

size_t loom_model_activation_bytes(const loom_model *m) {
    return m->arena_floats * sizeof(float);
}
double loom_model_loss(loom_model *m) {
    double sum = 0.0;
    loom_model_loss_sum(m, 0.0f, 0, &sum); /* cannot fail on one rank */
    return sum;
}

double loom_model_loss_and_dlogits(loom_model *m, float dloss) {
    double sum = 0.0;
    loom_model_loss_sum(m, dloss, 1, &sum);
    return sum;
}

size_t loom_model_block_range_end(const loom_param_table *t, int l) {
    return l + 1 < t->n_layer ? t->blocks[l + 1].begin : t->head_begin;
}

int loom_model_can_shorten(const loom_model *m) {
    return (m->cfg.family == LOOM_FAMILY_GPT2 || m->cfg.family == LOOM_FAMILY_LLAMA) &&
           !loom_model_cp_on(m) && !m->moe && loom_backend_precision(m->be) == LOOM_PRECISION_FP32;
}

loom_status loom_model_set_tokens(loom_model *m, int T, loom_error *err) {
    if (T == m->T) return LOOM_OK;
    const int tp = m->tp ? m->tp->size : 1, sp = loom_model_seq_parallel(m);
    if (!loom_model_can_shorten(m) || T < 1 || T > m->T_seq || (sp && m->B * T % tp))
        return loom_error_set(err, LOOM_ERR_STATE,
                              "model: cannot run %d of %d positions a sample in this layout", T,
                              m->T_seq);
    /* tensor parallelism: its collectives move the rows of B x T tokens */
    loom_status st = tp > 1 ? loom_tp_set_rows(m->tp, m->B * T, err) : LOOM_OK;
    if (st) return st;
    m->T = T;
    m->Ns = sp ? m->B * T / tp : m->B * T;
    return LOOM_OK;
}

void loom_model_load_batch(loom_model *m, const int32_t *batch, int first) {
    m->ops->load_batch(m, batch, first);
}

loom_status loom_model_embed_forward(loom_model *m, const float *p) {
    return m->ops->embed_forward(m, p);
}

loom_status loom_model_blocks_forward(loom_model *m, const float *p, int lo, int hi, const float *x,
                                      const float **out) {
    loom_status st = LOOM_OK;
    for (int l = lo; l < hi && !st; l++) {
        if (l > lo && (m->round_stream >> l & 1))
            round_stream(m->blocks[l - 1].res2, (size_t)m->Ns * m->cfg.d_model);
        st = m->ops->block_forward(m, p, l, x);
        x = m->blocks[l].res2;
    }
    *out = x;
    return st;
}

loom_status loom_model_head_forward(loom_model *m, const float *p, const float *x) {
    return m->ops->head_forward(m, p, x);
}

loom_status loom_model_loss_sum(loom_model *m, float dloss, int backward, double *sum) {
    return m->ops->loss_sum(m, dloss, backward, sum);
}

loom_status loom_model_head_backward(loom_model *m, const float *p, float *g, const float *x) {
    return m->ops->head_backward(m, p, g, x);
}

loom_status loom_model_blocks_backward(loom_model *m, const float *p, float *g, int lo, int hi,
                                       const float *x, loom_grads_ready_fn ready, void *ctx) {
    const loom_param_table *t = &m->table;
    loom_status st = LOOM_OK;
    for (int l = hi - 1; l >= lo && !st; l--) {
        st = m->ops->block_backward(m, p, g, l, l > lo ? m->blocks[l - 1].res2 : x);
        if (!st && l > lo && (m->round_stream >> l & 1))
            round_stream(m->dres, (size_t)m->Ns * m->cfg.d_model);
        if (!st && ready) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    return st;
}

loom_status loom_model_blocks_backward_weight(loom_model *m, const float *p, float *g, int lo,
                                              int hi, const float *x, loom_grads_ready_fn ready,
                                              void *ctx) {
    const loom_param_table *t = &m->table;
    loom_status st = LOOM_OK;
    for (int l = hi - 1; l >= lo && !st; l--) {
        if (!m->no_weight_grads) /* a frozen decoder: nothing to compute, the range reported */
            st = m->ops->block_backward_weight(m, p, g, l, l > lo ? m->blocks[l - 1].res2 : x);
        if (!st && ready) st = ready(ctx, t->blocks[l].begin, loom_model_block_range_end(t, l));
    }
    return st;
}

loom_status loom_model_head_backward_weight(loom_model *m, float *g) {
    return m->no_weight_grads ? LOOM_OK : m->ops->head_backward_weight(m, g);
}

loom_status loom_model_embed_backward(loom_model *m, const float *p, float *g) {
    return m->ops->embed_backward(m, p, g);
}

loom_status loom_model_forward(loom_model *m, const float *p) {
    loom_trace_begin(m->trace, "forward", "compute");
    const float *x = m->embed;
    loom_status st = loom_model_embed_forward(m, p);
    if (!st) st = loom_model_blocks_forward(m, p, 0, m->table.n_layer, m->embed, &x);
    if (!st) st = loom_model_head_forward(m, p, x);
    loom_trace_end(m->trace);
    return st;
}

/* lm_head's local rows (vocabulary rows on this rank) and their length; 0 when none */
static int64_t head_rows(const loom_param_table *t, size_t *row) {
    *row = 0;
    for (int i = 0; i < t->n_params; i++)
        if (t->params[i].offset == t->lm_head && t->params[i].shape[0] > 0) {
            *row = t->params[i].numel / (size_t)t->params[i].shape[0];
            return t->params[i].shape[0];
        }
    return 0;
}

void loom_model_head_piece(const loom_param_table *t, int k, int K, size_t *begin, size_t *end) {
    size_t row;
    const int64_t V = head_rows(t, &row);
    *begin = k == 0 ? t->head_begin : t->lm_head + (size_t)(V * k / K) * row;
    *end = k == K - 1 ? t->total : t->lm_head + (size_t)(V * (k + 1) / K) * row;
}

int loom_model_head_can_split(const loom_model *m) {
    const loom_param_table *t = &m->table;
    size_t row;
    return m->ops->head_backward_rows && t->has_head && t->lm_head != LOOM_NO_PARAM &&
           t->lm_head != t->wte && head_rows(t, &row) > 1 && !m->split_backward &&
           !loom_model_seq_parallel(m) && m->be->ops->linear_backward_weight_ld;
}

/* The head's backward and its range(s): one, or head_pieces of vocabulary rows (the
 * weight gradient of each computed right before it is handed over). */
static loom_status head_backward_ranges(loom_model *m, const float *p, float *g, const float *x,
                                        loom_grads_ready_fn ready, void *ctx) {
    const loom_param_table *t = &m->table;
    const int K = ready && m->head_pieces > 1 ? m->head_pieces : 1;
    m->head_weight_deferred = K > 1;
    loom_status st = loom_model_head_backward(m, p, g, x);
    m->head_weight_deferred = 0;
    if (K == 1) return !st && ready ? ready(ctx, t->head_begin, t->total) : st;
    size_t row;
    const int64_t V = head_rows(t, &row);
    for (int k = K - 1; k >= 0 && !st; k--) {
        size_t b, e;
        loom_model_head_piece(t, k, K, &b, &e);
        st = m->ops->head_backward_rows(m, g, (int)(V * k / K), (int)(V * (k + 1) / K));
        if (!st) st = ready(ctx, b, e);
    }
    return st;
}

loom_status loom_model_backward(loom_model *m, const float *p, float *g, loom_grads_ready_fn ready,
                                void *ctx) {
    const loom_param_table *t = &m->table;
    const int L = t->n_layer;
    const float *x_last = L > 0 ? m->blocks[L - 1].res2 : m->embed;
    loom_trace_begin(m->trace, "backward", "compute");
    /* Everything after the last block (the final norm, an untied head) is final then. */
    loom_status st = head_backward_ranges(m, p, g, x_last, ready, ctx);
    /* m->dres holds d(block output); each block turns it into d(block input). */
    if (!st) st = loom_model_blocks_backward(m, p, g, 0, L, m->embed, ready, ctx);
    /* With data parallelism's embedding split (parallel/embed_grad.h) the caller turns
     * d(embedding output), left in m->dres, into the embeddings' gradients. */
    if (!st && !(ready && m->defer_embedding_grad)) st = loom_model_embed_backward(m, p, g);
    if (ready && !st) st = ready(ctx, 0, L > 0 ? t->blocks[0].begin : t->head_begin);
    loom_trace_end(m->trace);
    return st;
}

size_t loom_model_stream_floats(const loom_model *m) {
    return (size_t)m->Ns * m->cfg.d_model + m->cond_floats;
}

void loom_model_stream_send(loom_model *m, const float *x, float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    loom_backend_copy(m->be, buf, x, n * sizeof(float));
    if (m->cond_floats) loom_backend_copy(m->be, buf + n, m->cond, m->cond_floats * sizeof(float));
}

void loom_model_stream_receive(loom_model *m, const float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    if (m->cond_floats) loom_backend_copy(m->be, m->cond, buf + n, m->cond_floats * sizeof(float));
}

void loom_model_grad_stream_send(loom_model *m, float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    loom_backend_copy(m->be, buf, m->dres, n * sizeof(float));
    if (m->cond_floats) loom_backend_copy(m->be, buf + n, m->dcond, m->cond_floats * sizeof(float));
}

void loom_model_grad_stream_receive(loom_model *m, const float *buf) {
    const size_t n = (size_t)m->Ns * m->cfg.d_model;
    loom_backend_copy(m->be, m->dres, buf, n * sizeof(float));
    if (m->cond_floats) loom_backend_copy(m->be, m->dcond, buf + n, m->cond_floats * sizeof(float));
}

int loom_model_record_words(const loom_model_config *c) {
    if (c->family == LOOM_FAMILY_VLM) return loom_vlm_record_words(c);
    return c->family == LOOM_FAMILY_DIT ? 2 + 2 * loom_model_dit_sample_floats(c) : c->seq_len + 1;
}
