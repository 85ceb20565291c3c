#include "parallel/placement.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char host[64];
    int dp, tp, pp;
} where;

/* The most hosts one group of a dimension spans: a group is the ranks that agree on the
 * two other coordinates (dim 0 = dp, 1 = tp, 2 = pp). */
static int hosts_per_group(const where *w, const int *host_id, int n, int dim) {
    int most = 1;
    for (int r = 0; r < n; r++) {
        int distinct = 0;
        for (int q = 0; q < n; q++) {
            const int same = (dim == 0 || w[q].dp == w[r].dp) && (dim == 1 || w[q].tp == w[r].tp) &&
                             (dim == 2 || w[q].pp == w[r].pp);
            if (!same) continue;
            int seen = 0; /* is q's host that of an earlier member? */
            for (int p = 0; p < q && !seen; p++)
                seen = host_id[p] == host_id[q] && (dim == 0 || w[p].dp == w[r].dp) &&
                       (dim == 1 || w[p].tp == w[r].tp) && (dim == 2 || w[p].pp == w[r].pp);
            distinct += !seen;
        }
        if (distinct > most) most = distinct;
    }
    return most;
}

void loom_placement_report(const loom_mesh *m, FILE *f) {
    if (m->size <= 1 || m->world.mpi == MPI_COMM_NULL) return;
    where me = {{0}, m->dp_rank, m->tp_rank, m->pp_rank};
    if (gethostname(me.host, sizeof me.host) != 0) snprintf(me.host, sizeof me.host, "?");
    me.host[sizeof me.host - 1] = 0;
    const int n = m->size;
    where *all = m->rank == 0 ? calloc((size_t)n, sizeof *all) : NULL;
    int *host_id = m->rank == 0 ? calloc((size_t)n, sizeof *host_id) : NULL;
    int ok = m->rank != 0 || (all && host_id);
    MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, m->world.mpi);
    if (m->rank != 0 || !ok) {
        free(all);
        free(host_id);
        return;
    }
    int hosts = 0;
    for (int r = 0; r < n; r++) {
        host_id[r] = -1;
        for (int q = 0; q < r && host_id[r] < 0; q++)
            if (!strcmp(all[q].host, all[r].host)) host_id[r] = host_id[q];
        if (host_id[r] < 0) host_id[r] = hosts++;
    }
    char line[2048];
    size_t len = (size_t)snprintf(line, sizeof line, "loom train: placement:");
    for (int h = 0; h < hosts && len < sizeof line; h++) {
        int first = -1;
        for (int r = 0; r < n && first < 0; r++)
            if (host_id[r] == h) first = r;
        len += (size_t)snprintf(line + len, sizeof line - len, "%s %s ranks", h ? "," : "",
                                all[first].host);
        for (int r = first, k = 0; r < n && len < sizeof line; r++) { /* runs: A-B,C */
            if (host_id[r] != h || (r > first && host_id[r - 1] == h)) continue;
            int e = r;
            while (e + 1 < n && host_id[e + 1] == h) e++;
            len += (size_t)(e > r ? snprintf(line + len, sizeof line - len, "%s%d-%d",
                                             k++ ? "," : " ", r, e)
                                  : snprintf(line + len, sizeof line - len, "%s%d", k++ ? "," : " ",
                                             r));
        }
    }
    if (len < sizeof line)
        snprintf(line + len, sizeof line - len,
                 "; a tp group spans %d host(s), a dp group %d, a pp group %d",
                 hosts_per_group(all, host_id, n, 1), hosts_per_group(all, host_id, n, 0),
                 hosts_per_group(all, host_id, n, 2));
    fprintf(f, "%s\n", line);
    free(all);
    free(host_id);
}
