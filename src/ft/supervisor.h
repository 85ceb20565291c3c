/* `loom run`: the supervisor. Launches the ranks, watches their heartbeats and the
 * launcher, and on a failure stops the job, writes a diagnosis and restarts it (from
 * the newest checkpoint when the job writes checkpoints; elastic: with fewer ranks). */
#ifndef LOOM_FT_SUPERVISOR_H
#define LOOM_FT_SUPERVISOR_H

#include "core/error.h"
#include "ft/run_config.h"

/* Runs the job to completion or until restarts run out. train_argv holds the train
 * options (without "train"); loom_exe is the loom binary. *exit_code: 0 done, 1 gave
 * up (the message says why), 130/143 interrupted. */
loom_status loom_supervisor_run(const loom_run_config *cfg, const loom_run_job *job,
                                const char *loom_exe, char **train_argv, int train_argc,
                                int *exit_code, loom_error *err);

#endif
