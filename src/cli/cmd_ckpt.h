/* loom ckpt inspect|verify|export: checkpoint tools. */
#ifndef LOOM_CLI_CMD_CKPT_H
#define LOOM_CLI_CMD_CKPT_H

int loom_cmd_ckpt(int argc, char **argv);

#endif
