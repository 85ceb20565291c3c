/* A bounded start-up: a rank that never starts must not leave the others waiting
 * forever. OpenMPI's MPI_Init ends with a fence over every rank of the job (measured
 * here: a rank started 5 s late keeps the others inside MPI_Init for those 5 s), so the
 * wait happens inside MPI_Init itself, where no MPI call (and no timeout of MPI's) can
 * run. A watchdog thread, armed before MPI_Init and disarmed once the mesh is built,
 * ends this process after the timeout with one line naming this rank and the job size:
 * every rank that did start prints such a line, so the ranks missing from the output
 * are the ones that never started (inside the fence nothing else can tell). */
#ifndef LOOM_CLI_STARTUP_WATCHDOG_H
#define LOOM_CLI_STARTUP_WATCHDOG_H

#include "core/worker.h"

typedef struct {
    loom_worker worker; /* core/worker.h: sleeps until the timeout or the disarm (its stop) */
    double timeout_s;
} loom_startup_watchdog;

/* Arms the watchdog when launched by an MPI launcher (a single process has nobody to
 * wait for); it then exits the process with status 1 after timeout_s. */
void loom_startup_watchdog_arm(loom_startup_watchdog *w, double timeout_s);
void loom_startup_watchdog_disarm(loom_startup_watchdog *w);

#endif
