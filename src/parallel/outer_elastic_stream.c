/* Elastic DiLoCo workers, streaming (parallel/outer_elastic_impl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/outer_elastic_impl.h"

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
    loom_elastic_say(o, step, what);
}

/* B: the lead's exchange of fragment u's outer gradient (e->g) for the members' mean. */
static loom_status fragment_exchange(loom_outer *o, int u, int step, loom_error *err) {
    elastic *e = o->elastic;
    const exchange x = {MSG_DELTA, MSG_UPDATE,       e->g,          part_offset(o, u, o->kinds),
                        o->dtype,  "outer gradient", "outer update"};
    e->part = u;
    const loom_status st = loom_elastic_mean(o, step, &x, MEAN_DIVIDE, err);
    e->part = -1;
    return st;
}

void *loom_elastic_exchange_thread(void *arg) {
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
    if ((st = loom_elastic_group_verdict(o, st, v, err))) return st;
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
loom_status loom_elastic_flight_apply(loom_outer *o, loom_error *err) {
    elastic *e = o->elastic;
    if (e->flight != FLIGHT_RUNNING) return e->flight_st;
    const double t0 = loom_now_ms();
    loom_status st = loom_worker_wait(&e->xthread, err);
    const double waited = loom_now_ms() - t0;
    o->stats.hidden_ms += e->flight_ms > waited ? e->flight_ms - waited : 0.0;
    loom_elastic_take_sent(o);
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
        loom_elastic_take_sent(o);
        if (!st) fragment_apply(o, u, step);
    }
    return fragment_spread(o, u, st, err);
}

/* Fragment u's overlapped sync, at its landing: C (unless a save took it) and D. */
static loom_status fragment_finish(loom_outer *o, int u, loom_error *err) {
    elastic *e = o->elastic;
    if (!e->pending) return LOOM_OK; /* resumed after the sync: C was saved, D done at start */
    loom_status st = e->lead ? loom_elastic_flight_apply(o, err) : LOOM_OK;
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
loom_status loom_elastic_streaming_step(loom_outer *o, int step, loom_error *err) {
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
        loom_elastic_admit_now(o, step);
    return st;
}

/* Streaming: the lead learns where each rank's runs of every fragment are in start_all
 * (the ranks' runs, gathered once: their place in the rank's buffer and their length). */
loom_status loom_elastic_group_fragments(loom_outer *o, loom_error *err) {
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
