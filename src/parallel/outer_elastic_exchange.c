/* Elastic DiLoCo workers, between the workers' leads (parallel/outer_elastic_impl.h):
 * names through the ompi-server, the coordinator's admission of joiners, and the exchange
 * of a vector for the members' mean through the coordinator, with deadlines. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fault.h"
#include "core/timeline.h"
#include "parallel/outer_elastic_impl.h"

/* Worker's k-th name: loom-elastic-wI, loom-elastic-wI.1, ... */
static void service_of(int worker, int k, char *name, size_t n) {
    if (k)
        snprintf(name, n, "loom-elastic-w%d.%d", worker, k);
    else
        snprintf(name, n, "loom-elastic-w%d", worker);
}

#define ALIVE_TAG " alive="

/* A published value "PORT alive=ENDPOINT" split: port into port (its own buffer), the
 * endpoint returned (NULL: a value without one, connected to as it is). */
static const char *split_value(const char *value, char port[MPI_MAX_PORT_NAME]) {
    snprintf(port, MPI_MAX_PORT_NAME, "%s", value);
    char *tag = strstr(port, ALIVE_TAG);
    if (!tag) return NULL;
    *tag = 0;
    return value + (tag - port) + strlen(ALIVE_TAG);
}

loom_status loom_elastic_publish(elastic *e, char name[64], char port[MPI_MAX_PORT_NAME],
                                 loom_error *err) {
    /* with the supervisor's "started" line and the next one: where a slow join's time went */
    char who[32];
    snprintf(who, sizeof who, "elastic: worker %d", e->me);
    loom_timeline_print_so_far(stderr, who);
    fprintf(stderr, "loom: elastic: worker %d publishing its name (at %.3f)\n", e->me,
            loom_wall_s());
    loom_status st = loom_liveness_open(&e->alive, err);
    if (st) return st;
    if (MPI_Open_port(MPI_INFO_NULL, port) != MPI_SUCCESS) {
        loom_liveness_close(&e->alive);
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker %d: MPI_Open_port failed", e->me);
    }
    snprintf(e->published, sizeof e->published, "%s" ALIVE_TAG "%s", port, e->alive.endpoint);
    /* the first of this worker's names that nobody alive holds: a predecessor killed
     * while it waited to be admitted left its name, which nobody can withdraw */
    for (int k = 0; k < MAX_NAMES; k++) {
        char held[MPI_MAX_PORT_NAME], its_port[MPI_MAX_PORT_NAME];
        service_of(e->me, k, name, 64);
        if (MPI_Lookup_name(name, MPI_INFO_NULL, held) == MPI_SUCCESS) {
            const char *endpoint = split_value(held, its_port);
            if (!endpoint || loom_liveness_probe(endpoint, LIVENESS_TIMEOUT_MS)) {
                st = loom_error_set(err, LOOM_ERR_STATE,
                                    "--elastic-worker %d: its name %s is published by a process "
                                    "that is alive (%s): is worker %d running twice?",
                                    e->me, name, endpoint ? endpoint : "no liveness endpoint",
                                    e->me);
                break;
            }
            fprintf(stderr,
                    "loom: elastic: worker %d: %s is held by a process that is gone (%s): "
                    "trying the next name\n",
                    e->me, name, endpoint);
            continue;
        }
        if (MPI_Publish_name(name, MPI_INFO_NULL, e->published) == MPI_SUCCESS) return LOOM_OK;
        st = loom_error_set(err, LOOM_ERR_IO,
                            "--elastic-worker %d: publishing %s failed (every worker's mpirun "
                            "needs --ompi-server: docs/diloco.md)",
                            e->me, name);
        break;
    }
    if (!st)
        st = loom_error_set(err, LOOM_ERR_STATE,
                            "--elastic-worker %d: its %d names are all held by processes that "
                            "are gone (restart the run's ompi-server: docs/diloco.md)",
                            e->me, MAX_NAMES);
    MPI_Close_port(port);
    loom_liveness_close(&e->alive);
    return st;
}

void loom_elastic_withdraw(elastic *e, const char *name, const char *port) {
    MPI_Unpublish_name(name, MPI_INFO_NULL, e->published);
    MPI_Close_port(port);
    loom_liveness_close(&e->alive);
}

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The round-start parameters' hash: the log lines' check that members agree. */
static unsigned long long checksum(const float *x, size_t n) {
    return (unsigned long long)fnv1a(x, n * sizeof(float));
}

static int members_text(const elastic *e, char *buf, size_t n) {
    int count = 0;
    size_t at = 0;
    buf[0] = 0;
    for (int w = 0; w < e->W; w++)
        if (e->member[w]) {
            at += (size_t)snprintf(buf + at, at < n ? n - at : 0, "%s%d", count ? "," : "", w);
            count++;
        }
    return count;
}

static void head_fill(const elastic *e, msg_head *h, msg_kind kind, int step) {
    memset(h, 0, sizeof *h);
    h->kind = kind, h->step = step, h->part = e->part, h->from = e->me;
    for (int w = 0; w < e->W; w++)
        if (e->member[w]) h->members[h->n_members++] = w;
}

unsigned char *loom_elastic_in_buf(elastic *e, int w) {
    if (!e->in[w]) e->in[w] = malloc(e->msg_bytes);
    return e->in[w];
}

/* A peer lost: its intercommunicator and requests are abandoned, never freed (freeing
 * waits for the dead peer), and so is its receive buffer (a late message may land in it). */
static void abandon(elastic *e, int w) {
    e->peer[w] = MPI_COMM_NULL;
    e->member[w] = 0;
    e->in[w] = NULL;
}

/* Polls n exchanges (requests rq[2 i], rq[2 i + 1]; MPI_REQUEST_NULL allowed) until all are
 * done or failed, or the deadline passes (the pending ones then stay EX_PENDING). The time
 * this process was not scheduled does not count against the peer: after a whole machine
 * paused, the first process to wake would otherwise drop peers that had no chance to run. */
void loom_elastic_poll(MPI_Request *rq, int n, ex_state *st, double timeout_ms) {
    double last = loom_now_ms(), until = last + timeout_ms;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (st[i] != EX_PENDING) continue;
            int flag = 0;
            if (MPI_Testall(2, rq + 2 * i, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
                st[i] = EX_FAILED;
            else if (flag)
                st[i] = EX_DONE;
            else
                pending++;
        }
        const double now = loom_now_ms();
        if (now - last >= LOOM_STALL_MS) until += now - last;
        last = now;
        if (!pending || now > until) return;
        usleep(500);
    }
}

/* The bytes the exchanges sent (answer, ask: e->sent) into this step's count. */
void loom_elastic_take_sent(loom_outer *o) {
    o->stats.bytes_step += o->elastic->sent;
    o->elastic->sent = 0.0;
}

void loom_elastic_say(const loom_outer *o, int step, const char *what) {
    const elastic *e = o->elastic;
    char ids[4 * MAX_W];
    const int n = members_text(e, ids, sizeof ids);
    fprintf(stderr, "loom: elastic: worker %d step %d: %s, members=%d [%s], checksum %016llx\n",
            e->me, step, what, n, ids, checksum(e->start_all, e->all));
}

/* ---- between the workers: the leads ---- */

/* Coordinator: worker w's published port whose process is alive, if any (1; name and
 * port filled). Its names are looked up in order (a gap of one allowed: a name withdrawn
 * late by its job's mpirun); a value whose liveness endpoint does not answer is stale (the
 * joiner is gone: connecting to its port would block for OpenMPI's 600 s) and skipped,
 * probed again after STALE_RETRY_MS (a joiner cut off answers once its link is back); so
 * is a port whose connect or transfer failed before. */
static int find_live(elastic *e, int w, int step, char name[64], char port[MPI_MAX_PORT_NAME]) {
    char value[MPI_MAX_PORT_NAME];
    for (int k = 0, misses = 0; k < MAX_NAMES && misses < 2; k++) {
        service_of(w, k, name, 64);
        e->lookups[w]++;
        const int rc = MPI_Lookup_name(name, MPI_INFO_NULL, value);
        if (rc != MPI_SUCCESS) {
            e->lookups_failed[w]++;
            e->lookup_rc[w] = rc;
            misses++;
            continue;
        }
        misses = 0;
        const char *endpoint = split_value(value, port);
        snprintf(e->last_port[w], sizeof e->last_port[w], "%s", port);
        if (!strcmp(port, e->failed_port[w])) continue; /* still listed, nobody accepts */
        const uint64_t h = fnv1a(value, strlen(value));
        int slot = -1;
        for (int i = 0; i < MAX_NAMES; i++)
            if (e->stale[w][i] == h) slot = i;
        if (slot >= 0 && loom_now_ms() < e->stale_retry[w][slot]) continue;
        if (endpoint && !loom_liveness_probe(endpoint, LIVENESS_TIMEOUT_MS)) {
            if (slot < 0) {
                slot = e->stale_next[w]++ % MAX_NAMES;
                e->stale[w][slot] = h;
                e->stale_found[w]++;
                fprintf(stderr,
                        "loom: elastic: worker %d step %d: %s is stale: worker %d's process that "
                        "published it is gone or cut off (%s does not answer); not connected "
                        "to (at %.3f)\n",
                        e->me, step, name, w, endpoint, loom_wall_s());
            }
            e->stale_retry[w][slot] = loom_now_ms() + STALE_RETRY_MS;
            continue;
        }
        if (slot >= 0) e->stale[w][slot] = 0; /* it answers again: a link back */
        return 1;
    }
    return 0;
}

/* Coordinator: connects to every published worker not in the group and sends it the
 * state (round-start parameters, momentum, step). Returns how many joined. */
int loom_elastic_admit(loom_outer *o, int step) {
    elastic *e = o->elastic;
    int joined = 0;
    for (int w = 0; w < e->W; w++) {
        if (w == e->me || e->member[w]) continue;
        char name[64], port[MPI_MAX_PORT_NAME];
        if (!find_live(e, w, step, name, port)) continue;
        MPI_Comm ic = MPI_COMM_NULL;
        if (MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &ic) != MPI_SUCCESS) {
            e->connects_failed[w]++;
            snprintf(e->failed_port[w], sizeof e->failed_port[w], "%s", port);
            fprintf(stderr,
                    "loom: elastic: worker %d step %d: connecting to worker %d failed (%s "
                    "looked up: port %s, at %.3f)\n",
                    e->me, step, w, name, port, loom_wall_s());
            continue;
        }
        MPI_Comm_set_errhandler(ic, MPI_ERRORS_RETURN);
        e->member[w] = 1;
        msg_head h;
        head_fill(e, &h, MSG_STATE, step);
        memcpy(e->out, &h, sizeof h);
        memcpy(e->out + sizeof h, e->start_all, e->all * sizeof(float));
        memcpy(e->out + sizeof h + e->all * sizeof(float), e->mom, e->all * sizeof(float));
        MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        ex_state st = EX_PENDING;
        if (MPI_Isend(e->out, (int)e->state_bytes, MPI_BYTE, 0, TAG, ic, &rq[0]) != MPI_SUCCESS)
            st = EX_FAILED;
        else
            loom_elastic_poll(rq, 1, &st, e->timeout_ms);
        o->stats.bytes_step += (double)e->state_bytes;
        if (st != EX_DONE) {
            abandon(e, w);
            snprintf(e->failed_port[w], sizeof e->failed_port[w], "%s", port);
            fprintf(stderr,
                    "loom: elastic: worker %d step %d: worker %d did not take the state in %g s "
                    "(port %s, not tried again; at %.3f)\n",
                    e->me, step, w, e->timeout_ms / 1e3, port, loom_wall_s());
            continue;
        }
        e->peer[w] = ic;
        joined++;
        char what[64];
        snprintf(what, sizeof what, "worker %d joined", w);
        loom_elastic_say(o, step, what);
    }
    return joined;
}

/* Coordinator: an admission window opens (its counts start from nothing). */
void loom_elastic_window_open(elastic *e) {
    memset(e->lookups, 0, sizeof e->lookups);
    memset(e->lookups_failed, 0, sizeof e->lookups_failed);
    memset(e->lookup_rc, 0, sizeof e->lookup_rc);
    memset(e->connects_failed, 0, sizeof e->connects_failed);
    memset(e->stale_found, 0, sizeof e->stale_found);
    memset(e->last_port, 0, sizeof e->last_port);
}

/* Coordinator: an admission window of `waited_s` closed; one line per worker still
 * missing, naming what was looked for and what the look-ups and connects gave. */
void loom_elastic_window_close(const elastic *e, int step, const char *what, double waited_s) {
    for (int w = 0; w < e->W; w++) {
        if (w == e->me || e->member[w]) continue;
        char name[64], why[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        service_of(w, 0, name, sizeof name);
        if (e->lookups_failed[w]) MPI_Error_string(e->lookup_rc[w], why, &len);
        fprintf(stderr,
                "loom: elastic: worker %d step %d: %s: worker %d not admitted in %.1f s: %d "
                "look-up(s) of %s (and its next names) on the name server, %d found nothing "
                "(last error: %s), %d stale, %d connect(s) failed%s%s (at %.3f)\n",
                e->me, step, what, w, waited_s, e->lookups[w], name, e->lookups_failed[w],
                e->lookups_failed[w] ? why : "none", e->stale_found[w], e->connects_failed[w],
                e->last_port[w][0] ? ", last port found " : "", e->last_port[w], loom_wall_s());
    }
}

/* Coordinator, after an outer step: admits the workers waiting to join. With the fault
 * admit@S (core/fault.h: a rejoin at a known step, for tests) only at step S, and there it
 * waits until every worker is a member (up to LOOM_OUTER_ELASTIC_START_S). */
void loom_elastic_admit_now(loom_outer *o, int step) {
    elastic *e = o->elastic;
    if (!loom_fault_any(LOOM_FAULT_ADMIT)) {
        loom_elastic_admit(o, step);
        return;
    }
    if (!loom_fault_armed(LOOM_FAULT_ADMIT, step)) return;
    int members = 0;
    for (int w = 0; w < e->W; w++) members += e->member[w];
    fprintf(stderr,
            "loom: elastic: worker %d step %d: fault injection admit@%d: waiting up to %g s for "
            "%d worker(s) to join (at %.3f)\n",
            e->me, step, step, LOOM_OUTER_ELASTIC_START_S, e->W - members, loom_wall_s());
    loom_elastic_window_open(e);
    const double t0 = loom_now_ms(), until = t0 + 1e3 * LOOM_OUTER_ELASTIC_START_S;
    while (members < e->W && loom_now_ms() < until) {
        members += loom_elastic_admit(o, step);
        if (members < e->W) usleep(50000);
    }
    char what[32];
    snprintf(what, sizeof what, "admit@%d", step);
    if (members < e->W) loom_elastic_window_close(e, step, what, (loom_now_ms() - t0) * 1e-3);
}

/* The coordinator's own vector `from` through the wire format into the outgoing message's
 * payload and back into x->v, as a member receives it; returns the message's bytes. */
static size_t through_wire(loom_outer *o, const exchange *x, const float *from) {
    elastic *e = o->elastic;
    unsigned char *payload = e->out + sizeof(msg_head);
    loom_outer_quantize(x->dtype, from, x->n, o->cfg.block, payload);
    loom_outer_dequantize(x->dtype, payload, x->n, o->cfg.block, x->v);
    return sizeof(msg_head) + loom_outer_wire_bytes(x->dtype, x->n, o->cfg.block);
}

/* Coordinator: every member's `up` of this step, widened from the wire format, added with
 * its own (passed through the format and back, as the others') in worker order into
 * e->acc; a member whose message does not come within the deadline is dropped. Returns
 * how many vectors were added (-1: out of memory). */
static int collect(loom_outer *o, int step, const exchange *x) {
    elastic *e = o->elastic;
    const size_t dbytes = through_wire(o, x, x->v);
    MPI_Request rq[2 * MAX_W];
    ex_state st[MAX_W];
    for (int w = 0; w < e->W; w++) {
        rq[2 * w] = rq[2 * w + 1] = MPI_REQUEST_NULL;
        st[w] = EX_DONE;
        if (w == e->me || !e->member[w]) continue;
        unsigned char *b = loom_elastic_in_buf(e, w);
        if (!b) return -1;
        st[w] = MPI_Irecv(b, (int)dbytes, MPI_BYTE, 0, TAG, e->peer[w], &rq[2 * w]) == MPI_SUCCESS
                    ? EX_PENDING
                    : EX_FAILED;
    }
    loom_elastic_poll(rq, e->W, st, e->timeout_ms);
    for (int w = 0; w < e->W; w++) {
        if (w == e->me || !e->member[w]) continue;
        const msg_head *h = (const msg_head *)e->in[w];
        if (st[w] == EX_DONE && h->kind == (int32_t)x->up && h->step == step && h->part == e->part)
            continue;
        abandon(e, w);
        fprintf(stderr,
                "loom: elastic: worker %d step %d: worker %d lost (no %s in %g s): dropped\n",
                e->me, step, w, x->what, e->timeout_ms / 1e3);
    }
    int count = 0;
    for (int w = 0; w < e->W; w++) {
        if (w != e->me && !e->member[w]) continue;
        const float *d = x->v;
        if (w != e->me) {
            loom_outer_dequantize(x->dtype, e->in[w] + sizeof(msg_head), x->n, o->cfg.block,
                                  e->wide);
            d = e->wide;
        }
        for (size_t i = 0; i < x->n; i++) e->acc[i] = count ? e->acc[i] + d[i] : d[i];
        count++;
    }
    return count;
}

/* Coordinator: the mean in e->acc as `down` to every member (one whose send does not
 * complete in time is dropped); x->v becomes what the wire carries, which every member,
 * this one too, goes on with. */
static void answer(loom_outer *o, int step, const exchange *x) {
    elastic *e = o->elastic;
    const size_t dbytes = through_wire(o, x, e->acc);
    msg_head h;
    head_fill(e, &h, x->down, step);
    memcpy(e->out, &h, sizeof h);
    MPI_Request rq[2 * MAX_W];
    ex_state st[MAX_W];
    for (int w = 0; w < e->W; w++) {
        rq[2 * w] = rq[2 * w + 1] = MPI_REQUEST_NULL;
        st[w] = EX_DONE;
        if (w == e->me || !e->member[w]) continue;
        st[w] =
            MPI_Isend(e->out, (int)dbytes, MPI_BYTE, 0, TAG, e->peer[w], &rq[2 * w]) == MPI_SUCCESS
                ? EX_PENDING
                : EX_FAILED;
        e->sent += (double)dbytes;
    }
    loom_elastic_poll(rq, e->W, st, e->timeout_ms);
    for (int w = 0; w < e->W; w++)
        if (st[w] != EX_DONE) {
            abandon(e, w);
            fprintf(stderr,
                    "loom: elastic: worker %d step %d: worker %d lost (took no %s in %g s): "
                    "dropped\n",
                    e->me, step, w, x->answer, e->timeout_ms / 1e3);
        }
}

/* Member: its vector up to the coordinator, the mean back into x->v (widened) and the
 * membership from its head. */
static loom_status ask(loom_outer *o, int step, const exchange *x, loom_error *err) {
    elastic *e = o->elastic;
    const size_t dbytes = sizeof(msg_head) + loom_outer_wire_bytes(x->dtype, x->n, o->cfg.block);
    const int c = e->coordinator;
    msg_head h;
    head_fill(e, &h, x->up, step);
    memcpy(e->out, &h, sizeof h);
    loom_outer_quantize(x->dtype, x->v, x->n, o->cfg.block, e->out + sizeof h);
    MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    ex_state st = EX_PENDING;
    if (MPI_Irecv(e->in[0], (int)dbytes, MPI_BYTE, 0, TAG, e->peer[c], &rq[0]) != MPI_SUCCESS ||
        MPI_Isend(e->out, (int)dbytes, MPI_BYTE, 0, TAG, e->peer[c], &rq[1]) != MPI_SUCCESS)
        st = EX_FAILED;
    else /* the coordinator may still be training, then waits for the others: 3 deadlines */
        loom_elastic_poll(rq, 1, &st, 3 * e->timeout_ms);
    e->sent += (double)dbytes;
    const msg_head *r = (const msg_head *)e->in[0];
    if (st != EX_DONE || r->kind != (int32_t)x->down || r->step != step || r->part != e->part) {
        e->peer[c] = MPI_COMM_NULL; /* abandoned, with its buffer (a late message) */
        e->in[0] = NULL;
        return loom_error_set(err, LOOM_ERR_IO,
                              "--elastic-worker %d: step %d: no %s from the coordinator (worker "
                              "%d) in %g s: this worker leaves the group (restart it with "
                              "--elastic-join; docs/diloco.md)",
                              e->me, step, x->answer, c, 3 * e->timeout_ms / 1e3);
    }
    memset(e->member, 0, sizeof e->member);
    for (int k = 0; k < r->n_members && k < MAX_W; k++) e->member[r->members[k]] = 1;
    loom_outer_dequantize(x->dtype, e->in[0] + sizeof(msg_head), x->n, o->cfg.block, x->v);
    return LOOM_OK;
}

loom_status loom_elastic_mean(loom_outer *o, int step, const exchange *x, mean_rule rule,
                              loom_error *err) {
    elastic *e = o->elastic;
    if (e->me != e->coordinator) return ask(o, step, x, err);
    const int count = collect(o, step, x); /* this worker's own vector included: >= 1 */
    if (count < 0) return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    if (rule == MEAN_TIMES_INVERSE) {
        const float inv = 1.0f / (float)count;
        for (size_t i = 0; i < x->n; i++) e->acc[i] *= inv;
    } else {
        for (size_t i = 0; i < x->n; i++) e->acc[i] /= (float)count;
    }
    answer(o, step, x);
    return LOOM_OK;
}
