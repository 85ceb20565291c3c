/* What survives a peer's death or loss between two MPI jobs joined by MPI_Comm_connect /
 * MPI_Comm_accept (OpenMPI 4.1 has no ULFM): bench/probe_elastic.py builds and runs it;
 * not part of the library.
 *
 *   mpicc -O2 -o mpi_join_probe bench/mpi_join_probe.c
 *   ompi-server --no-daemonize -r URI &
 *   mpirun --ompi-server file:URI -n 2 ./mpi_join_probe stay SECONDS TIMEOUT_S [STOPFILE]
 *   mpirun --ompi-server file:URI -n 1 ./mpi_join_probe join SECONDS TIMEOUT_S [STOPFILE]
 *
 * stay (the job that goes on, any number of ranks): every 0.2 s a "step": an MPI_Allreduce
 *   over its own MPI_COMM_WORLD (the job's own work), then on rank 0, when no peer is
 *   joined, MPI_Lookup_name of the service (answers at once when nothing is published)
 *   and, when a joiner published its port, MPI_Comm_connect to it; with a peer, one
 *   exchange (MPI_Isend/MPI_Irecv of one double on the intercommunicator, polled with
 *   MPI_Testall up to TIMEOUT_S). An exchange that does not complete in time (the peer
 *   died or its link is cut: MPI itself reports nothing, and neither fails nor aborts)
 *   drops the peer: its intercommunicator and requests are abandoned, never freed
 *   (MPI_Comm_disconnect and MPI_Comm_free would wait for the dead peer).
 * join (the job that comes and goes, rank 0): MPI_Open_port, MPI_Publish_name, a blocking
 *   MPI_Comm_accept (the stay job connects at its next step), MPI_Unpublish_name, then an
 *   exchange every 0.2 s; after a lost exchange it publishes and accepts again.
 * Both end after SECONDS or once STOPFILE exists (join: before it would publish again).
 *
 * Each event is one JSON line on stdout: {"role", "t" (seconds since the start), "event":
 * joined | lost | summary, ...}; summary: steps, exchanges, joins, losses and the longest
 * step (ms: whether a lost peer stalls the job's own work beyond TIMEOUT_S). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char port[MPI_MAX_PORT_NAME];
static double t0;
static const char *role;
static const char *service = "loom-probe-joiner";

static void event(const char *ev, const char *extra) {
    printf("{\"role\": \"%s\", \"t\": %.3f, \"event\": \"%s\"%s%s}\n", role, now_s() - t0, ev,
           extra[0] ? ", " : "", extra);
    fflush(stdout);
}

/* One exchange with the peer, polled until timeout_s; 1 when it completed. */
static int exchange(MPI_Comm inter, double x, double timeout_s) {
    double y = -1, t = now_s();
    MPI_Request rq[2];
    int done = 0;
    if (MPI_Irecv(&y, 1, MPI_DOUBLE, 0, 7, inter, &rq[0]) ||
        MPI_Isend(&x, 1, MPI_DOUBLE, 0, 7, inter, &rq[1]))
        return 0;
    while (!done && now_s() - t < timeout_s) {
        if (MPI_Testall(2, rq, &done, MPI_STATUSES_IGNORE)) return 0;
        if (!done) usleep(1000);
    }
    return done; /* not done: the requests are abandoned with the intercommunicator */
}

int main(int argc, char **argv) {
    if ((argc != 4 && argc != 5) || (strcmp(argv[1], "stay") && strcmp(argv[1], "join"))) {
        fprintf(stderr, "usage: mpi_join_probe stay|join SECONDS TIMEOUT_S [STOPFILE]\n");
        return 2;
    }
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN); /* also for name lookups */
    t0 = now_s();
    role = argv[1];
    int stay = !strcmp(role, "stay");
    double seconds = atof(argv[2]), timeout_s = atof(argv[3]);
    const char *stopfile = argc == 5 ? argv[4] : NULL;
    char buf[256];
    int steps = 0, exchanges = 0, joins = 0, losses = 0, stop = 0;
    double longest_ms = 0;
    MPI_Comm peer = MPI_COMM_NULL;
    while (!stop) {
        double ts = now_s();
        int one = 1, sum = 0;
        if (stay) MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        steps++;
        if (rank == 0 && peer == MPI_COMM_NULL) {
            int rc = MPI_SUCCESS;
            if (stay) {
                if (MPI_Lookup_name(service, MPI_INFO_NULL, port) == MPI_SUCCESS)
                    rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &peer);
            } else {
                if (stopfile && access(stopfile, F_OK) == 0) break; /* not again */
                MPI_Open_port(MPI_INFO_NULL, port);
                MPI_Publish_name(service, MPI_INFO_NULL, port);
                rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &peer);
                MPI_Unpublish_name(service, MPI_INFO_NULL, port);
                MPI_Close_port(port);
            }
            if (rc != MPI_SUCCESS) peer = MPI_COMM_NULL;
            if (peer != MPI_COMM_NULL) {
                MPI_Comm_set_errhandler(peer, MPI_ERRORS_RETURN);
                joins++;
                snprintf(buf, sizeof buf, "\"joins\": %d", joins);
                event("joined", buf);
            } else if (rc != MPI_SUCCESS) {
                snprintf(buf, sizeof buf, "\"rc\": %d", rc);
                event("join_failed", buf);
            }
        }
        if (rank == 0 && peer != MPI_COMM_NULL) {
            if (exchange(peer, steps, timeout_s)) {
                exchanges++;
            } else {
                losses++;
                snprintf(buf, sizeof buf, "\"losses\": %d", losses);
                event("lost", buf);
                peer = MPI_COMM_NULL; /* abandoned */
            }
        }
        double ms = (now_s() - ts) * 1e3;
        if (ms > longest_ms) longest_ms = ms;
        stop = now_s() - t0 >= seconds || (stopfile && access(stopfile, F_OK) == 0);
        MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
        usleep(200000);
    }
    if (rank == 0) {
        snprintf(buf, sizeof buf,
                 "\"steps\": %d, \"exchanges\": %d, \"joins\": %d, \"losses\": %d, "
                 "\"longest_step_ms\": %.1f",
                 steps, exchanges, joins, losses, longest_ms);
        event("summary", buf);
    }
    MPI_Finalize(); /* an abandoned intercommunicator to a dead job does not hold it up */
    return 0;
}
