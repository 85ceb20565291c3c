/* The launcher process (mpirun or srun) of one attempt: started in its own session so
 * that the whole job can be signalled as one process group, its output in a log file. */
#ifndef LOOM_FT_LAUNCH_H
#define LOOM_FT_LAUNCH_H

#include <sys/types.h>

#include "core/error.h"

typedef struct {
    pid_t pid;
    int running;
    int status; /* exit code, or 128 + signal */
} loom_launch;

/* fork + setsid + exec of argv[0] (PATH lookup), stdin /dev/null, stdout and stderr
 * appended to log_path. */
loom_status loom_launch_start(loom_launch *l, char *const argv[], const char *log_path,
                              loom_error *err);
/* Reaps the launcher if it has exited: 1 when it has (l->status set). */
int loom_launch_poll(loom_launch *l);
/* SIGTERM to the launcher (it forwards to the ranks), SIGKILL to its process group and
 * the given rank pids (this host's) after grace_s; returns when the launcher is reaped. */
void loom_launch_stop(loom_launch *l, double grace_s, const pid_t *rank_pids, int n);
/* 1 if pid is gone or a zombie (a rank that died, on this host). */
int loom_pid_dead(pid_t pid);

#endif
