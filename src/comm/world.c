#include "comm/world.h"

#include <mpi.h>
#include <stdlib.h>

/* Launchers announce themselves in the environment; without one, skip MPI (an MPI
 * singleton would fork a runtime daemon for nothing). */
int loom_world_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("SLURM_PROCID");
}

loom_status loom_world_init(loom_world *w, int *argc, char ***argv, loom_error *err) {
    w->rank = 0;
    w->size = 1;
    w->mpi = 0;
    if (!loom_world_launched()) return LOOM_OK;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return loom_error_set(err, LOOM_ERR_STATE, "MPI_Init_thread failed");
    w->mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    return LOOM_OK;
}

void loom_world_finalize(loom_world *w) {
    if (w->mpi) MPI_Finalize();
    w->mpi = 0;
}
