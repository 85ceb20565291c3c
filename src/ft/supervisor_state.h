/* The state `loom run`'s supervisor keeps over the run (ft/supervisor.c: the attempts as a
 * state machine) and the watching of one attempt (ft/watch.c), shared by the two; not
 * for other modules. */
#ifndef LOOM_FT_SUPERVISOR_STATE_H
#define LOOM_FT_SUPERVISOR_STATE_H

#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "ft/detect.h"
#include "ft/launch.h"
#include "ft/monitor.h"
#include "ft/run_config.h"
#include "train/batch_skip.h"

/* One failure and what its recovery cost (for summary.json). */
typedef struct {
    loom_failure f;
    int64_t max_step;   /* the furthest step reached before the failure */
    double teardown_ms; /* detection -> every rank stopped */
    double restart_ms;  /* detection -> first step completed after the restart */
    int64_t resumed_at; /* steps already done when the restarted job trained again */
    int recovered;
} loom_failure_log;

typedef struct {
    const loom_run_config *cfg;
    const loom_run_job *job;
    loom_monitor mon;
    FILE *events;
    char host[64];
    int world, dp, attempt;
    loom_batch_skip skip;
    int *blame; /* failures per slot (original rank) */
    int *slots; /* slot of each current rank */
    loom_failure_log *log;
    int n_log;
    json_t *rejected; /* checkpoints a rank refused to load (checksum, missing file) */
    double start_ms;
    char hosts[LOOM_RUN_PATH]; /* --hosts of the next attempt (elastic: a lost host dropped) */
    const volatile sig_atomic_t *stop; /* set (the signal) by SIGINT or SIGTERM */
    int mon_open;                      /* mon to be closed */
    const char *loom_exe;              /* what the launcher runs, with train_argv */
    char **train_argv;
    int train_argc;
    int *exit_code;
    loom_error *err;
    loom_status st; /* what loom_supervisor_run returns */
} loom_sup;

/* How an attempt ended; LOOM_ATTEMPT_RUNNING: not yet. */
typedef enum {
    LOOM_ATTEMPT_RUNNING,    /* still watched */
    LOOM_ATTEMPT_FINISHED,   /* every step done */
    LOOM_ATTEMPT_FAILED,     /* a failure, described in *f */
    LOOM_ATTEMPT_INTERRUPTED /* a signal to the supervisor */
} loom_attempt_outcome;

/* events.jsonl: one line `{"t": WALL, "attempt": N, "event": "WHAT", FIELDS}` (fmt: the
 * fields, NULL for none), for the benchmark and for people. */
void loom_sup_event(loom_sup *s, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The attempt's launcher.log in attempt_dir. */
static inline void loom_sup_launcher_log(const char *attempt_dir, char *out, size_t size) {
    snprintf(out, size, "%s/launcher.log", attempt_dir);
}

/* Watches one attempt (its launcher l, its folder attempt_dir) until it ends or fails
 * (the rules: ft/detect.h; a failure described in *f); along the way its milestones, the
 * previous failure's recovery, slow links and stragglers go to events.jsonl and the
 * progress to stderr. */
loom_attempt_outcome loom_sup_watch(loom_sup *s, loom_launch *l, const char *attempt_dir,
                                    loom_failure *f);

#endif
