/* loom rl's own settings (its flags: src/cli/cmd_rl.c; the loop: rl/rl.h). */
#ifndef LOOM_RL_RL_CONFIG_H
#define LOOM_RL_RL_CONFIG_H

#include "core/fs.h"
#include "model/generate.h"
#include "rl/grpo.h"

typedef struct {
    char prompts[LOOM_PATH_MAX];      /* --prompts: one prompt a line */
    char eval_prompts[LOOM_PATH_MAX]; /* --eval-prompts: held-out, greedy, exact match */
    int eval_every;                   /* iterations between evaluations (0: start and end) */
    int iterations;                   /* --iterations */
    int prompts_per_iter;             /* --prompts-per-iter P */
    int group_size;                   /* --group-size G >= 2 */
    loom_sampling sampling;           /* --temperature (> 0), --top-p */
    int max_new;                      /* --max-new-tokens */
    loom_grpo_config grpo;            /* --clip-eps, --kl-coef */
    loom_grpo_norm norm;              /* --loss-norm sequence | token */
    int ppo_epochs;                   /* --ppo-epochs: optimizer steps per iteration */
    int ppo_micro_batch;              /* --ppo-micro-batch: sequences per forward/backward */
    char reward_cmd[LOOM_PATH_MAX];   /* --reward-cmd; "" = the arithmetic verifier */
    float time_limit_min;             /* --time-limit: no iteration starts after (0: none) */
    int gen_tp;                       /* --gen-layout "--tp T": generation's tp group (1) */
    float capacity_ignored;           /* MoE: the model's capacity factor, not applied (rl) */
    char dump_dir[LOOM_PATH_MAX];     /* --dump-dir: the rollouts' draws, MoE router decisions */
} loom_rl_config;

void loom_rl_config_defaults(loom_rl_config *rc);

#endif
