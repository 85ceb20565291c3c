/* loom data arith: verifiable arithmetic tasks (addition, multiplication) for SFT and RL. */
#ifndef LOOM_CLI_CMD_DATA_ARITH_H
#define LOOM_CLI_CMD_DATA_ARITH_H

/* argv[0] is "arith"; usage is printed for --help. 0, or 2 on any error. */
int loom_cmd_data_arith(int argc, char **argv, const char *usage);

#endif
