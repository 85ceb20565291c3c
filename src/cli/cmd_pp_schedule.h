/* loom pp-schedule: prints a pipeline schedule (timeline and action lists per stage). */
#ifndef LOOM_CLI_CMD_PP_SCHEDULE_H
#define LOOM_CLI_CMD_PP_SCHEDULE_H

int loom_cmd_pp_schedule(int argc, char **argv);

#endif
