/* The model, every family: `struct loom_model` (the configuration, the parameter table,
 * the activations planned at start-up in one arena, the parallel groups) and its public
 * functions, forward and backward over the flat parameter/gradient buffers. model.c runs
 * them through the family's table of pieces (loom_model_ops): transformer.c for the
 * language models, dit.c for the diffusion transformer, vlm.c for the multimodal LLM. */
#ifndef LOOM_MODEL_MODEL_H
#define LOOM_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/trace.h"
#include "cp/cp.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/moe.h"
#include "model/params.h"
#include "tp/tp.h"

/* Activations of one block, kept from forward for backward. */
typedef struct {
    float *norm1, *norm1_mean, *norm1_rstd; /* [N,C], [N], [N] (mean unused by RMSNorm) */
    float *qkv;                             /* [N, (H+2KV)*hd], after RoPE */
    float *att, *lse;                       /* [N, H*hd], [B*H*T] */
    float *res1;                            /* [N,C] residual after attention */
    float *norm2, *norm2_mean, *norm2_rstd;
    float *fc;   /* [N, F] or [N, 2F] pre-activation */
    float *act;  /* [N, F] */
    float *res2; /* [N,C] block output */
    /* --precision bf16 (docs/precision.md): the activations whose only readers are bf16
     * GEMMs kept as the bf16 bits those GEMMs read (norm1, norm2 and act then NULL: their
     * fp32 values pass through the model's backward scratch); NULL: kept in fp32 */
    loom_bf16 *norm1_bf16, *norm2_bf16, *act_bf16;
    /* --precision bf16: attention's qkv (after RoPE), its output att and the MLP's
     * pre-activation fc rounded to bf16 where autocast's outputs are, kept as those bits
     * (qkv, att and fc then NULL; their readers load bf16 or widen them:
     * loom_model_bf16_pre_activations) */
    loom_bf16 *qkv_bf16, *att_bf16, *fc_bf16;
    /* split backward only (else NULL): output gradients of proj, fc, attn_out, qkv */
    float *d_res2, *d_fc, *d_res1, *d_qkv;
} loom_block_acts;

/* Called around every block's forward and backward (backward = 0 or 1): where fully
 * sharded data parallelism gathers a block's parameters just before use, prefetches
 * the next one and frees them after. Any field may be NULL. */
typedef struct {
    loom_status (*before_block)(void *ctx, int layer, int backward);
    loom_status (*after_block)(void *ctx, int layer, int backward);
    void *ctx;
} loom_block_hooks;

typedef struct loom_model loom_model;
/* Called during backward whenever the gradients of the flat range [begin, end) are
 * final (ranges arrive in decreasing order and tile [0, total)): the hook that lets
 * data parallelism reduce a bucket while backward computes earlier layers. */
typedef loom_status (*loom_grads_ready_fn)(void *ctx, size_t begin, size_t end);
struct loom_carver;               /* model/model_impl.h */
typedef struct loom_dit loom_dit; /* model/dit.c: a DiT's inputs, conditioning, activations */
typedef struct loom_vlm loom_vlm; /* model/vlm.c: a vlm's encoder, projector, images, weights */

/* The pieces of forward and backward one family implements (transformer.c: the language
 * models; dit.c: the diffusion transformer; vlm.c: the multimodal LLM). The model's
 * public functions below (model.c) call them through m->ops, chosen when the model is
 * created. Shapes and contracts: the
 * loom_model_* functions of the same names. */
typedef struct {
    void (*plan)(loom_model *m, struct loom_carver *cv, int sequence_parallel);
    size_t (*plan_bytes)(const loom_model *m, int sequence_parallel);
    void (*load_batch)(loom_model *m, const int32_t *batch, int first);
    loom_status (*embed_forward)(loom_model *m, const float *params);
    /* block l (local index) from input x, hooks around it; output m->blocks[l].res2 */
    loom_status (*block_forward)(loom_model *m, const float *params, int l, const float *x);
    loom_status (*head_forward)(loom_model *m, const float *params, const float *x);
    loom_status (*loss_sum)(loom_model *m, float dloss, int backward, double *sum);
    loom_status (*head_backward)(loom_model *m, const float *params, float *grads, const float *x);
    /* block l: m->dres = d(output) -> d(input x); and its weight gradients (split) */
    loom_status (*block_backward)(loom_model *m, const float *params, float *grads, int l,
                                  const float *x);
    loom_status (*block_backward_weight)(loom_model *m, const float *params, float *grads, int l,
                                         const float *x);
    loom_status (*head_backward_weight)(loom_model *m, float *grads);
    loom_status (*embed_backward)(loom_model *m, const float *params, float *grads);
    /* The head's weight gradient for vocabulary rows [v0, v1) of this rank (whole
     * sequences, fp32 kernels); NULL in families without an untied head */
    loom_status (*head_backward_rows)(loom_model *m, float *grads, int v0, int v1);
} loom_model_ops;

struct loom_model {
    const loom_model_ops *ops; /* the family's forward/backward */
    loom_model_config cfg;
    loom_block_hooks hooks;
    loom_trace *trace; /* NULL or where forward/backward spans go */
    loom_param_table table;
    int B, T; /* micro-batch shape the arena is planned for: T tokens of a sample here */
    /* Context parallelism (cp/cp.h): NULL or a group of one = whole sequences here. Else
     * this rank holds T = T_seq / cp tokens of every sample, in cp's local row order (its
     * chunks of the sequence: model/context.c), and attention runs through cp. */
    loom_cp *cp;
    int T_seq; /* tokens of a whole sample (the sequence length the data has) */
    /* Tensor parallelism: NULL or a group of one = the whole model here. Else this rank
     * holds H/tp heads, d_ff/tp MLP columns and vocab/tp rows (parallel/tp.h); with
     * sequence parallelism the residual stream (embed, res1, res2, norm outputs, dres)
     * holds only Ns = N/tp rows. */
    loom_tp *tp;
    int Ns;          /* rows of the residual stream here */
    float *full;     /* [N,C] gather target (sequence parallelism only) */
    float *moe_full; /* [N,C] MoE with sequence parallelism: whole output / output gradient */
    /* Where the kernels run and the tensors live (loom_backend_cpu() by default): every
     * op and every activation, token and loss buffer goes through it. */
    const loom_backend *be;
    loom_backend_arena arena; /* the activations, carved at set-up */
    size_t arena_floats;
    float *embed;            /* [N,C] */
    loom_block_acts *blocks; /* n_layer */
    float *normf, *normf_mean, *normf_rstd;
    loom_bf16 *normf_bf16; /* normf kept in bf16 (normf then NULL), as the blocks' norms */
    float *logits;         /* [N,V]; holds dlogits after the loss */
    /* --precision bf16: the logits (and then dlogits) as bf16 [N,V] (logits then NULL):
     * loom_model_bf16_logits */
    loom_bf16 *logits_bf16;
    float *losses;      /* [N] */
    float *losses_host; /* [N] host copy the loss sum reads (host memory) */
    /* backward scratch, shared by all blocks */
    float *dres, *dnorm, *dqkv, *datt, *dfc, *dact, *att_scratch;
    int32_t *inputs, *targets; /* [N] each */
    loom_moe *moe;             /* NULL for a dense model (model/moe.h) */
    int split_backward;        /* 1: backward in B (input) and W (weight) parts */
    int no_weight_grads;       /* 1: B only, W never runs (LOOM_MODEL_NO_WEIGHT_GRADS) */
    /* 1: activation recomputation: the arena keeps only each block's output (the next
     * block's input) per layer, the other activations are one block's worth shared by
     * all layers, refilled by re-running the block's forward right before its backward
     * (and before W under split backward). Same kernels, same order: bitwise identical. */
    int recompute;
    /* 1: selective recomputation (LOOM_RECOMPUTE_SELECTIVE): every block keeps its
     * linears' outputs and norms; the attention output (with its log-sum-exp) and the
     * MLP's activation are one block's worth shared by all layers, recomputed from the
     * kept qkv and fc right before the block's backward (and before W). Bitwise identical
     * to no recomputation. */
    int recompute_selective;
    int size_only; /* LOOM_MODEL_SIZE_ONLY: the arena is sized, not allocated */
    /* bf16 only, the tests' reference for pipelines (LOOM_BF16_ROUND_STREAM=l,l,...): bit l
     * set: the residual stream entering layer l, and its gradient leaving it, are rounded
     * to bf16 in place inside a blocks_forward/backward range (where a pipeline's bf16
     * message would round them), so one process computes what a pipeline split there does. */
    uint64_t round_stream;
    /* bf16 only, the tests' reference for tensor parallelism (LOOM_BF16_ROUND_TP=R or R,sum,
     * model/tp_round.c): one process rounds the linears' partial sums over R ranks as tp
     * R's bf16 messages do (round_tp_sum: and their sum, as tp without sequence parallelism) */
    int round_tp, round_tp_sum;
    float *round_tp_scratch;
    /* 1: a backward with a `ready` callback leaves the embeddings' gradients (wte, wpe)
     * to the caller: d(embedding output) stays in dres (parallel/embed_grad.h) */
    int defer_embedding_grad;
    /* --grad-accum sharded (parallel/zero.h): a backward with a `ready` callback computes
     * an untied head's weight gradient in head_pieces pieces of vocabulary rows and hands
     * each over as its own range (loom_model_head_piece); 0 or 1: the head in one range */
    int head_pieces;
    int head_weight_deferred; /* set around head_backward while the pieces follow */
    /* What travels between pipeline stages with the residual stream (cond_floats 0: none):
     * a DiT's conditioning silu(c) [B, C] every block reads, and its gradient. */
    float *cond, *dcond;
    size_t cond_floats;
    loom_dit *dit; /* NULL unless family dit */
    loom_vlm *vlm; /* NULL unless family vlm */
};

/* Pipeline stages (src/pipeline/) and zero-bubble schedules: LOOM_MODEL_SPLIT_BACKWARD
 * splits block and head backward into B (input gradients, sent upstream at once) and W
 * (weight gradients, later), keeping what W needs; LOOM_MODEL_RECOMPUTE plans the arena
 * for recomputation (see `recompute`). */
#define LOOM_MODEL_SPLIT_BACKWARD 1
#define LOOM_MODEL_RECOMPUTE 2
/* Size the activation arena (arena_floats, loom_model_activation_bytes) but allocate
 * none: the model can be measured, not run (loom plan sizes a layout this way). */
#define LOOM_MODEL_SIZE_ONLY 4
/* Plan the arena for selective recomputation (see `recompute_selective`). */
#define LOOM_MODEL_RECOMPUTE_SELECTIVE 8
/* With LOOM_MODEL_SPLIT_BACKWARD: W never runs (a frozen decoder, --freeze llm), so B keeps
 * nothing for it (no per-block output-gradient buffers). */
#define LOOM_MODEL_NO_WEIGHT_GRADS 16

/* --recompute: what backward recomputes (the values of loom_train_config.recompute). */
typedef enum {
    LOOM_RECOMPUTE_NONE = 0,     /* every activation kept */
    LOOM_RECOMPUTE_FULL = 1,     /* each block's input kept, its forward run again */
    LOOM_RECOMPUTE_SELECTIVE = 2 /* linears' outputs kept; attention and activations again */
} loom_recompute;
/* "none", "full" or "selective" (loom_recompute's value). */
const char *loom_recompute_name(int mode);

/* What a model is built for. Zero-initialised fields mean "none / the whole model". */
typedef struct {
    const loom_model_config *cfg; /* required */
    int B, T; /* micro-batch the arena is planned for (T <= cfg->seq_len): whole samples */
    /* Context parallelism: NULL or a group of one = none; else created for B x T with the
     * model's heads per tensor-parallel rank, and it must outlive the model. */
    loom_cp *cp;
    /* Tensor parallelism: NULL or a group of one = the whole model here. tp must outlive
     * the model and be created for rows B*T and width d_model. */
    loom_tp *tp;
    /* Expert parallelism: this rank holds its share of the experts of ep (NULL or size 1:
     * all of them); tokens are dispatched over ep. */
    loom_comm *ep;
    /* A pipeline stage: only these layers (the registry has only their tensors, under
     * their global names; table.layer_ids maps local block indices to global ones).
     * NULL: all layers. */
    const loom_layer_set *layers;
    int flags; /* LOOM_MODEL_SPLIT_BACKWARD | LOOM_MODEL_RECOMPUTE | LOOM_MODEL_SIZE_ONLY */
    const loom_backend *backend; /* NULL: loom_backend_cpu(); must outlive the model */
} loom_model_options;

/* Builds the registry and plans the arena for micro-batch B x T. */
loom_status loom_model_create(loom_model *m, const loom_model_options *opts, loom_error *err);
/* Sets activation recomputation (a loom_recompute: 0 none, 1 full, 2 selective) and plans
 * the arena again (before use). */
loom_status loom_model_set_recompute(loom_model *m, int mode, loom_error *err);
/* Activation bytes the arena would need with sequence parallelism on or off (for the
 * start-up report). */
size_t loom_model_plan_bytes(const loom_model *m, int sequence_parallel);
/* The same for this model holding whole sequences (without context parallelism). */
size_t loom_model_plan_bytes_whole(const loom_model *m, int sequence_parallel);
void loom_model_destroy(loom_model *m);
size_t loom_model_activation_bytes(const loom_model *m);

/* Runs the following calls on the first T positions of each sample (1 <= T <= the
 * planned length; the arena planned for it is used in part): causal attention makes a
 * position's outputs independent of later ones. Only a language model holding whole
 * sequences (no context parallelism, no experts, fp32; tensor parallelism sets its
 * group's row count, loom_tp_set_rows, and with sequence parallelism B x T must divide
 * by tp): else (or T out of range) LOOM_ERR_STATE and nothing changes. Records are still
 * read as windows of the planned length + 1 tokens. loom_model_can_shorten says whether
 * it may be called. */
int loom_model_can_shorten(const loom_model *m);
loom_status loom_model_set_tokens(loom_model *m, int T, loom_error *err);

/* int32 words of one record of a batch (data/batch_source.h): a language model's window
 * of T+1 tokens; a dit's flow-matching sample (model/dit.h). */
int loom_model_record_words(const loom_model_config *cfg);
/* Records [first, first + B) of batch (host, loom_model_record_words each) into the
 * model's inputs (backend memory): a language model's tokens and next-token targets, a
 * dit's noised patches, times, labels and velocity targets. */
void loom_model_load_batch(loom_model *m, const int32_t *batch, int first);
/* Forward over m->inputs; fills m->logits (no loss). Fails only if a hook fails. */
loom_status loom_model_forward(loom_model *m, const float *params);
/* Loss of m->targets given m->logits: fills m->losses and turns logits into dlogits with
 * weight dloss per token; returns the sum of the per-token losses. */
double loom_model_loss_and_dlogits(loom_model *m, float dloss);
/* Loss only (evaluation): the sum of the per-token losses; logits are left as they are. */
double loom_model_loss(loom_model *m);
/* Both of the above for any layout (vocabulary-parallel with tensor parallelism):
 * backward 0 is loom_model_loss, 1 loom_model_loss_and_dlogits; the sum goes to *sum. */
loom_status loom_model_loss_sum(loom_model *m, float dloss, int backward, double *sum);

/* Backward from dlogits: grads += d(sum of weighted losses)/d params. `ready` may be
 * NULL; its first error stops the calls and is returned. */
/* Piece k of K of the head's flat range [head_begin, total) split by the untied head's
 * vocabulary rows (rows [V k / K, V (k+1) / K) of lm_head): piece 0 begins at head_begin
 * (the final norm with it), piece K - 1 ends at total. */
void loom_model_head_piece(const loom_param_table *t, int k, int K, size_t *begin, size_t *end);
/* 1 when this model can hand its head over in pieces (head_pieces > 1): an untied head
 * in a family with head_backward_rows, whole sequences (no sequence parallelism), no
 * split backward, and a backend with linear_backward_weight_ld (fp32 on the CPU). */
int loom_model_head_can_split(const loom_model *m);
loom_status loom_model_backward(loom_model *m, const float *params, float *grads,
                                loom_grads_ready_fn ready, void *ctx);

/* The pieces of forward and backward a pipeline stage runs. Layer indices lo..hi are
 * local (table.layer_ids maps them to global ones). */
/* m->inputs -> m->embed. */
loom_status loom_model_embed_forward(loom_model *m, const float *params);
/* Blocks [lo, hi) from input x (kept: backward reads it again); *out = the output. */
loom_status loom_model_blocks_forward(loom_model *m, const float *params, int lo, int hi,
                                      const float *x, const float **out);
/* Final norm and logits from the last block's output x. */
loom_status loom_model_head_forward(loom_model *m, const float *params, const float *x);
/* From dlogits to m->dres = d(x) (x: the last block's output). */
loom_status loom_model_head_backward(loom_model *m, const float *params, float *grads,
                                     const float *x);
/* m->dres = d(output of block hi-1) -> m->dres = d(x), x the input of block lo. ready
 * (may be NULL): called with each block's flat range right after its backward (for the
 * last micro-batch: the range is final then). */
loom_status loom_model_blocks_backward(loom_model *m, const float *params, float *grads, int lo,
                                       int hi, const float *x, loom_grads_ready_fn ready,
                                       void *ctx);
/* W parts (split_backward models, after the matching B); x: the input of block lo, as
 * for B (recomputation runs the blocks' forward again); ready as above, after each W. */
loom_status loom_model_blocks_backward_weight(loom_model *m, const float *params, float *grads,
                                              int lo, int hi, const float *x,
                                              loom_grads_ready_fn ready, void *ctx);
/* The message between pipeline stages: the residual stream's Ns x C floats (block output
 * x forward, m->dres backward), then m->cond / m->dcond. A receiving stage reads x in
 * place from the buffer; receive copies the rest. */
size_t loom_model_stream_floats(const loom_model *m);
void loom_model_stream_send(loom_model *m, const float *x, float *buf);
void loom_model_stream_receive(loom_model *m, const float *buf);
void loom_model_grad_stream_send(loom_model *m, float *buf);
void loom_model_grad_stream_receive(loom_model *m, const float *buf);
/* End of block l's flat range (its parameters are [blocks[l].begin, this)). */
size_t loom_model_block_range_end(const loom_param_table *t, int l);
loom_status loom_model_head_backward_weight(loom_model *m, float *grads);
/* Embedding gradient from m->dres = d(embed). */
loom_status loom_model_embed_backward(loom_model *m, const float *params, float *grads);

#endif
