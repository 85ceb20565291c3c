/* loom run: the supervisor (src/ft/supervisor.h does the work). */
#ifndef LOOM_CLI_CMD_RUN_H
#define LOOM_CLI_CMD_RUN_H

int loom_cmd_run(int argc, char **argv);

#endif
