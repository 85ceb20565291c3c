#include "ft/supervisor.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fs.h"
#include "ft/batch_info.h"
#include "ft/detect.h"
#include "ft/hosts.h"
#include "ft/launch.h"
#include "ft/launch_argv.h"
#include "ft/monitor.h"
#include "ft/rank_addr.h"
#include "ft/slurm.h"
#include "ft/supervisor_state.h"
#include "ckpt/ckpt_dir.h"
#include "train/batch_skip.h"

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
    interrupted = sig;
}

void loom_sup_event(loom_sup *s, const char *what, const char *fmt, ...) {
    if (!s->events) return;
    fprintf(s->events, "{\"t\": %.6f, \"attempt\": %d, \"event\": \"%s\"", loom_wall_s(),
            s->attempt, what);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs(", ", s->events);
        vfprintf(s->events, fmt, ap);
        va_end(ap);
    }
    fputs("}\n", s->events);
    fflush(s->events);
}

static void rank_log(const loom_sup *s, const char *attempt_dir, int rank, char *out, size_t size) {
    loom_launch_rank_log(s->cfg->launcher, attempt_dir, rank, out, size);
}

static void skip_list_text(const loom_batch_skip *k, char *out, size_t size) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < k->n && n + 24 < size; i++)
        n += (size_t)snprintf(out + n, size - n, "%s%lld", i ? "," : "", (long long)k->batches[i]);
}

/* Checkpoints the ranks of an attempt passed over, for summary.json: refused ("loom: rank R:
 * checkpoint DIR not usable: why") or left unfinished by a crash ("loom: rank R: checkpoint
 * DIR unfinished, ignored (...)"), both from the resume code (train/checkpointing.c). */
static void scan_rejected(loom_sup *s, const char *attempt_dir) {
    for (int r = 0; r < s->world; r++) {
        char path[LOOM_RUN_PATH + 64], line[2048];
        rank_log(s, attempt_dir, r, path, sizeof path);
        FILE *fp = fopen(path, "r");
        while (fp && fgets(line, sizeof line, fp)) {
            int rank;
            if ((!strstr(line, " not usable: ") && !strstr(line, " unfinished, ignored (")) ||
                sscanf(line, "loom: rank %d:", &rank) != 1)
                continue;
            line[strcspn(line, "\n")] = 0;
            json_t *o = json_object();
            json_object_set_new(o, "attempt", json_integer(s->attempt));
            json_object_set_new(o, "rank", json_integer(rank));
            json_object_set_new(o, "line", json_string(line));
            json_array_append_new(s->rejected, o);
            fprintf(stderr, "loom run: %s\n", line);
        }
        if (fp) fclose(fp);
    }
}

/* The launcher's command line for this attempt (ft/launch_argv.h). */
static void build_argv(loom_sup *s, const char *loom_exe, char **train_argv, int train_argc,
                       const char *attempt_dir, loom_launch_cmd *cmd) {
    char skips[LOOM_RUN_PATH];
    skip_list_text(&s->skip, skips, sizeof skips);
    const loom_launch_spec spec = {
        .launcher = s->cfg->launcher,
        .hosts = s->hosts,
        .world = s->world,
        .dp = s->dp,
        .attempt_dir = attempt_dir,
        .loom_exe = loom_exe,
        .command = s->job->command,
        .train_argv = train_argv,
        .train_argc = train_argc,
        .skip_list = skips,
        .resume = s->attempt > 0 && (s->job->ckpt_dirs[0][0] || s->job->ckpt_dirs[1][0]),
        .as_root = geteuid() == 0,
        .cores = sysconf(_SC_NPROCESSORS_ONLN),
        .launcher_args = s->cfg->launcher_args,
    };
    loom_launch_cmd_build(cmd, &spec);
}

/* Rolling back past a bad step: checkpoints of that step or later hold its update, so
 * they are set aside (renamed, kept for inspection) and --resume auto finds an older one. */
static int set_aside_in(const char *dir, int64_t from_step, int attempt) {
    int moved = 0;
    loom_ckpt_entry *list = NULL;
    int n = loom_ckpt_list(dir, &list, 0);
    for (int i = 0; i < n; i++) {
        if (list[i].step < from_step) continue;
        char to[sizeof list[i].path + 64];
        snprintf(to, sizeof to, "%s/rolled_back_a%d_step_%08lld", dir, attempt,
                 (long long)list[i].step);
        if (rename(list[i].path, to) == 0) moved++;
    }
    free(list);
    return moved;
}

/* (--outer diloco --workers W: each worker's checkpoints are in DIR/worker_I.) */
static int set_aside_checkpoints(const loom_run_job *j, int64_t from_step, int attempt) {
    int moved = 0;
    for (int t = 0; t < 2; t++) {
        if (!j->ckpt_dirs[t][0]) continue;
        for (int w = 0; w < (j->workers ? j->workers : 1); w++) {
            char dir[LOOM_RUN_PATH + 32];
            if (j->workers)
                snprintf(dir, sizeof dir, "%s/worker_%d", j->ckpt_dirs[t], w);
            else
                snprintf(dir, sizeof dir, "%s", j->ckpt_dirs[t]);
            moved += set_aside_in(dir, from_step, attempt);
        }
    }
    return moved;
}

/* The largest data-parallel size <= ranks that splits the global batch evenly. */
static int fit_dp(const loom_run_job *j, int ranks) {
    for (int d = ranks; d >= 1; d--)
        if (j->global_batch % (d * j->micro_batch) == 0) return d;
    return 0;
}

/* summary.json's entry of one failure; adds its replayed steps and recovery time. */
static json_t *failure_json(const loom_failure_log *l, int64_t *wasted, double *recovery) {
    json_t *o = json_pack("{s:i, s:s, s:o, s:I, s:I, s:f}", "attempt", l->f.attempt, "kind",
                          loom_fail_kind_name(l->f.kind), "rank",
                          l->f.rank >= 0 ? json_integer(l->f.rank) : json_null(), "step",
                          (json_int_t)l->f.step, "max_step_before", (json_int_t)l->max_step,
                          "teardown_s", l->teardown_ms * 1e-3);
    if (!l->recovered) return o;
    const int64_t replayed = l->max_step > l->resumed_at ? l->max_step - l->resumed_at : 0;
    json_object_set_new(o, "resumed_at_step", json_integer(l->resumed_at));
    json_object_set_new(o, "replayed_steps", json_integer(replayed));
    json_object_set_new(o, "recovery_s", json_real(l->restart_ms * 1e-3));
    *wasted += replayed;
    *recovery += l->restart_ms * 1e-3;
    return o;
}

/* The last attempt's ranks: where each ran, the beats heard. */
static json_t *ranks_json(const loom_monitor *m) {
    json_t *ranks = json_array();
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *rs = &m->ranks[r];
        json_array_append_new(ranks, json_pack("{s:i, s:o*, s:I}", "rank", r, "host",
                                               rs->seen ? json_string(rs->beat.host) : json_null(),
                                               "heartbeats", (json_int_t)rs->accepted));
    }
    return ranks;
}

static void write_summary(loom_sup *s, const char *outcome, const char *why) {
    json_t *fails = json_array();
    int64_t wasted = 0;
    double recovery = 0;
    for (int i = 0; i < s->n_log; i++)
        json_array_append_new(fails, failure_json(&s->log[i], &wasted, &recovery));
    json_t *j = json_object();
    json_object_set_new(j, "outcome", json_string(outcome));
    json_object_set_new(j, "why", json_string(why));
    json_object_set_new(j, "attempts", json_integer(s->attempt + 1));
    json_object_set_new(j, "final_ranks", json_integer(s->world));
    json_object_set_new(j, "failures", fails);
    json_object_set_new(j, "wasted_steps", json_integer(wasted));
    json_object_set_new(j, "rejected_checkpoints", json_incref(s->rejected));
    json_object_set_new(j, "recovery_s_total", json_real(recovery));
    json_object_set_new(j, "wall_s", json_real((loom_now_ms() - s->start_ms) * 1e-3));
    json_object_set_new(j, "heartbeats_accepted", json_integer(s->mon.accepted));
    json_object_set_new(j, "datagrams_rejected", json_integer(s->mon.rejected));
    json_object_set_new(j, "ranks", ranks_json(&s->mon));
    char path[LOOM_RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/summary.json", s->cfg->run_dir);
    json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    fprintf(stderr,
            "loom run: %s after %d attempt(s): %d failure(s), %lld step(s) replayed, %.1f s "
            "spent recovering (%s)\n",
            outcome, s->attempt + 1, s->n_log, (long long)wasted, recovery, path);
}

/* Before a restart across hosts: waits (up to --host-wait in all) until every other host
 * the next attempt runs on answers on the network, so that a launch does not start while
 * a link is still down (its start-up window then starts at the launch, after the wait).
 * The hosts: loom_hosts_restart_addrs, `skip` / `skip_addr` (a host already waited for)
 * left out. A host that still does not answer is launched on anyway (the start-up rule
 * then judges it), said in one line. */
static void wait_for_hosts(loom_sup *s, const char *skip, const char *skip_addr) {
    char addrs[16][64];
    const int n = loom_hosts_restart_addrs(&s->mon, s->host, s->hosts, skip, skip_addr, addrs, 16);
    const double t0 = loom_now_ms(), until = t0 + s->cfg->host_wait_s * 1e3;
    for (int i = 0; i < n; i++) {
        int said = 0;
        const int back = loom_host_await(addrs[i], until, &interrupted, &said);
        const double waited = (loom_now_ms() - t0) * 1e-3;
        if (said || !back)
            loom_sup_event(s, back ? "host_back" : "host_gone",
                           "\"host\": \"%s\", \"waited_s\": %.3f", addrs[i], waited);
        if (!back)
            fprintf(stderr,
                    "loom run: host %s did not answer within %.0f s: restarting on it anyway\n",
                    addrs[i], s->cfg->host_wait_s);
        else if (said)
            fprintf(stderr, "loom run: host %s answers again after %.1f s\n", addrs[i], waited);
    }
}

/* 1 once some rank of the attempt has beaten. */
static int any_rank_seen(const loom_sup *s) {
    for (int r = 0; r < s->mon.world; r++)
        if (s->mon.ranks[r].seen) return 1;
    return 0;
}

/* The pids of the attempt's ranks on this host (as their beats gave them); how many. */
static int local_pids(const loom_sup *s, pid_t *pids) {
    int np = 0;
    for (int r = 0; r < s->world; r++)
        if (s->mon.ranks[r].seen && strcmp(s->mon.ranks[r].beat.host, s->host) == 0)
            pids[np++] = s->mon.ranks[r].beat.pid;
    return np;
}

/* The supervisor's states. An attempt is launched and watched; after a failure it is
 * stopped, diagnosed, its lost host waited for, its recovery planned, then relaunched or
 * given up on. */
typedef enum {
    SUP_LAUNCH,      /* the attempt's launcher started */
    SUP_WATCH,       /* watched until it ends or fails */
    SUP_FINISHED,    /* every step done: exit 0 */
    SUP_INTERRUPTED, /* a signal to the supervisor: the job stopped, exit 128 + signal */
    SUP_STOP,        /* a failure: every rank stopped, checkpoints refused noted */
    SUP_NOT_STARTED, /* the program is not there on a node: exit 2 */
    SUP_DIAGNOSE,    /* who failed, the bad batch skipped, its checkpoints set aside */
    SUP_AWAIT_HOST,  /* a lost or cut-off host waited for, its ranks ended */
    SUP_PLAN,        /* the recovery chosen (shrink or not), diagnosis.json */
    SUP_GIVE_UP,     /* --max-restarts exhausted: exit 1 */
    SUP_RELAUNCH,    /* the hosts waited for, the ranks shrunk, the next attempt */
    SUP_END
} sup_state;

/* What the states of one attempt share (cleared at each launch). */
typedef struct {
    char dir[LOOM_RUN_PATH + 32]; /* run_dir/attempt_N */
    loom_launch l;
    loom_failure f;
    loom_not_started ns;
    int64_t max_step; /* the furthest step reached before the failure */
    double teardown;  /* ms from detection to every rank stopped */
    char skipped[64], host_note[256], recovery[512];
    int host_waited, drop, slot, shrink, give_up;
} attempt_ctx;

/* The attempt's environment for the ranks: its number and each rank's slot. */
static void export_attempt(const loom_sup *s) {
    char attempt[16];
    snprintf(attempt, sizeof attempt, "%d", s->attempt);
    setenv("LOOM_FT_ATTEMPT", attempt, 1);
    char slots[LOOM_RUN_PATH] = "";
    for (int r = 0, n = 0; r < s->world && n < (int)sizeof slots - 12; r++)
        n += snprintf(slots + n, sizeof slots - n, "%s%d", r ? "," : "", s->slots[r]);
    setenv("LOOM_FT_SLOTS", slots, 1);
}

static sup_state st_launch(loom_sup *s, attempt_ctx *a) {
    memset(a, 0, sizeof *a);
    snprintf(a->dir, sizeof a->dir, "%s/attempt_%d", s->cfg->run_dir, s->attempt);
    loom_mkdir_p(a->dir);
    export_attempt(s);
    static loom_launch_cmd cmdline;
    build_argv(s, s->loom_exe, s->train_argv, s->train_argc, a->dir, &cmdline);
    char path[LOOM_RUN_PATH + 64];
    snprintf(path, sizeof path, "%s/command.txt", a->dir);
    FILE *cmd = fopen(path, "w");
    for (int i = 0; cmd && i < cmdline.argc; i++)
        fprintf(cmd, "%s%s", cmdline.argv[i], i + 1 < cmdline.argc ? " " : "\n");
    if (cmd) fclose(cmd);
    if ((s->st = loom_monitor_reset(&s->mon, s->world, s->attempt, s->err))) return SUP_END;
    loom_sup_launcher_log(a->dir, path, sizeof path);
    if ((s->st = loom_launch_start(&a->l, cmdline.argv, path, s->err))) return SUP_END;
    loom_sup_event(s, "launch", "\"ranks\": %d, \"dp\": %d", s->world, s->dp);
    return SUP_WATCH;
}

static sup_state st_watch(loom_sup *s, attempt_ctx *a) {
    const loom_attempt_outcome outcome = loom_sup_watch(s, &a->l, a->dir, &a->f);
    if (outcome != LOOM_ATTEMPT_FAILED) scan_rejected(s, a->dir);
    return outcome == LOOM_ATTEMPT_FINISHED      ? SUP_FINISHED
           : outcome == LOOM_ATTEMPT_INTERRUPTED ? SUP_INTERRUPTED
                                                 : SUP_STOP;
}

static sup_state st_finished(loom_sup *s, attempt_ctx *a) {
    (void)a;
    loom_sup_event(s, "done", NULL);
    write_summary(s, "finished", "every step done");
    *s->exit_code = 0;
    return SUP_END;
}

static sup_state st_interrupted(loom_sup *s, attempt_ctx *a) {
    pid_t pids[s->world > 0 ? s->world : 1];
    const int np = local_pids(s, pids);
    fprintf(stderr, "loom run: interrupted: stopping the job (SIGTERM, then SIGKILL)\n");
    loom_launch_stop(&a->l, s->cfg->grace_s, pids, np);
    write_summary(s, "interrupted", "signal to the supervisor");
    *s->exit_code = 128 + (int)interrupted;
    return SUP_END;
}

static sup_state st_stop(loom_sup *s, attempt_ctx *a) {
    pid_t pids[s->world > 0 ? s->world : 1];
    const int np = local_pids(s, pids);
    loom_failure *f = &a->f;
    f->attempt = s->attempt;
    f->detected_ms = loom_now_ms();
    a->max_step = loom_monitor_step(&s->mon);
    loom_sup_event(s, "failure_detected", "\"kind\": \"%s\", \"rank\": %d, \"step\": %lld",
                   loom_fail_kind_name(f->kind), f->rank, (long long)f->step);
    loom_launch_stop(&a->l, s->cfg->grace_s, pids, np);
    a->teardown = loom_now_ms() - f->detected_ms;
    loom_sup_event(s, "stopped", "\"teardown_s\": %.3f, \"launcher_status\": %d",
                   a->teardown * 1e-3, a->l.status);
    if (!f->exit_status) f->exit_status = a->l.status;
    scan_rejected(s, a->dir);
    /* No rank ever beat and the launcher says the program is not there on a node: a
     * restart cannot help. */
    return !any_rank_seen(s) && loom_detect_not_started(s->cfg->launcher, a->dir, s->world, &a->ns)
               ? SUP_NOT_STARTED
               : SUP_DIAGNOSE;
}

/* Says where the program is missing and stops (exit 2). */
static sup_state st_not_started(loom_sup *s, attempt_ctx *a) {
    const loom_not_started *ns = &a->ns;
    char why[1400];
    snprintf(why, sizeof why, "rank %d on %s: %s: %s; is it on a filesystem every node sees? (%s)",
             ns->rank, ns->node[0] ? ns->node : "?", ns->path,
             ns->why[0] ? ns->why : "cannot be accessed or executed there",
             !strcmp(s->cfg->launcher, "srun") ? "slurmstepd's execve()" : "mpirun");
    fprintf(stderr, "loom run: %s\n", why);
    loom_sup_event(s, "not_started", "\"rank\": %d", ns->rank);
    write_summary(s, "not_started", why);
    *s->exit_code = 2;
    s->st = LOOM_OK;
    return SUP_END;
}

static int bad_loss(const loom_failure *f) {
    return (f->kind == LOOM_FAIL_SPIKE || f->kind == LOOM_FAIL_NONFINITE) && f->step > 0;
}

static sup_state st_diagnose(loom_sup *s, attempt_ctx *a) {
    loom_failure *f = &a->f;
    if (f->kind == LOOM_FAIL_CRASH && f->rank < 0) { /* learn who from the launcher */
        loom_failure g;
        char log[LOOM_RUN_PATH + 64];
        loom_sup_launcher_log(a->dir, log, sizeof log);
        loom_detect_exit(&s->mon, a->l.status, log, &g);
        if (g.rank >= 0) *f = g;
    }
    if (bad_loss(f)) f->batch = loom_batch_skip_batch_of(&s->skip, f->step);
    if (bad_loss(f) && s->cfg->skip_bad_batches && s->skip.n < LOOM_SKIP_MAX) {
        int64_t batch = loom_batch_skip_batch_of(&s->skip, f->step);
        s->skip.batches[s->skip.n++] = batch;
        char list[LOOM_RUN_PATH];
        skip_list_text(&s->skip, list, sizeof list);
        loom_batch_skip_parse(&s->skip, list, s->err); /* sorts */
        snprintf(a->skipped, sizeof a->skipped, ", skipping batch %lld", (long long)batch);
    }
    const int rolled_back = bad_loss(f) ? set_aside_checkpoints(s->job, f->step, s->attempt) : 0;
    if (rolled_back)
        fprintf(stderr, "loom run: %d checkpoint(s) of step >= %lld set aside (rolled_back_*)\n",
                rolled_back, (long long)f->step);
    return (f->kind == LOOM_FAIL_HOST || f->kind == LOOM_FAIL_PARTITION) && f->n_culprits &&
                   s->attempt < s->cfg->max_restarts
               ? SUP_AWAIT_HOST
               : SUP_PLAN;
}

/* A lost or cut-off host: wait (bounded) until it answers again, end what is left of the
 * attempt there, and restart on the same hosts; --elastic restarts without it when it
 * does not come back in time. */
static sup_state st_await_host(loom_sup *s, attempt_ctx *a) {
    const loom_run_config *cfg = s->cfg;
    const loom_failure *f = &a->f;
    a->host_waited = 1;
    char addr[64];
    snprintf(addr, sizeof addr, "%s", s->mon.ranks[f->culprits[0]].from);
    fprintf(stderr, "loom run: waiting up to %.0f s for host %s (%s) to answer again\n",
            cfg->host_wait_s, f->host, addr);
    const double t0 = loom_now_ms(), until = t0 + cfg->host_wait_s * 1e3;
    const int back = loom_host_await(addr, until, &interrupted, NULL);
    const double waited = (loom_now_ms() - t0) * 1e-3;
    loom_sup_event(s, back ? "host_back" : "host_gone", "\"host\": \"%s\", \"waited_s\": %.3f",
                   f->host, waited);
    if (back && !strcmp(cfg->launcher, "mpirun")) {
        char agent[512];
        loom_hosts_agent(cfg->launcher_args, agent, sizeof agent);
        loom_hosts_stop_remote_ranks(&s->mon, s->host, agent);
    }
    if (back)
        snprintf(a->host_note, sizeof a->host_note,
                 " on the same hosts (%s answers again after %.1f s)", f->host, waited);
    else if (cfg->elastic && s->hosts[0])
        a->drop = 1;
    else
        snprintf(a->host_note, sizeof a->host_note,
                 " on the same hosts (%s did not answer within %.0f s)", f->host, cfg->host_wait_s);
    return SUP_PLAN;
}

/* --elastic: the ranks of the next attempt when they shrink (0: they do not): without the
 * host dropped, or without a slot that failed --exclude-after times. */
static int plan_shrink(loom_sup *s, attempt_ctx *a) {
    const loom_run_config *cfg = s->cfg;
    if (a->drop) {
        char left[LOOM_RUN_PATH];
        snprintf(left, sizeof left, "%s", s->hosts);
        const int slots =
            loom_hosts_drop(left, sizeof left, a->f.host, s->mon.ranks[a->f.culprits[0]].from);
        const int dp = slots > 0 ? fit_dp(s->job, slots < s->world ? slots : s->world) : 0;
        if (dp >= cfg->min_ranks && dp >= 1 && left[0]) {
            snprintf(a->host_note, sizeof a->host_note,
                     " on %s (elastic: %s did not answer within "
                     "%.0f s)",
                     left, a->f.host, cfg->host_wait_s);
            snprintf(s->hosts, sizeof s->hosts, "%s", left);
            return dp;
        }
    }
    if (cfg->elastic && a->slot >= 0 && s->blame[a->slot] >= cfg->exclude_after) {
        int dp = fit_dp(s->job, s->world - 1);
        if (dp >= cfg->min_ranks && dp >= 1) return dp;
    }
    return 0;
}

/* diagnosis.json: the failure, the recovery, the rank's log and the bad batch's sequences. */
static void write_diagnosis(loom_sup *s, attempt_ctx *a) {
    const loom_failure *f = &a->f;
    char log[LOOM_RUN_PATH + 64];
    rank_log(s, a->dir, f->rank >= 0 ? f->rank : 0, log, sizeof log);
    json_t *batch = NULL;
    if (f->batch > 0) {
        loom_error be = {0};
        if (!(batch = loom_batch_info(s->job, f->batch, s->dp, &be)))
            fprintf(stderr, "loom run: the bad batch's sequences are not named: %s\n", be.msg);
    }
    if (loom_diagnosis_write(f, s->cfg->run_dir, a->dir, log, a->recovery, batch, s->err))
        fprintf(stderr, "%s\n", s->err->msg);
}

static sup_state st_plan(loom_sup *s, attempt_ctx *a) {
    const loom_run_config *cfg = s->cfg;
    a->slot = a->f.rank >= 0 && a->f.rank < s->world ? s->slots[a->f.rank] : -1;
    if (a->slot >= 0) s->blame[a->slot]++;
    a->shrink = plan_shrink(s, a);
    const int ckpt = s->job->ckpt_dirs[0][0] || s->job->ckpt_dirs[1][0];
    a->give_up = s->attempt >= cfg->max_restarts;
    if (a->give_up)
        snprintf(a->recovery, sizeof a->recovery, "none: --max-restarts %d exhausted",
                 cfg->max_restarts);
    else
        snprintf(a->recovery, sizeof a->recovery, "restart %d of %d with %d rank(s)%s, %s%s",
                 s->attempt + 1, cfg->max_restarts, a->shrink ? a->shrink : s->world,
                 a->host_note[0] ? a->host_note
                 : a->shrink     ? " (elastic: the failing rank is excluded)"
                                 : "",
                 ckpt ? "from the newest valid checkpoint" : "from step 0 (no --ckpt-dir)",
                 a->skipped);
    write_diagnosis(s, a);
    loom_failure_log *fl = &s->log[s->n_log++];
    memset(fl, 0, sizeof *fl);
    fl->f = a->f;
    fl->max_step = a->max_step;
    fl->teardown_ms = a->teardown;
    return a->give_up ? SUP_GIVE_UP : SUP_RELAUNCH;
}

static sup_state st_give_up(loom_sup *s, attempt_ctx *a) {
    const loom_run_config *cfg = s->cfg;
    char why[700];
    snprintf(why, sizeof why,
             "gave up: --max-restarts %d exhausted; last failure: %s of rank %d at step "
             "%lld (%s/diagnosis.json)",
             cfg->max_restarts, loom_fail_kind_name(a->f.kind), a->f.rank, (long long)a->f.step,
             cfg->run_dir);
    fprintf(stderr, "loom run: %s\n", why);
    write_summary(s, "gave_up", why);
    *s->exit_code = 1;
    s->st = LOOM_OK;
    return SUP_END;
}

/* The next attempt's ranks: the lost host's go and the first `shrink` others stay, in
 * order; or the failing slot goes and the first healthy ones stay (renumbered). */
static void shrink_ranks(loom_sup *s, const attempt_ctx *a) {
    const loom_failure *f = &a->f;
    if (a->drop) {
        int kept = 0;
        for (int r = 0; r < s->world && kept < a->shrink; r++) {
            int on_lost = 0;
            for (int i = 0; i < f->n_culprits; i++) on_lost |= f->culprits[i] == r;
            if (!on_lost) s->slots[kept++] = s->slots[r];
        }
        fprintf(stderr, "loom run: elastic: host %s dropped; %d -> %d ranks on %s\n", f->host,
                s->world, a->shrink, s->hosts);
    } else {
        fprintf(stderr,
                "loom run: elastic: rank %d (slot %d) failed %d times: excluded; %d -> %d "
                "ranks\n",
                f->rank, a->slot, s->blame[a->slot], s->world, a->shrink);
        for (int r = f->rank; r + 1 < s->world; r++) s->slots[r] = s->slots[r + 1];
    }
    s->world = s->dp = a->shrink;
}

static sup_state st_relaunch(loom_sup *s, attempt_ctx *a) {
    const loom_failure *f = &a->f;
    /* Failures the network may be behind: the next launch waits for every host. */
    if (s->hosts[0] && !strcmp(s->cfg->launcher, "mpirun") &&
        (f->kind == LOOM_FAIL_HEARTBEAT || f->kind == LOOM_FAIL_STARTUP ||
         f->kind == LOOM_FAIL_HOST || f->kind == LOOM_FAIL_PARTITION))
        wait_for_hosts(s, a->host_waited ? f->host : "", /* that one was waited for */
                       a->host_waited ? s->mon.ranks[f->culprits[0]].from : "");
    if (a->shrink) shrink_ranks(s, a);
    s->st = LOOM_OK;
    s->attempt++;
    return SUP_LAUNCH;
}

typedef sup_state (*sup_step)(loom_sup *s, attempt_ctx *a);
static const sup_step sup_steps[SUP_END] = {
    [SUP_LAUNCH] = st_launch,     [SUP_WATCH] = st_watch,
    [SUP_FINISHED] = st_finished, [SUP_INTERRUPTED] = st_interrupted,
    [SUP_STOP] = st_stop,         [SUP_NOT_STARTED] = st_not_started,
    [SUP_DIAGNOSE] = st_diagnose, [SUP_AWAIT_HOST] = st_await_host,
    [SUP_PLAN] = st_plan,         [SUP_GIVE_UP] = st_give_up,
    [SUP_RELAUNCH] = st_relaunch,
};

/* The job's shape against -n, --dp, --global-batch and --elastic. */
static loom_status check_job(const loom_sup *s, int mr, loom_error *err) {
    const loom_run_config *cfg = s->cfg;
    const loom_run_job *job = s->job;
    if (cfg->ranks % mr != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: -n %d: must be a multiple of --tp x --pp x --cp = %d (one "
                              "model replica)",
                              cfg->ranks, mr);
    if (job->dp != 1 && job->dp != s->dp)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "loom run: --dp %d with -n %d: the ranks not in --tp x --pp x --cp = %d "
            "are data-parallel replicas (give --dp %d, or leave it out)",
            job->dp, cfg->ranks, mr, s->dp);
    if (!fit_dp(job, s->dp) || job->global_batch % (s->dp * job->micro_batch) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --global-batch %d: must be a multiple of --dp %d x "
                              "--micro-batch %d",
                              job->global_batch, s->dp, job->micro_batch);
    if (cfg->elastic && mr > 1)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "loom run: --elastic with --tp x --pp x --cp = %d: shrinking drops one "
            "data-parallel rank at a time, so it needs --tp 1 --pp 1 --cp 1",
            mr);
    return LOOM_OK;
}

/* Before anything is made or launched: the hosts (mpirun: enough slots, every other host
 * known and answering the rsh agent; srun: Slurm answers and agrees), then the address the
 * ranks are told, one that reaches this host from theirs: --bind's own, or (a wildcard
 * --bind with --hosts) this host's address on the route to the hosts. */
static loom_status check_hosts(const loom_run_config *cfg, char *rank_addr, size_t size,
                               loom_error *err) {
    loom_status st;
    if (!strcmp(cfg->launcher, "mpirun") && cfg->hosts[0]) {
        char source[LOOM_RUN_PATH + 16], agent[512];
        snprintf(source, sizeof source, "%s%s", cfg->hostfile[0] ? "--hostfile " : "--hosts",
                 cfg->hostfile);
        loom_hosts_agent(cfg->launcher_args, agent, sizeof agent);
        const int over = strstr(cfg->launcher_args, "-oversubscribe") != NULL;
        if ((st = loom_hosts_check(cfg->hosts, source, cfg->ranks, over, agent, LOOM_HOSTS_PROBE_S,
                                   err)))
            return st;
    }
    const char *addr_hosts = cfg->hosts;
    char node_addrs[4096];
    if (!strcmp(cfg->launcher, "srun")) {
        if ((st = loom_slurm_check(cfg->hosts, cfg->ranks, LOOM_SLURM_PROBE_S, err))) return st;
        /* The ranks run on the allocation's nodes (outside one, on nodes srun picks): the
         * address towards them, from the addresses Slurm knows them by; this host may not
         * be one of them (salloc) and may not resolve their names. */
        const char *nodes = getenv("SLURM_JOB_NODELIST");
        if (!addr_hosts[0]) {
            if (loom_slurm_node_addrs(nodes, LOOM_SLURM_PROBE_S, node_addrs, sizeof node_addrs))
                addr_hosts = node_addrs;
            else if (nodes && getenv("SLURM_JOB_NUM_NODES") &&
                     atoi(getenv("SLURM_JOB_NUM_NODES")) > 1)
                addr_hosts = nodes;
        }
    }
    return loom_rank_addr(cfg->bind, addr_hosts, rank_addr, size, err);
}

/* The run folder, the heartbeat socket (its address and token for the ranks), events.jsonl,
 * the per-slot records and the signal handlers. */
static loom_status open_run(loom_sup *s, const char *rank_addr, loom_error *err) {
    const loom_run_config *cfg = s->cfg;
    loom_status st;
    if (loom_mkdir_p(cfg->run_dir) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: --run-dir '%s': cannot create: %s",
                              cfg->run_dir, strerror(errno));
    if (gethostname(s->host, sizeof s->host) != 0) snprintf(s->host, sizeof s->host, "?");
    s->host[sizeof s->host - 1] = 0;
    if ((st = loom_monitor_open(&s->mon, cfg->bind, rank_addr, s->job->steps, err))) return st;
    s->mon_open = 1;
    char hex[33], path[LOOM_RUN_PATH + 64];
    loom_beat_token_hex(s->mon.token, hex);
    setenv("LOOM_FT_ADDR", s->mon.addr, 1);
    setenv("LOOM_FT_TOKEN", hex, 1);
    snprintf(path, sizeof path, "%s/events.jsonl", cfg->run_dir);
    s->events = fopen(path, "w");
    s->blame = calloc((size_t)cfg->ranks, sizeof *s->blame);
    s->slots = calloc((size_t)cfg->ranks, sizeof *s->slots);
    s->log = calloc((size_t)cfg->max_restarts + 2, sizeof *s->log);
    if (!s->blame || !s->slots || !s->log)
        return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    for (int r = 0; r < s->world; r++) s->slots[r] = r;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return LOOM_OK;
}

static void close_run(loom_sup *s) {
    if (s->events) fclose(s->events);
    free(s->blame);
    free(s->slots);
    json_decref(s->rejected);
    free(s->log);
    if (s->mon_open) loom_monitor_close(&s->mon);
}

loom_status loom_supervisor_run(const loom_run_config *cfg, const loom_run_job *job,
                                const char *loom_exe, char **train_argv, int train_argc,
                                int *exit_code, loom_error *err) {
    loom_sup s = {.cfg = cfg, .job = job, .world = cfg->ranks, .start_ms = loom_now_ms()};
    s.rejected = json_array();
    s.stop = &interrupted;
    s.loom_exe = loom_exe;
    s.train_argv = train_argv;
    s.train_argc = train_argc;
    s.exit_code = exit_code;
    s.err = err;
    const int mr = job->model_ranks > 0 ? job->model_ranks : 1;
    s.dp = cfg->ranks / mr;
    snprintf(s.hosts, sizeof s.hosts, "%s", cfg->hosts);
    *exit_code = 1;
    char rank_addr[256];
    if (!(s.st = loom_batch_skip_parse(&s.skip, job->skip_steps, err)) &&
        !(s.st = check_job(&s, mr, err)) &&
        !(s.st = check_hosts(cfg, rank_addr, sizeof rank_addr, err)) &&
        !(s.st = open_run(&s, rank_addr, err))) {
        fprintf(stderr, "loom run: %d rank(s) via %s, heartbeats on %s%s, run folder %s\n", s.world,
                cfg->launcher, s.mon.addr,
                cfg->hosts[0] && loom_addr_is_wildcard(cfg->bind)
                    ? " (this host's address towards --hosts; --bind ADDR to choose)"
                    : "",
                cfg->run_dir);
        attempt_ctx a;
        for (sup_state q = SUP_LAUNCH; q != SUP_END;) q = sup_steps[q](&s, &a);
    }
    close_run(&s);
    return s.st;
}
