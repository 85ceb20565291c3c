#include "parallel/mesh.h"

#include <stdio.h>
#include <string.h>

loom_status loom_layout_validate(loom_layout l, int world_size, loom_error *err) {
    if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1 || l.cp < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--dp %d --tp %d --pp %d --ep %d --cp %d: every size must be >= 1",
                              l.dp, l.tp, l.pp, l.ep, l.cp);
    if (l.tp > world_size)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--tp %d: larger than the job's %d rank(s) (a tensor-parallel group "
                              "needs --tp ranks; launch with mpirun -n %d or more)",
                              l.tp, world_size, l.tp);
    if (l.pp > world_size)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp %d: larger than the job's %d rank(s) (each pipeline stage "
                              "needs its own ranks; launch with mpirun -n %d or more)",
                              l.pp, world_size, l.pp);
    const long ranks = (long)l.dp * l.cp * l.tp * l.pp;
    if (ranks != world_size) {
        char cp[32] = "";
        if (l.cp > 1) snprintf(cp, sizeof cp, " x --cp %d", l.cp);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--dp %d%s x --tp %d x --pp %d = %ld ranks, but the job has %d "
                              "(launch with mpirun -n %ld, or change the sizes)",
                              l.dp, cp, l.tp, l.pp, ranks, world_size, ranks);
    }
    const int replicas = loom_layout_replicas(l);
    if (replicas % l.ep != 0) {
        if (l.cp > 1)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--ep %d: must divide --dp %d x --cp %d = %d (expert-parallel "
                                  "groups are carved out of the data- and context-parallel ranks)",
                                  l.ep, l.dp, l.cp, replicas);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ep %d: must divide --dp %d (expert-parallel groups are carved "
                              "out of the data-parallel group)",
                              l.ep, l.dp);
    }
    return LOOM_OK;
}

static loom_status split(loom_comm *out, const loom_comm *world, int color, int key,
                         const char *name, loom_error *err) {
    MPI_Comm sub;
    if (MPI_Comm_split(world->mpi, color, key, &sub) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "mesh: MPI_Comm_split for %s failed", name);
    loom_status st = loom_comm_from_mpi(out, sub, name, err);
    MPI_Comm_free(&sub);
    return st;
}

/* Rank `rank`'s coordinates: tp fastest, then cp, dp, pp (Megatron's order). */
static void place(loom_mesh *m, loom_layout l, int size, int rank) {
    m->layout = l;
    m->rank = rank;
    m->size = size;
    const int R = loom_layout_replicas(l); /* dp x cp: the parameters' replicas */
    m->tp_rank = rank % l.tp;
    m->cp_rank = (rank / l.tp) % l.cp;
    m->data_rank = (rank / (l.tp * l.cp)) % l.dp;
    m->dp_rank = m->data_rank * l.cp + m->cp_rank;
    m->pp_rank = rank / (l.tp * R);
    m->ep_rank = m->dp_rank % l.ep;
}

loom_status loom_mesh_shape(loom_mesh *m, loom_layout l, int world_size, int rank,
                            loom_error *err) {
    memset(m, 0, sizeof *m);
    loom_status st = loom_layout_validate(l, world_size, err);
    if (st) return st;
    if (rank < 0 || rank >= world_size)
        return loom_error_set(err, LOOM_ERR_INPUT, "rank %d: expected 0..%d", rank, world_size - 1);
    place(m, l, world_size, rank);
    const int R = loom_layout_replicas(l), r = m->dp_rank;
    loom_comm_shape(&m->world, "world", rank, world_size);
    loom_comm_shape(&m->dp, "dp", r, R);
    loom_comm_shape(&m->tp, "tp", m->tp_rank, l.tp);
    loom_comm_shape(&m->pp, "pp", m->pp_rank, l.pp);
    loom_comm_shape(&m->cp, "cp", m->cp_rank, l.cp);
    loom_comm_shape(&m->ep, "ep", r % l.ep, l.ep);
    loom_comm_shape(&m->edp, "edp", r / l.ep, R / l.ep);
    m->workers = 1;
    loom_comm_shape(&m->outer, "outer", 0, 1);
    return LOOM_OK;
}

/* The communicators of a mesh placed by place(), split out of base (MPI_COMM_WORLD, or a
 * worker group). */
static loom_status create_on(loom_mesh *m, MPI_Comm base, loom_error *err) {
    const loom_layout l = m->layout;
    const int R = loom_layout_replicas(l);
    /* cell: the ranks of one (pp, tp) pair; r: this rank's place among its replicas */
    const int pp_i = m->pp_rank, r = m->dp_rank, tp_i = m->tp_rank;
    const int cell = pp_i * l.tp + tp_i;
    const int data_i = m->data_rank - m->worker * l.dp; /* inside the group */
    loom_status st;
    if ((st = loom_comm_from_mpi(&m->world, base, "world", err)) ||
        (st = split(&m->dp, &m->world, cell, r, "dp", err)) ||
        (st = split(&m->tp, &m->world, pp_i * R + r, tp_i, "tp", err)) ||
        (st = split(&m->pp, &m->world, r * l.tp + tp_i, pp_i, "pp", err)) ||
        (st = split(&m->cp, &m->world, (pp_i * l.dp + data_i) * l.tp + tp_i, m->cp_rank, "cp",
                    err)) ||
        (st = split(&m->ep, &m->world, cell * (R / l.ep) + r / l.ep, r % l.ep, "ep", err)) ||
        (st = split(&m->edp, &m->world, cell * l.ep + r % l.ep, r / l.ep, "edp", err))) {
        loom_mesh_free(m);
        return st;
    }
    return LOOM_OK;
}

loom_status loom_mesh_create(loom_mesh *m, const loom_world *w, loom_layout l, loom_error *err) {
    memset(m, 0, sizeof *m);
    loom_status st = loom_layout_validate(l, w->size, err);
    if (st) return st;
    place(m, l, w->size, w->rank);
    m->workers = 1;
    loom_comm_self(&m->outer, "outer");
    if (!w->mpi) { /* one process: every communicator is trivial */
        loom_comm_self(&m->world, "world");
        loom_comm_self(&m->dp, "dp");
        loom_comm_self(&m->tp, "tp");
        loom_comm_self(&m->pp, "pp");
        loom_comm_self(&m->ep, "ep");
        loom_comm_self(&m->edp, "edp");
        loom_comm_self(&m->cp, "cp");
        return LOOM_OK;
    }
    return create_on(m, MPI_COMM_WORLD, err);
}

loom_status loom_mesh_create_workers(loom_mesh *m, const loom_world *w, loom_layout l, int workers,
                                     loom_error *err) {
    if (workers <= 1) return loom_mesh_create(m, w, l, err);
    memset(m, 0, sizeof *m);
    if (w->size % workers != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--workers %d: must divide the job's %d rank(s) (each worker group "
                              "gets the same number of ranks)",
                              workers, w->size);
    const int group = w->size / workers;
    loom_status st = loom_layout_validate(l, group, err);
    if (st)
        return loom_error_prefix(err, "--workers %d: each worker group has %d rank(s)", workers,
                                 group);
    place(m, l, group, w->rank % group);
    m->worker = w->rank / group;
    m->workers = workers;
    m->data_rank += m->worker * l.dp;
    loom_comm_self(&m->outer, "outer"); /* until split below (freeable on failure) */
    MPI_Comm sub;
    if (MPI_Comm_split(MPI_COMM_WORLD, m->worker, w->rank, &sub) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_IO, "mesh: MPI_Comm_split for the worker group failed");
    st = create_on(m, sub, err);
    MPI_Comm_free(&sub);
    if (st) return st;
    if (MPI_Comm_split(MPI_COMM_WORLD, m->rank, m->worker, &sub) != MPI_SUCCESS) {
        loom_mesh_free(m);
        return loom_error_set(err, LOOM_ERR_IO, "mesh: MPI_Comm_split for outer failed");
    }
    st = loom_comm_from_mpi(&m->outer, sub, "outer", err);
    MPI_Comm_free(&sub);
    if (st) loom_mesh_free(m);
    return st;
}

void loom_mesh_free(loom_mesh *m) {
    loom_comm_free(&m->outer);
    loom_comm_free(&m->edp);
    loom_comm_free(&m->cp);
    loom_comm_free(&m->ep);
    loom_comm_free(&m->pp);
    loom_comm_free(&m->tp);
    loom_comm_free(&m->dp);
    loom_comm_free(&m->world);
}
