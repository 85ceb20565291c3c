/* loom data arith: verifiable arithmetic tasks (addition, multiplication) for SFT and RL. */
#ifndef LOOM_CLI_CMD_DATA_ARITH_H
#define LOOM_CLI_CMD_DATA_ARITH_H

#include "cli/cmd_data_images.h"

/* argv[0] is "arith"; help is printed for --help. 0, or 2 on any error. */
int loom_cmd_data_arith(int argc, char **argv, const loom_data_help *help);

#endif
