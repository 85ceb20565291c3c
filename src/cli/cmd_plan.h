/* loom plan: the layout to train with, predicted from a machine profile (docs/PLAN.md). */
#ifndef LOOM_CLI_CMD_PLAN_H
#define LOOM_CLI_CMD_PLAN_H

int loom_cmd_plan(int argc, char **argv);

#endif
