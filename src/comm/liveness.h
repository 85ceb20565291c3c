/* A process's proof of life that another process can check in bounded time: a TCP socket
 * whose thread answers every connection with a random token, and the probe that expects
 * that token. MPI has no such check: OpenMPI 4.1's MPI_Comm_connect to a port whose
 * process died waits 600 s (docs/diloco.md), so an elastic joiner's name carries its
 * liveness endpoint and the coordinator probes it before connecting. The token makes the
 * answer this process's own: another process listening at the same address and port (an
 * address several hosts share, a port used again) does not pass. */
#ifndef LOOM_COMM_LIVENESS_H
#define LOOM_COMM_LIVENESS_H

#include <pthread.h>
#include <stddef.h>

#include "core/error.h"

#define LOOM_LIVENESS_TOKEN_CHARS 32

typedef struct {
    int fd;      /* the listening socket; -1 when closed */
    int stop_fd; /* an eventfd that ends the answering thread */
    pthread_t thread;
    int running; /* open: the descriptors and the thread are this endpoint's (0 when zeroed) */
    char token[LOOM_LIVENESS_TOKEN_CHARS + 1]; /* hex digits, from getrandom */
    char endpoint[256]; /* "ADDR[,ADDR...]:PORT/TOKEN": this host's IPv4 addresses */
} loom_liveness;

/* Listens on every IPv4 address of this host at a port the kernel picks and starts the
 * thread that answers; endpoint names the non-loopback addresses that are up (127.0.0.1
 * when there is none), the port and the token. */
loom_status loom_liveness_open(loom_liveness *l, loom_error *err);
/* Stops the thread and closes the socket (nothing when closed, or never opened and zeroed). */
void loom_liveness_close(loom_liveness *l);
/* 1 if the process that made endpoint (a loom_liveness endpoint) still answers: one of its
 * addresses gives back its token within timeout_ms; 0 if every one is refused,
 * unreachable, silent or answers something else that long, or the endpoint does not
 * parse. */
int loom_liveness_probe(const char *endpoint, double timeout_ms);

#endif
