/* loom run --elastic with worker groups: one mpirun per worker (ft/elastic_workers.h). */
#include "ft/elastic_workers.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fs.h"
#include "ft/detect.h"
#include "ft/hosts.h"
#include "ft/launch.h"
#include "ft/monitor.h"
#include "ft/rank_addr.h"

#define MAX_WORKERS 64
#define OWN_ARGS 24  /* the launcher's words around the train options */
#define MAX_EXTRA 64 /* --launcher-args words, and the rsh agent's */
#define HOST_MAX 256
#define MAX_PIDS 256 /* a stopped worker's ranks on this host, SIGKILLed after --grace */

#define MAX_EXITS 64 /* the exit codes summary.json lists per worker */

typedef struct {
    loom_launch job;
    int restarts;                  /* this worker's launches after the first */
    int exits[MAX_EXITS], n_exits; /* each launch's exit code, in order */
    int done;                      /* ended (and not started again) */
    char host[HOST_MAX];           /* --hosts: the host its mpirun runs in ("": this one) */
    loom_monitor mon;              /* its ranks' heartbeats (LOOM_FT_ATTEMPT: its restarts) */
    int mon_open;
    double launch_ms;   /* the current launch (the start-up rule's clock) */
    int training;       /* every rank of the current launch past start-up and loading */
    json_t *detections; /* what the heartbeat watch found, one object per detection */
} worker;

/* What every launch shares. */
typedef struct {
    const loom_run_config *cfg;
    int ranks;       /* per worker */
    int checkpoints; /* the train options have --ckpt-dir */
    const char *uri; /* the ompi-server's URI file */
    const char *exe;
    char **train_argv;
    int train_argc;
    char cwd[LOOM_RUN_PATH];
    char extra[LOOM_RUN_PATH]; /* --launcher-args, split in place */
    char *extra_w[MAX_EXTRA];
    int n_extra;
    char agent[512]; /* the rsh agent, split in place */
    char *agent_w[MAX_EXTRA];
    int n_agent;
    char host[64]; /* this host's name (the ranks' beats name theirs) */
} plan;

static int split_words(char *text, char **words, int max) {
    int n = 0;
    for (char *save = NULL, *w = strtok_r(text, " \t\n", &save); w && n < max;
         w = strtok_r(NULL, " \t\n", &save))
        words[n++] = w;
    return n;
}

/* Appends word to out as one single-quoted shell word (' as '\''); 0 when it does not fit. */
static int quote_word(char *out, size_t size, size_t *at, const char *word) {
    size_t n = *at;
    if (n + 3 >= size) return 0;
    if (n) out[n++] = ' ';
    out[n++] = '\'';
    for (const char *c = word; *c; c++) {
        if (n + 6 >= size) return 0;
        if (*c == '\'') {
            memcpy(out + n, "'\\''", 4);
            n += 4;
        } else {
            out[n++] = *c;
        }
    }
    out[n++] = '\'';
    out[n] = 0;
    *at = n;
    return 1;
}

/* --hosts: the host of each worker, its ranks I x R .. (I + 1) x R - 1 placed by slot in
 * the list's order as mpirun would place one job's; a worker's ranks must share a host. */
static loom_status worker_hosts(const char *hosts, worker *w, int W, int R, loom_error *err) {
    char list[LOOM_RUN_PATH];
    snprintf(list, sizeof list, "%s", hosts);
    int rank = 0;
    for (char *save = NULL, *e = strtok_r(list, ",", &save); e && rank < W * R;
         e = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(e, ':');
        const int slots = colon ? atoi(colon + 1) : 1;
        if (colon) *colon = 0;
        for (int k = 0; k < slots && rank < W * R; k++, rank++) {
            worker *x = &w[rank / R];
            if (rank % R == 0)
                snprintf(x->host, sizeof x->host, "%s", e);
            else if (strcmp(x->host, e) != 0)
                return loom_error_set(err, LOOM_ERR_INPUT,
                                      "loom run: --elastic --hosts: worker %d's %d ranks span "
                                      "hosts %s and %s (expected each worker's ranks on one "
                                      "host: its mpirun runs there)",
                                      rank / R, R, x->host, e);
        }
    }
    if (rank < W * R)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --elastic --hosts %s: %d slot(s) for %d workers of %d "
                              "rank(s) (expected at least %d)",
                              hosts, rank, W, R, W * R);
    return LOOM_OK;
}

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

/* Worker w's mpirun (argv[0..n)) in its host w->host through the rsh agent: `AGENT HOST
 * 'cd CWD && exec env LOOM_FT_...=... mpirun ...'` (each word quoted), so that all its
 * ranks are local to the mpirun, which runs in that host. */
static loom_status launch_remote(worker *w, char **argv, int n, const char *slots,
                                 const char *attempt, const plan *p, const char *log,
                                 loom_error *err) {
    const size_t size = 65536;
    char *cmd = malloc(size), env[1200];
    char **rsh = calloc((size_t)p->n_agent + 3, sizeof *rsh);
    if (!cmd || !rsh) {
        free(cmd), free(rsh);
        return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    }
    size_t at = 0;
    int ok = quote_word(cmd, size, &at, "cd");
    ok = ok && quote_word(cmd, size, &at, p->cwd);
    if (ok && at + 16 < size) at += (size_t)snprintf(cmd + at, size - at, " && exec");
    ok = ok && quote_word(cmd, size, &at, "env");
    snprintf(env, sizeof env, "LOOM_FT_SLOTS=%s", slots);
    ok = ok && quote_word(cmd, size, &at, env);
    snprintf(env, sizeof env, "LOOM_FT_ATTEMPT=%s", attempt);
    ok = ok && quote_word(cmd, size, &at, env);
    char token[33];
    loom_beat_token_hex(w->mon.token, token);
    snprintf(env, sizeof env, "LOOM_FT_ADDR=%s", w->mon.addr);
    ok = ok && quote_word(cmd, size, &at, env);
    snprintf(env, sizeof env, "LOOM_FT_TOKEN=%s", token);
    ok = ok && quote_word(cmd, size, &at, env);
    const char *inject = getenv("LOOM_INJECT");
    snprintf(env, sizeof env, "LOOM_INJECT=%s", inject ? inject : "");
    ok = ok && (!inject || quote_word(cmd, size, &at, env));
    for (int i = 0; i < n && ok; i++) ok = quote_word(cmd, size, &at, argv[i]);
    loom_status st = LOOM_OK;
    if (!ok) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "loom run: --elastic --hosts: worker command longer than %zu bytes",
                            size);
    } else {
        int m = 0;
        for (int i = 0; i < p->n_agent; i++) rsh[m++] = p->agent_w[i];
        rsh[m++] = w->host;
        rsh[m++] = cmd;
        rsh[m] = NULL;
        st = loom_launch_start(&w->job, rsh, log, err);
    }
    free(cmd), free(rsh);
    return st;
}

/* One worker's mpirun: its slots (LOOM_FT_SLOTS: --inject RANK counts over all workers'
 * ranks), attempt (LOOM_FT_ATTEMPT: its restarts) and heartbeat socket (LOOM_FT_ADDR,
 * LOOM_FT_TOKEN: its own monitor's) in the environment it inherits.
 * again: a restart, which resumes from the worker's newest valid checkpoint when the job
 * writes them (--resume auto: DIR/worker_I's, after the train options, so it overrides
 * theirs); a worker other than 0 joins the running group (--elastic-join), worker 0 founds
 * it again from that checkpoint (it is the one coordinator; docs/diloco.md). */
static loom_status launch(worker *w, int id, int again, const plan *p, loom_error *err) {
    const int join = again && id != 0, resume = again && p->checkpoints, ranks = p->ranks;
    char words[OWN_ARGS][64], slots[1024], attempt[16], log[LOOM_RUN_PATH + 32];
    char **argv = calloc((size_t)p->train_argc + OWN_ARGS + MAX_EXTRA + 1, sizeof *argv);
    if (!argv) return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    int n = 0, k = 0;
#define WORD(...) (snprintf(words[k], sizeof words[k], __VA_ARGS__), argv[n++] = words[k++])
    WORD("mpirun");
    if (geteuid() == 0) WORD("--allow-run-as-root");
    WORD("--oversubscribe"); /* the workers share this host's cores */
    if (!w->host[0] || !strstr(p->cfg->launcher_args, "mpi_yield_when_idle")) {
        WORD("--mca"); /* (an MCA parameter may be given once only) */
        WORD("mpi_yield_when_idle");
        WORD("1");
    }
    for (int i = 0; w->host[0] && i < p->n_extra; i++) argv[n++] = p->extra_w[i];
    argv[n++] = "--ompi-server";
    char server[LOOM_RUN_PATH + 8];
    snprintf(server, sizeof server, "file:%s", p->uri);
    argv[n++] = server;
    WORD("-n");
    WORD("%d", ranks);
    argv[n++] = (char *)p->exe;
    WORD("train");
    for (int i = 0; i < p->train_argc; i++) argv[n++] = p->train_argv[i];
    WORD("--elastic-worker");
    WORD("%d", id);
    if (join) WORD("--elastic-join");
    if (resume) {
        WORD("--resume");
        WORD("auto");
    }
#undef WORD
    size_t at = 0;
    slots[0] = 0;
    for (int r = 0; r < ranks && at < sizeof slots; r++)
        at += (size_t)snprintf(slots + at, sizeof slots - at, "%s%d", r ? "," : "", id * ranks + r);
    snprintf(attempt, sizeof attempt, "%d", w->restarts);
    snprintf(log, sizeof log, "%s/worker_%d.log", p->cfg->run_dir, id);
    /* the monitor takes this launch's beats only (their attempt is its restarts) */
    loom_status st = loom_monitor_reset(&w->mon, ranks, w->restarts, err);
    w->launch_ms = loom_now_ms();
    w->training = 0;
    if (!st && w->host[0]) {
        st = launch_remote(w, argv, n, slots, attempt, p, log, err);
    } else if (!st) {
        char token[33];
        loom_beat_token_hex(w->mon.token, token);
        setenv("LOOM_FT_SLOTS", slots, 1);
        setenv("LOOM_FT_ATTEMPT", attempt, 1);
        setenv("LOOM_FT_ADDR", w->mon.addr, 1);
        setenv("LOOM_FT_TOKEN", token, 1);
        st = loom_launch_start(&w->job, argv, log, err);
        unsetenv("LOOM_FT_SLOTS");
        unsetenv("LOOM_FT_ATTEMPT");
        unsetenv("LOOM_FT_ADDR");
        unsetenv("LOOM_FT_TOKEN");
    }
    free(argv);
    const char *how = join ? " again with --elastic-join" : again ? " again (the coordinator)" : "";
    const char *from = resume             ? " --resume auto (its newest checkpoint)"
                       : again && id == 0 ? " without checkpoints (no --ckpt-dir: the run "
                                            "starts over from step 0)"
                                          : "";
    if (!st)
        fprintf(stderr,
                "loom run: elastic: worker %d started%s%s%s%s (%d rank(s), log %s; at %.3f)\n", id,
                how, from, w->host[0] ? " on " : "", w->host, ranks, log, loom_wall_s());
    return st;
}

/* Every rank of worker w's launch past start-up and loading (the stall rule's start). */
static int all_training(const loom_monitor *m) {
    int n = 0;
    for (int r = 0; r < m->world; r++)
        n += m->ranks[r].seen && m->ranks[r].beat.phase != LOOM_PHASE_INIT &&
             m->ranks[r].beat.phase != LOOM_PHASE_CKPT;
    return n == m->world;
}

/* The one-job supervisor's heartbeat rules (ft/detect.h) on one worker's ranks: a
 * collective waited in for --heartbeat-timeout (from hangs_from on), a rank silent for
 * --heartbeat-timeout or never heard of within --startup-timeout, no step for
 * --step-timeout once every rank trains: 1 and f filled. */
static int watch_worker(worker *w, const loom_run_config *cfg, double now, double hangs_from,
                        loom_failure *f) {
    const double hb_ms = cfg->heartbeat_timeout_s * 1e3;
    if (!w->training) w->training = all_training(&w->mon);
    if (now >= hangs_from && loom_detect_hang(&w->mon, hb_ms, f)) return 1;
    if (loom_detect_silence(&w->mon, now, w->launch_ms, hb_ms, cfg->startup_timeout_s * 1e3, f))
        return 1;
    return cfg->step_timeout_s > 0 && w->training &&
           loom_detect_stall(&w->mon, now, cfg->step_timeout_s * 1e3, f);
}

/* A detection on worker id: one line naming the worker, the rank (and its slot: --inject
 * counts those) and what was seen, the detection into its summary.json entry, and its job
 * stopped (SIGTERM, then SIGKILL to its process group and its ranks here after --grace). */
static void stop_detected(worker *w, int id, const plan *p, loom_failure *f, double now) {
    if (f->rank < 0 && w->mon.world == 1) f->rank = 0; /* a stall of a one-rank worker */
    const int slot = f->rank >= 0 ? id * p->ranks + f->rank : -1;
    char who[96] = "";
    if (f->rank >= 0)
        snprintf(who, sizeof who, " rank %d (slot %d%s%s)", f->rank, slot, f->host[0] ? ", " : "",
                 f->host);
    fprintf(stderr,
            "loom run: elastic: worker %d:%s %s detected: %s; its job is stopped (at %.3f)\n", id,
            who, loom_fail_kind_name(f->kind), f->detail, loom_wall_s());
    json_t *d =
        json_pack("{s:i, s:s, s:i, s:i, s:I, s:f, s:s}", "launch", w->restarts + 1, "kind",
                  loom_fail_kind_name(f->kind), "rank", f->rank, "slot", slot, "step",
                  (json_int_t)f->step, "after_s", (now - w->launch_ms) * 1e-3, "detail", f->detail);
    if (d) json_array_append_new(w->detections, d);
    pid_t pids[MAX_PIDS];
    int np = 0;
    for (int r = 0; r < w->mon.world && np < MAX_PIDS; r++)
        if (w->mon.ranks[r].seen && !strcmp(w->mon.ranks[r].beat.host, p->host))
            pids[np++] = w->mon.ranks[r].beat.pid;
    const double t0 = loom_now_ms();
    loom_launch_stop(&w->job, p->cfg->grace_s, pids, np);
    fprintf(stderr, "loom run: elastic: worker %d's job stopped in %.1f s\n", id,
            (loom_now_ms() - t0) * 1e-3);
}

/* A worker's last outer sync, from the last "outer sync, members=" line of its log
 * (parallel/outer_elastic_exchange.c's loom_elastic_say): into o as step, members and checksum. */
static void last_sync(const char *run_dir, int id, json_t *o) {
    char path[LOOM_RUN_PATH + 32], line[1024], last[1024] = "";
    snprintf(path, sizeof path, "%s/worker_%d.log", run_dir, id);
    FILE *fp = fopen(path, "r");
    while (fp && fgets(line, sizeof line, fp))
        if (strstr(line, ": outer sync, members=")) snprintf(last, sizeof last, "%s", line);
    if (fp) fclose(fp);
    const char *at = strstr(last, " step "), *m = strstr(last, "members="),
               *c = strstr(last, "checksum ");
    int step = 0, members = 0;
    char sum[32] = "";
    if (!at || !m || !c || sscanf(at, " step %d", &step) != 1 ||
        sscanf(m, "members=%d", &members) != 1 || sscanf(c, "checksum %31s", sum) != 1) {
        json_object_set_new(o, "last_sync", json_null());
        return;
    }
    json_object_set_new(
        o, "last_sync",
        json_pack("{s:i, s:i, s:s}", "step", step, "members", members, "checksum", sum));
}

/* summary.json of an elastic run: the outcome, and per worker its launches, their exit
 * codes, what the heartbeat watch detected and its last outer sync (equal checksums: the
 * members ended with the same parameters). */
static void write_summary(const loom_run_config *cfg, const worker *w, int started,
                          const char *outcome, int exit_code, int restarts, double t0) {
    json_t *workers = json_array();
    for (int i = 0; i < started; i++) {
        json_t *exits = json_array();
        for (int k = 0; k < w[i].n_exits; k++)
            json_array_append_new(exits, json_integer(w[i].exits[k]));
        json_t *o = json_pack(
            "{s:i, s:i, s:o, s:s, s:O}", "worker", i, "launches", w[i].restarts + 1, "exits", exits,
            "host", w[i].host[0] ? w[i].host : "localhost", "detections", w[i].detections);
        last_sync(cfg->run_dir, i, o);
        json_array_append_new(workers, o);
    }
    json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:f, s:o}", "mode", "elastic_workers", "outcome",
                          outcome, "exit_code", exit_code, "restarts", restarts, "wall_s",
                          (loom_now_ms() - t0) * 1e-3, "workers", workers);
    char path[LOOM_RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/summary.json", cfg->run_dir);
    if (json_dump_file(j, path, JSON_INDENT(2)) != 0)
        fprintf(stderr, "loom run: elastic: cannot write %s\n", path);
    json_decref(j);
}

/* The ompi-server the workers find each other through; its URI file in the run folder.
 * With --hosts it takes the --launcher-args' `--mca oob_*` settings (the interfaces the
 * hosts reach it on). */
static loom_status start_server(loom_launch *server, const plan *p, char *uri, size_t size,
                                loom_error *err) {
    const char *dir = p->cfg->run_dir;
    snprintf(uri, size, "%s/ompi-server.uri", dir);
    remove(uri);
    char log[LOOM_RUN_PATH + 32];
    snprintf(log, sizeof log, "%s/ompi-server.log", dir);
    char *argv[8 + MAX_EXTRA] = {"ompi-server", "--no-daemonize", "-r", uri};
    int n = 4;
    for (int i = 0; p->cfg->hosts[0] && i + 2 < p->n_extra; i++)
        if ((!strcmp(p->extra_w[i], "--mca") || !strcmp(p->extra_w[i], "-mca")) &&
            !strncmp(p->extra_w[i + 1], "oob_", 4)) {
            argv[n++] = p->extra_w[i];
            argv[n++] = p->extra_w[i + 1];
            argv[n++] = p->extra_w[i + 2];
            i += 2;
        }
    argv[n] = NULL;
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

/* Open one heartbeat monitor per worker (its own socket and token) on --bind, at the address
 * the ranks reach it by (ft/rank_addr.h). */
static loom_status open_monitors(worker *w, int W, plan *p, loom_error *err) {
    char addr[256];
    if (gethostname(p->host, sizeof p->host) != 0) snprintf(p->host, sizeof p->host, "?");
    p->host[sizeof p->host - 1] = 0;
    loom_status st = loom_rank_addr(p->cfg->bind, p->cfg->hosts, addr, sizeof addr, err);
    for (int i = 0; i < W && !st; i++) {
        if (!(w[i].detections = json_array()))
            return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
        st = loom_monitor_open(&w[i].mon, p->cfg->bind, addr, 0, err);
        w[i].mon_open = !st;
    }
    return st;
}

static void close_monitors(worker *w, int W) {
    for (int i = 0; i < W; i++) {
        if (w[i].mon_open) loom_monitor_close(&w[i].mon);
        json_decref(w[i].detections);
        w[i].mon_open = 0, w[i].detections = NULL;
    }
}

/* The run: every 50 ms each worker's beats are read and its heartbeat rules applied; a
 * worker whose job ended with an error, or whose ranks were found silent or hung (its job
 * then stopped), is started again while restarts are left, until worker 0 is done. */
static loom_status watch(worker *w, int started, const plan *p, int *restarts, loom_error *err) {
    const loom_run_config *cfg = p->cfg;
    double last_round = loom_now_ms(), hangs_from = 0;
    loom_status st = LOOM_OK;
    while (!st && !w[0].done && !interrupted) {
        tick();
        const double now = loom_now_ms(), gap = now - last_round;
        last_round = now;
        if (gap >= LOOM_STALL_MS) { /* ft/watch.c's rule: the gap's silence is nobody's, and
                                     * hangs are judged again one heartbeat timeout later */
            for (int i = 0; i < started; i++) {
                loom_monitor_excuse_gap(&w[i].mon, gap);
                w[i].launch_ms += gap;
            }
            hangs_from = now + cfg->heartbeat_timeout_s * 1e3;
            fprintf(stderr,
                    "loom run: elastic: this process was not scheduled for %.1f s (the machine "
                    "paused or starved it): the ranks' silence in that time is not counted, and "
                    "hangs are judged again after %.0f s\n",
                    gap * 1e-3, cfg->heartbeat_timeout_s);
        }
        for (int i = 0; i < started && !st; i++) {
            if (w[i].done) continue;
            loom_monitor_drain(&w[i].mon, now);
            loom_failure f;
            const int ended = loom_launch_poll(&w[i].job);
            if (ended) {
                fprintf(stderr, "loom run: elastic: worker %d ended (exit %d)\n", i,
                        w[i].job.status);
            } else if (watch_worker(&w[i], cfg, now, hangs_from, &f)) {
                stop_detected(&w[i], i, p, &f, now);
            } else {
                continue;
            }
            const int code = w[i].job.status;
            if (w[i].n_exits < MAX_EXITS) w[i].exits[w[i].n_exits++] = code;
            /* worker 0 too: started again, it founds the group from its newest checkpoint,
             * and the members, which hear nothing from it, leave and rejoin it */
            if ((ended && code == 0) || *restarts >= cfg->max_restarts) {
                if (!ended || code != 0)
                    fprintf(stderr,
                            "loom run: elastic: no restarts left (--max-restarts %d): "
                            "worker %d stays out%s\n",
                            cfg->max_restarts, i, i == 0 ? " (the run ends)" : "");
                w[i].done = 1;
            } else {
                ++*restarts, w[i].restarts++;
                st = launch(&w[i], i, 1, p, err);
            }
            last_round = loom_now_ms(); /* a stop's grace is not a stall of this process */
        }
    }
    return st;
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
    if (strcmp(cfg->launcher, "mpirun") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --elastic with --workers: through mpirun only, in this "
                              "version (--launcher srun: start one job per worker yourself: "
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
    const double t0 = loom_now_ms();
    worker w[MAX_WORKERS];
    memset(w, 0, sizeof w);
    plan *p = calloc(1, sizeof *p);
    if (!p) return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    p->cfg = cfg, p->ranks = R, p->checkpoints = checkpoints, p->exe = exe;
    p->train_argv = train_argv, p->train_argc = train_argc;
    snprintf(p->extra, sizeof p->extra, "%s", cfg->launcher_args);
    p->n_extra = split_words(p->extra, p->extra_w, MAX_EXTRA);
    loom_hosts_agent(cfg->launcher_args, p->agent, sizeof p->agent);
    p->n_agent = split_words(p->agent, p->agent_w, MAX_EXTRA);
    if (!getcwd(p->cwd, sizeof p->cwd)) snprintf(p->cwd, sizeof p->cwd, ".");
    loom_status st = LOOM_OK;
    if (cfg->hosts[0]) { /* each host answers the agent; each worker's ranks on one host */
        char source[LOOM_RUN_PATH + 16], agent[512];
        snprintf(source, sizeof source, "%s%s", cfg->hostfile[0] ? "--hostfile " : "--hosts",
                 cfg->hostfile);
        loom_hosts_agent(cfg->launcher_args, agent, sizeof agent);
        const int over = strstr(cfg->launcher_args, "-oversubscribe") != NULL;
        if (!(st = loom_hosts_check(cfg->hosts, source, cfg->ranks, over, agent, LOOM_HOSTS_PROBE_S,
                                    err)))
            st = worker_hosts(cfg->hosts, w, W, R, err);
    }
    if (!st) st = open_monitors(w, W, p, err);
    if (st) {
        close_monitors(w, W);
        free(p);
        return st;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    loom_launch server;
    char uri[LOOM_RUN_PATH + 32];
    p->uri = uri;
    if ((st = start_server(&server, p, uri, sizeof uri, err))) {
        close_monitors(w, W);
        free(p);
        return st;
    }
    fprintf(stderr, "loom run: elastic: %d workers of %d rank(s), names through %s\n", W, R, uri);
    int started = 0;
    for (; started < W && !st; started++) st = launch(&w[started], started, 0, p, err);
    int restarts = 0;
    if (!st) st = watch(w, started, p, &restarts, err);
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
        if (!w[i].done && w[i].n_exits < MAX_EXITS) w[i].exits[w[i].n_exits++] = w[i].job.status;
    }
    if (w[0].job.running) {
        loom_launch_stop(&w[0].job, cfg->grace_s, NULL, 0);
        if (w[0].n_exits < MAX_EXITS) w[0].exits[w[0].n_exits++] = w[0].job.status;
    }
    loom_launch_stop(&server, 1.0, NULL, 0);
    free(p);
    if (interrupted && !st)
        st = loom_error_set(err, LOOM_ERR_IO,
                            "loom run: elastic: interrupted; every worker stopped");
    if (!st) {
        *exit_code = w[0].job.status;
        fprintf(stderr, "loom run: elastic: worker 0 (the coordinator) exit %d; %d restart(s)\n",
                *exit_code, restarts);
    }
    write_summary(cfg, w, started,
                  interrupted       ? "interrupted"
                  : st              ? "failed"
                  : *exit_code == 0 ? "finished"
                                    : "gave_up",
                  st ? 1 : *exit_code, restarts, t0);
    close_monitors(w, W);
    return st;
}
