/* loom rl: post-training by reinforcement learning (GRPO), src/rl/rl.h. */
#ifndef LOOM_CLI_CMD_RL_H
#define LOOM_CLI_CMD_RL_H

#include "cli/train_options.h"
#include "rl/rl.h"

/* Parses and checks loom rl's command line (argv[0] = "rl") into rc and o (loom train's
 * options as loom rl runs them: --global-batch, --micro-batch, --steps set from the rl
 * flags). -1: go on; else the exit code (0 for --help, 2 after one line on bad input). */
int loom_cmd_rl_options(int argc, char **argv, loom_rl_config *rc, loom_train_options *o);

/* argv[0] is "rl". 0, 2 on bad input (one line naming the flag or file), 1 otherwise. */
int loom_cmd_rl(int argc, char **argv);

#endif
