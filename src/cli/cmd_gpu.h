/* loom gpu-info: the CUDA devices this build can use, or why there are none. */
#ifndef LOOM_CLI_CMD_GPU_H
#define LOOM_CLI_CMD_GPU_H

int loom_cmd_gpu_info(int argc, char **argv);

#endif
