/* LD_PRELOAD shim for test_diloco.py: MPI_Unpublish_name of the service LOOM_SHIM_NAME waits
 * LOOM_SHIM_DELAY_S seconds first. An elastic joiner withdraws its name through a round trip
 * to its mpirun and the ompi-server, which a loaded machine can stretch; this makes that
 * slowness happen on every run (docs/diloco.md, "Elastic workers"). Built by the test with
 * mpicc; without the two variables it only forwards to PMPI_Unpublish_name. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int MPI_Unpublish_name(const char *service, MPI_Info info, const char *port) {
    const char *name = getenv("LOOM_SHIM_NAME"), *delay = getenv("LOOM_SHIM_DELAY_S");
    if (name && delay && !strcmp(service, name)) {
        const double s = atof(delay);
        fprintf(stderr, "shim: MPI_Unpublish_name(%s) delayed by %.1f s\n", service, s);
        struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&t, NULL);
    }
    return PMPI_Unpublish_name(service, info, port);
}
