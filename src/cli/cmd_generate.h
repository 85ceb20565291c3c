#ifndef LOOM_CLI_CMD_GENERATE_H
#define LOOM_CLI_CMD_GENERATE_H
/* `loom generate --weights PATH --prompt TEXT ...`: exit code 0, 2 on bad input. */
int loom_cmd_generate(int argc, char **argv);
#endif
