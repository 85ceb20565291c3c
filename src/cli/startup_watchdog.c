#include "cli/startup_watchdog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/world.h"

/* This rank and the job size as the launcher announced them (MPI is not up yet). */
static const char *env_first(const char *a, const char *b, const char *c) {
    const char *v = getenv(a);
    if (!v) v = getenv(b);
    if (!v) v = getenv(c);
    return v;
}

static void *watch(void *arg) {
    loom_startup_watchdog *w = arg;
    if (!loom_worker_sleep(&w->worker, w->timeout_s)) return NULL; /* disarmed in time */
    const char *rank = env_first("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID");
    const char *size = env_first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS");
    char line[512];
    int n = snprintf(line, sizeof line,
                     "loom train: rank %s of %s: start-up timed out after %g s (--startup-timeout) "
                     "waiting for the other ranks in MPI_Init: at least one rank has not "
                     "started. Every rank that did start prints this line; the ranks missing "
                     "from these lines never started\n",
                     rank ? rank : "?", size ? size : "?", w->timeout_s);
    if (n > 0) {
        ssize_t unused =
            write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line);
        (void)unused;
    }
    /* MPI cannot be finalized from inside its own start-up: end the process. */
    _exit(1);
}

void loom_startup_watchdog_arm(loom_startup_watchdog *w, double timeout_s) {
    memset(w, 0, sizeof *w);
    if (!loom_world_launched()) return;
    w->timeout_s = timeout_s;
    loom_worker_start(&w->worker, watch, w); /* not started: no watchdog (as before) */
}

void loom_startup_watchdog_disarm(loom_startup_watchdog *w) {
    loom_worker_stop(&w->worker); /* nothing when not armed */
}
