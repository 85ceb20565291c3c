/* Elastic DiLoCo workers: one MPI job per worker, outer syncs point to point through a
 * coordinator, with deadlines (parallel/outer_elastic.h; docs/diloco.md says why each
 * choice, and why the members cannot diverge). This file: the worker's life in the group
 * (create, found or join, the syncs of plain DiLoCo and of a warm start) and, inside the
 * worker's job, the lead's gather and spread; parallel/outer_elastic_impl.h names the
 * others. */
#include "parallel/outer_elastic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/timeline.h"
#include "comm/world.h"
#include "parallel/outer_elastic_impl.h"

/* A joiner's rank slower than this from its start to the join says where the time went */
#define SLOW_START_MS 10e3

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
loom_status loom_elastic_group_verdict(loom_outer *o, loom_status st, int v[2], loom_error *err) {
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
    if ((st = loom_elastic_group_verdict(o, st, v, err))) return st;
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

/* The lead's outer step: the members' mean outer gradient (added in worker order, divided
 * by their number, as the one-job mode's owner of a chunk does), then the outer step,
 * the same on every member. */
static loom_status sync_outer(loom_outer *o, int step, loom_error *err) {
    elastic *e = o->elastic;
    const exchange x = {MSG_DELTA, MSG_UPDATE,       e->g,          e->all,
                        o->dtype,  "outer gradient", "outer update"};
    const loom_status st = loom_elastic_mean(o, step, &x, MEAN_DIVIDE, err);
    loom_elastic_take_sent(o);
    if (st) return st;
    apply(o, step, e->g);
    loom_elastic_say(o, step, "outer sync");
    if (e->me == e->coordinator && step < o->steps) loom_elastic_admit_now(o, step);
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
        st = loom_elastic_mean(o, step, &x, MEAN_TIMES_INVERSE, err);
        loom_elastic_take_sent(o);
    }
    int v[2] = {step, 0};
    if ((st = loom_elastic_group_verdict(o, st, v, err))) return st;
    if (e->job == MPI_COMM_NULL)
        memcpy(grads, e->gbuf, n * sizeof(float));
    else if (MPI_Scatterv(e->gbuf, e->gcounts, e->gdispls, MPI_FLOAT, grads, (int)n, MPI_FLOAT, 0,
                          e->job) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "--elastic-worker: MPI_Scatterv failed");
    o->sync_bytes = o->stats.bytes_step;
    o->sync_ms = loom_now_ms() - t0;
    return LOOM_OK;
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
        st = loom_elastic_streaming_step(o, step, err);
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
    const loom_status published = loom_elastic_publish(e, name, port, err);
    if (published) return published;
    fprintf(stderr, "loom: elastic: worker %d waiting to join (%s published at %.3f)\n", e->me,
            name, loom_wall_s());
    MPI_Comm ic = MPI_COMM_NULL;
    const int rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &ic);
    if (rc != MPI_SUCCESS) {
        loom_elastic_withdraw(e, name, port);
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
        loom_elastic_poll(rq, 1, &st, e->timeout_ms);
    loom_elastic_withdraw(e, name, port);
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
    loom_elastic_say(o, h->step,
                     *keep ? "joined (its checkpoint is the group's state: kept)" : "joined");
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
    const loom_status published = loom_elastic_publish(e, name, port, err);
    if (published) return published;
    loom_elastic_withdraw(e, name, port);
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
    loom_elastic_window_open(e);
    const double t0 = loom_now_ms(), until = t0 + 1e3 * LOOM_OUTER_ELASTIC_START_S;
    int members = 1;
    while (members < e->W && loom_now_ms() < until) {
        members += loom_elastic_admit(o, step);
        if (members < e->W) usleep(100000);
    }
    if (members < e->W) loom_elastic_window_close(e, step, "founding", (loom_now_ms() - t0) * 1e-3);
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
    if (!st && o->n_frag) st = loom_elastic_group_fragments(o, err);
    if (st) return st;
    /* streaming's exchanges overlap the inner steps where MPI may be called from a thread */
    e->overlap = o->n_frag && loom_world_thread_level() >= MPI_THREAD_MULTIPLE;
    if (e->overlap && e->lead &&
        loom_worker_start(&e->xthread, loom_elastic_exchange_thread, o) != 0)
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
        if (!e->start_all || !e->mom || !e->g || !e->acc || !e->wide || !e->out ||
            !loom_elastic_in_buf(e, 0) || (o->cfg.start_step > 0 && !e->gbuf))
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
        /* a rank other than the lead slow to get here (the lead waits for it in the job's
         * collectives above) says where its start-up went; the lead says it in any case */
        if (!e->lead && loom_timeline_elapsed_ms() > SLOW_START_MS) {
            char who[48];
            snprintf(who, sizeof who, "elastic: worker %d rank %d", e->me, o->group->rank);
            loom_timeline_print_so_far(stderr, who);
        }
        if (e->lead) st = join_receive(o, &at, err);
        v[0] = at, v[1] = 0;
        st = loom_elastic_group_verdict(o, st, v, err);
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
    loom_liveness_close(&e->alive);
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
