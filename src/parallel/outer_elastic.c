/* Elastic DiLoCo workers: one MPI job per worker, outer syncs point to point through a
 * coordinator, with deadlines (parallel/outer_elastic.h; docs/diloco.md says why each
 * choice, and why the members cannot diverge). */
#include "parallel/outer_elastic.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/crc32c.h"
#include "core/fault.h"
#include "core/fs.h"
#include "core/worker.h"
#include "comm/world.h"
#include "parallel/outer_impl.h"

#define MAX_W LOOM_OUTER_MAX_FRAGMENTS
#define TAG 71

typedef enum {
    MSG_DELTA = 1,  /* a member's outer gradient */
    MSG_UPDATE = 2, /* the coordinator's mean of them */
    MSG_STATE = 3,  /* the group's state, to a joiner */
    MSG_GRADS = 4,  /* a member's gradients of a warm-start step */
    MSG_MEAN = 5    /* the coordinator's mean of them */
} msg_kind;

/* What heads every message: its kind, the step, the fragment (streaming; -1: the whole
 * model), the sender, the members (UPDATE, STATE). */
typedef struct {
    int32_t kind, step, part, from, n_members;
    int32_t members[MAX_W];
} msg_head;

/* Streaming (--outer-fragments F > 1): where the group's values of one fragment are (lead;
 * o->frag[k] holds this rank's runs of it). */
typedef struct {
    size_t at, n; /* a run of the fragment in start_all and mom */
} span;
typedef struct {
    int *counts, *displs; /* floats of the fragment each job rank sends, and where */
    size_t all;           /* the group's floats of the fragment */
    span *map;            /* where they are in start_all, in that order */
    int n_map;
} frag_part;

/* An exchange's progress (poll). */
typedef enum { EX_PENDING, EX_DONE, EX_FAILED } ex_state;

struct loom_outer_elastic {
    int me, W, coordinator; /* worker ids */
    double timeout_ms;
    /* the worker's own job (dp/tp/pp inside the worker): its rank 0, the lead, does every
     * exchange with the other workers for the whole group; the arrays below marked "lead"
     * exist only there. The group's buffers are its ranks' flat buffers back to back in rank
     * order, each once (a dp replica of another rank's buffer contributes nothing). */
    MPI_Comm job;           /* MPI_COMM_NULL: a job of one rank */
    int lead, contrib;      /* this rank is the job's rank 0; contributes its buffer */
    int *counts, *displs;   /* lead: floats each job rank contributes, and where */
    size_t all;             /* the group's floats (the counts' sum) */
    int *gcounts, *gdispls; /* --outer-start-step: the same for gradients (every rank's) */
    size_t gall;
    float *gbuf;          /* lead: the group's gradients of a warm-start step, then their mean */
    float *start_all;     /* lead: the group's round-start parameters */
    float *mine;          /* this rank's outer gradient start - params */
    float *view;          /* ZeRO-3 with --ep: its own ranges' parameters, packed (o->own) */
    MPI_Comm peer[MAX_W]; /* coordinator: one per member; member: peer[coordinator] */
    int member[MAX_W];    /* the last membership this worker knows */
    float *mom;           /* lead: the outer momentum, whole (every member holds the same) */
    float *g;             /* lead: the group's outer gradient, then the members' mean */
    float *acc,
        *wide; /* coordinator: the mean being added up; a member's, widened (max(all, gall)) */
    unsigned char *out;           /* lead: a message being sent */
    unsigned char *in[MAX_W];     /* coordinator: each member's message; member: [0] */
    size_t state_bytes;           /* head + 2 x all floats: the state a joiner takes */
    size_t msg_bytes;             /* the largest message: the state, or a warm start's gradients */
    size_t wire_bytes;            /* an outer gradient or mean in --outer-dtype */
    int start_step;               /* the step the run starts after (a joiner: the coordinator's) */
    int loaded;                   /* lead: start_all and mom came from this worker's checkpoint */
    int32_t saved_members[MAX_W]; /* lead, loaded: the members at the save (reported) */
    int n_saved_members;
    int finished; /* the last step's sync is done: disconnect at the end */
    double sent;  /* bytes the exchanges (answer, ask) sent, not yet in the step's count */
    /* streaming: the lead's exchange thread (MPI_THREAD_MULTIPLE: overlap) and the
     * fragment it works on; pending (every rank): a sync started, not yet landed */
    int overlap, pending;
    loom_worker xthread;
    int flight_u, flight_step;
    enum { FLIGHT_NONE, FLIGHT_RUNNING, FLIGHT_APPLIED } flight;
    loom_status flight_st;
    double flight_ms;
    int part;         /* the fragment being synced (msg_head.part; -1: the whole model) */
    frag_part *parts; /* lead, streaming: o->n_frag of them */
    /* coordinator: what an admission window saw of each missing worker (its closing line) */
    int lookups[MAX_W], lookups_failed[MAX_W], lookup_rc[MAX_W], connects_failed[MAX_W];
    char last_port[MAX_W][96];
    /* coordinator: each worker's port whose connect or state transfer failed. The name
     * server may still list it (the joiner withdraws its name only after taking the state,
     * and a joiner that died never does); a connect to a port nobody accepts on any more
     * blocks in MPI_Comm_connect (OpenMPI 4.1 waits 600 s), so it is never tried again: a
     * joiner started again publishes a new port (its new job's). */
    char failed_port[MAX_W][MPI_MAX_PORT_NAME];
};

typedef struct loom_outer_elastic elastic;

static void service_of(int worker, char *name, size_t n) {
    snprintf(name, n, "loom-elastic-w%d", worker);
}

/* Opens a port and publishes it under worker's service name (through ompi-server). */
static loom_status publish(int worker, char name[64], char port[MPI_MAX_PORT_NAME],
                           loom_error *err) {
    service_of(worker, name, 64);
    if (MPI_Open_port(MPI_INFO_NULL, port) != MPI_SUCCESS ||
        MPI_Publish_name(name, MPI_INFO_NULL, port) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO,
                              "--elastic-worker %d: publishing %s failed (every worker's mpirun "
                              "needs --ompi-server: docs/diloco.md)",
                              worker, name);
    return LOOM_OK;
}

/* FNV-1a over the round-start parameters: the log lines' check that members agree. */
static unsigned long long checksum(const float *x, size_t n) {
    const unsigned char *b = (const unsigned char *)x;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return (unsigned long long)h;
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

static unsigned char *in_buf(elastic *e, int w) {
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
static void poll(MPI_Request *rq, int n, ex_state *st, double timeout_ms) {
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

/* The outer SGD step of `step` with the mean outer gradient g on the group's round-start
 * parameters, the same on every member (lead). --outer-warmup R: the first R syncs (by the
 * round, a function of the step, as in the one-job mode: outer.c) only average the workers
 * (start += -g) and leave the momentum untouched. */
static void apply(loom_outer *o, int step, const float *g) {
    elastic *e = o->elastic;
    /* the first sync comes H inner steps after the warm start's S (0 without one) */
    const int warm = loom_outer_warm(&o->cfg, step, o->cfg.start_step + o->cfg.inner_steps);
    double sq = 0.0;
    for (size_t i = 0; i < e->all; i++) {
        sq += (double)g[i] * g[i];
        e->start_all[i] += loom_outer_update(&o->cfg, warm, &e->mom[i], g[i]);
    }
    o->stats.grad_norm = sqrt(sq);
}

/* The bytes the exchanges sent (answer, ask: e->sent) into this step's count. */
static void take_sent(loom_outer *o) {
    o->stats.bytes_step += o->elastic->sent;
    o->elastic->sent = 0.0;
}

static void say(const loom_outer *o, int step, const char *what) {
    const elastic *e = o->elastic;
    char ids[4 * MAX_W];
    const int n = members_text(e, ids, sizeof ids);
    fprintf(stderr, "loom: elastic: worker %d step %d: %s, members=%d [%s], checksum %016llx\n",
            e->me, step, what, n, ids, checksum(e->start_all, e->all));
}

/* ---- inside the worker's job: the lead gathers and spreads ---- */

/* This rank's parameters as one run of o->n_start values: params itself, or with own ranges
 * (ZeRO-3 with --ep) their values packed into e->view. */
static const float *params_view(const loom_outer *o) {
    if (!o->own) return o->params;
    loom_outer_params_pack(o, o->elastic->view);
    return o->elastic->view;
}

/* params = src (n_start values, packed like params_view). */
static void params_set(loom_outer *o, const float *src) {
    if (o->own)
        loom_outer_params_unpack(o, src);
    else
        memcpy(o->params, src, o->n_start * sizeof(float));
}

/* Every rank's outer gradient start - params into the lead's g (the group's, rank order). */
static loom_status group_gather(loom_outer *o, loom_error *err) {
    elastic *e = o->elastic;
    const float *p = params_view(o);
    for (size_t i = 0; i < o->n_start; i++) e->mine[i] = o->start[i] - p[i];
    if (e->job == MPI_COMM_NULL) {
        memcpy(e->g, e->mine, o->n_start * sizeof(float));
        return LOOM_OK;
    }
    if (MPI_Gatherv(e->mine, e->contrib ? (int)o->n_start : 0, MPI_FLOAT, e->g, e->counts,
                    e->displs, MPI_FLOAT, 0, e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO,
                              "--elastic-worker %d: gathering the outer "
                              "gradient inside the worker's job failed",
                              e->me);
    return LOOM_OK;
}

/* The lead's verdict `st` and v[0..2) (a joiner's start step, and whether the ranks keep
 * their parameters) to every rank of the job. On the lead's failure every rank fails. */
static loom_status group_verdict(loom_outer *o, loom_status st, int v[2], loom_error *err) {
    elastic *e = o->elastic;
    int32_t w[3] = {(int32_t)st, (int32_t)v[0], (int32_t)v[1]};
    if (e->job != MPI_COMM_NULL && MPI_Bcast(w, 3, MPI_INT32_T, 0, e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO,
                              "--elastic-worker %d: broadcast inside the "
                              "worker's job failed",
                              e->me);
    if (w[0] != LOOM_OK)
        return e->lead ? st
                       : loom_error_set(err, LOOM_ERR_IO,
                                        "--elastic-worker %d: the job's rank 0 left the group "
                                        "(its line says why; restart the job with --elastic-join)",
                                        e->me);
    v[0] = w[1], v[1] = w[2];
    return LOOM_OK;
}

/* group_verdict, then on success the group's round-start parameters to every rank (a dp
 * replica takes its replica's by broadcast), and params = start unless kept (v[1]). */
static loom_status group_spread(loom_outer *o, loom_status st, int v[2], loom_error *err) {
    elastic *e = o->elastic;
    if ((st = group_verdict(o, st, v, err))) return st;
    const size_t bytes = o->n_start * sizeof(float);
    if (e->job == MPI_COMM_NULL) {
        memcpy(o->start, e->start_all, bytes);
    } else {
        if (MPI_Scatterv(e->start_all, e->counts, e->displs, MPI_FLOAT, o->start,
                         e->contrib ? (int)o->n_start : 0, MPI_FLOAT, 0, e->job) != MPI_SUCCESS)
            return loom_error_set(err, LOOM_ERR_IO,
                                  "--elastic-worker %d: scattering the "
                                  "parameters inside the worker's job failed",
                                  e->me);
        loom_status bs;
        if (o->shards > 1 && (bs = loom_comm_bcast(o->dp, o->start, bytes, 0, err))) return bs;
    }
    if (!v[1]) params_set(o, o->start);
    o->stats.syncs = 1;
    return LOOM_OK;
}

/* ---- between the workers: the leads ---- */

/* Coordinator: connects to every published worker not in the group and sends it the
 * state (round-start parameters, momentum, step). Returns how many joined. */
static int admit(loom_outer *o, int step) {
    elastic *e = o->elastic;
    int joined = 0;
    for (int w = 0; w < e->W; w++) {
        if (w == e->me || e->member[w]) continue;
        char name[64], port[MPI_MAX_PORT_NAME];
        service_of(w, name, sizeof name);
        e->lookups[w]++;
        const int rc = MPI_Lookup_name(name, MPI_INFO_NULL, port);
        if (rc != MPI_SUCCESS) {
            e->lookups_failed[w]++;
            e->lookup_rc[w] = rc;
            continue;
        }
        snprintf(e->last_port[w], sizeof e->last_port[w], "%s", port);
        if (!strcmp(port, e->failed_port[w])) continue; /* still listed, nobody accepts */
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
            poll(rq, 1, &st, e->timeout_ms);
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
        say(o, step, what);
    }
    return joined;
}

/* Coordinator: an admission window opens (its counts start from nothing). */
static void window_open(elastic *e) {
    memset(e->lookups, 0, sizeof e->lookups);
    memset(e->lookups_failed, 0, sizeof e->lookups_failed);
    memset(e->lookup_rc, 0, sizeof e->lookup_rc);
    memset(e->connects_failed, 0, sizeof e->connects_failed);
    memset(e->last_port, 0, sizeof e->last_port);
}

/* Coordinator: an admission window of `waited_s` closed; one line per worker still
 * missing, naming what was looked for and what the look-ups and connects gave. */
static void window_close(const elastic *e, int step, const char *what, double waited_s) {
    for (int w = 0; w < e->W; w++) {
        if (w == e->me || e->member[w]) continue;
        char name[64], why[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        service_of(w, name, sizeof name);
        if (e->lookups_failed[w]) MPI_Error_string(e->lookup_rc[w], why, &len);
        fprintf(stderr,
                "loom: elastic: worker %d step %d: %s: worker %d not admitted in %.1f s: %d "
                "look-up(s) of %s on the name server, %d found nothing (last error: %s), %d "
                "connect(s) failed%s%s (at %.3f)\n",
                e->me, step, what, w, waited_s, e->lookups[w], name, e->lookups_failed[w],
                e->lookups_failed[w] ? why : "none", e->connects_failed[w],
                e->last_port[w][0] ? ", last port found " : "", e->last_port[w], loom_wall_s());
    }
}

/* Coordinator, after an outer step: admits the workers waiting to join. With the fault
 * admit@S (core/fault.h: a rejoin at a known step, for tests) only at step S, and there it
 * waits until every worker is a member (up to LOOM_OUTER_ELASTIC_START_S). */
static void admit_now(loom_outer *o, int step) {
    elastic *e = o->elastic;
    if (!loom_fault_any(LOOM_FAULT_ADMIT)) {
        admit(o, step);
        return;
    }
    if (!loom_fault_armed(LOOM_FAULT_ADMIT, step)) return;
    int members = 0;
    for (int w = 0; w < e->W; w++) members += e->member[w];
    fprintf(stderr,
            "loom: elastic: worker %d step %d: fault injection admit@%d: waiting up to %g s for "
            "%d worker(s) to join (at %.3f)\n",
            e->me, step, step, LOOM_OUTER_ELASTIC_START_S, e->W - members, loom_wall_s());
    window_open(e);
    const double t0 = loom_now_ms(), until = t0 + 1e3 * LOOM_OUTER_ELASTIC_START_S;
    while (members < e->W && loom_now_ms() < until) {
        members += admit(o, step);
        if (members < e->W) usleep(50000);
    }
    char what[32];
    snprintf(what, sizeof what, "admit@%d", step);
    if (members < e->W) window_close(e, step, what, (loom_now_ms() - t0) * 1e-3);
}

/* One exchange through the coordinator: an outer sync (each member's outer gradient up,
 * the mean down), or a warm-start step's gradients (--outer-start-step). */
typedef struct {
    msg_kind up, down; /* a member's message, the coordinator's answer */
    float *v;          /* lead: this worker's vector in, the members' mean out */
    size_t n;
    loom_outer_dtype dtype; /* on the wire, both ways */
    const char *what;       /* the member's vector, for the lines */
    const char *answer;     /* the coordinator's, for the lines */
} exchange;

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
        unsigned char *b = in_buf(e, w);
        if (!b) return -1;
        st[w] = MPI_Irecv(b, (int)dbytes, MPI_BYTE, 0, TAG, e->peer[w], &rq[2 * w]) == MPI_SUCCESS
                    ? EX_PENDING
                    : EX_FAILED;
    }
    poll(rq, e->W, st, e->timeout_ms);
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
    poll(rq, e->W, st, e->timeout_ms);
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
        poll(rq, 1, &st, 3 * e->timeout_ms);
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

/* The lead's outer step: the members' mean outer gradient (added in worker order, divided
 * by their number, as the one-job mode's owner of a chunk does), then the outer step,
 * the same on every member. */
static loom_status sync_outer(loom_outer *o, int step, loom_error *err) {
    elastic *e = o->elastic;
    const exchange x = {MSG_DELTA, MSG_UPDATE,       e->g,          e->all,
                        o->dtype,  "outer gradient", "outer update"};
    if (e->me == e->coordinator) {
        const int count = collect(o, step, &x);
        if (count < 0)
            return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
        for (size_t i = 0; i < x.n; i++) e->acc[i] /= (float)count;
        answer(o, step, &x);
    } else {
        loom_status st = ask(o, step, &x, err);
        take_sent(o);
        if (st) return st;
    }
    take_sent(o);
    apply(o, step, e->g);
    say(o, step, "outer sync");
    if (e->me == e->coordinator && step < o->steps) admit_now(o, step);
    return LOOM_OK;
}

/* The lead's e->start_all from the ranks' parameters (params, each rank's contribution). */
static loom_status gather_params(loom_outer *o, loom_error *err) {
    elastic *e = o->elastic;
    const float *p = params_view(o);
    if (e->job == MPI_COMM_NULL) {
        memcpy(e->start_all, p, o->n_start * sizeof(float));
        return LOOM_OK;
    }
    if (MPI_Gatherv(p, e->contrib ? (int)o->n_start : 0, MPI_FLOAT, e->start_all, e->counts,
                    e->displs, MPI_FLOAT, 0, e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Gatherv failed");
    return LOOM_OK;
}

/* The warm start's end (step S): the round-start parameters are the parameters now. */
static loom_status take_start(loom_outer *o, loom_error *err) {
    memcpy(o->start, params_view(o), o->n_start * sizeof(float));
    return gather_params(o, err);
}

loom_status loom_outer_elastic_sync_grads(loom_outer *o, float *grads, size_t n, int step,
                                          loom_error *err) {
    elastic *e = o->elastic;
    const double t0 = loom_now_ms();
    if (n != o->n_start)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--outer-start-step with --elastic-worker: this rank's gradient "
                              "(%zu values) is not the part of the parameters it syncs (%zu; "
                              "--freeze): not supported",
                              n, o->n_start);
    /* every rank's gradients to the lead: each replica holds its own reduced part */
    loom_status st = LOOM_OK;
    if (e->job == MPI_COMM_NULL)
        memcpy(e->gbuf, grads, n * sizeof(float));
    else if (MPI_Gatherv(grads, (int)n, MPI_FLOAT, e->gbuf, e->gcounts, e->gdispls, MPI_FLOAT, 0,
                         e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Gatherv failed");
    o->stats.bytes_step = 0.0;
    if (e->lead) {
        /* summed in worker order and scaled by 1/members, as the one-job mode's all-reduce
         * then 1/W; fp32 on the wire, as there */
        const exchange x = {MSG_GRADS,       MSG_MEAN,   e->gbuf,        e->gall,
                            LOOM_OUTER_FP32, "gradient", "gradient mean"};
        if (e->me == e->coordinator) {
            const int count = collect(o, step, &x);
            if (count < 0)
                st = loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
            const float inv = 1.0f / (float)(count > 0 ? count : 1);
            for (size_t i = 0; !st && i < x.n; i++) e->acc[i] *= inv;
            if (!st) answer(o, step, &x);
        } else {
            st = ask(o, step, &x, err);
        }
        take_sent(o);
    }
    int v[2] = {step, 0};
    if ((st = group_verdict(o, st, v, err))) return st;
    if (e->job == MPI_COMM_NULL)
        memcpy(grads, e->gbuf, n * sizeof(float));
    else if (MPI_Scatterv(e->gbuf, e->gcounts, e->gdispls, MPI_FLOAT, grads, (int)n, MPI_FLOAT, 0,
                          e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Scatterv failed");
    o->sync_bytes = o->stats.bytes_step;
    o->sync_ms = loom_now_ms() - t0;
    return LOOM_OK;
}

/* ---- streaming (--outer-fragments F > 1): one fragment at a time, as the one-job mode ----
 * Fragment u's sync after its step s: every rank's outer gradient of it to the lead (A),
 * the exchange through the coordinator (B, the lead), the outer step on the fragment's
 * round-start values and momentum (C, the lead), and the new round-start values back to
 * every rank (D). The local parameters are mixed with them two steps later, where the
 * one-job mode's overlapped exchange lands. With MPI_THREAD_MULTIPLE the lead's exchange
 * thread runs B while the next two inner steps compute, and C and D come at the landing;
 * otherwise all of it runs at s. Either way the same numbers come out, and which fragments
 * land at a step is a function of the step, so a resume or a joiner lands the same ones.
 * With --ep below ZeRO-3 a fragment is two parts (its dense and its expert tensors:
 * o->frag[u * kinds + j]), exchanged as one message. */

/* Floats of fragment u's parts before part j in the group's message (lead). */
static size_t part_offset(const loom_outer *o, int u, int j) {
    size_t at = 0;
    for (int i = 0; i < j; i++) at += o->elastic->parts[u * o->kinds + i].all;
    return at;
}

/* C: the lead's outer step of fragment u (the members' mean outer gradient in e->g). */
static void fragment_apply(loom_outer *o, int u, int step) {
    elastic *e = o->elastic;
    for (int j = 0; j < o->kinds; j++) {
        const int k = u * o->kinds + j;
        const frag_part *fp = &e->parts[k];
        const float *g = e->g + part_offset(o, u, j);
        const int warm = loom_outer_warm(&o->cfg, step, o->frag[k].offset);
        double sq = 0.0;
        size_t n = 0;
        for (int m = 0; m < fp->n_map; m++)
            for (size_t i = fp->map[m].at; i < fp->map[m].at + fp->map[m].n; i++, n++) {
                sq += (double)g[n] * g[n];
                e->start_all[i] += loom_outer_update(&o->cfg, warm, &e->mom[i], g[n]);
            }
        o->norm_sq[k] = sq;
    }
    double all = 0.0;
    for (int k = 0; k < o->n_frag; k++) all += o->norm_sq[k];
    o->stats.grad_norm = sqrt(all);
    char what[48];
    snprintf(what, sizeof what, "outer sync of fragment %d", u);
    say(o, step, what);
}

/* B: the lead's exchange of fragment u's outer gradient (e->g) for the members' mean. */
static loom_status fragment_exchange(loom_outer *o, int u, int step, loom_error *err) {
    elastic *e = o->elastic;
    const exchange x = {MSG_DELTA, MSG_UPDATE,       e->g,          part_offset(o, u, o->kinds),
                        o->dtype,  "outer gradient", "outer update"};
    loom_status st = LOOM_OK;
    e->part = u;
    if (e->me == e->coordinator) {
        const int count = collect(o, step, &x);
        if (count < 0) st = loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
        for (size_t i = 0; !st && i < x.n; i++) e->acc[i] /= (float)count;
        if (!st) answer(o, step, &x);
    } else {
        st = ask(o, step, &x, err);
    }
    e->part = -1;
    return st;
}

static void *exchange_thread(void *arg) {
    loom_outer *o = arg;
    elastic *e = o->elastic;
    while (loom_worker_next(&e->xthread)) {
        loom_error err = {0};
        const double t0 = loom_now_ms();
        const loom_status st = fragment_exchange(o, e->flight_u, e->flight_step, &err);
        e->flight_ms = loom_now_ms() - t0;
        loom_worker_done(&e->xthread, st, &err);
    }
    return NULL;
}

/* A: every rank's outer gradient of fragment u (start - params over its runs) into the
 * lead's e->g, its parts back to back, each in rank order. */
static loom_status fragment_gather(loom_outer *o, int u, loom_error *err) {
    elastic *e = o->elastic;
    for (int j = 0; j < o->kinds; j++) {
        const int k = u * o->kinds + j;
        const loom_outer_fragment *f = &o->frag[k];
        loom_outer_fragment_delta(o, f, e->mine);
        float *dst = e->lead ? e->g + part_offset(o, u, j) : NULL;
        if (e->job == MPI_COMM_NULL)
            memcpy(dst, e->mine, f->n * sizeof(float));
        else if (MPI_Gatherv(e->mine, e->contrib ? (int)f->n : 0, MPI_FLOAT, dst,
                             e->lead ? e->parts[k].counts : NULL,
                             e->lead ? e->parts[k].displs : NULL, MPI_FLOAT, 0,
                             e->job) != MPI_SUCCESS)
            return loom_error_set(err, LOOM_ERR_IO,
                                  "--elastic-worker %d: gathering fragment %d's outer gradient "
                                  "inside the worker's job failed",
                                  e->me, u);
    }
    return LOOM_OK;
}

/* D, after the lead's verdict st: fragment u's new round-start values to the ranks that
 * hold them (a dp replica by broadcast). */
static loom_status fragment_spread(loom_outer *o, int u, loom_status st, loom_error *err) {
    elastic *e = o->elastic;
    int v[2] = {0, 0};
    if ((st = group_verdict(o, st, v, err))) return st;
    for (int j = 0; j < o->kinds; j++) {
        const int k = u * o->kinds + j;
        const loom_outer_fragment *f = &o->frag[k];
        if (e->lead) {
            const frag_part *fp = &e->parts[k];
            size_t n = 0;
            for (int m = 0; m < fp->n_map; m++) {
                memcpy(e->g + n, e->start_all + fp->map[m].at, fp->map[m].n * sizeof(float));
                n += fp->map[m].n;
            }
        }
        if (e->job == MPI_COMM_NULL)
            memcpy(e->mine, e->g, f->n * sizeof(float));
        else if (MPI_Scatterv(e->g, e->lead ? e->parts[k].counts : NULL,
                              e->lead ? e->parts[k].displs : NULL, MPI_FLOAT, e->mine,
                              e->contrib ? (int)f->n : 0, MPI_FLOAT, 0, e->job) != MPI_SUCCESS)
            return loom_error_set(err, LOOM_ERR_IO,
                                  "--elastic-worker %d: scattering fragment %d inside the "
                                  "worker's job failed",
                                  e->me, u);
        if (o->shards > 1 && (st = loom_comm_bcast(o->dp, e->mine, f->n * sizeof(float), 0, err)))
            return st;
        size_t at = 0;
        for (int r = 0; r < f->n_runs; r++) {
            const loom_outer_run *w = &f->runs[r];
            memcpy(o->start + w->packed, e->mine + at, w->numel * sizeof(float));
            at += w->numel;
        }
    }
    o->stats.syncs++;
    return LOOM_OK;
}

/* The lead: fragment u's exchange thread joined (once; its time behind the inner steps
 * counted as hidden) and its outer step taken. */
static loom_status flight_apply(loom_outer *o, loom_error *err) {
    elastic *e = o->elastic;
    if (e->flight != FLIGHT_RUNNING) return e->flight_st;
    const double t0 = loom_now_ms();
    loom_status st = loom_worker_wait(&e->xthread, err);
    const double waited = loom_now_ms() - t0;
    o->stats.hidden_ms += e->flight_ms > waited ? e->flight_ms - waited : 0.0;
    take_sent(o);
    if (!st) fragment_apply(o, e->flight_u, e->flight_step);
    e->flight = FLIGHT_APPLIED;
    e->flight_st = st;
    return st;
}

/* Fragment u's sync after step `step`: A, then B on the exchange thread (overlap) or B, C
 * and D at once. */
static loom_status fragment_start(loom_outer *o, int u, int step, int overlap, loom_error *err) {
    elastic *e = o->elastic;
    loom_status st = fragment_gather(o, u, err);
    if (st) return st;
    if (overlap && e->lead) {
        if (!loom_worker_claim(&e->xthread)) /* the last one is joined at its landing */
            return loom_error_set(err, LOOM_ERR_STATE,
                                  "--elastic-worker %d: step %d: fragment %d's exchange "
                                  "started while another was under way",
                                  e->me, step, u);
        e->flight_u = u, e->flight_step = step, e->flight = FLIGHT_RUNNING;
        e->flight_st = LOOM_OK;
        loom_worker_post(&e->xthread);
    }
    if (overlap) {
        e->pending = 1;
        return LOOM_OK;
    }
    if (e->lead) {
        st = fragment_exchange(o, u, step, err);
        take_sent(o);
        if (!st) fragment_apply(o, u, step);
    }
    return fragment_spread(o, u, st, err);
}

/* Fragment u's overlapped sync, at its landing: C (unless a save took it) and D. */
static loom_status fragment_finish(loom_outer *o, int u, loom_error *err) {
    elastic *e = o->elastic;
    if (!e->pending) return LOOM_OK; /* resumed after the sync: C was saved, D done at start */
    loom_status st = e->lead ? flight_apply(o, err) : LOOM_OK;
    e->flight = FLIGHT_NONE;
    e->pending = 0;
    return fragment_spread(o, u, st, err);
}

/* Fragment u's parameters mixed with its round-start values (replace: set to them). */
static void fragment_land(loom_outer *o, int u, int replace) {
    const float a = o->cfg.merge, b = 1.0f - a;
    for (int j = 0; j < o->kinds; j++) {
        const loom_outer_fragment *f = &o->frag[u * o->kinds + j];
        for (int r = 0; r < f->n_runs; r++) {
            const loom_outer_run *w = &f->runs[r];
            const float *s = o->start + w->packed;
            float *p = o->params + w->flat;
            for (size_t i = 0; i < w->numel; i++) p[i] = replace ? s[i] : a * p[i] + b * s[i];
        }
    }
}

/* After inner step `step`, in the one-job mode's order: the fragment synced two steps ago
 * lands, this step's is synced; at the last step whatever is pending lands, and every
 * fragment is synced once more, at once, and replaces the parameters (one model). The
 * coordinator admits the workers waiting to join when no exchange is under way: after a
 * landing (overlapped), or after a sync. */
static loom_status streaming_step(loom_outer *o, int step, loom_error *err) {
    elastic *e = o->elastic;
    const int U = o->cfg.fragments, last = step == o->steps;
    loom_status st = LOOM_OK;
    int admit_here = 0;
    for (int u = 0; u < U && !st; u++)
        if (loom_outer_sends_at(o, &o->frag[u * o->kinds], step - 2)) {
            if (!(st = fragment_finish(o, u, err))) fragment_land(o, u, 0);
            admit_here = 1;
        }
    for (int u = 0; u < U && !st; u++)
        if (loom_outer_sends_at(o, &o->frag[u * o->kinds], step)) {
            st = fragment_start(o, u, step, e->overlap && !last, err);
            admit_here |= !e->overlap;
        }
    for (int u = 0; last && u < U && !st; u++) {
        const loom_outer_fragment *f = &o->frag[u * o->kinds];
        const int in_flight =
            loom_outer_sends_at(o, f, step - 1) || loom_outer_sends_at(o, f, step);
        if (in_flight && !(st = fragment_finish(o, u, err))) fragment_land(o, u, 0);
        if (!st && !(st = fragment_start(o, u, step, 0, err))) fragment_land(o, u, 1);
    }
    if (!st && admit_here && !e->pending && e->lead && e->me == e->coordinator && !last)
        admit_now(o, step);
    return st;
}

loom_status loom_outer_elastic_after_step(loom_outer *o, int step, loom_error *err) {
    const double t0 = loom_now_ms();
    elastic *e = o->elastic;
    o->stats.bytes_step = 0.0;
    o->stats.hidden_ms = 0.0;
    o->stats.syncs = 0;
    loom_status st = LOOM_OK;
    if (step <= o->cfg.start_step) { /* a synchronous step: loom_outer_elastic_sync_grads */
        o->stats.bytes_step = o->sync_bytes;
        /* the members hold the same parameters: DiLoCo's first round starts from them */
        if (step == o->cfg.start_step) st = take_start(o, err);
        o->stats.exposed_ms = o->sync_ms + (loom_now_ms() - t0);
        o->sync_bytes = o->sync_ms = 0.0;
    } else if (o->n_frag) {
        st = streaming_step(o, step, err);
        o->stats.exposed_ms = loom_now_ms() - t0;
    } else {
        if ((step - o->cfg.start_step) % o->cfg.inner_steps == 0 || step == o->steps) {
            st = group_gather(o, err);
            if (!st && e->lead) st = sync_outer(o, step, err);
            int v[2] = {step, 0};
            st = group_spread(o, st, v, err);
        }
        o->stats.exposed_ms = loom_now_ms() - t0;
    }
    if (!st && step == o->steps) e->finished = 1;
    return st;
}

/* A joiner's lead: publish the name, wait for the coordinator and receive the state it
 * sends (in[0]; join_take takes it). *step: the coordinator's step. */
static loom_status join_receive(loom_outer *o, int *step, loom_error *err) {
    elastic *e = o->elastic;
    char name[64], port[MPI_MAX_PORT_NAME];
    /* with the supervisor's "started" line and the next one: where a slow join's time went */
    fprintf(stderr, "loom: elastic: worker %d publishing its name (at %.3f)\n", e->me,
            loom_wall_s());
    const loom_status published = publish(e->me, name, port, err);
    if (published) return published;
    fprintf(stderr, "loom: elastic: worker %d waiting to join (%s published at %.3f)\n", e->me,
            name, loom_wall_s());
    MPI_Comm ic = MPI_COMM_NULL;
    const int rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &ic);
    if (rc != MPI_SUCCESS) {
        MPI_Unpublish_name(name, MPI_INFO_NULL, port);
        MPI_Close_port(port);
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker %d: MPI_Comm_accept failed",
                              e->me);
    }
    MPI_Comm_set_errhandler(ic, MPI_ERRORS_RETURN);
    /* The state first, the name withdrawn after: the coordinator sends the state as soon as
     * its connect returns and waits --elastic-timeout for it to be taken, and withdrawing
     * the name is a round trip through this job's mpirun and the name server, which a
     * loaded machine can stretch past that deadline (and during which this process makes no
     * MPI progress, so the transfer would not move either). */
    MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    ex_state st = EX_PENDING;
    if (MPI_Irecv(e->in[0], (int)e->msg_bytes, MPI_BYTE, 0, TAG, ic, &rq[0]) != MPI_SUCCESS)
        st = EX_FAILED;
    else
        poll(rq, 1, &st, e->timeout_ms);
    MPI_Unpublish_name(name, MPI_INFO_NULL, port);
    MPI_Close_port(port);
    const msg_head *h = (const msg_head *)e->in[0];
    if (st != EX_DONE || h->kind != MSG_STATE || h->from < 0 || h->from >= e->W) {
        e->in[0] = NULL; /* abandoned with the intercommunicator (a late message) */
        return loom_error_set(err, LOOM_ERR_IO,
                              "--elastic-worker %d: the coordinator's state did not arrive in %g s "
                              "(or the coordinator's worker has another layout)",
                              e->me, e->timeout_ms / 1e3);
    }
    e->coordinator = h->from;
    e->peer[e->coordinator] = ic;
    *step = h->step;
    return LOOM_OK;
}

/* A joiner's lead: takes the state join_receive received; *keep: its own parameters stay
 * (they continue the state it was sent). */
static void join_take(loom_outer *o, int *keep) {
    elastic *e = o->elastic;
    const msg_head *h = (const msg_head *)e->in[0];
    const size_t bytes = e->all * sizeof(float);
    const unsigned char *state = e->in[0] + sizeof *h;
    /* a worker resumed from its own checkpoint keeps its inner state (parameters mid-round)
     * when the group is exactly where that checkpoint was: the same step, round-start
     * parameters and momentum (the whole run restarted, or the coordinator restarted from
     * a step this worker has a checkpoint of); else it takes the copy */
    *keep = e->loaded && h->step == e->start_step && !memcmp(e->start_all, state, bytes) &&
            !memcmp(e->mom, state + bytes, bytes);
    memcpy(e->start_all, state, bytes);
    memcpy(e->mom, state + bytes, bytes);
    e->start_step = h->step;
    for (int k = 0; k < h->n_members && k < MAX_W; k++) e->member[h->members[k]] = 1;
    say(o, h->step, *keep ? "joined (its checkpoint is the group's state: kept)" : "joined");
}

/* A joiner whose checkpoint is of another step than the group's (the coordinator restarted
 * from an older one, or the group moved on): its own checkpoint of the group's step, when
 * its folder holds one (reload: the caller's; collective over the job). */
static loom_status join_reload(loom_outer *o, int step, loom_outer_reload_fn reload, void *ctx,
                               loom_error *err) {
    elastic *e = o->elastic;
    const int back = e->start_step;
    int loaded = 0;
    loom_status st = reload(ctx, step, back, &loaded, err);
    if (st) return st;
    if (loaded) {
        e->start_step = step;
        return LOOM_OK;
    }
    if (e->lead && e->loaded)
        fprintf(stderr,
                "loom: elastic: worker %d: no usable checkpoint of the group's step %d in its "
                "folder: it takes the group's parameters and keeps the AdamW moments of its "
                "checkpoint of step %d (not the uninterrupted run's; docs/diloco.md)\n",
                e->me, step, back);
    else if (e->lead)
        fprintf(stderr,
                "loom: elastic: worker %d: no usable checkpoint of the group's step %d in its "
                "folder: it takes the group's parameters, its AdamW moments start fresh "
                "(docs/diloco.md)\n",
                e->me, step);
    return LOOM_OK;
}

/* The founder's lead: the group starts with whoever joined by the deadline. Its own name,
 * published and withdrawn at once, checks that the name server is there. */
static loom_status found(loom_outer *o, int step, loom_error *err) {
    elastic *e = o->elastic;
    char name[64], port[MPI_MAX_PORT_NAME];
    /* with the supervisor's "started" line and the next one: where a slow join's time went */
    fprintf(stderr, "loom: elastic: worker %d publishing its name (at %.3f)\n", e->me,
            loom_wall_s());
    const loom_status published = publish(e->me, name, port, err);
    if (published) return published;
    MPI_Unpublish_name(name, MPI_INFO_NULL, port);
    MPI_Close_port(port);
    e->member[e->me] = 1;
    fprintf(stderr,
            "loom: elastic: worker %d coordinates from step %d; waiting up to %g s for %d "
            "worker(s)\n",
            e->me, step, LOOM_OUTER_ELASTIC_START_S, e->W - 1);
    if (e->loaded) {
        char ids[4 * MAX_W];
        size_t at = 0;
        ids[0] = 0;
        for (int k = 0; k < e->n_saved_members; k++)
            at += (size_t)snprintf(ids + at, at < sizeof ids ? sizeof ids - at : 0, "%s%d",
                                   k ? "," : "", e->saved_members[k]);
        fprintf(stderr, "loom: elastic: worker %d: its checkpoint of step %d had members [%s]\n",
                e->me, step, ids);
    }
    window_open(e);
    const double t0 = loom_now_ms(), until = t0 + 1e3 * LOOM_OUTER_ELASTIC_START_S;
    int members = 1;
    while (members < e->W && loom_now_ms() < until) {
        members += admit(o, step);
        if (members < e->W) usleep(100000);
    }
    if (members < e->W) window_close(e, step, "founding", (loom_now_ms() - t0) * 1e-3);
    o->stats.bytes_step = 0.0;
    return LOOM_OK;
}

/* The job's ranks: who contributes what (every rank), and the lead's copy of the group's
 * round-start parameters. */
static loom_status group_open(loom_outer *o, loom_error *err) {
    elastic *e = o->elastic;
    e->lead = o->group->rank == 0;
    e->contrib = o->shards == 1 || o->dp->rank == 0;
    const int size = o->group->size;
    if (size > 1) e->job = o->group->mpi;
    e->counts = calloc(4 * (size_t)size, sizeof(int));
    if (!e->counts) return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    e->displs = e->counts + size;
    e->gcounts = e->counts + 2 * size, e->gdispls = e->counts + 3 * size;
    /* the parameters: a dp replica's buffer once; gradients (a warm start): every rank's */
    const int mine[2] = {e->contrib ? (int)o->n_start : 0, (int)o->n_start};
    int *both = calloc(2 * (size_t)size, sizeof(int));
    if (!both) return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    if (e->job == MPI_COMM_NULL)
        both[0] = mine[0], both[1] = mine[1];
    else if (MPI_Allgather(mine, 2, MPI_INT, both, 2, MPI_INT, e->job) != MPI_SUCCESS) {
        free(both);
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Allgather failed");
    }
    size_t at = 0, gat = 0;
    for (int r = 0; r < size; r++) {
        e->counts[r] = both[2 * r], e->gcounts[r] = both[2 * r + 1];
        e->displs[r] = (int)(at < 0x7fffffff ? at : 0x7fffffff);
        e->gdispls[r] = (int)(gat < 0x7fffffff ? gat : 0x7fffffff);
        at += (size_t)e->counts[r], gat += (size_t)e->gcounts[r];
    }
    free(both);
    e->all = at, e->gall = gat;
    if ((e->all * 2 > e->gall ? e->all * 2 : e->gall) * sizeof(float) + sizeof(msg_head) >
        (size_t)0x7fffffff)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--elastic-worker: the model is too large for one message (2 GiB)");
    return LOOM_OK;
}

/* Streaming: the lead learns where each rank's runs of every fragment are in start_all
 * (the ranks' runs, gathered once: their place in the rank's buffer and their length). */
static loom_status group_fragments(loom_outer *o, loom_error *err) {
    elastic *e = o->elastic;
    const int size = o->group->size, F = o->n_frag;
    /* this rank's runs and floats of each fragment (nothing from a dp replica's copy) */
    int *mine = calloc(2 * (size_t)F, sizeof(int)), n_runs = 0;
    if (!mine) return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    for (int k = 0; k < F && e->contrib; k++) {
        mine[2 * k] = o->frag[k].n_runs, mine[2 * k + 1] = (int)o->frag[k].n;
        n_runs += o->frag[k].n_runs;
    }
    uint64_t *runs = malloc((2 * (size_t)n_runs + 1) * sizeof *runs), *all_runs = NULL;
    /* lead: each rank's (runs, floats) of every fragment, then the runs' gather counts */
    int *all = e->lead ? calloc(2 * (size_t)F * size + 2 * (size_t)size, sizeof(int)) : NULL;
    int *rcounts = all ? all + 2 * (size_t)F * size : NULL,
        *rdispls = rcounts ? rcounts + size : NULL;
    size_t total = 0;
    loom_status st = LOOM_OK;
    if (!runs || (e->lead && !all)) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
        goto done;
    }
    for (int k = 0, at = 0; k < F && e->contrib; k++)
        for (int r = 0; r < o->frag[k].n_runs; r++, at += 2)
            runs[at] = o->frag[k].runs[r].packed, runs[at + 1] = o->frag[k].runs[r].numel;
    if (e->job == MPI_COMM_NULL) {
        memcpy(all, mine, 2 * (size_t)F * sizeof(int));
    } else if (MPI_Gather(mine, 2 * F, MPI_INT, all, 2 * F, MPI_INT, 0, e->job) != MPI_SUCCESS) {
        st = loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Gather failed");
        goto done;
    }
    for (int r = 0; e->lead && r < size; r++) {
        int n = 0;
        for (int k = 0; k < F; k++) n += all[2 * ((size_t)r * F + k)];
        rcounts[r] = 2 * n, rdispls[r] = (int)total;
        total += 2 * (size_t)n;
    }
    if (e->lead && !(all_runs = malloc((total + 1) * sizeof *all_runs))) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
        goto done;
    }
    if (e->job == MPI_COMM_NULL)
        memcpy(all_runs, runs, 2 * (size_t)n_runs * sizeof *runs);
    else if (MPI_Gatherv(runs, 2 * n_runs, MPI_UINT64_T, all_runs, rcounts, rdispls, MPI_UINT64_T,
                         0, e->job) != MPI_SUCCESS) {
        st = loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Gatherv failed");
        goto done;
    }
    if (!e->lead) goto done;
    if (!(e->parts = calloc((size_t)F, sizeof *e->parts))) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
        goto done;
    }
    for (int k = 0; k < F && !st; k++) {
        frag_part *fp = &e->parts[k];
        int n_map = 0;
        for (int r = 0; r < size; r++) n_map += all[2 * ((size_t)r * F + k)];
        fp->counts = calloc(2 * (size_t)size, sizeof(int));
        fp->map = malloc(((size_t)n_map + 1) * sizeof *fp->map);
        if (!fp->counts || !fp->map) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
            break;
        }
        fp->displs = fp->counts + size;
        for (int r = 0; r < size; r++) {
            const int *rk = all + 2 * (size_t)r * F; /* rank r: runs and floats of each fragment */
            const uint64_t *u = all_runs + rdispls[r];
            for (int j = 0; j < k; j++) u += 2 * (size_t)rk[2 * j];
            fp->counts[r] = rk[2 * k + 1], fp->displs[r] = (int)fp->all;
            fp->all += (size_t)rk[2 * k + 1];
            for (int j = 0; j < rk[2 * k]; j++)
                fp->map[fp->n_map++] = (span){(size_t)e->displs[r] + u[2 * j], u[2 * j + 1]};
        }
    }
done:
    free(mine), free(runs), free(all), free(all_runs);
    return st;
}

loom_status loom_outer_elastic_create(loom_outer *o, loom_error *err) {
    const loom_outer_config *c = &o->cfg;
    int mpi_on = 0;
    MPI_Initialized(&mpi_on);
    if (!mpi_on) /* loom alone runs one rank without MPI */
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--elastic-worker %d: expected to run under mpirun "
                              "--ompi-server file:URI (docs/diloco.md)",
                              c->elastic_worker);
    elastic *e = calloc(1, sizeof *e);
    if (!e) return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    o->elastic = e;
    e->me = c->elastic_worker;
    e->W = c->workers;
    e->coordinator = 0;
    e->timeout_ms = 1e3 * c->elastic_timeout;
    e->job = MPI_COMM_NULL;
    e->part = -1;
    for (int w = 0; w < MAX_W; w++) e->peer[w] = MPI_COMM_NULL;
    loom_status st = group_open(o, err);
    if (!st && o->n_frag) st = group_fragments(o, err);
    if (st) return st;
    /* streaming's exchanges overlap the inner steps where MPI may be called from a thread */
    e->overlap = o->n_frag && loom_world_thread_level() >= MPI_THREAD_MULTIPLE;
    if (e->overlap && e->lead && loom_worker_start(&e->xthread, exchange_thread, o) != 0)
        return loom_error_set(err, LOOM_ERR_STATE,
                              "--elastic-worker: starting the exchange thread failed");
    const size_t n1 = o->n_start ? o->n_start : 1, a1 = e->all ? e->all : 1;
    const size_t g1 = e->gall > a1 ? e->gall : a1; /* a warm start's gradients, or all */
    o->start = malloc(n1 * sizeof(float));
    e->mine = malloc(n1 * sizeof(float));
    if (o->own) e->view = malloc(n1 * sizeof(float));
    if (!o->start || !e->mine || (o->own && !e->view))
        return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    memcpy(o->start, params_view(o), o->n_start * sizeof(float));
    if (e->lead) {
        e->state_bytes = sizeof(msg_head) + 2 * e->all * sizeof(float);
        e->msg_bytes =
            sizeof(msg_head) + (2 * e->all > e->gall ? 2 * e->all : e->gall) * sizeof(float);
        e->wire_bytes = loom_outer_wire_bytes(o->dtype, e->all, c->block);
        e->start_all = malloc(a1 * sizeof(float));
        e->mom = calloc(a1, sizeof(float));
        e->g = malloc(a1 * sizeof(float));
        e->acc = malloc(g1 * sizeof(float));
        e->wide = malloc(g1 * sizeof(float));
        e->gbuf = o->cfg.start_step > 0 ? malloc(g1 * sizeof(float)) : NULL;
        e->out = malloc(e->msg_bytes);
        if (!e->start_all || !e->mom || !e->g || !e->acc || !e->wide || !e->out || !in_buf(e, 0) ||
            (o->cfg.start_step > 0 && !e->gbuf))
            return loom_error_set(err, LOOM_ERR_NOMEM, "--elastic-worker: out of memory");
    }
    /* name look-ups and connects report failures instead of ending the job */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    return LOOM_OK;
}

loom_status loom_outer_elastic_begin(loom_outer *o, int *step, loom_outer_reload_fn reload,
                                     void *ctx, loom_error *err) {
    elastic *e = o->elastic;
    e->start_step = *step;
    /* without a checkpoint the group's round-start parameters are its initial ones */
    int loaded = e->loaded;
    if (e->job != MPI_COMM_NULL && MPI_Bcast(&loaded, 1, MPI_INT, 0, e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Bcast failed");
    loom_status gs;
    if (!loaded && (gs = gather_params(o, err))) return gs;
    /* the lead founds or joins the group; every rank takes its part of the round-start
     * parameters, and its parameters too unless they continue them (kept) */
    const int founder = e->me == 0 && !o->cfg.elastic_join;
    int keep = founder, v[2];
    loom_status st = LOOM_OK;
    if (founder) {
        if (e->lead) st = found(o, e->start_step, err);
    } else {
        /* the coordinator's step to every rank: a joiner resumed from a checkpoint of
         * another step loads its own of that step first, when it has one */
        int at = e->start_step;
        if (e->lead) st = join_receive(o, &at, err);
        v[0] = at, v[1] = 0;
        st = group_verdict(o, st, v, err);
        if (!st && reload && v[0] != e->start_step) st = join_reload(o, v[0], reload, ctx, err);
        if (!st && e->lead) join_take(o, &keep);
    }
    v[0] = e->start_step, v[1] = keep; /* a joiner's lead: the coordinator's step */
    st = group_spread(o, st, v, err);
    e->start_step = v[0];
    o->stats.syncs = 0;
    *step = e->start_step;
    return st;
}

void loom_outer_elastic_free(loom_outer *o) {
    elastic *e = o->elastic;
    loom_worker_stop(&e->xthread); /* after a running exchange ends (its deadline at most) */
    for (int w = 0; w < MAX_W; w++) {
        /* after the last sync every live peer disconnects too; otherwise abandon */
        if (e->finished && e->peer[w] != MPI_COMM_NULL) MPI_Comm_disconnect(&e->peer[w]);
        free(e->in[w]);
    }
    free(e->mom), free(e->g), free(e->acc), free(e->wide), free(e->gbuf), free(e->out);
    free(e->start_all), free(e->mine), free(e->view), free(e->counts);
    for (int k = 0; e->parts && k < o->n_frag; k++) free(e->parts[k].counts), free(e->parts[k].map);
    free(e->parts);
    free(e);
    o->elastic = NULL;
}

void loom_outer_elastic_mesh(loom_mesh *m, const loom_outer_config *c) {
    if (c->elastic_worker < 0) return;
    m->worker = c->elastic_worker;
    m->workers = c->workers;
    m->data_rank += m->worker * m->layout.dp;
}

/* ---- checkpoints: the lead's DIR/outer/step_N/elastic.bin (parallel/outer.h) ---- */

/* Version 2 adds the run's --outer-start-step after the head (version 1 files: 0). */
static const char MAGIC1[8] = {'L', 'O', 'O', 'M', 'E', 'L', 'A', '1'};
static const char MAGIC[8] = {'L', 'O', 'O', 'M', 'E', 'L', 'A', '2'};

typedef struct {
    char magic[8];
    int64_t step;
    uint64_t all;
    int32_t workers, worker, n_members;
    int32_t members[MAX_W];
} state_head;

static void state_path(char *out, size_t n, const char *dir, int step) {
    snprintf(out, n, "%s/outer/step_%08d/elastic.bin", dir, step);
}

int loom_outer_elastic_saved(const loom_outer *o, const char *dir, int step) {
    if (!o->elastic->lead) return 1;
    char path[1200];
    state_path(path, sizeof path, dir, step);
    return access(path, F_OK) == 0;
}

loom_status loom_outer_elastic_save(loom_outer *o, const char *dir, int step, loom_error *err) {
    elastic *e = o->elastic;
    if (!e->lead) return LOOM_OK; /* the lead holds the group's outer state */
    /* a streaming sync under way: its outer step is part of this step's state (the landing
     * then only spreads it; a resume lands it from the saved round-start values) */
    loom_status fs;
    if (e->pending && (fs = flight_apply(o, err))) return fs;
    char path[1200], tmp[1216];
    state_path(path, sizeof path, dir, step);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    loom_mkdir_parent(path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-dir: cannot write %s: %s", tmp,
                              strerror(errno));
    state_head h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.step = step, h.all = e->all, h.workers = e->W, h.worker = e->me;
    for (int w = 0; w < e->W; w++)
        if (e->member[w]) h.members[h.n_members++] = w;
    const size_t bytes = e->all * sizeof(float);
    const int32_t ext[2] = {o->cfg.start_step, 0};
    uint32_t crc = loom_crc32c(0, &h, sizeof h);
    crc = loom_crc32c(crc, ext, sizeof ext);
    crc = loom_crc32c(crc, e->start_all, bytes);
    crc = loom_crc32c(crc, e->mom, bytes);
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(ext, sizeof ext, 1, f) == 1 &&
             (!bytes || fwrite(e->start_all, bytes, 1, f) == 1) &&
             (!bytes || fwrite(e->mom, bytes, 1, f) == 1) && fwrite(&crc, sizeof crc, 1, f) == 1;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-dir: writing %s failed: %s", path,
                              strerror(errno));
    }
    return LOOM_OK;
}

loom_status loom_outer_elastic_load(loom_outer *o, const char *dir, int step, loom_error *err) {
    elastic *e = o->elastic;
    if (!e->lead) return LOOM_OK;
    char path[1200];
    state_path(path, sizeof path, dir, step);
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: the elastic worker's outer state %s: cannot open: %s "
                              "(saved by --elastic-worker with the same workers and layout)",
                              path, strerror(errno));
    state_head h;
    const size_t bytes = e->all * sizeof(float);
    int ok = fread(&h, sizeof h, 1, f) == 1;
    const int v1 = ok && !memcmp(h.magic, MAGIC1, 8);
    int32_t ext[2] = {0, 0};
    ok = ok && (v1 || (!memcmp(h.magic, MAGIC, 8) && fread(ext, sizeof ext, 1, f) == 1));
    ok = ok && h.step == step && h.all == e->all && h.workers == e->W && h.worker == e->me &&
         h.n_members >= 0 && h.n_members <= MAX_W;
    uint32_t crc = 0;
    ok = ok && (!bytes || fread(e->start_all, bytes, 1, f) == 1) &&
         (!bytes || fread(e->mom, bytes, 1, f) == 1) && fread(&crc, sizeof crc, 1, f) == 1;
    fclose(f);
    if (ok) {
        uint32_t want = loom_crc32c(0, &h, sizeof h);
        if (!v1) want = loom_crc32c(want, ext, sizeof ext);
        want = loom_crc32c(want, e->start_all, bytes);
        ok = loom_crc32c(want, e->mom, bytes) == crc;
    }
    if (!ok) {
        memset(e->mom, 0, bytes);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: %s: not this worker's outer state (step, size or workers "
                              "differ), truncated or corrupt",
                              path);
    }
    if (ext[0] != o->cfg.start_step) { /* named only once the CRC holds */
        memset(e->mom, 0, bytes);
        return loom_outer_other_start(o, path, (int)ext[0], err);
    }
    e->loaded = 1;
    e->n_saved_members = h.n_members;
    memcpy(e->saved_members, h.members, sizeof h.members);
    return LOOM_OK;
}
