#include "model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "model/vlm_parts.h"

typedef struct {
    loom_param_table *t;
    int capacity;
    int tp_rank, tp_size;
    int ep_rank, ep_size;
} builder;

/* Registers a tensor of global shape [rows, cols] (cols 0: a vector), sharded over the
 * tensor-parallel group along tp_dim (-1: replicated) in tp_parts fused blocks. */
static size_t add_placed(builder *b, const char *name, int64_t rows, int64_t cols,
                         loom_init_kind init, float std, int tp_dim, int tp_parts) {
    loom_param_table *t = b->t;
    loom_param *p = &t->params[t->n_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = cols > 0 ? 2 : 1;
    p->global_shape[0] = rows;
    p->global_shape[1] = cols > 0 ? cols : 0;
    p->tp_dim = b->tp_size > 1 ? tp_dim : -1;
    p->tp_parts = tp_parts;
    p->tp_rank = b->tp_rank;
    p->tp_size = b->tp_size;
    p->shape[0] = p->global_shape[0];
    p->shape[1] = p->global_shape[1];
    if (p->tp_dim >= 0) p->shape[p->tp_dim] /= b->tp_size;
    p->numel = (size_t)p->shape[0] * (size_t)(cols > 0 ? p->shape[1] : 1);
    p->offset = t->total;
    p->init = init;
    p->init_std = std;
    p->decay = p->ndim >= 2;
    p->sp_partial = 0;
    p->expert = -1;
    p->ep_rank = b->ep_rank;
    p->ep_size = b->ep_size;
    p->replica = 0;
    t->total += p->numel;
    return p->offset;
}

static size_t add(builder *b, const char *name, int64_t rows, int64_t cols, loom_init_kind init,
                  float std) {
    return add_placed(b, name, rows, cols, init, std, -1, 1);
}

/* A norm weight or bias: replicated, but with sequence parallelism each rank's gradient
 * covers only its rows of the sequence. */
static size_t add_norm(builder *b, const char *name, int64_t n, loom_init_kind init) {
    size_t off = add(b, name, n, 0, init, 0);
    b->t->params[b->t->n_params - 1].sp_partial = 1;
    return off;
}

/* A replicated DiT tensor whose gradient, with sequence parallelism, each rank computes
 * from its own rows only (the conditioning path, patch embedding, final layer). */
static size_t add_rows_partial(builder *b, const char *name, int64_t rows, int64_t cols,
                               loom_init_kind init, float std) {
    size_t off = add(b, name, rows, cols, init, std);
    b->t->params[b->t->n_params - 1].sp_partial = 1;
    return off;
}

/* xavier_uniform's bound for a [fan_out, fan_in] matrix. */
static float xavier(int64_t fan_in, int64_t fan_out) {
    return sqrtf(6.0f / (float)(fan_in + fan_out));
}

/* The DiT's tensors (facebookresearch/DiT names and initialisation: model/dit.h): the
 * embedders on the first stage, the blocks, the final layer on the last. Attention and
 * MLP are Megatron-sharded as GPT-2's; everything else is replicated over tp. */
static void add_dit(builder *b, const loom_model_config *c, const loom_layer_set *set) {
    loom_param_table *t = b->t;
    loom_dit_params *d = &t->dit;
    const int C = c->d_model, F = c->d_ff, K = c->n_classes;
    const int P = loom_model_dit_patch_floats(c); /* in and out: pt * p * p * channels */
    d->x_embed_w = d->x_embed_b = d->t_fc1_w = d->t_fc1_b = d->t_fc2_w = d->t_fc2_b = d->y_table =
        d->final_ada_w = d->final_ada_b = d->final_w = d->final_b = LOOM_NO_PARAM;
    if (set->first) {
        d->x_embed_w =
            add_rows_partial(b, "x_embedder.proj.weight", C, P, LOOM_INIT_UNIFORM, xavier(P, C));
        d->x_embed_b = add_rows_partial(b, "x_embedder.proj.bias", C, 0, LOOM_INIT_ZEROS, 0);
        d->t_fc1_w = add_rows_partial(b, "t_embedder.mlp.0.weight", C, LOOM_DIT_FREQ_DIM,
                                      LOOM_INIT_NORMAL, 0.02f);
        d->t_fc1_b = add_rows_partial(b, "t_embedder.mlp.0.bias", C, 0, LOOM_INIT_ZEROS, 0);
        d->t_fc2_w = add_rows_partial(b, "t_embedder.mlp.2.weight", C, C, LOOM_INIT_NORMAL, 0.02f);
        d->t_fc2_b = add_rows_partial(b, "t_embedder.mlp.2.bias", C, 0, LOOM_INIT_ZEROS, 0);
        d->y_table = add_rows_partial(b, "y_embedder.embedding_table.weight", K + 1, C,
                                      LOOM_INIT_NORMAL, 0.02f);
    }
    char n[LOOM_PARAM_NAME_MAX];
    for (int i = 0; i < t->n_layer; i++) {
        loom_block_params *k = &t->blocks[i];
        const int l = t->layer_ids[i];
        k->norm1_w = k->norm1_b = k->norm2_w = k->norm2_b = LOOM_NO_PARAM;
        k->gate_w = LOOM_NO_PARAM;
        k->begin = t->total;
#define NAME(suffix) snprintf(n, sizeof n, "blocks.%d.%s", l, suffix)
        NAME("adaLN_modulation.1.weight");
        k->ada_w = add_rows_partial(b, n, 6 * C, C, LOOM_INIT_ZEROS, 0);
        NAME("adaLN_modulation.1.bias");
        k->ada_b = add_rows_partial(b, n, 6 * C, 0, LOOM_INIT_ZEROS, 0);
        NAME("attn.qkv.weight");
        k->qkv_w = add_placed(b, n, 3 * C, C, LOOM_INIT_UNIFORM, xavier(C, 3 * C), 0, 3);
        NAME("attn.qkv.bias");
        k->qkv_b = add_placed(b, n, 3 * C, 0, LOOM_INIT_ZEROS, 0, 0, 3);
        NAME("attn.proj.weight");
        k->attn_out_w = add_placed(b, n, C, C, LOOM_INIT_UNIFORM, xavier(C, C), 1, 1);
        NAME("attn.proj.bias");
        k->attn_out_b = add(b, n, C, 0, LOOM_INIT_ZEROS, 0);
        NAME("mlp.fc1.weight");
        k->fc_w = add_placed(b, n, F, C, LOOM_INIT_UNIFORM, xavier(C, F), 0, 1);
        NAME("mlp.fc1.bias");
        k->fc_b = add_placed(b, n, F, 0, LOOM_INIT_ZEROS, 0, 0, 1);
        NAME("mlp.fc2.weight");
        k->proj_w = add_placed(b, n, C, F, LOOM_INIT_UNIFORM, xavier(F, C), 1, 1);
        NAME("mlp.fc2.bias");
        k->proj_b = add(b, n, C, 0, LOOM_INIT_ZEROS, 0);
#undef NAME
    }
    t->head_begin = t->total;
    if (set->last) {
        d->final_ada_w = add_rows_partial(b, "final_layer.adaLN_modulation.1.weight", 2 * C, C,
                                          LOOM_INIT_ZEROS, 0);
        d->final_ada_b = add_rows_partial(b, "final_layer.adaLN_modulation.1.bias", 2 * C, 0,
                                          LOOM_INIT_ZEROS, 0);
        d->final_w = add_rows_partial(b, "final_layer.linear.weight", P, C, LOOM_INIT_ZEROS, 0);
        d->final_b = add_rows_partial(b, "final_layer.linear.bias", P, 0, LOOM_INIT_ZEROS, 0);
    }
}

/* A vlm's vision encoder and projector (model/vlm.h), on the first stage in front of the
 * decoder's embedding; replicated over tp (every rank encodes the micro-batch's images). */
static loom_status add_vlm(builder *b, const loom_model_config *c) {
    loom_vlm_params *v = &b->t->vlm;
    const int D = c->vit_d_model, F = c->vit_d_ff, C = c->d_model;
    const int P = loom_model_dit_patch_floats(c);
    const float std = 0.02f;
    v->blocks = calloc((size_t)c->vit_layers, sizeof *v->blocks);
    if (!v->blocks) return LOOM_ERR_NOMEM;
    v->n_layer = c->vit_layers;
    v->begin = b->t->total;
    v->patch_w = add(b, "vision.patch_embed.weight", D, P, LOOM_INIT_UNIFORM, xavier(P, D));
    v->patch_b = add(b, "vision.patch_embed.bias", D, 0, LOOM_INIT_ZEROS, 0);
    char n[LOOM_PARAM_NAME_MAX];
    for (int l = 0; l < c->vit_layers; l++) {
        loom_block_params *k = &v->blocks[l];
        k->begin = b->t->total;
        k->moe = 0;
        k->gate_w = k->ada_w = k->ada_b = LOOM_NO_PARAM;
#define V(field, suffix, rows, cols, init, s)                                                      \
    (snprintf(n, sizeof n, "vision.blocks.%d.%s", l, suffix),                                      \
     k->field = add(b, n, rows, cols, init, s))
        V(norm1_w, "norm1.weight", D, 0, LOOM_INIT_ONES, 0);
        V(norm1_b, "norm1.bias", D, 0, LOOM_INIT_ZEROS, 0);
        V(qkv_w, "attn.qkv.weight", 3 * D, D, LOOM_INIT_NORMAL, std);
        V(qkv_b, "attn.qkv.bias", 3 * D, 0, LOOM_INIT_ZEROS, 0);
        V(attn_out_w, "attn.proj.weight", D, D, LOOM_INIT_NORMAL, std);
        V(attn_out_b, "attn.proj.bias", D, 0, LOOM_INIT_ZEROS, 0);
        V(norm2_w, "norm2.weight", D, 0, LOOM_INIT_ONES, 0);
        V(norm2_b, "norm2.bias", D, 0, LOOM_INIT_ZEROS, 0);
        V(fc_w, "mlp.fc1.weight", F, D, LOOM_INIT_NORMAL, std);
        V(fc_b, "mlp.fc1.bias", F, 0, LOOM_INIT_ZEROS, 0);
        V(proj_w, "mlp.fc2.weight", D, F, LOOM_INIT_NORMAL, std);
        V(proj_b, "mlp.fc2.bias", D, 0, LOOM_INIT_ZEROS, 0);
#undef V
    }
    v->norm_w = add(b, "vision.norm.weight", D, 0, LOOM_INIT_ONES, 0);
    v->norm_b = add(b, "vision.norm.bias", D, 0, LOOM_INIT_ZEROS, 0);
    v->proj_begin = b->t->total;
    v->fc1_w = add(b, "projector.fc1.weight", C, D, LOOM_INIT_NORMAL, std);
    v->fc1_b = add(b, "projector.fc1.bias", C, 0, LOOM_INIT_ZEROS, 0);
    v->fc2_w = add(b, "projector.fc2.weight", C, C, LOOM_INIT_NORMAL, std);
    v->fc2_b = add(b, "projector.fc2.bias", C, 0, LOOM_INIT_ZEROS, 0);
    v->end = b->t->total;
    return LOOM_OK;
}

loom_status loom_params_check_tp(const loom_model_config *c, int tp, loom_error *err) {
    if (tp <= 1) return LOOM_OK;
    struct {
        const char *flag, *why;
        int value;
    } split[] = {
        {"--n-head", "attention heads are split over the tensor-parallel group", c->n_head},
        {"--n-kv-head", "key/value heads are split too (not replicated)", c->n_kv_head},
        {"--d-ff", "the MLP hidden width is split", c->d_ff},
        {"--vocab-size", "embedding and output rows are split by vocabulary", c->vocab_size},
    };
    /* a dit has no vocabulary: its embedding and head are replicated */
    const size_t n_split = sizeof split / sizeof split[0] - (c->family == LOOM_FAMILY_DIT);
    for (size_t i = 0; i < n_split; i++)
        if (split[i].value % tp != 0) {
            const int up = (split[i].value + tp - 1) / tp * tp;
            return loom_error_set(
                err, LOOM_ERR_INPUT, "%s %d: must be divisible by --tp %d (%s; e.g. %s %d)",
                split[i].flag, split[i].value, tp, split[i].why, split[i].flag, up);
        }
    return LOOM_OK;
}

static loom_status build_table(loom_param_table *t, const loom_model_config *c, int tp_rank,
                               int tp_size, int ep_rank, int ep_size, const loom_layer_set *set,
                               loom_error *err);

loom_status loom_params_build(loom_param_table *t, const loom_model_config *c,
                              const loom_params_options *o, loom_error *err) {
    const loom_params_options none = {0};
    if (!o) o = &none;
    return build_table(t, c, o->tp_rank, o->tp_size > 0 ? o->tp_size : 1, o->ep_rank,
                       o->ep_size > 0 ? o->ep_size : 1, o->layers, err);
}

/* One expert's feed-forward tensors under `prefix` (Mixtral w1/w3/w2 for Llama, c_fc and
 * c_proj with biases for GPT-2), tagged with global expert index e (-1: shared). */
static loom_expert_params add_expert(builder *b, const char *prefix, int gpt2, int e, int C, int F,
                                     float std, float proj_std) {
    loom_expert_params x = {LOOM_NO_PARAM, LOOM_NO_PARAM, LOOM_NO_PARAM, LOOM_NO_PARAM};
    char n[LOOM_PARAM_NAME_MAX];
    const int first = b->t->n_params;
#define EXP(suffix, rows, cols, init, s)                                                           \
    (snprintf(n, sizeof n, "%s.%s", prefix, suffix), add(b, n, rows, cols, init, s))
    if (gpt2) {
        x.fc_w = EXP("c_fc.weight", F, C, LOOM_INIT_NORMAL, std);
        x.fc_b = EXP("c_fc.bias", F, 0, LOOM_INIT_ZEROS, 0);
        x.proj_w = EXP("c_proj.weight", C, F, LOOM_INIT_NORMAL, proj_std);
        x.proj_b = EXP("c_proj.bias", C, 0, LOOM_INIT_ZEROS, 0);
    } else {
        x.fc_w = EXP("w1.weight", F, C, LOOM_INIT_NORMAL, std);
        EXP("w3.weight", F, C, LOOM_INIT_NORMAL, std);
        x.proj_w = EXP("w2.weight", C, F, LOOM_INIT_NORMAL, proj_std);
    }
#undef EXP
    for (int i = first; i < b->t->n_params; i++) b->t->params[i].expert = e;
    return x;
}

/* A mixture-of-experts block's tensors: router, this rank's experts, shared expert. */
static void add_moe(builder *b, loom_block_params *k, const loom_model_config *c, int l, int gpt2,
                    float std, float proj_std) {
    const int C = c->d_model, F = c->d_ff, E = c->n_experts;
    char base[LOOM_PARAM_NAME_MAX], n[LOOM_PARAM_NAME_MAX + 32];
    snprintf(base, sizeof base, gpt2 ? "transformer.h.%d.moe" : "model.layers.%d.block_sparse_moe",
             l);
    k->moe = 1;
    k->fc_w = k->fc_b = k->proj_w = k->proj_b = LOOM_NO_PARAM;
    snprintf(n, sizeof n, "%s.gate.weight", base);
    k->gate_w = add(b, n, E, C, LOOM_INIT_NORMAL, std);
    const loom_param_table *t = b->t;
    for (int j = 0; j < t->n_local_experts; j++) {
        const int e = t->expert_first + j;
        snprintf(n, sizeof n, "%s.experts.%d", base, e);
        size_t start = t->total;
        loom_expert_params x = add_expert(b, n, gpt2, e, C, F, std, proj_std);
        if (j == 0) k->expert0 = x;
        k->expert_stride = t->total - start;
    }
    k->shared = (loom_expert_params){LOOM_NO_PARAM, LOOM_NO_PARAM, LOOM_NO_PARAM, LOOM_NO_PARAM};
    if (c->shared_expert) {
        snprintf(n, sizeof n, "%s.shared_expert", base);
        k->shared = add_expert(b, n, gpt2, -1, C, F, std, proj_std);
    }
}

/* Rank tp_rank of tp_size, ep_rank of ep_size, holding the layer set (NULL: all). */
static loom_status build_table(loom_param_table *t, const loom_model_config *c, int tp_rank,
                               int tp_size, int ep_rank, int ep_size, const loom_layer_set *set,
                               loom_error *err) {
    memset(t, 0, sizeof *t);
    if (c->n_experts > 0 && (ep_size < 1 || c->n_experts % ep_size != 0))
        return loom_error_set(err, LOOM_ERR_INPUT, "--ep %d: must divide --n-experts %d", ep_size,
                              c->n_experts);
    loom_layer_set whole = {1, {0}, {c->n_layer}, 1, 1};
    if (!set) set = &whole;
    loom_status st = loom_params_check_tp(c, tp_size, err);
    if (st) return st;
    const int L = c->n_layer, C = c->d_model, F = c->d_ff, V = c->vocab_size;
    const int hd = C / c->n_head, Hq = c->n_head * hd, Hkv = c->n_kv_head * hd;
    const int capacity = 8 + L * (16 + 4 * (c->n_experts > 0 ? c->n_experts : 0) + 8) +
                         (c->family == LOOM_FAMILY_VLM ? 16 + 12 * c->vit_layers : 0);
    t->params = calloc((size_t)capacity, sizeof *t->params);
    t->blocks = calloc((size_t)L, sizeof *t->blocks);
    t->layer_ids = calloc((size_t)L + 1, sizeof *t->layer_ids);
    if (!t->params || !t->blocks || !t->layer_ids) {
        loom_params_free(t);
        return loom_error_set(err, LOOM_ERR_NOMEM, "parameter registry: out of memory");
    }
    t->n_layer = 0;
    for (int ch = 0; ch < set->n_chunks; ch++)
        for (int l = set->lo[ch]; l < set->hi[ch]; l++) t->layer_ids[t->n_layer++] = l;
    t->has_embed = set->first;
    t->has_head = set->last;
    t->ep_rank = ep_rank;
    t->ep_size = ep_size;
    t->n_local_experts = c->n_experts > 0 ? c->n_experts / ep_size : 0;
    t->expert_first = ep_rank * t->n_local_experts;
    builder b = {t, capacity, tp_rank, tp_size, ep_rank, ep_size};
    (void)b.capacity;
    /* GPT-2 init (also used for Llama): N(0, 0.02), residual projections scaled by
     * 1/sqrt(2L) as in GPT-2's paper; norms start at one, biases at zero. */
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    char n[LOOM_PARAM_NAME_MAX];
    const int gpt2 = c->family == LOOM_FAMILY_GPT2;
    t->wte = t->wpe = t->normf_w = t->normf_b = t->lm_head = LOOM_NO_PARAM;
    t->vlm.begin = t->vlm.end = t->vlm.proj_begin = LOOM_NO_PARAM;
    if (c->family == LOOM_FAMILY_DIT) {
        add_dit(&b, c, set);
    } else if (gpt2 && (set->first || set->last)) {
        /* The last stage's copy of the tied embedding comes first too, so that its range
         * is reported last in backward, as on the first stage. */
        t->wte = add_placed(&b, "transformer.wte.weight", V, C, LOOM_INIT_NORMAL, std, 0, 1);
        t->params[t->n_params - 1].replica = !set->first;
        if (set->first)
            t->wpe = add(&b, "transformer.wpe.weight", c->seq_len, C, LOOM_INIT_NORMAL, std);
    } else if (set->first) {
        if (c->family == LOOM_FAMILY_VLM && add_vlm(&b, c) != LOOM_OK) {
            loom_params_free(t);
            return loom_error_set(err, LOOM_ERR_NOMEM, "parameter registry: out of memory");
        }
        t->wte = add_placed(&b, "model.embed_tokens.weight", V, C, LOOM_INIT_NORMAL, std, 0, 1);
    }
    for (int i = 0; i < t->n_layer && c->family != LOOM_FAMILY_DIT; i++) {
        loom_block_params *k = &t->blocks[i];
        const int l = t->layer_ids[i];
        k->norm1_b = k->qkv_b = k->attn_out_b = k->norm2_b = k->fc_b = k->proj_b = LOOM_NO_PARAM;
        k->ada_w = k->ada_b = LOOM_NO_PARAM;
        k->begin = t->total;
/* COL: column-parallel (output rows split), ROW: row-parallel (input columns split). */
#define NAME(suffix)                                                                               \
    snprintf(n, sizeof n, "%s%d.%s", gpt2 ? "transformer.h." : "model.layers.", l, suffix)
#define ADD(suffix, rows, cols, init, s) (NAME(suffix), add(&b, n, rows, cols, init, s))
#define NORM(suffix, rows, init) (NAME(suffix), add_norm(&b, n, rows, init))
#define COL(suffix, rows, cols, init, s, parts)                                                    \
    (NAME(suffix), add_placed(&b, n, rows, cols, init, s, 0, parts))
#define ROW(suffix, rows, cols, s)                                                                 \
    (NAME(suffix), add_placed(&b, n, rows, cols, LOOM_INIT_NORMAL, s, 1, 1))
        if (gpt2) {
            k->norm1_w = NORM("ln_1.weight", C, LOOM_INIT_ONES);
            k->norm1_b = NORM("ln_1.bias", C, LOOM_INIT_ZEROS);
            k->qkv_w = COL("attn.c_attn.weight", 3 * C, C, LOOM_INIT_NORMAL, std, 3);
            k->qkv_b = COL("attn.c_attn.bias", 3 * C, 0, LOOM_INIT_ZEROS, 0, 3);
            k->attn_out_w = ROW("attn.c_proj.weight", C, C, proj_std);
            k->attn_out_b = ADD("attn.c_proj.bias", C, 0, LOOM_INIT_ZEROS, 0);
            k->norm2_w = NORM("ln_2.weight", C, LOOM_INIT_ONES);
            k->norm2_b = NORM("ln_2.bias", C, LOOM_INIT_ZEROS);
            if (loom_model_layer_is_moe(c, l)) {
                add_moe(&b, k, c, l, 1, std, proj_std);
                continue;
            }
            k->fc_w = COL("mlp.c_fc.weight", F, C, LOOM_INIT_NORMAL, std, 1);
            k->fc_b = COL("mlp.c_fc.bias", F, 0, LOOM_INIT_ZEROS, 0, 1);
            k->proj_w = ROW("mlp.c_proj.weight", C, F, proj_std);
            k->proj_b = ADD("mlp.c_proj.bias", C, 0, LOOM_INIT_ZEROS, 0);
        } else {
            k->norm1_w = NORM("input_layernorm.weight", C, LOOM_INIT_ONES);
            k->qkv_w = COL("self_attn.q_proj.weight", Hq, C, LOOM_INIT_NORMAL, std, 1);
            COL("self_attn.k_proj.weight", Hkv, C, LOOM_INIT_NORMAL, std, 1);
            COL("self_attn.v_proj.weight", Hkv, C, LOOM_INIT_NORMAL, std, 1);
            k->attn_out_w = ROW("self_attn.o_proj.weight", C, Hq, proj_std);
            k->norm2_w = NORM("post_attention_layernorm.weight", C, LOOM_INIT_ONES);
            if (loom_model_layer_is_moe(c, l)) {
                add_moe(&b, k, c, l, 0, std, proj_std);
                continue;
            }
            k->fc_w = COL("mlp.gate_proj.weight", F, C, LOOM_INIT_NORMAL, std, 1);
            COL("mlp.up_proj.weight", F, C, LOOM_INIT_NORMAL, std, 1);
            k->proj_w = ROW("mlp.down_proj.weight", C, F, proj_std);
        }
#undef ADD
#undef NORM
#undef COL
#undef ROW
#undef NAME
    }
    if (c->family != LOOM_FAMILY_DIT) t->head_begin = t->total;
    if (!set->last || c->family == LOOM_FAMILY_DIT) {
        /* no final norm or head on this stage (a dit's final layer: add_dit) */
    } else if (gpt2) {
        t->normf_w = add_norm(&b, "transformer.ln_f.weight", C, LOOM_INIT_ONES);
        t->normf_b = add_norm(&b, "transformer.ln_f.bias", C, LOOM_INIT_ZEROS);
        t->lm_head = t->wte; /* tied */
    } else {
        t->normf_w = add_norm(&b, "model.norm.weight", C, LOOM_INIT_ONES);
        t->lm_head = add_placed(&b, "lm_head.weight", V, C, LOOM_INIT_NORMAL, std, 0, 1);
    }
    /* Each element of the model counted once in the global gradient norm: a tp shard on
     * its rank, a tp-replicated tensor (norms, row-parallel biases, MoE blocks) on tp
     * rank 0, a pipeline stage's tied copy never (its owner counts it). Data-parallel
     * replicas are the gradient-sync strategy's to tell apart (parallel/grad_sync.h). */
    for (int i = 0; i < t->n_params; i++) {
        loom_param *p = &t->params[i];
        p->counted_in_norm = !p->replica && (p->tp_dim >= 0 || p->tp_rank == 0);
        p->frozen = c->freeze && (c->freeze & (int)loom_vlm_param_part(p->name)) != 0;
    }
    return LOOM_OK;
}

void loom_params_free(loom_param_table *t) {
    free(t->vlm.blocks);
    free(t->params);
    free(t->blocks);
    free(t->layer_ids);
    memset(t, 0, sizeof *t);
}

void loom_params_init_range(const loom_param_table *t, float *dst, size_t lo, size_t hi,
                            uint64_t seed) {
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a >= b) continue;
        float *w = dst + (a - lo);
        const size_t first = a - p->offset, n = b - a; /* element index inside the tensor */
        if (p->init == LOOM_INIT_ONES) {
            for (size_t j = 0; j < n; j++) w[j] = 1.0f;
        } else if (p->init == LOOM_INIT_ZEROS) {
            memset(w, 0, n * sizeof *w);
        } else if (p->init == LOOM_INIT_UNIFORM) {
            const uint32_t stream = loom_hash_name(p->name);
            const double a = p->init_std;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++) {
                const uint64_t g = (uint64_t)loom_param_global_index(p, (int64_t)(first + j));
                const uint32_t bits = (uint32_t)(loom_philox_u64(seed, stream, g, 0) >> 32);
                w[j] = (float)(a * (2.0 * loom_philox_uniform(bits) - 1.0));
            }
        } else {
            const uint32_t stream = loom_hash_name(p->name);
            const double s = p->init_std;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++)
                w[j] = (float)(s * loom_philox_normal(
                                       seed, stream,
                                       (uint64_t)loom_param_global_index(p, (int64_t)(first + j))));
        }
    }
}

void loom_params_init(const loom_param_table *t, float *params, uint64_t seed) {
    loom_params_init_range(t, params, 0, t->total, seed);
}

int64_t loom_param_global_index(const loom_param *p, int64_t local) {
    if (p->tp_dim < 0 || p->tp_size == 1) return local;
    const int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
    const int64_t gcols = p->ndim == 2 ? p->global_shape[1] : 1;
    int64_t r = local / cols, c = local % cols; /* local row and column */
    if (p->tp_dim == 0) {
        const int64_t part = p->shape[0] / p->tp_parts, gpart = p->global_shape[0] / p->tp_parts;
        r = (r / part) * gpart + (int64_t)p->tp_rank * part + r % part;
    } else {
        const int64_t part = cols / p->tp_parts, gpart = gcols / p->tp_parts;
        c = (c / part) * gpart + (int64_t)p->tp_rank * part + c % part;
    }
    return r * gcols + c;
}

int loom_params_train_span(const loom_param_table *t, size_t *lo, size_t *hi) {
    size_t a = t->total, b = 0;
    int frozen = 0;
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        if (p->frozen) {
            frozen = 1;
            continue;
        }
        if (p->offset < a) a = p->offset;
        if (p->offset + p->numel > b) b = p->offset + p->numel;
    }
    if (!frozen) a = 0, b = t->total;
    if (a > b) a = b = 0; /* every tensor frozen: nothing to train here */
    *lo = a;
    *hi = b;
    return a != 0 || b != t->total;
}

int loom_params_find(const loom_param_table *t, const char *name) {
    for (int i = 0; i < t->n_params; i++)
        if (strcmp(t->params[i].name, name) == 0) return i;
    return -1;
}
