/* MPI bandwidth between two ranks (bench/bench_mpi_tcp.py builds and runs it; not part
 * of the library). Run with exactly 2 ranks, one per host:
 *
 *   mpicc -O2 -o mpi_tcp_probe bench/mpi_tcp_probe.c
 *   mpirun -n 2 --host A:1,B:1 [--mca ...] ./mpi_tcp_probe [--p2p 4M,64M,1G]
 *       [--p2p-bytes 1G] [--coll-mb 512] [--coll-reps 2] [--no-sendrecv] [--no-rsag]
 *       [--iallreduce] [--no-allreduce] [--thread-multiple] [--coll-gap-s S]
 *       [--poll-max-us U]
 *
 * p2p: rank 0 sends messages of each size to rank 1 (MPI_Send/MPI_Recv, blocking), enough
 *   of them for --p2p-bytes in all (at least one), after one untimed message of that size;
 *   rank 1 answers the last with a 1-byte message, so the time covers delivery.
 *   MB/s = bytes / time (MB = 1e6 bytes).
 * sendrecv: both ranks MPI_Sendrecv the same sizes to each other at once (as one step of
 *   a 2-rank all-reduce does); MB/s per direction, of the slower rank's time.
 * allreduce: MPI_Allreduce(MPI_SUM) of --coll-mb MB of floats, one untimed warm-up call,
 *   then --coll-reps timed calls (each after a barrier); the fastest and the median go out
 *   as MB/s = buffer bytes / time (nccl-tests' "algbw"; with 2 ranks a ring all-reduce
 *   moves the buffer's size per rank each way, so busbw = algbw). The sum is checked.
 * rsag: the same buffer as MPI_Reduce_scatter_block (each rank its half) then
 *   MPI_Allgather of the halves: the two halves of a ring all-reduce, timed together.
 * iallreduce (--iallreduce): the same buffer as loom's gradient reduction calls it,
 *   MPI_Iallreduce(MPI_IN_PLACE) then MPI_Wait (coll/libnbc: pass loom's algorithm,
 *   --mca coll_libnbc_iallreduce_algorithm 3, src/comm/world.c).
 * --coll-gap-s S: every collective call starts S seconds after its barrier, the links idle
 *   before it as between two training steps' reductions (TCP's restart after idle).
 * --poll-max-us U: the iallreduce is waited for as loom's engine thread does (MPI_Test,
 *   then a sleep from 20 us doubling up to U), not with MPI_Wait.
 *
 * Prints one JSON line (rank 0): {"hosts": [...], "p2p_MBps": {"4MiB": ...},
 * "sendrecv_MBps": {...}, "allreduce": {...}, "reduce_scatter_allgather": {...},
 * "iallreduce": {...}}. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024.0;
        break;
    case 'm':
    case 'M':
        v *= 1024.0 * 1024.0;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024.0 * 1024.0;
        break;
    default:
        break;
    }
    return (size_t)v;
}

static void size_name(size_t n, char *out, size_t cap) {
    if (n % (1u << 30) == 0)
        snprintf(out, cap, "%zuGiB", n >> 30);
    else if (n % (1u << 20) == 0)
        snprintf(out, cap, "%zuMiB", n >> 20);
    else
        snprintf(out, cap, "%zuB", n);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sends n bytes from rank 0 to rank 1 in one message (MPI counts are ints: 1 GiB fits,
 * 2 GiB and more would need a derived type). */
static void send_bytes(char *buf, size_t n, int rank) {
    if (rank == 0)
        MPI_Send(buf, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
    else
        MPI_Recv(buf, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

/* Both ranks send size bytes to each other at once (MPI_Sendrecv), as a ring or
 * recursive-doubling all-reduce step does; MB/s per direction. */
static double bidir(char *buf, char *buf2, size_t size, size_t total, int rank) {
    size_t reps = total / size ? total / size : 1;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < reps; i++)
        MPI_Sendrecv(buf, (int)size, MPI_BYTE, 1 - rank, 3, buf2, (int)size, MPI_BYTE, 1 - rank, 3,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    double dt = MPI_Wtime() - t0, slowest;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return (double)size * (double)reps / slowest / 1e6;
}

static double p2p(char *buf, size_t size, size_t total, int rank) {
    size_t reps = total / size ? total / size : 1;
    char ack = 0;
    send_bytes(buf, size, rank); /* warm-up: connection, first touch, registration */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < reps; i++) send_bytes(buf, size, rank);
    if (rank == 1)
        MPI_Send(&ack, 1, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    else
        MPI_Recv(&ack, 1, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    double dt = MPI_Wtime() - t0;
    return (double)size * (double)reps / dt / 1e6;
}

/* Times reps calls of op (0: allreduce, 1: reduce-scatter + allgather, 2: in-place
 * iallreduce + wait); fills best/median
 * MB/s of the buffer's bytes. Returns 0 if the sums are right. */
static long poll_max_us; /* --poll-max-us: 0 waits with MPI_Wait */

static int coll(int op, float *a, float *b, size_t n, int reps, int rank, int nranks, double *best,
                double *median, double gap_s) {
    double *t = calloc((size_t)reps, sizeof *t);
    size_t part = n / (size_t)nranks;
    int bad = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: untimed warm-up */
        for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 1);
        if (op == 2) memcpy(b, a, n * sizeof *b); /* in place: b is the buffer */
        MPI_Barrier(MPI_COMM_WORLD);
        if (gap_s > 0) { /* the links idle, as between two steps' reductions */
            struct timespec ts = {(time_t)gap_s, (long)((gap_s - (time_t)gap_s) * 1e9)};
            nanosleep(&ts, NULL);
        }
        double t0 = MPI_Wtime();
        if (op == 0) {
            MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (op == 2) {
            MPI_Request req;
            MPI_Iallreduce(MPI_IN_PLACE, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
            if (poll_max_us > 0) { /* as loom's engine thread: MPI_Test, then sleep 20..max us */
                int done = 0;
                long us = 20;
                while (MPI_Test(&req, &done, MPI_STATUS_IGNORE), !done) {
                    struct timespec ts = {0, us * 1000};
                    nanosleep(&ts, NULL);
                    if (us < poll_max_us) us *= 2;
                }
            } else {
                MPI_Wait(&req, MPI_STATUS_IGNORE);
            }
        } else {
            MPI_Reduce_scatter_block(a, b + (size_t)rank * part, (int)part, MPI_FLOAT, MPI_SUM,
                                     MPI_COMM_WORLD);
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, (int)part, MPI_FLOAT,
                          MPI_COMM_WORLD);
        }
        double dt = MPI_Wtime() - t0, slowest;
        MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r >= 0) t[r] = slowest;
        float want = (float)(nranks * (nranks + 1) / 2);
        for (size_t i = 0; i < part * (size_t)nranks; i += 4099)
            if (b[i] != want) bad = 1;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double bytes = (double)(part * (size_t)nranks) * sizeof(float);
    *best = bytes / t[0] / 1e6;
    *median = bytes / t[reps / 2] / 1e6;
    free(t);
    return bad;
}

int main(int argc, char **argv) {
    /* --thread-multiple: initialise as loom does (its engine thread calls MPI beside the
     * training thread), for OpenMPI's locking cost under MPI_THREAD_MULTIPLE */
    int multiple = 0, provided;
    for (int i = 1; i < argc; i++) multiple |= !strcmp(argv[i], "--thread-multiple");
    if (multiple)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const char *sizes = "4M,64M,1G";
    size_t p2p_total = (size_t)1 << 30;
    double coll_mb = 512.0;
    double gap_s = 0;
    int coll_reps = 2, rsag = 1, with_bidir = 1, iallreduce = 0, allreduce = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--p2p") && i + 1 < argc)
            sizes = argv[++i];
        else if (!strcmp(argv[i], "--p2p-bytes") && i + 1 < argc)
            p2p_total = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--coll-mb") && i + 1 < argc)
            coll_mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--poll-max-us") && i + 1 < argc)
            poll_max_us = atol(argv[++i]);
        else if (!strcmp(argv[i], "--coll-gap-s") && i + 1 < argc)
            gap_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--coll-reps") && i + 1 < argc)
            coll_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-rsag"))
            rsag = 0;
        else if (!strcmp(argv[i], "--no-sendrecv"))
            with_bidir = 0;
        else if (!strcmp(argv[i], "--iallreduce"))
            iallreduce = 1;
        else if (!strcmp(argv[i], "--no-allreduce"))
            allreduce = 0;
        else if (!strcmp(argv[i], "--thread-multiple"))
            continue;
        else {
            if (rank == 0) fprintf(stderr, "mpi_tcp_probe: unknown argument '%s'\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nranks != 2) {
        if (rank == 0) fprintf(stderr, "mpi_tcp_probe: needs exactly 2 ranks, got %d\n", nranks);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char host[MPI_MAX_PROCESSOR_NAME], peer[MPI_MAX_PROCESSOR_NAME];
    int len;
    MPI_Get_processor_name(host, &len);
    MPI_Sendrecv(host, sizeof host, MPI_CHAR, 1 - rank, 0, peer, sizeof peer, MPI_CHAR, 1 - rank, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);

    char json[4096];
    int off = snprintf(json, sizeof json, "{\"hosts\": [\"%s\", \"%s\"], \"p2p_MBps\": {",
                       rank == 0 ? host : peer, rank == 0 ? peer : host);
    /* the buffers: the largest of the sizes */
    size_t maxsz = 1;
    char list[256];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *s = strtok(list, ","); s; s = strtok(NULL, ","))
        if (parse_size(s) > maxsz) maxsz = parse_size(s);
    char *buf = malloc(maxsz), *buf2 = malloc(maxsz);
    memset(buf, rank, maxsz);
    memset(buf2, rank, maxsz);
    for (int mode = 0; mode < 1 + with_bidir; mode++) { /* 0: one way, 1: both ways */
        if (mode == 1)
            off += snprintf(json + off, sizeof json - (size_t)off, "}, \"sendrecv_MBps\": {");
        snprintf(list, sizeof list, "%s", sizes);
        int first = 1;
        for (char *s = strtok(list, ","); s; s = strtok(NULL, ",")) {
            size_t n = parse_size(s);
            double mbps =
                mode ? bidir(buf, buf2, n, p2p_total, rank) : p2p(buf, n, p2p_total, rank);
            char name[32];
            size_name(n, name, sizeof name);
            off += snprintf(json + off, sizeof json - (size_t)off, "%s\"%s\": %.0f",
                            first ? "" : ", ", name, mbps);
            first = 0;
        }
    }
    free(buf);
    free(buf2);
    off += snprintf(json + off, sizeof json - (size_t)off, "}");

    size_t n = (size_t)(coll_mb * 1e6 / sizeof(float));
    n -= n % (size_t)nranks;
    if (n > 0 && coll_reps > 0) {
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        memset(b, 0, n * sizeof *b);
        static const char *const names[] = {"allreduce", "reduce_scatter_allgather", "iallreduce"};
        const int run[] = {allreduce, rsag, iallreduce};
        for (int op = 0; op < 3; op++) {
            if (!run[op]) continue;
            double best, med;
            int bad = coll(op, a, b, n, coll_reps, rank, nranks, &best, &med, gap_s);
            off += snprintf(json + off, sizeof json - (size_t)off,
                            ", \"%s\": {\"MB\": %.0f, \"reps\": %d, \"best_MBps\": %.0f, "
                            "\"median_MBps\": %.0f, \"best_s\": %.3f, \"sum_ok\": %s}",
                            names[op], coll_mb, coll_reps, best, med,
                            n * sizeof(float) / best / 1e6, bad ? "false" : "true");
        }
        free(a);
        free(b);
    }
    snprintf(json + off, sizeof json - (size_t)off, "}");
    if (rank == 0) printf("%s\n", json);
    MPI_Finalize();
    return 0;
}
