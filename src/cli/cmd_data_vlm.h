/* loom data vlm: Fashion-MNIST grids with captions and questions -> vlm shards
 * (data/vlm_shard.h). */
#ifndef LOOM_CLI_CMD_DATA_VLM_H
#define LOOM_CLI_CMD_DATA_VLM_H

#include "cli/cmd_data_images.h"

/* argv[0] is "vlm"; help is printed for --help. 0, or 2 on any error. */
int loom_cmd_data_vlm(int argc, char **argv, const loom_data_help *help);

#endif
