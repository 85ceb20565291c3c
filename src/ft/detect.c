#include "ft/detect.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *KINDS[LOOM_FAIL_KIND_COUNT] = {"none",           "crash",      "exit",
                                                  "heartbeat_lost", "hang",       "no_progress",
                                                  "nonfinite_loss", "loss_spike", "startup"};

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

static const loom_beat_comm *find_comm(const loom_beat *b, const char *name) {
    for (int i = 0; i < b->n_comms; i++)
        if (strcmp(b->comms[i].name, name) == 0) return &b->comms[i];
    return NULL;
}

int loom_detect_hang(const loom_monitor *m, double timeout_ms, loom_failure *f) {
    int who = -1;
    const loom_beat_comm *worst = NULL;
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        if (!s->seen) continue;
        for (int i = 0; i < s->beat.n_comms; i++) {
            const loom_beat_comm *c = &s->beat.comms[i];
            if (c->waiting_seq && c->waited_ms >= timeout_ms &&
                (!worst || c->waited_ms > worst->waited_ms)) {
                worst = c;
                who = r;
            }
        }
    }
    if (!worst) return 0;
    memset(f, 0, sizeof *f);
    f->kind = LOOM_FAIL_HANG;
    snprintf(f->comm, sizeof f->comm, "%s", worst->name);
    snprintf(f->op, sizeof f->op, "%s", worst->waiting_op);
    f->seq = worst->waiting_seq;
    f->waited_s = worst->waited_ms * 1e-3;
    /* Culprits: ranks of that communicator that never started the operation. */
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *s = &m->ranks[r];
        const loom_beat_comm *c = s->seen ? find_comm(&s->beat, f->comm) : NULL;
        if (c && c->waiting_seq && f->n_waiting < LOOM_FAIL_LIST)
            f->waiting[f->n_waiting++] = r;
        else if ((!c || c->started < f->seq) && f->n_culprits < LOOM_FAIL_LIST)
            f->culprits[f->n_culprits++] = r;
    }
    set_rank(f, m, f->n_culprits ? f->culprits[0] : who);
    if (f->n_culprits) {
        const loom_rank_state *s = &m->ranks[f->culprits[0]];
        const loom_beat_comm *c = find_comm(&s->beat, f->comm);
        snprintf(f->detail, sizeof f->detail,
                 "%s #%llu on '%s' waited on for %.1f s by %d rank(s); rank %d never entered it "
                 "(its last operation on '%s' is #%llu, phase %s, step %lld)",
                 f->op, (unsigned long long)f->seq, f->comm, f->waited_s, f->n_waiting,
                 f->culprits[0], f->comm, (unsigned long long)(c ? c->started : 0),
                 loom_phase_name((loom_phase)s->beat.phase), (long long)s->beat.steps_done + 1);
    } else {
        snprintf(f->detail, sizeof f->detail,
                 "%s #%llu on '%s' waited on for %.1f s; every rank entered it (a stuck "
                 "transport?)",
                 f->op, (unsigned long long)f->seq, f->comm, f->waited_s);
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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
        double base = n ? median(prev, n) : NAN;
        if (!bad && factor > 0 && n >= 5 && loss > factor * base) bad = 1;
        if (!bad) continue;
        memset(f, 0, sizeof *f);
        f->kind = isfinite(loss) ? LOOM_FAIL_SPIKE : LOOM_FAIL_NONFINITE;
        f->rank = -1;
        f->step = s;
        f->loss = loss;
        f->baseline_loss = base;
        snprintf(f->detail, sizeof f->detail,
                 "loss %.4f at step %lld is %.1fx the median %.4f of the %d steps before", loss,
                 (long long)s, loss / base, base, n);
        return 1;
    }
    return 0;
}

int loom_detect_stragglers(loom_monitor *m, double factor, loom_straggler *out, int max) {
    enum { W = 8 };
    double med[m->world > 0 ? m->world : 1];
    int have = 0;
    for (int r = 0; r < m->world; r++) {
        loom_rank_state *s = &m->ranks[r];
        med[r] = NAN;
        if (s->hist_n < W) continue;
        double v[W];
        for (int i = 0; i < W; i++)
            v[i] = s->hist_compute[(s->hist_n - 1 - i) % LOOM_MONITOR_HISTORY];
        med[r] = median(v, W);
        have++;
    }
    int found = 0;
    if (have < 2) return 0;
    for (int r = 0; r < m->world; r++) {
        loom_rank_state *s = &m->ranks[r];
        if (isnan(med[r])) continue;
        /* The job's typical rank: the median over all ranks (one slow rank cannot move
         * it; with two ranks, the other one). */
        double others[m->world];
        int n = 0;
        for (int q = 0; q < m->world; q++)
            if ((q != r || have >= 3) && !isnan(med[q])) others[n++] = med[q];
        double base = median(others, n);
        /* A floor of 2 ms keeps scheduler noise on tiny steps from counting. */
        if (base > 0 && med[r] > factor * base && med[r] - base > 2.0)
            s->straggler_hits++;
        else
            s->straggler_hits = 0;
        if (s->straggler_hits >= 8 && !s->straggler_reported && found < max) {
            s->straggler_reported = 1;
            loom_straggler *o = &out[found++];
            o->rank = r;
            snprintf(o->host, sizeof o->host, "%s", s->beat.host);
            o->compute_ms = med[r];
            o->others_ms = base;
            o->slowdown = base > 0 ? med[r] / base : INFINITY;
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
    }
    fclose(fp);
    return found;
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
