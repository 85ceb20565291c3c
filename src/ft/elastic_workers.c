/* loom run --elastic with worker groups: one mpirun per worker (ft/elastic_workers.h). */
#include "ft/elastic_workers.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fs.h"
#include "ft/launch.h"

#define MAX_WORKERS 64
#define OWN_ARGS 24 /* the launcher's words around the train options */

typedef struct {
    loom_launch job;
    int restarts; /* this worker's launches after the first */
    int done;     /* ended (and not started again) */
} worker;

/* SIGINT / SIGTERM to loom run: every worker is stopped (they run in their own sessions). */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static void tick(void) {
    const struct timespec t = {0, 50 * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* One worker's mpirun: its slots (LOOM_FT_SLOTS: --inject RANK counts over all workers'
 * ranks) and attempt (LOOM_FT_ATTEMPT: its restarts) in the environment it inherits.
 * resume: a restart also resumes from the worker's newest valid checkpoint (--resume auto:
 * DIR/worker_I's, after the train options, so it overrides theirs). */
static loom_status launch(worker *w, int id, int ranks, int join, int resume, const char *uri,
                          const char *exe, char **train_argv, int train_argc, const char *dir,
                          loom_error *err) {
    char words[OWN_ARGS][64], slots[1024], attempt[16], log[LOOM_RUN_PATH + 32];
    char **argv = calloc((size_t)train_argc + OWN_ARGS + 1, sizeof *argv);
    if (!argv) return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    int n = 0, k = 0;
#define WORD(...) (snprintf(words[k], sizeof words[k], __VA_ARGS__), argv[n++] = words[k++])
    WORD("mpirun");
    if (geteuid() == 0) WORD("--allow-run-as-root");
    WORD("--oversubscribe"); /* the workers share this host's cores */
    WORD("--mca");
    WORD("mpi_yield_when_idle");
    WORD("1");
    argv[n++] = "--ompi-server";
    char server[LOOM_RUN_PATH + 8];
    snprintf(server, sizeof server, "file:%s", uri);
    argv[n++] = server;
    WORD("-n");
    WORD("%d", ranks);
    argv[n++] = (char *)exe;
    WORD("train");
    for (int i = 0; i < train_argc; i++) argv[n++] = train_argv[i];
    WORD("--elastic-worker");
    WORD("%d", id);
    if (join) WORD("--elastic-join");
    if (join && resume) {
        WORD("--resume");
        WORD("auto");
    }
#undef WORD
    size_t at = 0;
    slots[0] = 0;
    for (int r = 0; r < ranks && at < sizeof slots; r++)
        at += (size_t)snprintf(slots + at, sizeof slots - at, "%s%d", r ? "," : "", id * ranks + r);
    snprintf(attempt, sizeof attempt, "%d", w->restarts);
    setenv("LOOM_FT_SLOTS", slots, 1);
    setenv("LOOM_FT_ATTEMPT", attempt, 1);
    snprintf(log, sizeof log, "%s/worker_%d.log", dir, id);
    loom_status st = loom_launch_start(&w->job, argv, log, err);
    unsetenv("LOOM_FT_SLOTS");
    unsetenv("LOOM_FT_ATTEMPT");
    free(argv);
    if (!st)
        fprintf(stderr, "loom run: elastic: worker %d started%s%s (%d rank(s), log %s)\n", id,
                join ? " again with --elastic-join" : "",
                join && resume ? " --resume auto (its newest checkpoint)" : "", ranks, log);
    return st;
}

/* The ompi-server the workers find each other through; its URI file in the run folder. */
static loom_status start_server(loom_launch *server, const char *dir, char *uri, size_t size,
                                loom_error *err) {
    snprintf(uri, size, "%s/ompi-server.uri", dir);
    remove(uri);
    char log[LOOM_RUN_PATH + 32];
    snprintf(log, sizeof log, "%s/ompi-server.log", dir);
    char *argv[] = {"ompi-server", "--no-daemonize", "-r", uri, NULL};
    loom_status st = loom_launch_start(server, argv, log, err);
    if (st) return st;
    const double until = loom_now_ms() + 10e3;
    while (loom_now_ms() < until && !loom_launch_poll(server)) {
        FILE *f = fopen(uri, "r");
        int c = f ? fgetc(f) : EOF;
        if (f) fclose(f);
        if (c != EOF) return LOOM_OK;
        tick();
    }
    loom_launch_stop(server, 1.0, NULL, 0);
    return loom_error_set(err, LOOM_ERR_IO,
                          "loom run: elastic: ompi-server wrote no URI to %s in 10 s (its log: "
                          "%s/ompi-server.log)",
                          uri, dir);
}

loom_status loom_elastic_workers_run(const loom_run_config *cfg, int W, const char *exe,
                                     char **train_argv, int train_argc, int checkpoints,
                                     int *exit_code, loom_error *err) {
    *exit_code = 1;
    if (W < 2 || W > MAX_WORKERS || cfg->ranks % W != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --elastic with --workers %d: -n %d must be a multiple of "
                              "the workers (each worker is one job of -n / W ranks; W <= %d)",
                              W, cfg->ranks, MAX_WORKERS);
    if (cfg->hosts[0] || strcmp(cfg->launcher, "mpirun") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --elastic with --workers: this host only, through mpirun, "
                              "in this version (start one mpirun per host yourself: "
                              "docs/diloco.md)");
    for (int i = 0; i < train_argc; i++)
        if (!strcmp(train_argv[i], "--elastic-worker") || !strcmp(train_argv[i], "--elastic-join"))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "loom run: --elastic with --workers: leave %s out (loom run "
                                  "gives each worker its own)",
                                  train_argv[i]);
    if (loom_mkdir_p(cfg->run_dir) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "loom run: --run-dir %s: %s", cfg->run_dir,
                              strerror(errno));
    const int R = cfg->ranks / W;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    loom_launch server;
    char uri[LOOM_RUN_PATH + 32];
    loom_status st = start_server(&server, cfg->run_dir, uri, sizeof uri, err);
    if (st) return st;
    fprintf(stderr, "loom run: elastic: %d workers of %d rank(s), names through %s\n", W, R, uri);
    worker w[MAX_WORKERS];
    memset(w, 0, sizeof w);
    int started = 0;
    for (; started < W && !st; started++)
        st = launch(&w[started], started, R, 0, 0, uri, exe, train_argv, train_argc, cfg->run_dir,
                    err);
    int restarts = 0;
    while (!st && !w[0].done && !interrupted) {
        tick();
        for (int i = 0; i < started; i++) {
            if (w[i].done || !loom_launch_poll(&w[i].job)) continue;
            const int code = w[i].job.status;
            fprintf(stderr, "loom run: elastic: worker %d ended (exit %d)\n", i, code);
            if (i == 0 || code == 0 || restarts >= cfg->max_restarts) {
                if (i != 0 && code != 0)
                    fprintf(stderr,
                            "loom run: elastic: no restarts left (--max-restarts %d): "
                            "worker %d stays out\n",
                            cfg->max_restarts, i);
                w[i].done = 1;
                continue;
            }
            restarts++, w[i].restarts++;
            st = launch(&w[i], i, R, 1, checkpoints, uri, exe, train_argv, train_argc, cfg->run_dir,
                        err);
        }
    }
    /* the coordinator ended: the members end at the same last sync; a joiner still waiting
     * for admission never will */
    const double until = loom_now_ms() + (st || interrupted ? 0.0 : 1e3 * cfg->grace_s);
    for (int i = 1; i < started; i++) {
        while (!w[i].done && !loom_launch_poll(&w[i].job) && loom_now_ms() < until) tick();
        if (!w[i].done && w[i].job.running) {
            fprintf(stderr, "loom run: elastic: worker %d still running%s: stopped\n", i,
                    interrupted ? " (interrupted)" : " after worker 0 ended");
            loom_launch_stop(&w[i].job, cfg->grace_s, NULL, 0);
        }
    }
    if (w[0].job.running) loom_launch_stop(&w[0].job, cfg->grace_s, NULL, 0);
    loom_launch_stop(&server, 1.0, NULL, 0);
    if (interrupted && !st)
        st = loom_error_set(err, LOOM_ERR_IO,
                            "loom run: elastic: interrupted; every worker stopped");
    if (!st) {
        *exit_code = w[0].job.status;
        fprintf(stderr, "loom run: elastic: worker 0 (the coordinator) exit %d; %d restart(s)\n",
                *exit_code, restarts);
    }
    return st;
}
