/* loom data vlm: Fashion-MNIST grids with captions and questions -> vlm shards
 * (data/vlm_shard.h). */
#ifndef LOOM_CLI_CMD_DATA_VLM_H
#define LOOM_CLI_CMD_DATA_VLM_H

/* argv[0] is "vlm"; usage is printed for --help. 0, or 2 on any error. */
int loom_cmd_data_vlm(int argc, char **argv, const char *usage);

#endif
