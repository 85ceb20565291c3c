#include "cli/startup_watchdog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)w->timeout_s;
    deadline.tv_nsec += (long)((w->timeout_s - (double)(time_t)w->timeout_s) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!w->disarmed)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &deadline) != 0) break;
    int fire = !w->disarmed;
    pthread_mutex_unlock(&w->mu);
    if (!fire) return NULL;
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
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&w->mu, NULL);
    w->armed = pthread_create(&w->thread, NULL, watch, w) == 0;
}

void loom_startup_watchdog_disarm(loom_startup_watchdog *w) {
    if (!w->armed) return;
    pthread_mutex_lock(&w->mu);
    w->disarmed = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->armed = 0;
}
