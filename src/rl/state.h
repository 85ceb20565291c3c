/* loom rl's private state (rl/rl.c's loop and rl/gen_layout.c's generation copy). */
#ifndef LOOM_RL_STATE_H
#define LOOM_RL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt_plan.h"
#include "model/generate_batch.h"
#include "parallel/mesh.h"
#include "parallel/reshard.h"
#include "rl/grpo.h"
#include "rl/prompts.h"
#include "rl/rl_config.h"
#include "rl/sample_dump.h"
#include "train/run.h"

/* Everything one loop owns besides the trainer's run. Sequences are numbered q = prompt
 * k x G + sample over the iteration; the generation layout gives its replica w (world
 * rank / gen tp) the slice [g0, g0 + gper), the training layout gives data rank d
 * [q0, q0 + per). */
typedef struct {
    const loom_rl_config *rc;
    loom_run *run;
    int n_global, per, q0, gper, g0;
    int T, W, V, Vl; /* positions, record words, vocabulary, its part on this tp rank */
    int Tm;          /* positions a sample the model is planned for here (--cp: T / cp) */
    loom_prompt_set train, eval;
    loom_batch_generator gen;
    uint8_t *stop; /* [V]: the newline ends a completion */
    /* the generation layout's own copy of the weights (training with --tp > 1): every
     * rank whole, filled from the training shards by reshard */
    loom_param_table gen_table;
    float *gen_params; /* NULL: generation reads the training buffer (tp 1) */
    loom_ckpt_descs train_descs, gen_descs;
    loom_reshard to_gen;
    /* --gen-layout "--tp T": the generation mesh (tp T x dp world / T); gdp replicas, this
     * rank's replica grank, glead: its tp rank 0 (scores and counts for the replica) */
    loom_mesh gmesh;
    int gmesh_on, gdp, grank, glead;
    double reshard_ms, reshard_bytes;
    /* every sequence of the iteration ([n_global]) */
    const int32_t **pptr;
    int *plen, *clen, *pidx;    /* pidx: the prompt (a line of --prompts) of each sequence */
    int32_t *comp;              /* [n_global, max_new] */
    uint64_t *stream;           /* [gper] */
    float *reward;              /* [n_global] */
    double *sums;               /* [n_global (2 + max_new)]: exchange of the gen slices */
    float *adv, *weight;        /* [per T] per token */
    float *old_logp, *ref_logp; /* [per T] */
    /* the first PPO epoch's own forward writes old_logp (the policy before the update:
     * the same forward, so the same numbers as the separate pass of a checked iteration) */
    int old_from_update;
    float aux_dloss;     /* MoE: the weight of a token's auxiliary losses, 1 / (P G T) */
    float *ref_params;   /* kl_coef > 0: the initial weights (this rank's shard) */
    float *full, *parts; /* --tp > 1: a micro-batch's whole-vocabulary logits */
    char **ctext;        /* [gper] completion bytes for the reward */
    size_t *ctext_len, *ptext_len;
    /* --pp > 1: where the last stage's log-probabilities and update statistics go */
    float *stage_logp;
    loom_grpo_stats *stage_stats;
    /* --dump-dir with MoE: the router decisions of every update micro-batch, row step x
     * accum + k (step = iteration x --ppo-epochs + epoch; train/route_dump.h); with --pp
     * each stage its own layers' (summed over the pipeline group before writing) */
    loom_route_dump routes;
    /* --dump-dir: every training rollout's draws on this replica (rl/sample_dump.h) */
    loom_sample_dump samples;
    int route_step; /* --pp: the update step the pipeline's forwards record */
} rl_state;

#endif
