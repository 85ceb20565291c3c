#ifndef LOOM_CLI_CMD_SAMPLE_H
#define LOOM_CLI_CMD_SAMPLE_H
/* `loom sample --weights W.safetensors ...`: images (or clips) from a dit model by
 * integrating its flow (model/flow_sampler.h). Exit code 0, 2 on bad input. */
int loom_cmd_sample(int argc, char **argv);
#endif
