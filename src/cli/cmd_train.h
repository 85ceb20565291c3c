#ifndef LOOM_CLI_CMD_TRAIN_H
#define LOOM_CLI_CMD_TRAIN_H
/* `loom train ...`: returns the process exit code (0 ok, 2 bad input, 1 other failure). */
int loom_cmd_train(int argc, char **argv);
#endif
