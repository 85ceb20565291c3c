/* Watching one attempt of `loom run` (ft/supervisor_state.h): each round's pieces (the
 * milestones, the previous failure's recovery, the failure rules by kind, slow links,
 * stragglers, progress). */
#include "ft/supervisor_state.h"

#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "ft/hosts.h"
#include "ft/launch_argv.h"

/* Where the restarted job's state came from: rank 0's "loom: resume source: ..." line of
 * the attempt (train/checkpointing.c; peer memory or disk, with the bytes read from each),
 * without its prefix; "" when there is none. */
static void resume_source(const loom_sup *s, const char *attempt_dir, char *out, size_t size) {
    char path[LOOM_RUN_PATH + 64], line[1024];
    out[0] = 0;
    loom_launch_rank_log(s->cfg->launcher, attempt_dir, 0, path, sizeof path);
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

/* The ranks whose own loss spiked: their beats of the step may come a moment after the
 * first one (waits up to 1 s for every rank to report it). */
static void spike_ranks(loom_sup *s, loom_failure *f) {
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
static void watch_links(loom_sup *s, loom_link_watch *w, double now) {
    loom_slow_link sl;
    if (!loom_hosts_probe_links(w, &s->mon, s->world, s->host, now, &sl)) return;
    fprintf(stderr,
            "loom run: slow link: host %s (ranks %s) at %s: a round trip to it takes %.1f ms "
            "while the job trains, against %.1f ms to the others (%s); the ranks wait %.1f ms "
            "per step for communication and compute %.1f ms (reported, not restarted)\n",
            sl.host, sl.ranks, sl.addr, sl.rtt_ms, sl.others_rtt_ms, sl.others, sl.blocked_ms,
            sl.compute_ms);
    loom_sup_event(s, "slow_link",
                   "\"host\": \"%s\", \"ranks\": [%s], \"rtt_ms\": %.3f, \"others_rtt_ms\": %.3f, "
                   "\"blocked_ms\": %.3f, \"compute_ms\": %.3f",
                   sl.host, sl.ranks, sl.rtt_ms, sl.others_rtt_ms, sl.blocked_ms, sl.compute_ms);
}

/* What watching one attempt keeps from one round to the next. */
typedef struct {
    loom_launch *l;
    const char *attempt_dir;
    double launch_ms, last_print, dead_since;
    double last_round, hangs_judged_from; /* this supervisor's own stalls (excuse_own_stall) */
    int64_t straggler_step, spike_checked, printed_step, print_every;
    int all_seen, loading, training; /* the attempt's milestones, said once each */
    loom_failure_log *pending;       /* the previous failure, until a step is done after it */
    loom_failure_log *catching_up;   /* until the steps lost to the failure are redone */
    loom_link_watch links;
} watch_state;

/* How far every rank of the attempt has come. */
typedef enum {
    RANKS_BEATING, /* has beaten */
    RANKS_STARTED, /* past start-up: loading a checkpoint, or training */
    RANKS_TRAINING /* past start-up and loading */
} ranks_milestone;

static int all_ranks_reached(const loom_sup *s, ranks_milestone m) {
    int n = 0;
    for (int r = 0; r < s->world; r++) {
        const loom_rank_state *rs = &s->mon.ranks[r];
        n += rs->seen && (m == RANKS_BEATING || rs->beat.phase != LOOM_PHASE_INIT) &&
             (m != RANKS_TRAINING || rs->beat.phase != LOOM_PHASE_CKPT);
    }
    return n == s->world;
}

/* The milestones in events.jsonl: every rank beating, loading, training. */
static void note_milestones(loom_sup *s, watch_state *w, double now) {
    if (!w->all_seen && all_ranks_reached(s, RANKS_BEATING)) {
        w->all_seen = 1;
        loom_sup_event(s, "all_ranks_beating", "\"after_s\": %.3f", (now - w->launch_ms) * 1e-3);
    }
    if (!w->loading && all_ranks_reached(s, RANKS_STARTED)) {
        w->loading = 1;
        loom_sup_event(s, "loading", NULL);
    }
    if (!w->training && all_ranks_reached(s, RANKS_TRAINING)) {
        w->training = 1;
        loom_sup_event(s, "training", "\"steps_done\": %lld",
                       (long long)loom_monitor_step(&s->mon));
    }
}

/* The first step rs completed after a restart closes the previous failure's record. */
static void close_failure(loom_sup *s, watch_state *w, const loom_rank_state *rs, double now) {
    loom_failure_log *p = w->pending;
    p->recovered = 1;
    p->resumed_at = rs->beat.start_step;
    p->restart_ms = now - p->f.detected_ms;
    const long long replayed =
        (long long)(p->max_step > p->resumed_at ? p->max_step - p->resumed_at : 0);
    loom_sup_event(s, "first_step_after_restart",
                   "\"step\": %lld, \"recovery_s\": %.3f, \"replayed_steps\": %lld",
                   (long long)rs->hist_step[0], p->restart_ms * 1e-3, replayed);
    fprintf(stderr,
            "loom run: recovered: step %lld done %.1f s after the failure was "
            "detected (%lld step(s) to replay)\n",
            (long long)rs->hist_step[0], p->restart_ms * 1e-3, replayed);
    char source[1024];
    resume_source(s, w->attempt_dir, source, sizeof source);
    if (source[0]) {
        fprintf(stderr, "loom run: recovered from %s\n", source);
        loom_sup_event(s, "resume_source", "\"line\": \"%s\"", source);
    }
    w->catching_up = p;
    w->pending = NULL;
}

/* The previous failure's recovery: its first step done, then the lost steps redone. */
static void note_recovery(loom_sup *s, watch_state *w, double now) {
    for (int r = 0; w->pending && r < s->world; r++)
        if (s->mon.ranks[r].hist_n > 0) close_failure(s, w, &s->mon.ranks[r], now);
    if (w->catching_up && loom_monitor_step(&s->mon) > w->catching_up->max_step) {
        loom_sup_event(s, "caught_up", "\"step\": %lld", (long long)loom_monitor_step(&s->mon));
        w->catching_up = NULL;
    }
}

/* Losses first: a job that spiked and then finished is still rolled back. */
static loom_attempt_outcome check_losses(loom_sup *s, watch_state *w, int64_t step,
                                         loom_failure *f) {
    if (step <= w->spike_checked) return LOOM_ATTEMPT_RUNNING;
    if (loom_detect_loss_spike(&s->mon, s->cfg->loss_spike_factor, w->spike_checked, step, f)) {
        if (f->kind == LOOM_FAIL_SPIKE) spike_ranks(s, f);
        return LOOM_ATTEMPT_FAILED;
    }
    w->spike_checked = step;
    return LOOM_ATTEMPT_RUNNING;
}

/* A rank on this host that died: seen at once, before the launcher notices. */
static loom_attempt_outcome check_dead_rank(loom_sup *s, watch_state *w, double now,
                                            loom_failure *f) {
    const int dead = loom_detect_dead_rank(&s->mon, s->host);
    if (dead < 0) return LOOM_ATTEMPT_RUNNING;
    /* A rank that died can be the victim of another's error (MPI_Abort kills the job):
     * wait a moment for failure reports before calling it a crash. */
    if (w->dead_since < 0) w->dead_since = now;
    if (now - w->dead_since < 200 && !loom_launch_poll(w->l)) return LOOM_ATTEMPT_RUNNING;
    loom_monitor_drain(&s->mon, loom_now_ms());
    char log[LOOM_RUN_PATH + 32];
    loom_sup_launcher_log(w->attempt_dir, log, sizeof log);
    if (loom_detect_host_lost(&s->mon, log, f)) return LOOM_ATTEMPT_FAILED;
    if (!loom_detect_reported(&s->mon)) {
        /* The launcher may name the first rank killed (one on another host). */
        if (!loom_detect_launcher_crash(&s->mon, log, f)) loom_detect_crash(&s->mon, dead, f);
        return LOOM_ATTEMPT_FAILED;
    }
    loom_detect_exit(&s->mon, w->l->running ? 0 : w->l->status, log, f);
    return LOOM_ATTEMPT_FAILED;
}

/* The launcher ended: every step done, or a failure (its log and status say which). */
static loom_attempt_outcome check_launcher(loom_sup *s, watch_state *w, loom_failure *f) {
    if (!loom_launch_poll(w->l)) return LOOM_ATTEMPT_RUNNING;
    loom_monitor_drain(&s->mon, loom_now_ms());
    if (w->l->status == 0) return LOOM_ATTEMPT_FINISHED;
    char log[LOOM_RUN_PATH + 32];
    loom_sup_launcher_log(w->attempt_dir, log, sizeof log);
    if (!loom_detect_host_lost(&s->mon, log, f)) loom_detect_exit(&s->mon, w->l->status, log, f);
    return LOOM_ATTEMPT_FAILED;
}

/* A silent host that still answers on the network is not cut off: its processes are
 * gone (or frozen), the launcher has not said so yet. */
static void partition_or_lost(loom_sup *s, loom_failure *f) {
    if (!loom_host_answers(s->mon.ranks[f->culprits[0]].from)) return;
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

/* One silent rank on another host that does not answer on the network: its host is cut
 * off (its other ranks finished, or their last beats came just before the cut), and the
 * restart must wait for it like for a partition. */
static void silent_host_cut(loom_sup *s, loom_failure *f) {
    const loom_rank_state *rs =
        f->kind == LOOM_FAIL_HEARTBEAT && f->rank >= 0 ? &s->mon.ranks[f->rank] : NULL;
    if (rs && rs->from[0] && strcmp(rs->beat.host, s->host) && !loom_host_answers(rs->from)) {
        loom_failure g;
        if (loom_detect_host_cut(&s->mon, f->rank, loom_now_ms(), &g)) *f = g;
    }
}

/* Heartbeats and timeouts: a whole host silent, a hang, a silent rank, a stalled step. */
static loom_attempt_outcome check_timeouts(loom_sup *s, watch_state *w, double now,
                                           loom_failure *f) {
    const loom_run_config *c = s->cfg;
    const double hb_ms = c->heartbeat_timeout_s * 1e3;
    /* A whole host silent while the others beat: before the hang and silence rules,
     * which would blame one of its ranks (or a waiting rank) alone. */
    if (loom_detect_partition(&s->mon, now, hb_ms, f)) {
        partition_or_lost(s, f);
        return LOOM_ATTEMPT_FAILED;
    }
    if (now >= w->hangs_judged_from && loom_detect_hang(&s->mon, hb_ms, f))
        return LOOM_ATTEMPT_FAILED;
    if (loom_detect_silence(&s->mon, now, w->launch_ms, hb_ms, c->startup_timeout_s * 1e3, f)) {
        silent_host_cut(s, f);
        return LOOM_ATTEMPT_FAILED;
    }
    if (c->step_timeout_s > 0 && w->training &&
        loom_detect_stall(&s->mon, now, c->step_timeout_s * 1e3, f))
        return LOOM_ATTEMPT_FAILED;
    return LOOM_ATTEMPT_RUNNING;
}

/* Stragglers: judged once per step that every rank has reported. */
static void check_stragglers(loom_sup *s, watch_state *w) {
    int64_t common = INT64_MAX;
    for (int r = 0; r < s->world; r++) {
        const loom_rank_state *rs = &s->mon.ranks[r];
        int64_t last = rs->hist_n ? rs->hist_step[(rs->hist_n - 1) % LOOM_MONITOR_HISTORY] : 0;
        if (last < common) common = last;
    }
    if (common <= w->straggler_step) return;
    w->straggler_step = common;
    loom_straggler st[16];
    int n = loom_detect_stragglers(&s->mon, s->cfg->straggler_factor, st, 16);
    loom_error e;
    if (n && loom_stragglers_write(st, n, s->cfg->run_dir, s->attempt, &e))
        fprintf(stderr, "%s\n", e.msg);
    for (int i = 0; i < n; i++)
        loom_sup_event(s, "straggler", "\"rank\": %d, \"slowdown\": %.3f", st[i].rank,
                       st[i].slowdown);
}

/* A round comes every 50 ms or beat; one that came a second or more late means this
 * process was not scheduled (the machine paused, or starved it). The ranks' beats of that
 * time may never have been sent (they were paused too, and the first to resume are heard
 * first): silence during the gap is nobody's, so its clocks move on by the gap. The ranks'
 * own clocks of a wait in a collective counted the gap too: hangs are judged again one
 * heartbeat timeout later. Without this a healthy job restarts after the machine stalls. */
static void excuse_own_stall(loom_sup *s, watch_state *w, double now) {
    const double gap = now - w->last_round;
    w->last_round = now;
    if (gap < LOOM_STALL_MS) return;
    loom_monitor_excuse_gap(&s->mon, gap);
    w->launch_ms += gap;
    if (w->dead_since >= 0) w->dead_since += gap;
    w->hangs_judged_from = now + s->cfg->heartbeat_timeout_s * 1e3;
    fprintf(stderr,
            "loom run: this supervisor was not scheduled for %.1f s (the machine paused or "
            "starved it): the ranks' silence in that time is not counted, and hangs are judged "
            "again after %.0f s\n",
            gap * 1e-3, s->cfg->heartbeat_timeout_s);
    loom_sup_event(s, "supervisor_stall", "\"gap_s\": %.3f", gap * 1e-3);
}

/* The progress line: every tenth of the steps, or every 30 s. */
static void print_progress(loom_sup *s, watch_state *w, int64_t step, double now) {
    if (step < w->printed_step + w->print_every && (now - w->last_print <= 30e3 || step <= 0))
        return;
    double loss = step <= s->mon.max_steps ? s->mon.loss[step] : NAN;
    fprintf(stderr, "loom run: step %lld/%d loss %.4f (attempt %d, %d ranks)\n", (long long)step,
            s->job->steps, loss, s->attempt, s->world);
    w->printed_step = step;
    w->last_print = now;
}

/* A round every 50 ms or beat: drain the beats, note milestones and recovery, apply the
 * failure rules, then probe the links, judge stragglers, print progress. */
loom_attempt_outcome loom_sup_watch(loom_sup *s, loom_launch *l, const char *attempt_dir,
                                    loom_failure *f) {
    watch_state w = {.l = l, .attempt_dir = attempt_dir, .launch_ms = loom_now_ms()};
    w.last_print = w.last_round = w.launch_ms;
    w.dead_since = -1;
    w.pending = s->n_log && !s->log[s->n_log - 1].recovered ? &s->log[s->n_log - 1] : NULL;
    w.print_every = s->job->steps >= 10 ? s->job->steps / 10 : 1;
    struct pollfd pfd = {s->mon.fd, POLLIN, 0};
    for (;;) {
        poll(&pfd, 1, 50);
        const double now = loom_now_ms();
        excuse_own_stall(s, &w, now);
        loom_monitor_drain(&s->mon, now);
        if (*s->stop) return LOOM_ATTEMPT_INTERRUPTED;
        note_milestones(s, &w, now);
        note_recovery(s, &w, now);
        const int64_t step = loom_monitor_step(&s->mon);
        loom_attempt_outcome o = check_losses(s, &w, step, f);
        if (o == LOOM_ATTEMPT_RUNNING) o = check_dead_rank(s, &w, now, f);
        if (o == LOOM_ATTEMPT_RUNNING) o = check_launcher(s, &w, f);
        if (o == LOOM_ATTEMPT_RUNNING) o = check_timeouts(s, &w, now, f);
        if (o != LOOM_ATTEMPT_RUNNING) return o;
        if (w.training && s->hosts[0] && step > 0) watch_links(s, &w.links, now);
        check_stragglers(s, &w);
        print_progress(s, &w, step, now);
    }
}
