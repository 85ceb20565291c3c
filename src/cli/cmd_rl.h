/* loom rl: post-training by reinforcement learning (GRPO), src/rl/rl.h. */
#ifndef LOOM_CLI_CMD_RL_H
#define LOOM_CLI_CMD_RL_H

/* argv[0] is "rl". 0, 2 on bad input (one line naming the flag or file), 1 otherwise. */
int loom_cmd_rl(int argc, char **argv);

#endif
