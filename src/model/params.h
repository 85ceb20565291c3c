/* The parameter registry: every parameter described once (Hugging Face name, global
 * shape, where it lives in the flat buffer, how it is initialised, whether it decays).
 * Parameters, gradients and optimizer moments are flat buffers of `total` floats
 * laid out identically, so one offset addresses a tensor in all of them. */
#ifndef LOOM_MODEL_PARAMS_H
#define LOOM_MODEL_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/config.h"

#define LOOM_PARAM_NAME_MAX 96
#define LOOM_NO_PARAM ((size_t)-1)
/* Width of the DiT's sinusoidal timestep features (frequency_embedding_size). */
#define LOOM_DIT_FREQ_DIM 256

/* NORMAL: N(0, init_std^2); UNIFORM: U(-init_std, init_std) (xavier_uniform's bound). */
typedef enum {
    LOOM_INIT_NORMAL,
    LOOM_INIT_ONES,
    LOOM_INIT_ZEROS,
    LOOM_INIT_UNIFORM
} loom_init_kind;

typedef struct {
    char name[LOOM_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[2]; /* this rank's (local) shape */
    /* Placement across the tensor-parallel group. tp_dim -1: replicated, shape ==
     * global_shape. Else shape[tp_dim] = global_shape[tp_dim] / tp_size and this rank
     * holds slice tp_rank of that dim; with tp_parts > 1 (a fused matrix such as GPT-2's
     * c_attn = [q; k; v]) the dim is made of tp_parts equal blocks and the rank holds its
     * slice of each block, back to back. Checkpoints and initialisation map local
     * elements to global ones with loom_param_global_index. */
    int64_t global_shape[2];
    int tp_dim, tp_parts, tp_rank, tp_size;
    size_t offset; /* in floats, into the flat buffers */
    size_t numel;
    loom_init_kind init;
    float init_std;
    int decay; /* 1: weight decay applies (matrices); 0: norms and biases */
    /* 1 for norm weights/biases: replicated over TP, but with sequence parallelism each
     * rank's gradient is a partial sum over its rows (all-reduced over tp before use). */
    int sp_partial;
    /* Placement across the expert-parallel group: expert is the global index of the
     * expert this tensor belongs to (-1: not an expert tensor, replicated over ep), held
     * by rank ep_rank of a group of ep_size (expert / (n_experts / ep_size) == ep_rank).
     * The name carries the global index, so shapes and offsets are the same on every ep
     * rank while the contents differ. */
    int expert, ep_rank, ep_size;
    /* 1 for a copy that another pipeline stage also holds (GPT-2's tied embedding on the
     * last stage): trained identically there, written to checkpoints by its owner only. */
    int replica;
    /* 1 where this rank's copy counts in the global gradient norm (set by the builder:
     * tp shards always, tp-replicated tensors on tp rank 0, tied copies never). */
    int counted_in_norm;
    /* 1 for a tensor of a frozen vlm part (--freeze): no gradient, no optimizer update. */
    int frozen;
} loom_param;

/* Offsets of one expert's (or the shared expert's) feed-forward tensors: fc [FC, C]
 * (GPT-2 c_fc, F rows; Llama w1 then w3 back to back, 2F rows = [gate; up]) and proj
 * [C, F]; biases only for GPT-2 (LOOM_NO_PARAM otherwise, or for a missing expert). */
typedef struct {
    size_t fc_w, fc_b, proj_w, proj_b;
} loom_expert_params;

/* Offsets (in floats) of one transformer block's tensors; LOOM_NO_PARAM when the family
 * has none. Llama's q/k/v (and gate/up) are registered back to back so that they form
 * one [(H+2KV)*hd, C] (resp. [2F, C]) matrix and run as one GEMM, like GPT-2's c_attn. */
typedef struct {
    size_t begin; /* the block's flat range starts here (its first tensor) */
    size_t norm1_w, norm1_b;
    size_t qkv_w, qkv_b;
    size_t attn_out_w, attn_out_b;
    size_t norm2_w, norm2_b;
    size_t fc_w, fc_b;     /* [F, C] (gelu) or [2F, C] = [gate; up] (swiglu) */
    size_t proj_w, proj_b; /* [C, F] */
    /* Mixture of experts (moe 1; the dense MLP fields are then LOOM_NO_PARAM): the router
     * [E, C], this rank's local expert j at expert0 + j * expert_stride (same layout),
     * and the optional shared expert. */
    int moe;
    size_t gate_w;
    loom_expert_params expert0, shared;
    size_t expert_stride;
    /* DiT: the block's adaLN modulation [6C, C] (norms have no parameters) */
    size_t ada_w, ada_b;
} loom_block_params;

/* Offsets of a DiT's tensors outside the blocks (model/dit.h); LOOM_NO_PARAM when this
 * rank holds none (a pipeline stage without the embedding or the head). */
typedef struct {
    size_t x_embed_w, x_embed_b;               /* patch embedding [C, P_in] */
    size_t t_fc1_w, t_fc1_b, t_fc2_w, t_fc2_b; /* timestep MLP [C, 256], [C, C] */
    size_t y_table;                            /* class embedding [n_classes + 1, C] */
    size_t final_ada_w, final_ada_b;           /* final adaLN [2C, C] */
    size_t final_w, final_b;                   /* final linear [P_out, C] */
} loom_dit_params;

/* Offsets of a vlm's vision encoder and projector (model/vlm.h), all on the first pipeline
 * stage in front of the decoder's embedding (LOOM_NO_PARAM elsewhere). The encoder's
 * blocks reuse loom_block_params: LayerNorm (norm1/norm2 with biases), fused qkv with
 * bias, attn_out, fc (GELU) and proj, each with a bias. */
typedef struct {
    size_t begin, end;         /* the encoder and projector: the flat range [begin, end) */
    size_t proj_begin;         /* the projector's first tensor */
    size_t patch_w, patch_b;   /* [Dv, C*p*p], [Dv] */
    size_t norm_w, norm_b;     /* the encoder's final LayerNorm [Dv] */
    size_t fc1_w, fc1_b;       /* projector [d_model, Dv], [d_model] */
    size_t fc2_w, fc2_b;       /* projector [d_model, d_model], [d_model] */
    loom_block_params *blocks; /* vit_layers entries (NULL: none here) */
    int n_layer;
} loom_vlm_params;

typedef struct {
    loom_param *params;
    int n_params;
    size_t total;
    size_t wte, wpe, normf_w, normf_b, lm_head; /* lm_head == wte when tied */
    size_t head_begin; /* the head's flat range [head_begin, total) (total: no head here) */
    loom_dit_params dit;
    loom_vlm_params vlm;       /* family vlm only */
    loom_block_params *blocks; /* n_layer entries */
    int n_layer;               /* blocks held here (all of them, or a pipeline stage's) */
    int *layer_ids;            /* n_layer entries: block i here is global layer layer_ids[i] */
    int has_embed, has_head;   /* holds the embedding (first stage) / final norm + head (last) */
    int ep_rank, ep_size;      /* expert-parallel placement (1 group of one: all here) */
    int expert_first, n_local_experts;
} loom_param_table;

/* A range [lo, hi) of a table's flat buffers, and a piece of such a buffer in memory (a
 * rank's part of it may be spread over several ranges: --ep's segments). */
typedef struct {
    size_t lo, hi;
} loom_flat_range;
typedef struct {
    float *at;
    size_t n;
} loom_flat_piece;

/* The blocks a pipeline rank holds: n_chunks ranges [lo[c], hi[c]) of global layers (one
 * per model chunk, increasing), and whether it holds the embedding and the head. */
#define LOOM_MAX_CHUNKS 16
typedef struct {
    int n_chunks;
    int lo[LOOM_MAX_CHUNKS], hi[LOOM_MAX_CHUNKS];
    int first, last;
} loom_layer_set;

/* Where this rank sits: rank tp_rank of a tensor-parallel group of tp_size, rank
 * ep_rank of an expert-parallel group of ep_size, holding the blocks of `layers`.
 * Zero-initialised fields mean "none / the whole model" (sizes 0 count as 1, layers
 * NULL: every layer, the embedding and the head). */
typedef struct {
    int tp_rank, tp_size;
    int ep_rank, ep_size;
    const loom_layer_set *layers;
} loom_params_options;

/* Registers the tensors as this rank holds them (opts NULL: everything whole).
 * Tensor parallelism, Megatron placement: q/k/v, c_fc, gate/up and the vocabulary rows
 * of the embedding and head are column-parallel (tp_dim 0; GPT-2's fused c_attn with
 * tp_parts 3); attention/MLP output projections row-parallel (tp_dim 1); norms and the
 * biases of row-parallel layers replicated. Expert parallelism: only experts
 * [ep_rank * E/ep_size, (ep_rank + 1) * E/ep_size) are registered here. A pipeline
 * stage: only the tensors of `layers` (blocks in local order, under their global names;
 * GPT-2's tied embedding also on the last stage, as a replica). */
loom_status loom_params_build(loom_param_table *table, const loom_model_config *cfg,
                              const loom_params_options *opts, loom_error *err);
/* The divisibility tensor parallelism over tp ranks needs (n_head, n_kv_head, d_ff,
 * vocab_size); the message names the flag. */
loom_status loom_params_check_tp(const loom_model_config *cfg, int tp, loom_error *err);
void loom_params_free(loom_param_table *table);
/* Initialises every parameter from Philox keyed by (seed, name hash, element index):
 * any slice of a tensor can be initialised on its own with the same values. */
void loom_params_init(const loom_param_table *table, float *params, uint64_t seed);
/* The same values for the flat range [lo, hi) only, written to dst[0 .. hi-lo): a shard
 * initialises exactly its own elements. */
void loom_params_init_range(const loom_param_table *table, float *dst, size_t lo, size_t hi,
                            uint64_t seed);
/* Row-major index in the global tensor of local element `local` of p. */
int64_t loom_param_global_index(const loom_param *p, int64_t local);
/* Index of the parameter named `name`, or -1. */
int loom_params_find(const loom_param_table *table, const char *name);
/* The trainable span (--freeze): the smallest flat range [*lo, *hi) holding every tensor
 * that is not frozen; [0, total) when none is frozen (empty, lo == hi, when all are).
 * Gradients, AdamW state and the data-parallel reduction cover only this range
 * (parallel/zero.h); a vlm's parts are contiguous (encoder, projector, decoder), so a
 * frozen encoder, decoder or both ends leave it out. Returns 1 when it is not [0, total). */
int loom_params_train_span(const loom_param_table *table, size_t *lo, size_t *hi);

#endif
