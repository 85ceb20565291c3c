/* loom generate --image: a vlm's text for an image (cmd_generate.c hands over when the
 * arguments name --image). */
#ifndef LOOM_CLI_CMD_GENERATE_VLM_H
#define LOOM_CLI_CMD_GENERATE_VLM_H

/* 0, or 2 after one error line. */
int loom_cmd_generate_vlm(int argc, char **argv);

#endif
