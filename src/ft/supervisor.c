#include "ft/supervisor.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
#include "ckpt/ckpt_dir.h"
#include "train/batch_skip.h"

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
    interrupted = sig;
}

/* One failure and what its recovery cost (for summary.json). */
typedef struct {
    loom_failure f;
    int64_t max_step;   /* the furthest step reached before the failure */
    double teardown_ms; /* detection -> every rank stopped */
    double restart_ms;  /* detection -> first step completed after the restart */
    int64_t resumed_at; /* steps already done when the restarted job trained again */
    int recovered;
} failure_log;

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
    failure_log *log;
    int n_log;
    json_t *rejected; /* checkpoints a rank refused to load (checksum, missing file) */
    double start_ms;
    char hosts[LOOM_RUN_PATH]; /* --hosts of the next attempt (elastic: a lost host dropped) */
} sup;

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* events.jsonl: what happened when (wall clock), for the benchmark and for people. */
static void event(sup *s, const char *what, const char *fmt, ...) {
    if (!s->events) return;
    fprintf(s->events, "{\"t\": %.6f, \"attempt\": %d, \"event\": \"%s\"", wall_s(), s->attempt,
            what);
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

static void rank_log(const sup *s, const char *attempt_dir, int rank, char *out, size_t size) {
    loom_launch_rank_log(s->cfg->launcher, attempt_dir, rank, out, size);
}

static void skip_list_text(const loom_batch_skip *k, char *out, size_t size) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < k->n && n + 24 < size; i++)
        n += (size_t)snprintf(out + n, size - n, "%s%lld", i ? "," : "", (long long)k->batches[i]);
}

/* Checkpoints the ranks of an attempt refused ("loom: rank R: checkpoint DIR not usable:
 * why", from the resume code), for summary.json. */
static void scan_rejected(sup *s, const char *attempt_dir) {
    for (int r = 0; r < s->world; r++) {
        char path[LOOM_RUN_PATH + 64], line[2048];
        rank_log(s, attempt_dir, r, path, sizeof path);
        FILE *fp = fopen(path, "r");
        while (fp && fgets(line, sizeof line, fp)) {
            int rank;
            if (!strstr(line, " not usable: ") || sscanf(line, "loom: rank %d:", &rank) != 1)
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

/* Where the restarted job's state came from: rank 0's "loom: resume source: ..." line of
 * the attempt (train/checkpointing.c; peer memory or disk, with the bytes read from each),
 * without its prefix; "" when there is none. */
static void resume_source(const sup *s, const char *attempt_dir, char *out, size_t size) {
    char path[LOOM_RUN_PATH + 64], line[1024];
    out[0] = 0;
    rank_log(s, attempt_dir, 0, path, sizeof path);
    FILE *fp = fopen(path, "r");
    while (fp && fgets(line, sizeof line, fp))
        if (!strncmp(line, "loom: resume source: ", 21)) {
            line[strcspn(line, "\n")] = 0;
            for (char *c = line; *c; c++) /* it goes into events.jsonl as a JSON string */
                if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '\'';
            snprintf(out, size, "%s", line + 21);
        }
    if (fp) fclose(fp);
}

/* The launcher's command line for this attempt (ft/launch_argv.h). */
static void build_argv(sup *s, const char *loom_exe, char **train_argv, int train_argc,
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
static int set_aside_checkpoints(const loom_run_job *j, int64_t from_step, int attempt) {
    int moved = 0;
    for (int t = 0; t < 2; t++) {
        if (!j->ckpt_dirs[t][0]) continue;
        loom_ckpt_entry *list = NULL;
        int n = loom_ckpt_list(j->ckpt_dirs[t], &list, 0);
        for (int i = 0; i < n; i++) {
            if (list[i].step < from_step) continue;
            char to[sizeof list[i].path + 64];
            snprintf(to, sizeof to, "%s/rolled_back_a%d_step_%08lld", j->ckpt_dirs[t], attempt,
                     (long long)list[i].step);
            if (rename(list[i].path, to) == 0) moved++;
        }
        free(list);
    }
    return moved;
}

/* The largest data-parallel size <= ranks that splits the global batch evenly. */
static int fit_dp(const loom_run_job *j, int ranks) {
    for (int d = ranks; d >= 1; d--)
        if (j->global_batch % (d * j->micro_batch) == 0) return d;
    return 0;
}

static void write_summary(sup *s, const char *outcome, const char *why) {
    json_t *j = json_object(), *fails = json_array();
    double recovery = 0;
    int64_t wasted = 0;
    for (int i = 0; i < s->n_log; i++) {
        failure_log *l = &s->log[i];
        json_t *o = json_object();
        json_object_set_new(o, "attempt", json_integer(l->f.attempt));
        json_object_set_new(o, "kind", json_string(loom_fail_kind_name(l->f.kind)));
        json_object_set_new(o, "rank", l->f.rank >= 0 ? json_integer(l->f.rank) : json_null());
        json_object_set_new(o, "step", json_integer(l->f.step));
        json_object_set_new(o, "max_step_before", json_integer(l->max_step));
        json_object_set_new(o, "teardown_s", json_real(l->teardown_ms * 1e-3));
        if (l->recovered) {
            int64_t replayed = l->max_step - l->resumed_at;
            if (replayed < 0) replayed = 0;
            json_object_set_new(o, "resumed_at_step", json_integer(l->resumed_at));
            json_object_set_new(o, "replayed_steps", json_integer(replayed));
            json_object_set_new(o, "recovery_s", json_real(l->restart_ms * 1e-3));
            wasted += replayed;
            recovery += l->restart_ms * 1e-3;
        }
        json_array_append_new(fails, o);
    }
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
    json_t *ranks = json_array(); /* the last attempt's ranks: where each ran, beats heard */
    for (int r = 0; r < s->mon.world; r++) {
        const loom_rank_state *rs = &s->mon.ranks[r];
        json_t *o = json_object();
        json_object_set_new(o, "rank", json_integer(r));
        json_object_set_new(o, "host", rs->seen ? json_string(rs->beat.host) : json_null());
        json_object_set_new(o, "heartbeats", json_integer(rs->accepted));
        json_array_append_new(ranks, o);
    }
    json_object_set_new(j, "ranks", ranks);
    char path[LOOM_RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/summary.json", s->cfg->run_dir);
    json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    fprintf(stderr,
            "loom run: %s after %d attempt(s): %d failure(s), %lld step(s) replayed, %.1f s "
            "spent recovering (%s)\n",
            outcome, s->attempt + 1, s->n_log, (long long)wasted, recovery, path);
}

/* The ranks whose own loss spiked: their beats of the step may come a moment after the
 * first one (waits up to 1 s for every rank to report it). */
static void spike_ranks(sup *s, loom_failure *f) {
    const double until = loom_now_ms() + 1000;
    for (;;) {
        int behind = 0;
        for (int r = 0; r < s->world; r++) {
            const loom_rank_state *rs = &s->mon.ranks[r];
            const int64_t last =
                rs->hist_n ? rs->hist_step[(rs->hist_n - 1) % LOOM_MONITOR_HISTORY] : 0;
            behind += last < f->step && rs->beat.phase != LOOM_PHASE_DONE &&
                      rs->beat.phase != LOOM_PHASE_FAILED;
        }
        if (!behind || loom_now_ms() >= until) break;
        struct pollfd pfd = {s->mon.fd, POLLIN, 0};
        poll(&pfd, 1, 20);
        loom_monitor_drain(&s->mon, loom_now_ms());
    }
    loom_detect_spike_ranks(&s->mon, s->cfg->loss_spike_factor, f);
}

/* Slow links (ft/detect.h): while every rank trains, one other host's round trip measured
 * every 100 ms in turn (ft/hosts.h); a host named once per attempt, in one line and
 * events.jsonl. */
static void watch_links(sup *s, loom_link_watch *w, double now) {
    loom_slow_link sl;
    if (!loom_hosts_probe_links(w, &s->mon, s->world, s->host, now, &sl)) return;
    fprintf(stderr,
            "loom run: slow link: host %s (ranks %s) at %s: a round trip to it takes %.1f ms "
            "while the job trains, against %.1f ms to the others (%s); the ranks wait %.1f ms "
            "per step for communication and compute %.1f ms (reported, not restarted)\n",
            sl.host, sl.ranks, sl.addr, sl.rtt_ms, sl.others_rtt_ms, sl.others, sl.blocked_ms,
            sl.compute_ms);
    event(s, "slow_link",
          "\"host\": \"%s\", \"ranks\": [%s], \"rtt_ms\": %.3f, \"others_rtt_ms\": %.3f, "
          "\"blocked_ms\": %.3f, \"compute_ms\": %.3f",
          sl.host, sl.ranks, sl.rtt_ms, sl.others_rtt_ms, sl.blocked_ms, sl.compute_ms);
}

/* Before a restart across hosts: waits (up to --host-wait in all) until every other host
 * the next attempt runs on answers on the network, so that a launch does not start while
 * a link is still down (its start-up window then starts at the launch, after the wait).
 * The hosts: loom_hosts_restart_addrs, `skip` / `skip_addr` (a host already waited for)
 * left out. A host that still does not answer is launched on anyway (the start-up rule
 * then judges it), said in one line. */
static void wait_for_hosts(sup *s, const char *skip, const char *skip_addr) {
    char addrs[16][64];
    const int n = loom_hosts_restart_addrs(&s->mon, s->host, s->hosts, skip, skip_addr, addrs, 16);
    const double t0 = loom_now_ms(), until = t0 + s->cfg->host_wait_s * 1e3;
    for (int i = 0; i < n; i++) {
        int said = 0;
        const int back = loom_host_await(addrs[i], until, &interrupted, &said);
        const double waited = (loom_now_ms() - t0) * 1e-3;
        if (said || !back)
            event(s, back ? "host_back" : "host_gone", "\"host\": \"%s\", \"waited_s\": %.3f",
                  addrs[i], waited);
        if (!back)
            fprintf(stderr,
                    "loom run: host %s did not answer within %.0f s: restarting on it anyway\n",
                    addrs[i], s->cfg->host_wait_s);
        else if (said)
            fprintf(stderr, "loom run: host %s answers again after %.1f s\n", addrs[i], waited);
    }
}

/* 1 once some rank of the attempt has beaten. */
static int any_rank_seen(const sup *s) {
    for (int r = 0; r < s->mon.world; r++)
        if (s->mon.ranks[r].seen) return 1;
    return 0;
}

/* How an attempt ended. */
typedef enum {
    ATTEMPT_FINISHED,   /* every step done */
    ATTEMPT_FAILED,     /* a failure, described in *f */
    ATTEMPT_INTERRUPTED /* a signal to the supervisor */
} attempt_outcome;

/* Watches one attempt until it ends or fails (the rules: ft/detect.h). */
static attempt_outcome watch(sup *s, loom_launch *l, const char *attempt_dir, loom_failure *f) {
    const loom_run_config *c = s->cfg;
    const double launch_ms = loom_now_ms();
    double last_print = launch_ms;
    int64_t straggler_step = 0;
    int all_seen = 0, loading = 0, training = 0;
    double dead_since = -1;
    int64_t spike_checked = 0, printed_step = 0;
    failure_log *pending =
        s->n_log && !s->log[s->n_log - 1].recovered ? &s->log[s->n_log - 1] : NULL;
    failure_log *catching_up = NULL; /* until the steps lost to the failure are redone */
    const int64_t print_every = s->job->steps >= 10 ? s->job->steps / 10 : 1;
    struct pollfd pfd = {s->mon.fd, POLLIN, 0};
    loom_link_watch links = {0};
    for (;;) {
        poll(&pfd, 1, 50);
        double now = loom_now_ms();
        loom_monitor_drain(&s->mon, now);
        if (interrupted) return ATTEMPT_INTERRUPTED;
        if (!all_seen) {
            int n = 0;
            for (int r = 0; r < s->world; r++) n += s->mon.ranks[r].seen;
            if (n == s->world) {
                all_seen = 1;
                event(s, "all_ranks_beating", "\"after_s\": %.3f", (now - launch_ms) * 1e-3);
            }
        }
        if (!loading) { /* every rank is past start-up: loading a checkpoint, or training */
            int n = 0;
            for (int r = 0; r < s->world; r++)
                n += s->mon.ranks[r].seen && s->mon.ranks[r].beat.phase != LOOM_PHASE_INIT;
            if (n == s->world) {
                loading = 1;
                event(s, "loading", NULL);
            }
        }
        if (!training) {
            int n = 0;
            for (int r = 0; r < s->world; r++)
                n += s->mon.ranks[r].seen && s->mon.ranks[r].beat.phase != LOOM_PHASE_INIT &&
                     s->mon.ranks[r].beat.phase != LOOM_PHASE_CKPT;
            if (n == s->world) {
                training = 1;
                event(s, "training", "\"steps_done\": %lld", (long long)loom_monitor_step(&s->mon));
            }
        }
        /* The first step completed after a restart closes the previous failure's record. */
        for (int r = 0; pending && r < s->world; r++) {
            const loom_rank_state *rs = &s->mon.ranks[r];
            if (rs->hist_n > 0) {
                pending->recovered = 1;
                pending->resumed_at = rs->beat.start_step;
                pending->restart_ms = now - pending->f.detected_ms;
                event(s, "first_step_after_restart",
                      "\"step\": %lld, \"recovery_s\": %.3f, \"replayed_steps\": %lld",
                      (long long)rs->hist_step[0], pending->restart_ms * 1e-3,
                      (long long)(pending->max_step > pending->resumed_at
                                      ? pending->max_step - pending->resumed_at
                                      : 0));
                fprintf(stderr,
                        "loom run: recovered: step %lld done %.1f s after the failure was "
                        "detected (%lld step(s) to replay)\n",
                        (long long)rs->hist_step[0], pending->restart_ms * 1e-3,
                        (long long)(pending->max_step > pending->resumed_at
                                        ? pending->max_step - pending->resumed_at
                                        : 0));
                char source[1024];
                resume_source(s, attempt_dir, source, sizeof source);
                if (source[0]) {
                    fprintf(stderr, "loom run: recovered from %s\n", source);
                    event(s, "resume_source", "\"line\": \"%s\"", source);
                }
                catching_up = pending;
                pending = NULL;
            }
        }
        if (catching_up && loom_monitor_step(&s->mon) > catching_up->max_step) {
            event(s, "caught_up", "\"step\": %lld", (long long)loom_monitor_step(&s->mon));
            catching_up = NULL;
        }
        /* Losses first: a job that spiked and then finished is still rolled back. */
        int64_t step = loom_monitor_step(&s->mon);
        if (step > spike_checked) {
            if (loom_detect_loss_spike(&s->mon, c->loss_spike_factor, spike_checked, step, f)) {
                if (f->kind == LOOM_FAIL_SPIKE) spike_ranks(s, f);
                return ATTEMPT_FAILED;
            }
            spike_checked = step;
        }
        /* A rank on this host that died: seen at once, before the launcher notices. */
        const int dead = loom_detect_dead_rank(&s->mon, s->host);
        if (dead >= 0) {
            /* A rank that died can be the victim of another's error (MPI_Abort kills the
             * job): wait a moment for failure reports before calling it a crash. */
            if (dead_since < 0) dead_since = now;
            if (now - dead_since >= 200 || loom_launch_poll(l)) {
                loom_monitor_drain(&s->mon, loom_now_ms());
                char log[LOOM_RUN_PATH + 32];
                snprintf(log, sizeof log, "%s/launcher.log", attempt_dir);
                if (loom_detect_host_lost(&s->mon, log, f)) return ATTEMPT_FAILED;
                if (!loom_detect_reported(&s->mon)) {
                    /* The launcher may name the first rank killed (one on another host). */
                    if (!loom_detect_launcher_crash(&s->mon, log, f))
                        loom_detect_crash(&s->mon, dead, f);
                    return ATTEMPT_FAILED;
                }
                loom_detect_exit(&s->mon, l->running ? 0 : l->status, log, f);
                return ATTEMPT_FAILED;
            }
        }
        if (loom_launch_poll(l)) {
            loom_monitor_drain(&s->mon, loom_now_ms());
            if (l->status == 0) return ATTEMPT_FINISHED;
            char log[LOOM_RUN_PATH + 32];
            snprintf(log, sizeof log, "%s/launcher.log", attempt_dir);
            if (!loom_detect_host_lost(&s->mon, log, f))
                loom_detect_exit(&s->mon, l->status, log, f);
            return ATTEMPT_FAILED;
        }
        const double hb_ms = c->heartbeat_timeout_s * 1e3;
        /* A whole host silent while the others beat: before the hang and silence rules,
         * which would blame one of its ranks (or a waiting rank) alone. */
        if (loom_detect_partition(&s->mon, now, hb_ms, f)) {
            /* A host that still answers on the network is not cut off: its processes are
             * gone (or frozen), the launcher has not said so yet. */
            const char *addr = s->mon.ranks[f->culprits[0]].from;
            if (loom_host_answers(addr)) {
                char was[sizeof f->detail];
                snprintf(was, sizeof was, "%s", f->detail);
                char *cut = strstr(was, " cut off: ");
                f->kind = LOOM_FAIL_HOST;
                if (cut) {
                    *cut = 0;
                    snprintf(f->detail, sizeof f->detail,
                             "%s lost: %s; the host answers on the network, so its processes "
                             "are gone or frozen",
                             was, cut + strlen(" cut off: "));
                }
            }
            return ATTEMPT_FAILED;
        }
        if (loom_detect_hang(&s->mon, hb_ms, f)) return ATTEMPT_FAILED;
        if (loom_detect_silence(&s->mon, now, launch_ms, hb_ms, c->startup_timeout_s * 1e3, f)) {
            /* One silent rank on another host that does not answer on the network: its
             * host is cut off (its other ranks finished, or their last beats came just
             * before the cut), and the restart must wait for it like for a partition. */
            const loom_rank_state *rs =
                f->kind == LOOM_FAIL_HEARTBEAT && f->rank >= 0 ? &s->mon.ranks[f->rank] : NULL;
            if (rs && rs->from[0] && strcmp(rs->beat.host, s->host) &&
                !loom_host_answers(rs->from)) {
                loom_failure g;
                if (loom_detect_host_cut(&s->mon, f->rank, loom_now_ms(), &g)) *f = g;
            }
            return ATTEMPT_FAILED;
        }
        if (c->step_timeout_s > 0 && training &&
            loom_detect_stall(&s->mon, now, c->step_timeout_s * 1e3, f))
            return ATTEMPT_FAILED;
        if (training && s->hosts[0] && step > 0) watch_links(s, &links, now);
        /* Stragglers: judged once per step that every rank has reported. */
        int64_t common = INT64_MAX;
        for (int r = 0; r < s->world; r++) {
            const loom_rank_state *rs = &s->mon.ranks[r];
            int64_t last = rs->hist_n ? rs->hist_step[(rs->hist_n - 1) % LOOM_MONITOR_HISTORY] : 0;
            if (last < common) common = last;
        }
        if (common > straggler_step) {
            straggler_step = common;
            loom_straggler st[16];
            int n = loom_detect_stragglers(&s->mon, c->straggler_factor, st, 16);
            loom_error e;
            if (n && loom_stragglers_write(st, n, c->run_dir, s->attempt, &e))
                fprintf(stderr, "%s\n", e.msg);
            for (int i = 0; i < n; i++)
                event(s, "straggler", "\"rank\": %d, \"slowdown\": %.3f", st[i].rank,
                      st[i].slowdown);
        }
        if (step >= printed_step + print_every || (now - last_print > 30e3 && step > 0)) {
            double loss = step <= s->mon.max_steps ? s->mon.loss[step] : NAN;
            fprintf(stderr, "loom run: step %lld/%d loss %.4f (attempt %d, %d ranks)\n",
                    (long long)step, s->job->steps, loss, s->attempt, s->world);
            printed_step = step;
            last_print = now;
        }
    }
}

loom_status loom_supervisor_run(const loom_run_config *cfg, const loom_run_job *job,
                                const char *loom_exe, char **train_argv, int train_argc,
                                int *exit_code, loom_error *err) {
    sup s;
    memset(&s, 0, sizeof s);
    s.cfg = cfg;
    s.job = job;
    const int mr = job->model_ranks > 0 ? job->model_ranks : 1;
    s.world = cfg->ranks;
    s.dp = cfg->ranks / mr;
    s.start_ms = loom_now_ms();
    s.rejected = json_array();
    snprintf(s.hosts, sizeof s.hosts, "%s", cfg->hosts);
    *exit_code = 1;
    loom_status st;
    if ((st = loom_batch_skip_parse(&s.skip, job->skip_steps, err))) return st;
    if (cfg->ranks % mr != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: -n %d: must be a multiple of --tp x --pp x --cp = %d (one "
                              "model replica)",
                              cfg->ranks, mr);
    if (job->dp != 1 && job->dp != s.dp)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "loom run: --dp %d with -n %d: the ranks not in --tp x --pp x --cp = %d "
            "are data-parallel replicas (give --dp %d, or leave it out)",
            job->dp, cfg->ranks, mr, s.dp);
    if (!fit_dp(job, s.dp) || job->global_batch % (s.dp * job->micro_batch) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --global-batch %d: must be a multiple of --dp %d x "
                              "--micro-batch %d",
                              job->global_batch, s.dp, job->micro_batch);
    if (cfg->elastic && mr > 1)
        return loom_error_set(
            err, LOOM_ERR_INPUT,
            "loom run: --elastic with --tp x --pp x --cp = %d: shrinking drops one "
            "data-parallel rank at a time, so it needs --tp 1 --pp 1 --cp 1",
            mr);
    /* The ranks are told an address that reaches this host from theirs: --bind's own, or
     * (a wildcard --bind with --hosts) this host's address on the route to the hosts. */
    char rank_addr[256];
    if (!strcmp(cfg->launcher, "mpirun") && cfg->hosts[0]) {
        /* Before anything is made or launched: enough slots, and every other host known
         * and answering mpirun's rsh agent within a bound (ft/hosts.h). */
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
        /* Slurm answers (munged, slurmctld), and --hosts / -n agree with the allocation. */
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
    if ((st = loom_rank_addr(cfg->bind, addr_hosts, rank_addr, sizeof rank_addr, err))) return st;
    if (loom_mkdir_p(cfg->run_dir) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: --run-dir '%s': cannot create: %s",
                              cfg->run_dir, strerror(errno));
    if (gethostname(s.host, sizeof s.host) != 0) snprintf(s.host, sizeof s.host, "?");
    s.host[sizeof s.host - 1] = 0;
    if ((st = loom_monitor_open(&s.mon, cfg->bind, rank_addr, job->steps, err))) return st;
    char hex[33], path[LOOM_RUN_PATH + 64];
    loom_beat_token_hex(s.mon.token, hex);
    setenv("LOOM_FT_ADDR", s.mon.addr, 1);
    setenv("LOOM_FT_TOKEN", hex, 1);
    snprintf(path, sizeof path, "%s/events.jsonl", cfg->run_dir);
    s.events = fopen(path, "w");
    s.blame = calloc((size_t)cfg->ranks, sizeof *s.blame);
    s.slots = calloc((size_t)cfg->ranks, sizeof *s.slots);
    s.log = calloc((size_t)cfg->max_restarts + 2, sizeof *s.log);
    if (!s.blame || !s.slots || !s.log) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
        goto done;
    }
    for (int r = 0; r < s.world; r++) s.slots[r] = r;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "loom run: %d rank(s) via %s, heartbeats on %s%s, run folder %s\n", s.world,
            cfg->launcher, s.mon.addr,
            cfg->hosts[0] && loom_addr_is_wildcard(cfg->bind)
                ? " (this host's address towards --hosts; --bind ADDR to choose)"
                : "",
            cfg->run_dir);
    for (s.attempt = 0;; s.attempt++) {
        char attempt_dir[LOOM_RUN_PATH + 32];
        snprintf(attempt_dir, sizeof attempt_dir, "%s/attempt_%d", cfg->run_dir, s.attempt);
        loom_mkdir_p(attempt_dir);
        char attempt[16];
        snprintf(attempt, sizeof attempt, "%d", s.attempt);
        setenv("LOOM_FT_ATTEMPT", attempt, 1);
        char slots[LOOM_RUN_PATH] = "";
        for (int r = 0, n = 0; r < s.world && n < (int)sizeof slots - 12; r++)
            n += snprintf(slots + n, sizeof slots - n, "%s%d", r ? "," : "", s.slots[r]);
        setenv("LOOM_FT_SLOTS", slots, 1);
        static loom_launch_cmd cmdline;
        build_argv(&s, loom_exe, train_argv, train_argc, attempt_dir, &cmdline);
        char **argv = cmdline.argv;
        const int argc = cmdline.argc;
        snprintf(path, sizeof path, "%s/command.txt", attempt_dir);
        FILE *cmd = fopen(path, "w");
        for (int i = 0; cmd && i < argc; i++)
            fprintf(cmd, "%s%s", argv[i], i + 1 < argc ? " " : "\n");
        if (cmd) fclose(cmd);
        if ((st = loom_monitor_reset(&s.mon, s.world, s.attempt, err))) goto done;
        loom_launch l;
        snprintf(path, sizeof path, "%s/launcher.log", attempt_dir);
        if ((st = loom_launch_start(&l, argv, path, err))) goto done;
        event(&s, "launch", "\"ranks\": %d, \"dp\": %d", s.world, s.dp);
        loom_failure f;
        const attempt_outcome outcome = watch(&s, &l, attempt_dir, &f);
        if (outcome != ATTEMPT_FAILED) scan_rejected(&s, attempt_dir);
        if (outcome == ATTEMPT_FINISHED) {
            event(&s, "done", NULL);
            write_summary(&s, "finished", "every step done");
            *exit_code = 0;
            goto done;
        }
        pid_t pids[s.world > 0 ? s.world : 1];
        int np = 0;
        for (int r = 0; r < s.world; r++)
            if (s.mon.ranks[r].seen && strcmp(s.mon.ranks[r].beat.host, s.host) == 0)
                pids[np++] = s.mon.ranks[r].beat.pid;
        if (outcome == ATTEMPT_INTERRUPTED) {
            fprintf(stderr, "loom run: interrupted: stopping the job (SIGTERM, then SIGKILL)\n");
            loom_launch_stop(&l, cfg->grace_s, pids, np);
            write_summary(&s, "interrupted", "signal to the supervisor");
            *exit_code = 128 + (int)interrupted;
            goto done;
        }
        f.attempt = s.attempt;
        f.detected_ms = loom_now_ms();
        const int64_t max_step = loom_monitor_step(&s.mon);
        event(&s, "failure_detected", "\"kind\": \"%s\", \"rank\": %d, \"step\": %lld",
              loom_fail_kind_name(f.kind), f.rank, (long long)f.step);
        loom_launch_stop(&l, cfg->grace_s, pids, np);
        double teardown = loom_now_ms() - f.detected_ms;
        event(&s, "stopped", "\"teardown_s\": %.3f, \"launcher_status\": %d", teardown * 1e-3,
              l.status);
        if (!f.exit_status) f.exit_status = l.status;
        scan_rejected(&s, attempt_dir);
        /* No rank ever beat and the launcher says the program is not there on a node: a
         * restart cannot help; say where and stop (exit 2). */
        loom_not_started ns;
        if (!any_rank_seen(&s) &&
            loom_detect_not_started(cfg->launcher, attempt_dir, s.world, &ns)) {
            char why[1400];
            snprintf(why, sizeof why,
                     "rank %d on %s: %s: %s; is it on a filesystem every node sees? (%s)", ns.rank,
                     ns.node[0] ? ns.node : "?", ns.path,
                     ns.why[0] ? ns.why : "cannot be accessed or executed there",
                     !strcmp(cfg->launcher, "srun") ? "slurmstepd's execve()" : "mpirun");
            fprintf(stderr, "loom run: %s\n", why);
            event(&s, "not_started", "\"rank\": %d", ns.rank);
            write_summary(&s, "not_started", why);
            *exit_code = 2;
            st = LOOM_OK;
            goto done;
        }
        if (f.kind == LOOM_FAIL_CRASH && f.rank < 0) { /* learn who from the launcher */
            loom_failure g;
            snprintf(path, sizeof path, "%s/launcher.log", attempt_dir);
            loom_detect_exit(&s.mon, l.status, path, &g);
            if (g.rank >= 0) f = g;
        }
        /* Recovery plan. */
        if ((f.kind == LOOM_FAIL_SPIKE || f.kind == LOOM_FAIL_NONFINITE) && f.step > 0)
            f.batch = loom_batch_skip_batch_of(&s.skip, f.step);
        char recovery[512], skipped[64] = "";
        if ((f.kind == LOOM_FAIL_SPIKE || f.kind == LOOM_FAIL_NONFINITE) && cfg->skip_bad_batches &&
            f.step > 0 && s.skip.n < LOOM_SKIP_MAX) {
            int64_t batch = loom_batch_skip_batch_of(&s.skip, f.step);
            s.skip.batches[s.skip.n++] = batch;
            char list[LOOM_RUN_PATH];
            skip_list_text(&s.skip, list, sizeof list);
            loom_batch_skip_parse(&s.skip, list, err); /* sorts */
            snprintf(skipped, sizeof skipped, ", skipping batch %lld", (long long)batch);
        }
        const int rolled_back =
            (f.kind == LOOM_FAIL_SPIKE || f.kind == LOOM_FAIL_NONFINITE) && f.step > 0
                ? set_aside_checkpoints(job, f.step, s.attempt)
                : 0;
        if (rolled_back)
            fprintf(stderr,
                    "loom run: %d checkpoint(s) of step >= %lld set aside (rolled_back_*)\n",
                    rolled_back, (long long)f.step);
        /* A lost or cut-off host: wait (bounded) until it answers again, end what is left
         * of the attempt there, and restart on the same hosts; --elastic restarts without
         * it when it does not come back in time. */
        char host_note[256] = "";
        int drop = 0, host_waited = 0;
        if ((f.kind == LOOM_FAIL_HOST || f.kind == LOOM_FAIL_PARTITION) && f.n_culprits &&
            s.attempt < cfg->max_restarts) {
            host_waited = 1;
            char addr[64];
            snprintf(addr, sizeof addr, "%s", s.mon.ranks[f.culprits[0]].from);
            fprintf(stderr, "loom run: waiting up to %.0f s for host %s (%s) to answer again\n",
                    cfg->host_wait_s, f.host, addr);
            const double t0 = loom_now_ms(), until = t0 + cfg->host_wait_s * 1e3;
            const int back = loom_host_await(addr, until, &interrupted, NULL);
            const double waited = (loom_now_ms() - t0) * 1e-3;
            event(&s, back ? "host_back" : "host_gone", "\"host\": \"%s\", \"waited_s\": %.3f",
                  f.host, waited);
            if (back && !strcmp(cfg->launcher, "mpirun")) {
                char agent[512];
                loom_hosts_agent(cfg->launcher_args, agent, sizeof agent);
                loom_hosts_stop_remote_ranks(&s.mon, s.host, agent);
            }
            if (back)
                snprintf(host_note, sizeof host_note,
                         " on the same hosts (%s answers again after %.1f s)", f.host, waited);
            else if (cfg->elastic && s.hosts[0])
                drop = 1;
            else
                snprintf(host_note, sizeof host_note,
                         " on the same hosts (%s did not answer within %.0f s)", f.host,
                         cfg->host_wait_s);
        }
        const int slot = f.rank >= 0 && f.rank < s.world ? s.slots[f.rank] : -1;
        if (slot >= 0) s.blame[slot]++;
        int shrink = 0;
        if (drop) {
            char left[LOOM_RUN_PATH];
            snprintf(left, sizeof left, "%s", s.hosts);
            const int slots =
                loom_hosts_drop(left, sizeof left, f.host, s.mon.ranks[f.culprits[0]].from);
            const int dp = slots > 0 ? fit_dp(job, slots < s.world ? slots : s.world) : 0;
            if (dp >= cfg->min_ranks && dp >= 1 && left[0]) {
                shrink = dp;
                snprintf(host_note, sizeof host_note,
                         " on %s (elastic: %s did not answer within "
                         "%.0f s)",
                         left, f.host, cfg->host_wait_s);
                snprintf(s.hosts, sizeof s.hosts, "%s", left);
            }
        }
        if (!shrink && cfg->elastic && slot >= 0 && s.blame[slot] >= cfg->exclude_after) {
            int dp = fit_dp(job, s.world - 1);
            if (dp >= cfg->min_ranks && dp >= 1) shrink = dp;
        }
        const int ckpt = job->ckpt_dirs[0][0] || job->ckpt_dirs[1][0];
        const int give_up = s.attempt >= cfg->max_restarts;
        if (give_up)
            snprintf(recovery, sizeof recovery, "none: --max-restarts %d exhausted",
                     cfg->max_restarts);
        else
            snprintf(recovery, sizeof recovery, "restart %d of %d with %d rank(s)%s, %s%s",
                     s.attempt + 1, cfg->max_restarts, shrink ? shrink : s.world,
                     host_note[0] ? host_note
                     : shrink     ? " (elastic: the failing rank is excluded)"
                                  : "",
                     ckpt ? "from the newest valid checkpoint" : "from step 0 (no --ckpt-dir)",
                     skipped);
        char log[LOOM_RUN_PATH + 64];
        rank_log(&s, attempt_dir, f.rank >= 0 ? f.rank : 0, log, sizeof log);
        json_t *batch = NULL;
        if (f.batch > 0) {
            loom_error be = {0};
            if (!(batch = loom_batch_info(job, f.batch, s.dp, &be)))
                fprintf(stderr, "loom run: the bad batch's sequences are not named: %s\n", be.msg);
        }
        if ((st = loom_diagnosis_write(&f, cfg->run_dir, attempt_dir, log, recovery, batch, err)))
            fprintf(stderr, "%s\n", err->msg);
        failure_log *fl = &s.log[s.n_log++];
        memset(fl, 0, sizeof *fl);
        fl->f = f;
        fl->max_step = max_step;
        fl->teardown_ms = teardown;
        if (give_up) {
            char why[700];
            snprintf(why, sizeof why,
                     "gave up: --max-restarts %d exhausted; last failure: %s of rank %d at step "
                     "%lld (%s/diagnosis.json)",
                     cfg->max_restarts, loom_fail_kind_name(f.kind), f.rank, (long long)f.step,
                     cfg->run_dir);
            fprintf(stderr, "loom run: %s\n", why);
            write_summary(&s, "gave_up", why);
            *exit_code = 1;
            st = LOOM_OK;
            goto done;
        }
        /* Failures the network may be behind: the next launch waits for every host. */
        if (s.hosts[0] && !strcmp(cfg->launcher, "mpirun") &&
            (f.kind == LOOM_FAIL_HEARTBEAT || f.kind == LOOM_FAIL_STARTUP ||
             f.kind == LOOM_FAIL_HOST || f.kind == LOOM_FAIL_PARTITION))
            wait_for_hosts(&s, host_waited ? f.host : "", /* that one was waited for */
                           host_waited ? s.mon.ranks[f.culprits[0]].from : "");
        if (shrink && drop) {
            /* The lost host's ranks go; the first `shrink` of the others stay, in order. */
            int kept = 0;
            for (int r = 0; r < s.world && kept < shrink; r++) {
                int on_lost = 0;
                for (int i = 0; i < f.n_culprits; i++) on_lost |= f.culprits[i] == r;
                if (!on_lost) s.slots[kept++] = s.slots[r];
            }
            fprintf(stderr, "loom run: elastic: host %s dropped; %d -> %d ranks on %s\n", f.host,
                    s.world, shrink, s.hosts);
            s.world = s.dp = shrink;
        } else if (shrink) {
            fprintf(stderr,
                    "loom run: elastic: rank %d (slot %d) failed %d times: excluded; %d -> %d "
                    "ranks\n",
                    f.rank, slot, s.blame[slot], s.world, shrink);
            /* Drop the failing slot, keep the first healthy ones (renumbered in order). */
            for (int r = f.rank; r + 1 < s.world; r++) s.slots[r] = s.slots[r + 1];
            s.world = s.dp = shrink;
        }
        st = LOOM_OK;
    }
done:
    if (s.events) fclose(s.events);
    free(s.blame);
    free(s.slots);
    json_decref(s.rejected);
    free(s.log);
    loom_monitor_close(&s.mon);
    return st;
}
