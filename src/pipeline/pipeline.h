/* Pipeline parallelism: the layers are split into pp x v virtual stages (v model chunks
 * per pipeline rank, virtual stage s = chunk * pp + rank); the first holds the
 * embedding, the last the final norm, head and loss. A rank's model registry holds only
 * its own tensors under their global names (GPT-2's tied embedding also on the last rank,
 * as a replica whose gradient is summed with the first rank's before the optimizer).
 * One training step runs the rank's action list (pipeline/schedule.h): each send right
 * after its compute, all non-blocking. Each micro-batch in flight has its own activation
 * arena (a loom_model "slot"), as many as the schedule holds at once on this rank, and
 * the slot's message buffers (per chunk: activation and gradient, in and out): a
 * micro-batch's receives are posted as soon as its slot is free (the action that
 * released the previous occupant; the step's start for the first), so message memory
 * grows with the micro-batches in flight, not with the micro-batches per step. */
#ifndef LOOM_PIPELINE_PIPELINE_H
#define LOOM_PIPELINE_PIPELINE_H

#include <stdio.h>

#include "model/model.h"
#include "parallel/fsdp.h"
#include "parallel/grad_sync.h"
#include "parallel/mesh.h"
#include "tp/tp.h"
#include "parallel/zero.h"
#include "pipeline/schedule.h"
#include "pipeline/vision_plan.h"

/* What a pipeline needs of the training run's flags (train/ fills it in). */
typedef struct {
    int pp;                      /* --pp: pipeline ranks */
    int virtual_stages;          /* --virtual-stages: model chunks per rank (interleaved) */
    char schedule[16];           /* --pp-schedule: gpipe | 1f1b | interleaved | zb */
    char layers[256];            /* --pp-layers: layers per (virtual) stage; "" = balanced */
    char stats[1024];            /* --pp-stats: per-rank timers (JSON lines); "" = none */
    int recompute;               /* --recompute: a loom_recompute */
    int size_only;               /* sizing only: slot 0 sized (LOOM_MODEL_SIZE_ONLY), no buffers */
    const loom_backend *backend; /* the slots' ops (NULL: the CPU's; --precision bf16) */
    int bf16_messages; /* --precision bf16: the stage boundary's messages travel as bf16 */
    int micro_batch, global_batch;
    int vision_bubbles; /* --vision-schedule bubbles (vlm): pipeline/vision_plan.h */
} loom_pp_config;

/* --vision-schedule bubbles' run-time state (pipeline/vision_exec.c). */
typedef struct loom_pp_vision_state loom_pp_vision_state;

typedef struct {
    const loom_model_config *mc;
    loom_pp_config cfg;
    loom_mesh *mesh;
    loom_comm *comm; /* the pipeline group */
    int pp, rank, v, S, m;
    loom_pp_schedule train, eval;
    int counts[LOOM_PP_MAX_STAGES * LOOM_MAX_CHUNKS]; /* layers per virtual stage */
    loom_layer_set layers;
    int chunk_lo[LOOM_MAX_CHUNKS], chunk_hi[LOOM_MAX_CHUNKS]; /* local layer ranges */
    loom_model **slots;                                       /* slots[0] is the trainer's model */
    int n_slots;
    int *slot_train, *slot_eval; /* slot of each micro-batch */
    /* per micro-batch: index of the action after which its receives are posted (the one
     * that freed its slot; -1: at the step's start) */
    int *post_train, *post_eval;
    size_t act_floats;                 /* floats of one activation/gradient message */
    float *recv_buf, *send_buf;        /* [2 (activation, gradient)][n_slots][v][act_floats] */
    loom_comm_handle *recv_h, *send_h; /* one per buffer */
    /* --precision bf16: the messages travel as bf16 (round to nearest even, widened exactly
     * on receipt). wire_send, wire_recv: [2][n_slots][v][act_floats] bf16 bit patterns, what
     * MPI moves; recv_buf then holds only the activation half (a received activation is the
     * chunk's input, kept for its backward); send_buf is one message of fp32 scratch (the
     * outgoing message before its rounding, a received gradient widened before the model
     * copies it). NULL in fp32, where MPI moves recv_buf and send_buf as above. */
    uint16_t *wire_send, *wire_recv;
    uint64_t sent_bytes; /* message bytes this rank sent in training steps, all steps */
    float *tied;         /* [wte numel]: the other stage's copy of the tied embedding gradient */
    int tied_peer;       /* -1: none */
    FILE *stats;
    double *act_cpu_ms; /* per action of the training list */
    int step;
    loom_pp_vision_state *vision; /* --vision-schedule bubbles; NULL: the encoder on stage 0 */
    loom_param_table full_table;  /* world rank 0: the whole model (exports) */
    float *full_flat;
} loom_pipeline;

/* Checks --pp, --pp-layers, --virtual-stages and --pp-schedule against the model and the
 * micro-batch count (messages name the flag). Also called before MPI starts. */
loom_status loom_pipeline_validate(const loom_model_config *mc, const loom_pp_config *cfg, int dp,
                                   loom_error *err);
/* Layers per virtual stage (pc->pp x pc->virtual_stages counts, virtual stage s = chunk *
 * pp + rank): --pp-layers, else the balanced split (v = 1: the head's work counted on the
 * last stage) or an even one (interleaved). The split loom_pipeline_create uses. */
loom_status loom_pipeline_split_layers(const loom_model_config *mc, const loom_pp_config *pc,
                                       int *counts, loom_error *err);
/* Builds the schedules, the stage's model (into *model: slot 0, the one the trainer sees)
 * and the extra slots and message buffers. cp: NULL or the context-parallel attention
 * every slot shares (it keeps nothing between calls). */
loom_status loom_pipeline_create(loom_pipeline *pl, const loom_model_config *mc,
                                 const loom_pp_config *cfg, loom_mesh *mesh, loom_tp *tp,
                                 loom_cp *cp, loom_model *model, loom_error *err);
void loom_pipeline_free(loom_pipeline *pl);
/* The layers pipeline rank `rank` holds. */
void loom_pipeline_layers_of(const loom_pipeline *pl, int rank, loom_layer_set *out);
/* Bytes of the stage's message buffers (fp32: recv_buf and send_buf; bf16: the wire
 * buffers, the activation half of recv_buf and the scratch), also when sized only. */
size_t loom_pipeline_message_bytes(const loom_pipeline *pl);
/* Activation bytes of all slots, and a line for the start-up report. */
void loom_pipeline_report(const loom_pipeline *pl, FILE *f);

/* One step's forward and backward over this rank's micro-batches (batch: the rank's
 * dp slice, [G/dp, T+1]); gradients accumulate into grads and go to the gradient sync
 * (loom_grad_sync_begin done here, the caller finishes it) as each chunk's become final.
 * *loss_sum: the sum of the token losses of this dp slice, the same on every stage.
 * Before the schedule's first forward the sync gathers what the parameters need
 * (loom_grad_sync_begin_micro_batch: ZeRO-3's shards). */
loom_status loom_pipeline_step(loom_pipeline *pl, const float *params, float *grads,
                               const int32_t *batch, float dloss, loom_grad_sync *sync,
                               double *loss_sum, loom_error *err);
/* Forward only (validation): *loss_sum as above, no gradients. */
loom_status loom_pipeline_forward_loss(loom_pipeline *pl, const float *params, const int32_t *batch,
                                       loom_grad_sync *sync, double *loss_sum, loom_error *err);

/* A loss the caller computes on the last stage in place of cross-entropy (loom rl's
 * policy-gradient loss): called after the head's forward of micro-batch mb (m: its slot,
 * with m->logits [micro-batch x seq, vocabulary] and m->targets); adds the micro-batch's
 * loss to *loss and, when backward, leaves d loss / d logits in m->logits. The MoE layers
 * of the last chunk are the loss function's: it consumes their auxiliary losses
 * (loom_moe_loss_sum) and weighs them as it wants. */
typedef loom_status (*loom_pp_loss_fn)(void *ctx, loom_model *m, int mb, int backward, double *loss,
                                       loom_error *err);
/* Called after every forward action (F) of micro-batch mb with its slot m (the router
 * decisions of the chunk's MoE layers are then m's latest; loom rl's --dump-dir). */
typedef void (*loom_pp_forward_fn)(void *ctx, loom_model *m, int mb);
typedef struct {
    loom_pp_loss_fn loss; /* the last stage's loss (NULL: the model's cross-entropy, with
                           * aux_dloss as loom_pipeline_step's dloss) */
    void *ctx;            /* the argument of both functions */
    /* training: the weight of one token's MoE auxiliary losses (load balancing, z) on the
     * chunks before the last stage's loss: their gradient reaches the routers with it and
     * *loss_sum gains aux_dloss x their sum (loom_pipeline_step's dloss, where the sum is
     * added unweighted beside the unweighted cross-entropy) */
    float aux_dloss;
    loom_pp_forward_fn forwarded; /* NULL: none */
} loom_pp_custom;
/* loom_pipeline_step with c->loss as the last stage's loss. */
loom_status loom_pipeline_step_custom(loom_pipeline *pl, const float *params, float *grads,
                                      const int32_t *batch, loom_grad_sync *sync,
                                      const loom_pp_custom *c, double *loss_sum, loom_error *err);
/* loom_pipeline_forward_loss with c->loss (backward 0) as the last stage's loss (no
 * auxiliary losses: c->aux_dloss is not used). */
loom_status loom_pipeline_forward_custom(loom_pipeline *pl, const float *params,
                                         const int32_t *batch, loom_grad_sync *sync,
                                         const loom_pp_custom *c, double *loss_sum,
                                         loom_error *err);
/* Gathers the stages' unsharded tensors (stage table `st`, flat `sflat`: valid on the
 * stage's TP rank 0) into the whole model on world rank 0 (*out_t, *out_f; NULL
 * elsewhere). Collective over every rank. */
loom_status loom_pipeline_export(loom_pipeline *pl, const loom_param_table *st, const float *sflat,
                                 const loom_param_table **out_t, const float **out_f,
                                 loom_error *err);

/* --vision-schedule bubbles (pipeline/vision_exec.c; every call but setup and teardown
 * only where pl->vision is set): the plan and the encoder replicas; */
loom_status loom_pp_vision_setup(loom_pipeline *pl, loom_tp *tp, loom_cp *cp, loom_error *err);
void loom_pp_vision_teardown(loom_pipeline *pl);
const loom_pp_vision *loom_pp_vision_plan(const loom_pipeline *pl); /* NULL: none */
/* the bytes it holds on this stage: the encoder replicas' arenas (one per piece in flight),
 * their weights and gradients, the image rows' buffers; the first stage's gradient
 * buffers (0 without it; also when sized only, loom_pp_config.size_only); */
size_t loom_pp_vision_bytes(const loom_pipeline *pl);
/* a training step's start: the replicas' weights sent, the image rows' receives posted; */
loom_status loom_pp_vision_step_begin(loom_pipeline *pl, const float *params, loom_error *err);
/* a later stage, before its action j (j = its list's length: after the last): the pieces
 * placed there; */
loom_status loom_pp_vision_pieces(loom_pipeline *pl, int j, const int32_t *batch, loom_error *err);
/* the first stage: before micro-batch mb's embedding forward (any pl: sets where the
 * model's image rows come from; evaluation: always here), after its embedding backward (sends their
 * gradient); */
loom_status loom_pp_vision_before_embed(loom_pipeline *pl, loom_model *mod, int mb, int training,
                                        loom_error *err);
loom_status loom_pp_vision_after_embed_backward(loom_pipeline *pl, int mb, loom_error *err);
/* the first stage, before its embedding range is reported: the replicas' encoder
 * gradients added to its own, in stage order; */
loom_status loom_pp_vision_add_grads(loom_pipeline *pl, float *grads, loom_error *err);
/* every stage, at the step's end: its messages done. */
loom_status loom_pp_vision_step_end(loom_pipeline *pl, loom_error *err);

#endif
