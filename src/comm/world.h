/* The process world: MPI when launched by an MPI launcher (mpirun, srun), a single
 * process without MPI otherwise, so `loom train` runs with or without mpirun. */
#ifndef LOOM_COMM_WORLD_H
#define LOOM_COMM_WORLD_H

#include "core/error.h"

typedef struct {
    int rank, size;
    int mpi; /* 1 when MPI was initialised by loom_world_init */
} loom_world;

/* 1 when an MPI launcher (mpirun, srun) started this process. */
int loom_world_launched(void);
loom_status loom_world_init(loom_world *w, int *argc, char ***argv, loom_error *err);
void loom_world_finalize(loom_world *w);
/* The thread level MPI provides (MPI_THREAD_SINGLE when MPI is not initialised). */
int loom_world_thread_level(void);
const char *loom_world_thread_level_name(int level);

#endif
