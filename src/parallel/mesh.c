#include "parallel/mesh.h"

#include <string.h>

loom_status loom_layout_validate(loom_layout l, int world_size, loom_error *err) {
    if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--dp %d --tp %d --pp %d --ep %d: every size must be >= 1", l.dp,
                              l.tp, l.pp, l.ep);
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
    if ((long)l.dp * l.tp * l.pp != world_size)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--dp %d x --tp %d x --pp %d = %ld ranks, but the job has %d "
                              "(launch with mpirun -n %ld, or change the sizes)",
                              l.dp, l.tp, l.pp, (long)l.dp * l.tp * l.pp, world_size,
                              (long)l.dp * l.tp * l.pp);
    if (l.dp % l.ep != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ep %d: must divide --dp %d (expert-parallel groups are carved "
                              "out of the data-parallel group)",
                              l.ep, l.dp);
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

loom_status loom_mesh_create(loom_mesh *m, const loom_world *w, loom_layout l, loom_error *err) {
    memset(m, 0, sizeof *m);
    loom_status st = loom_layout_validate(l, w->size, err);
    if (st) return st;
    m->layout = l;
    m->rank = w->rank;
    m->size = w->size;
    m->tp_rank = w->rank % l.tp;
    m->dp_rank = (w->rank / l.tp) % l.dp;
    m->pp_rank = w->rank / (l.tp * l.dp);
    m->ep_rank = m->dp_rank % l.ep;
    if (!w->mpi) { /* one process: every communicator is trivial */
        loom_comm_self(&m->world, "world");
        loom_comm_self(&m->dp, "dp");
        loom_comm_self(&m->tp, "tp");
        loom_comm_self(&m->pp, "pp");
        loom_comm_self(&m->ep, "ep");
        loom_comm_self(&m->edp, "edp");
        return LOOM_OK;
    }
    const int pp_i = m->pp_rank, dp_i = m->dp_rank, tp_i = m->tp_rank;
    if ((st = loom_comm_from_mpi(&m->world, MPI_COMM_WORLD, "world", err)) ||
        (st = split(&m->dp, &m->world, pp_i * l.tp + tp_i, dp_i, "dp", err)) ||
        (st = split(&m->tp, &m->world, pp_i * l.dp + dp_i, tp_i, "tp", err)) ||
        (st = split(&m->pp, &m->world, dp_i * l.tp + tp_i, pp_i, "pp", err)) ||
        (st = split(&m->ep, &m->world, (pp_i * l.tp + tp_i) * (l.dp / l.ep) + dp_i / l.ep,
                    dp_i % l.ep, "ep", err)) ||
        (st = split(&m->edp, &m->world, (pp_i * l.tp + tp_i) * l.ep + dp_i % l.ep, dp_i / l.ep,
                    "edp", err))) {
        loom_mesh_free(m);
        return st;
    }
    return LOOM_OK;
}

void loom_mesh_free(loom_mesh *m) {
    loom_comm_free(&m->edp);
    loom_comm_free(&m->ep);
    loom_comm_free(&m->pp);
    loom_comm_free(&m->tp);
    loom_comm_free(&m->dp);
    loom_comm_free(&m->world);
}
