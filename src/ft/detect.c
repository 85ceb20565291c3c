#include "ft/detect.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/median.h"
#include "ft/launch.h"
#include "ft/launch_argv.h"

static const char *KINDS[LOOM_FAIL_KIND_COUNT] = {
    "none",           "crash",      "exit",    "heartbeat_lost", "hang",     "no_progress",
    "nonfinite_loss", "loss_spike", "startup", "host_lost",      "partition"};

const char *loom_fail_kind_name(loom_fail_kind k) {
    return k >= 0 && k < LOOM_FAIL_KIND_COUNT ? KINDS[k] : "unknown";
}

static void set_rank(loom_failure *f, const loom_monitor *m, int rank) {
    f->rank = rank;
    f->host[0] = 0;
    if (rank >= 0 && rank < m->world && m->ranks[rank].seen) {
        snprintf(f->host, sizeof f->host, "%s", m->ranks[rank].beat.host);
        f->step = m->ranks[rank].beat.steps_done + 1;
    }
}

/* Rank's instance of communicator `name`: the one whose rank 0 is world rank `first`
 * (any instance when first < 0). NULL when the rank has no such group. */
static const loom_beat_comm *find_comm(const loom_beat *b, const char *name, int first) {
    for (int i = 0; i < b->n_comms; i++)
        if (strcmp(b->comms[i].name, name) == 0 && (first < 0 || b->comms[i].group_first == first))
            return &b->comms[i];
    return NULL;
}

static int waits_somewhere(const loom_rank_state *s) {
    for (int i = 0; s->seen && i < s->beat.n_comms; i++)
        if (s->beat.comms[i].waiting_seq) return 1;
    return 0;
}

/* Members, waiting ranks and culprits of the collective w names (comm, group, seq). */
static void analyse_wait(const loom_monitor *m, loom_wait_record *w) {
    int unknown[LOOM_FAIL_LIST], n_unknown = 0;
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        const loom_beat_comm *c = s->seen ? find_comm(&s->beat, w->comm, w->comm_first) : NULL;
        if (!c) {
            /* Not seen, or never used this name: it may be a member. */
            if ((!s->seen || !find_comm(&s->beat, w->comm, -1)) && n_unknown < LOOM_FAIL_LIST)
                unknown[n_unknown++] = r;
            continue;
        }
        if (w->n_members < LOOM_FAIL_LIST) w->members[w->n_members++] = r;
        if (c->waiting_seq && w->n_waiting < LOOM_FAIL_LIST)
            w->waiting[w->n_waiting++] = r;
        else if (c->started < w->seq && w->n_culprits < LOOM_FAIL_LIST)
            w->culprits[w->n_culprits++] = r;
    }
    if (w->comm_first < 0 || w->n_members < w->comm_size)
        for (int i = 0; i < n_unknown && w->n_culprits < LOOM_FAIL_LIST; i++)
            w->culprits[w->n_culprits++] = unknown[i];
    int n = snprintf(w->group, sizeof w->group, "%s{", w->comm);
    for (int i = 0; i < w->n_members && n < (int)sizeof w->group - 16; i++)
        n += snprintf(w->group + n, sizeof w->group - n, "%s%d", i ? "," : "", w->members[i]);
    if (w->n_members < w->comm_size && n < (int)sizeof w->group - 8)
        n += snprintf(w->group + n, sizeof w->group - n, "%s...", w->n_members ? "," : "");
    snprintf(w->group + n, sizeof w->group - n, "}");
}

/* A culprit of w that is not itself waiting in some collective (-1: none). */
static int root_culprit(const loom_monitor *m, const loom_wait_record *w) {
    for (int i = 0; i < w->n_culprits; i++)
        if (!waits_somewhere(&m->ranks[w->culprits[i]])) return w->culprits[i];
    return -1;
}

int loom_detect_hang(const loom_monitor *m, double timeout_ms, loom_failure *f) {
    double longest = 0;
    for (int r = 0; r < m->world; r++)
        for (int i = 0; m->ranks[r].seen && i < m->ranks[r].beat.n_comms; i++) {
            const loom_beat_comm *c = &m->ranks[r].beat.comms[i];
            if (c->waiting_seq && c->waited_ms > longest) longest = c->waited_ms;
        }
    if (longest < timeout_ms) return 0;
    memset(f, 0, sizeof *f);
    f->kind = LOOM_FAIL_HANG;
    /* Every distinct collective waited in: (communicator instance, sequence number). */
    for (int r = 0; r < m->world; r++)
        for (int i = 0; m->ranks[r].seen && i < m->ranks[r].beat.n_comms; i++) {
            const loom_beat_comm *c = &m->ranks[r].beat.comms[i];
            if (!c->waiting_seq) continue;
            int k = 0;
            while (k < f->n_waits &&
                   !(strcmp(f->waits[k].comm, c->name) == 0 &&
                     f->waits[k].comm_first == c->group_first && f->waits[k].seq == c->waiting_seq))
                k++;
            if (k == f->n_waits) {
                if (k == LOOM_FAIL_WAITS) continue;
                loom_wait_record *w = &f->waits[f->n_waits++];
                snprintf(w->comm, sizeof w->comm, "%s", c->name);
                snprintf(w->op, sizeof w->op, "%s", c->waiting_op);
                w->comm_first = c->group_first;
                w->comm_size = c->group_size;
                w->seq = c->waiting_seq;
            }
            if (c->waited_ms * 1e-3 > f->waits[k].waited_s)
                f->waits[k].waited_s = c->waited_ms * 1e-3;
        }
    for (int k = 0; k < f->n_waits; k++) analyse_wait(m, &f->waits[k]);
    /* longest first (insertion sort: a few entries) */
    for (int i = 1; i < f->n_waits; i++)
        for (int j = i; j > 0 && f->waits[j].waited_s > f->waits[j - 1].waited_s; j--) {
            loom_wait_record t = f->waits[j];
            f->waits[j] = f->waits[j - 1];
            f->waits[j - 1] = t;
        }
    int pick = 0, root = -1;
    for (int k = 0; k < f->n_waits && root < 0; k++)
        if ((root = root_culprit(m, &f->waits[k])) >= 0) pick = k;
    const loom_wait_record *w = &f->waits[pick];
    f->hung = *w;
    snprintf(f->comm, sizeof f->comm, "%s", w->comm);
    snprintf(f->op, sizeof f->op, "%s", w->op);
    f->seq = w->seq;
    f->waited_s = w->waited_s;
    memcpy(f->culprits, w->culprits, sizeof f->culprits);
    f->n_culprits = w->n_culprits;
    memcpy(f->waiting, w->waiting, sizeof f->waiting);
    f->n_waiting = w->n_waiting;
    int who = root >= 0 ? root : w->n_culprits ? w->culprits[0] : w->n_waiting ? w->waiting[0] : -1;
    set_rank(f, m, who);
    if (w->n_culprits) {
        const loom_rank_state *s = &m->ranks[who];
        const loom_beat_comm *c = s->seen ? find_comm(&s->beat, w->comm, w->comm_first) : NULL;
        snprintf(f->detail, sizeof f->detail,
                 "%s #%llu on %s waited on for %.1f s by %d rank(s); rank %d never entered it "
                 "(its last operation on '%s' is #%llu, phase %s, step %lld)%s",
                 w->op, (unsigned long long)w->seq, w->group, w->waited_s, w->n_waiting, who,
                 w->comm, (unsigned long long)(c ? c->started : 0),
                 loom_phase_name((loom_phase)s->beat.phase), (long long)s->beat.steps_done + 1,
                 root < 0 ? " and waits in another collective itself (a cycle?)" : "");
    } else {
        snprintf(f->detail, sizeof f->detail,
                 "%s #%llu on %s waited on for %.1f s; every rank entered it (a stuck "
                 "transport?)",
                 w->op, (unsigned long long)w->seq, w->group, w->waited_s);
    }
    return 1;
}

int loom_detect_silence(const loom_monitor *m, double now_ms, double launch_ms, double timeout_ms,
                        double startup_ms, loom_failure *f) {
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        int finished =
            s->seen && (s->beat.phase == LOOM_PHASE_DONE || s->beat.phase == LOOM_PHASE_FAILED);
        if (finished) continue;
        if (s->seen && now_ms - s->last_beat_ms >= timeout_ms) {
            memset(f, 0, sizeof *f);
            f->kind = LOOM_FAIL_HEARTBEAT;
            set_rank(f, m, r);
            snprintf(f->detail, sizeof f->detail,
                     "no heartbeat from rank %d (pid %d on %s) for %.1f s; last seen in phase %s "
                     "after step %lld",
                     r, s->beat.pid, s->beat.host, (now_ms - s->last_beat_ms) * 1e-3,
                     loom_phase_name((loom_phase)s->beat.phase), (long long)s->beat.steps_done);
            return 1;
        }
        if (!s->seen && now_ms - launch_ms >= startup_ms) {
            memset(f, 0, sizeof *f);
            f->kind = LOOM_FAIL_STARTUP;
            f->rank = r;
            snprintf(f->detail, sizeof f->detail,
                     "rank %d sent no heartbeat within %.0f s of the launch", r, startup_ms * 1e-3);
            return 1;
        }
    }
    return 0;
}

int loom_detect_dead_rank(const loom_monitor *m, const char *host) {
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (!s->seen || strcmp(s->beat.host, host) != 0 || s->beat.phase == LOOM_PHASE_DONE ||
            s->beat.phase == LOOM_PHASE_FAILED)
            continue;
        if (loom_pid_dead(s->beat.pid)) return r;
    }
    return -1;
}

int loom_detect_reported(const loom_monitor *m) {
    int reported = 0;
    for (int r = 0; r < m->world; r++)
        reported |=
            m->ranks[r].beat.phase == LOOM_PHASE_FAILED || m->ranks[r].beat.nonfinite_step > 0;
    return reported;
}

void loom_detect_crash(const loom_monitor *m, int rank, loom_failure *f) {
    const loom_rank_state *s = &m->ranks[rank];
    memset(f, 0, sizeof *f);
    f->kind = LOOM_FAIL_CRASH;
    f->rank = rank;
    /* Its last beat may be older than its last step: no rank can be past the step the
     * dead one never finished. */
    f->step = loom_monitor_step(m) + 1;
    snprintf(f->host, sizeof f->host, "%s", s->beat.host);
    snprintf(f->detail, sizeof f->detail,
             "rank %d (pid %d on %s) died without a word (no error report) during step %lld", rank,
             s->beat.pid, s->beat.host, (long long)f->step);
}

int loom_detect_stall(const loom_monitor *m, double now_ms, double timeout_ms, loom_failure *f) {
    double latest = 0;
    for (int r = 0; r < m->world; r++)
        if (m->ranks[r].steps_changed_ms > latest) latest = m->ranks[r].steps_changed_ms;
    if (now_ms - latest < timeout_ms) return 0;
    memset(f, 0, sizeof *f);
    f->kind = LOOM_FAIL_STALL;
    f->rank = -1;
    f->step = loom_monitor_step(m) + 1;
    snprintf(f->detail, sizeof f->detail,
             "no rank completed a step for %.0f s (none is waiting in a collective)",
             timeout_ms * 1e-3);
    return 1;
}

int loom_detect_spike_ranks(const loom_monitor *m, double factor, loom_failure *f) {
    const int64_t s = f->step;
    f->n_culprits = 0;
    double ratio[LOOM_FAIL_LIST];
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *rs = &m->ranks[r];
        double own = NAN, prev[10];
        int n = 0;
        for (int i = 0; i < rs->hist_n && i < LOOM_MONITOR_HISTORY; i++) {
            int k = (rs->hist_n - 1 - i) % LOOM_MONITOR_HISTORY;
            if (rs->hist_step[k] == s) own = rs->hist_local_loss[k];
            if (rs->hist_step[k] < s && rs->hist_step[k] >= s - 10 &&
                isfinite(rs->hist_local_loss[k]) && n < 10)
                prev[n++] = rs->hist_local_loss[k];
        }
        if (!isfinite(own) || n < 5) continue;
        double base = loom_median(prev, n);
        if (!(base > 0) || !(own > factor * base) || f->n_culprits == LOOM_FAIL_LIST) continue;
        int i = f->n_culprits++;
        for (; i > 0 && ratio[i - 1] < own / base; i--) { /* insertion: largest first */
            f->culprits[i] = f->culprits[i - 1];
            ratio[i] = ratio[i - 1];
        }
        f->culprits[i] = r;
        ratio[i] = own / base;
        if (i == 0) {
            f->rank_loss = own;
            f->rank_baseline = base;
        }
    }
    size_t len = strlen(f->detail);
    if (f->n_culprits && len < sizeof f->detail)
        snprintf(f->detail + len, sizeof f->detail - len,
                 "; rank %d's own loss %.4f is %.1fx its median %.4f (its slice of the batch)",
                 f->culprits[0], f->rank_loss, f->rank_loss / f->rank_baseline, f->rank_baseline);
    return f->n_culprits;
}

int loom_detect_loss_spike(const loom_monitor *m, double factor, int64_t from, int64_t to,
                           loom_failure *f) {
    if (to > m->max_steps) to = m->max_steps;
    for (int64_t s = from + 1; s <= to; s++) {
        double loss = m->loss[s];
        if (isnan(loss)) continue; /* not seen (a NaN loss stops the trainer first) */
        double prev[10];
        int n = 0;
        for (int64_t k = s - 1; k >= 1 && k >= s - 10; k--)
            if (isfinite(m->loss[k])) prev[n++] = m->loss[k];
        int bad = !isfinite(loss);
        double base = n ? loom_median(prev, n) : NAN;
        if (!bad && factor > 0 && n >= 5 && loss > factor * base) bad = 1;
        if (!bad) continue;
        memset(f, 0, sizeof *f);
        f->kind = isfinite(loss) ? LOOM_FAIL_SPIKE : LOOM_FAIL_NONFINITE;
        f->rank = -1;
        f->step = s;
        f->loss = loss;
        f->baseline_loss = base;
        snprintf(f->detail, sizeof f->detail,
                 "loss %.4f at step %lld is %.1fx the median %.4f of the %d steps before; the "
                 "loss is global (the mean over every rank's slice of the batch), so no rank "
                 "failed",
                 loss, (long long)s, loss / base, base, n);
        return 1;
    }
    return 0;
}

int loom_detect_stragglers(loom_monitor *m, double factor, loom_straggler *out, int max) {
    enum { W = 8 };
    double med[m->world > 0 ? m->world : 1], blk[m->world > 0 ? m->world : 1];
    int have = 0;
    for (int r = 0; r < m->world; r++) {
        loom_rank_state *s = &m->ranks[r];
        med[r] = blk[r] = NAN;
        if (s->hist_n < W) continue;
        double v[W], b[W];
        for (int i = 0; i < W; i++) {
            v[i] = s->hist_compute[(s->hist_n - 1 - i) % LOOM_MONITOR_HISTORY];
            b[i] = s->hist_blocked[(s->hist_n - 1 - i) % LOOM_MONITOR_HISTORY];
        }
        med[r] = loom_median(v, W);
        blk[r] = loom_median(b, W);
        have++;
    }
    int found = 0;
    if (have < 2) return 0;
    for (int r = 0; r < m->world; r++) {
        loom_rank_state *s = &m->ranks[r];
        if (isnan(med[r])) continue;
        /* The job's typical rank: the median over all ranks (one slow rank cannot move
         * it; with two ranks, the other one). */
        double others[m->world], others_blk[m->world];
        int n = 0;
        for (int q = 0; q < m->world; q++)
            if ((q != r || have >= 3) && !isnan(med[q])) {
                others_blk[n] = blk[q];
                others[n++] = med[q];
            }
        double base = loom_median(others, n), base_blk = loom_median(others_blk, n);
        /* A floor of 2 ms keeps scheduler noise on tiny steps from counting. */
        /* Out of line for W steps, counted in steps, not in checks: the supervisor
         * checks when every rank has reported a new step, which can be every few
         * steps when steps are short or the machine is busy. */
        const int64_t step = s->hist_step[(s->hist_n - 1) % LOOM_MONITOR_HISTORY];
        if (base > 0 && med[r] > factor * base && med[r] - base > 2.0 &&
            (have >= 3 || blk[r] < base_blk)) {
            if (!s->straggler_since) s->straggler_since = step;
        } else {
            s->straggler_since = 0;
        }
        if (s->straggler_since && step - s->straggler_since + 1 >= W && !s->straggler_reported &&
            found < max) {
            s->straggler_reported = 1;
            loom_straggler *o = &out[found++];
            o->rank = r;
            snprintf(o->host, sizeof o->host, "%s", s->beat.host);
            o->compute_ms = med[r];
            o->others_ms = base;
            o->slowdown = base > 0 ? med[r] / base : INFINITY;
            o->blocked_ms = blk[r];
            o->others_blocked_ms = base_blk;
        }
    }
    return found;
}

/* "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed)." */
static int launcher_says(const char *log, int *rank, int *sig, char *host, size_t host_size) {
    FILE *fp = fopen(log, "r");
    if (!fp) return 0;
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, fp)) {
        const char *p = strstr(line, "process rank ");
        int r, pid, s;
        char node[64];
        if (p && sscanf(p, "process rank %d with PID %d on node %63s exited on signal %d", &r, &pid,
                        node, &s) == 4) {
            *rank = r;
            *sig = s;
            snprintf(host, host_size, "%s", node);
            found = 1;
            break;
        }
        /* srun: "srun: error: NODE: task R: Killed" ("tasks R-S: ..." for several), the
         * signal's description; "Exited with exit code N" is no signal. */
        int at = 0;
        if (sscanf(line, "srun: error: %63[^:]: task%*[s] %d%*[^:]: %n", node, &r, &at) == 2 ||
            sscanf(line, "srun: error: %63[^:]: task %d: %n", node, &r, &at) == 2) {
            if (!at) continue;
            char what[128];
            snprintf(what, sizeof what, "%s", line + at);
            what[strcspn(what, "\n")] = 0;
            for (s = 1; s < 65; s++)
                if (strsignal(s) && !strcmp(strsignal(s), what)) break;
            if (s == 65) continue;
            *rank = r;
            *sig = s;
            snprintf(host, host_size, "%s", node);
            found = 1;
            break;
        }
    }
    fclose(fp);
    return found;
}

/* srun: "slurmstepd-NODE: error: execve(): PATH: WHY" (older Slurm: "slurmstepd: ..."). */
static int execve_failed(const char *log, loom_not_started *out) {
    FILE *fp = fopen(log, "r");
    if (!fp) return 0;
    char line[2048];
    int found = 0;
    while (!found && fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        char *at = strstr(line, "error: execve(): ");
        char *why = at ? strrchr(at, ':') : NULL;
        if (!at || strncmp(line, "slurmstepd", 10) || why <= at + 16) continue;
        *why = 0;
        snprintf(out->path, sizeof out->path, "%s", at + 17);
        snprintf(out->why, sizeof out->why, "%s", why + 1 + (why[1] == ' '));
        out->why[0] = (char)tolower((unsigned char)out->why[0]);
        const char *node = line[10] == '-' ? line + 11 : "?";
        snprintf(out->node, sizeof out->node, "%.*s", (int)strcspn(node, ":"), node);
        found = 1;
    }
    fclose(fp);
    return found;
}

/* mpirun: "... could not access\nor execute an executable:\n\nExecutable: PATH\nNode: NODE
 * \n\nwhile attempting to start process rank R." */
static int mpirun_not_started(const char *log, loom_not_started *out) {
    FILE *fp = fopen(log, "r");
    if (!fp) return 0;
    char line[2048];
    int seen = 0, found = 0;
    while (!found && fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        if (strstr(line, "could not access")) seen = 1;
        if (!seen) continue;
        if (!strncmp(line, "Executable: ", 12))
            snprintf(out->path, sizeof out->path, "%s", line + 12);
        else if (!strncmp(line, "Node: ", 6))
            snprintf(out->node, sizeof out->node, "%s", line + 6);
        else if (sscanf(line, "while attempting to start process rank %d", &out->rank) == 1)
            found = out->path[0] != 0;
    }
    fclose(fp);
    return found;
}

int loom_detect_not_started(const char *launcher, const char *attempt_dir, int world,
                            loom_not_started *out) {
    memset(out, 0, sizeof *out);
    char log[2048];
    if (strcmp(launcher, "srun") != 0) {
        snprintf(log, sizeof log, "%s/launcher.log", attempt_dir);
        return mpirun_not_started(log, out);
    }
    for (int r = 0; r < world; r++) {
        loom_launch_rank_log(launcher, attempt_dir, r, log, sizeof log);
        if (execve_failed(log, out)) {
            out->rank = r;
            return 1;
        }
    }
    return 0;
}

int loom_detect_launcher_crash(const loom_monitor *m, const char *launcher_log, loom_failure *f) {
    int rank, sig;
    char host[64];
    if (!launcher_says(launcher_log, &rank, &sig, host, sizeof host)) return 0;
    memset(f, 0, sizeof *f);
    f->kind = LOOM_FAIL_CRASH;
    set_rank(f, m, rank);
    f->step = loom_monitor_step(m) + 1;
    if (!f->host[0]) snprintf(f->host, sizeof f->host, "%s", host);
    snprintf(f->detail, sizeof f->detail, "rank %d on %s was killed by signal %d (%s)", rank,
             f->host, sig, strsignal(sig));
    return 1;
}

void loom_detect_exit(const loom_monitor *m, int exit_status, const char *launcher_log,
                      loom_failure *f) {
    memset(f, 0, sizeof *f);
    f->exit_status = exit_status;
    f->rank = -1;
    /* A rank that saw its own loss become non-finite. */
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (s->seen && s->beat.nonfinite_step > 0) {
            if (f->kind != LOOM_FAIL_NONFINITE) {
                f->kind = LOOM_FAIL_NONFINITE;
                set_rank(f, m, r);
                f->step = s->beat.nonfinite_step;
            }
            if (f->n_culprits < LOOM_FAIL_LIST) f->culprits[f->n_culprits++] = r;
        }
    }
    if (f->kind == LOOM_FAIL_NONFINITE) {
        snprintf(f->detail, sizeof f->detail,
                 "the loss of step %lld became non-finite on rank %d (%d rank(s) saw it first)",
                 (long long)f->step, f->rank, f->n_culprits);
        f->loss = NAN;
        return;
    }
    int rank, sig;
    char host[64];
    if (launcher_says(launcher_log, &rank, &sig, host, sizeof host)) {
        f->kind = LOOM_FAIL_CRASH;
        set_rank(f, m, rank);
        if (!f->host[0]) snprintf(f->host, sizeof f->host, "%s", host);
        snprintf(f->detail, sizeof f->detail, "rank %d was killed by signal %d (%s)", rank, sig,
                 strsignal(sig));
        return;
    }
    f->kind = LOOM_FAIL_EXIT;
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (s->seen && s->beat.phase == LOOM_PHASE_FAILED) {
            set_rank(f, m, r);
            snprintf(f->detail, sizeof f->detail, "rank %d failed: %s", r, s->beat.msg);
            return;
        }
    }
    snprintf(f->detail, sizeof f->detail, "the launcher exited with status %d", exit_status);
}

int loom_detect_host_ranks(const loom_monitor *m, const char *host, int *ranks, int max) {
    int n = 0;
    for (int r = 0; r < m->world && n < max; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (s->seen && (!strcmp(s->beat.host, host) || !strcmp(s->from, host))) ranks[n++] = r;
    }
    return n;
}

/* "2-3" / "0,2,5": a sorted rank list, ranges joined. */
static void ranks_text(const int *ranks, int n, char *out, size_t size) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n && k + 16 < size; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        k += (size_t)snprintf(out + k, size - k, j > i ? "%s%d-%d" : "%s%d", k ? "," : "", ranks[i],
                              ranks[j]);
        i = j;
    }
}

/* The other hosts and their ranks, "loomh1 (ranks 0-1), ...", for the ranks not in skip. */
static void others_text(const loom_monitor *m, const char *skip_host, char *out, size_t size) {
    size_t k = 0;
    out[0] = 0;
    int done[LOOM_FAIL_LIST] = {0};
    for (int r = 0; r < m->world && r < LOOM_FAIL_LIST; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (!s->seen || done[r] || !strcmp(s->beat.host, skip_host)) continue;
        int list[LOOM_FAIL_LIST], n = 0;
        for (int q = r; q < m->world && q < LOOM_FAIL_LIST; q++)
            if (m->ranks[q].seen && !strcmp(m->ranks[q].beat.host, s->beat.host)) {
                list[n++] = q;
                done[q] = 1;
            }
        char rt[256];
        ranks_text(list, n, rt, sizeof rt);
        if (k + strlen(rt) + strlen(s->beat.host) + 16 < size)
            k += (size_t)snprintf(out + k, size - k, "%s%s (rank%s %s)", k ? ", " : "",
                                  s->beat.host, n > 1 ? "s" : "", rt);
    }
    if (!k) snprintf(out, size, "no other host");
}

static void host_failure(const loom_monitor *m, loom_fail_kind kind, const char *host,
                         const int *ranks, int n, loom_failure *f) {
    memset(f, 0, sizeof *f);
    f->kind = kind;
    set_rank(f, m, ranks[0]);
    f->step = loom_monitor_step(m) + 1;
    for (int i = 0; i < n && i < LOOM_FAIL_LIST; i++) f->culprits[f->n_culprits++] = ranks[i];
    if (!f->host[0]) snprintf(f->host, sizeof f->host, "%s", host);
}

int loom_detect_host_lost(const loom_monitor *m, const char *launcher_log, loom_failure *f) {
    FILE *fp = fopen(launcher_log, "r");
    if (!fp) return 0;
    char line[1024], node[256] = "";
    int lost = 0;
    while (fgets(line, sizeof line, fp) && !node[0]) {
        if (strstr(line, "lost communication with a remote daemon")) lost = 1;
        const char *p = strstr(line, "Remote daemon:");
        const char *on = p ? strstr(p, " on node ") : NULL;
        if (lost && on && sscanf(on, " on node %255s", node) != 1) node[0] = 0;
    }
    fclose(fp);
    if (!node[0]) return 0;
    int ranks[LOOM_FAIL_LIST];
    const int n = loom_detect_host_ranks(m, node, ranks, LOOM_FAIL_LIST);
    if (!n) return 0;
    host_failure(m, LOOM_FAIL_HOST, node, ranks, n, f);
    char rt[256], others[512];
    ranks_text(ranks, n, rt, sizeof rt);
    others_text(m, f->host, others, sizeof others);
    snprintf(f->detail, sizeof f->detail,
             "host %s (%s) lost: mpirun lost its daemon there; rank%s %s ran on it; the job "
             "also ran on %s",
             f->host, node, n > 1 ? "s" : "", rt, others);
    return 1;
}

/* Fills f with a partition of `host` (its ranks as culprits, the longest silence of its
 * ranks, the hosts still heard); 0 when no rank is on it. */
static int partition_of(const loom_monitor *m, const char *host, double now_ms, loom_failure *f) {
    int ranks[LOOM_FAIL_LIST];
    const int n = loom_detect_host_ranks(m, host, ranks, LOOM_FAIL_LIST);
    if (!n) return 0;
    host_failure(m, LOOM_FAIL_PARTITION, host, ranks, n, f);
    double quiet = 0; /* the longest silence of its ranks */
    for (int i = 0; i < n; i++) {
        const double q = now_ms - m->ranks[ranks[i]].last_beat_ms;
        if (q > quiet) quiet = q;
    }
    char rt[256], others[512];
    ranks_text(ranks, n, rt, sizeof rt);
    others_text(m, host, others, sizeof others);
    snprintf(f->detail, sizeof f->detail,
             "host %s (%s, rank%s %s) cut off: no heartbeat from any of its ranks for %.1f s; "
             "still heard: %s",
             host, m->ranks[ranks[0]].from[0] ? m->ranks[ranks[0]].from : "?", n > 1 ? "s" : "", rt,
             quiet * 1e-3, others);
    return 1;
}

static int finished(const loom_rank_state *s) {
    return s->beat.phase == LOOM_PHASE_DONE;
}

int loom_detect_partition(const loom_monitor *m, double now_ms, double silent_ms, loom_failure *f) {
    const char *silent_host = NULL;
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (!s->seen) return 0;                           /* start-up: the silence rules judge it */
        if (s->beat.phase == LOOM_PHASE_FAILED) return 0; /* the exit rules judge it */
    }
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (finished(s)) continue;
        /* One rank of the host silent for the full timeout, every one of it that has not
         * finished for half of it (its ranks' last beats are up to a beat interval apart),
         * another host heard within half of it or finished (its last word arrived; a rank
         * that finished sends no more beats): judged at the moment the single-rank silence
         * rule would fire. A job near its end has ranks that finished while the others
         * still save: that is no reason to blame one rank of a silent host alone. */
        int all_silent = 1, one_silent = 0, others_heard = 0;
        for (int q = 0; q < m->world; q++) {
            const loom_rank_state *o = &m->ranks[q];
            const double quiet = now_ms - o->last_beat_ms;
            if (!strcmp(o->beat.host, s->beat.host)) {
                if (finished(o)) continue;
                all_silent &= quiet >= silent_ms / 2;
                one_silent |= quiet >= silent_ms;
            } else
                others_heard |= finished(o) || quiet < silent_ms / 2;
        }
        if (all_silent && one_silent && others_heard) {
            if (silent_host && strcmp(silent_host, s->beat.host)) return 0; /* two: not one */
            silent_host = s->beat.host;
        }
    }
    return silent_host && partition_of(m, silent_host, now_ms, f);
}

int loom_detect_host_cut(const loom_monitor *m, int rank, double now_ms, loom_failure *f) {
    if (rank < 0 || rank >= m->world || !m->ranks[rank].seen) return 0;
    return partition_of(m, m->ranks[rank].beat.host, now_ms, f);
}

int loom_detect_slow_link(const loom_monitor *m, loom_link_probe *p, int n, double factor,
                          loom_slow_link *out) {
    enum { W = LOOM_LINK_WINDOW, STEPS = 4 };
    double med[n > 0 ? n : 1];
    int worst = -1;
    for (int i = 0; i < n; i++) {
        med[i] = NAN;
        if (p[i].n < W) continue;
        double v[W];
        for (int k = 0; k < W; k++) v[k] = p[i].rtt_ms[(p[i].n - 1 - k) % LOOM_LINK_SAMPLES];
        med[i] = loom_median(v, W);
        if (worst < 0 || med[i] > med[worst]) worst = i;
    }
    if (worst < 0 || p[worst].reported || med[worst] < 5.0) return 0;
    double others = -1;
    for (int i = 0; i < n; i++)
        if (i != worst && !isnan(med[i]) && med[i] > others) others = med[i];
    if (others < 0 || med[worst] < factor * (others > 0.5 ? others : 0.5)) return 0;
    /* The job waits on communication: the median rank's waiting and computing per step. */
    double blk[m->world > 0 ? m->world : 1], cmp[m->world > 0 ? m->world : 1];
    int have = 0;
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (!s->seen || s->hist_n < STEPS) continue;
        double b[STEPS], c[STEPS];
        for (int k = 0; k < STEPS; k++) {
            b[k] = s->hist_blocked[(s->hist_n - 1 - k) % LOOM_MONITOR_HISTORY];
            c[k] = s->hist_compute[(s->hist_n - 1 - k) % LOOM_MONITOR_HISTORY];
        }
        blk[have] = loom_median(b, STEPS);
        cmp[have++] = loom_median(c, STEPS);
    }
    if (!have) return 0;
    const double blocked = loom_median(blk, have), compute = loom_median(cmp, have);
    if (!(blocked > compute)) return 0;
    int ranks[LOOM_FAIL_LIST];
    int nr = loom_detect_host_ranks(m, p[worst].addr, ranks, LOOM_FAIL_LIST);
    if (!nr) nr = loom_detect_host_ranks(m, p[worst].host, ranks, LOOM_FAIL_LIST);
    if (!nr) return 0;
    memset(out, 0, sizeof *out);
    snprintf(out->host, sizeof out->host, "%s", m->ranks[ranks[0]].beat.host);
    snprintf(out->addr, sizeof out->addr, "%s", p[worst].addr);
    for (int i = 0, k = 0; i < nr && k + 16 < (int)sizeof out->ranks; i++)
        k += snprintf(out->ranks + k, sizeof out->ranks - k, "%s%d", i ? "," : "", ranks[i]);
    others_text(m, out->host, out->others, sizeof out->others);
    out->rtt_ms = med[worst];
    out->others_rtt_ms = others;
    out->blocked_ms = blocked;
    out->compute_ms = compute;
    p[worst].reported = 1;
    return 1;
}
