/* loom data: dataset preparation commands. */
#ifndef LOOM_CLI_CMD_DATA_H
#define LOOM_CLI_CMD_DATA_H

/* argv[0] is "data", argv[1] the subcommand. Returns 0 on success, 2 on any error
 * (one line "loom data: ..." on stderr). */
int loom_cmd_data(int argc, char **argv);

#endif
