/* A process's proof of life that another process can check in bounded time: a TCP socket
 * that listens and is never accepted on (the kernel completes a probe's handshake while
 * the process lives, and refuses it once the process is gone), and the probe. MPI has no
 * such check: OpenMPI 4.1's MPI_Comm_connect to a port whose process died waits 600 s
 * (docs/diloco.md), so an elastic joiner's name carries its liveness endpoint and the
 * coordinator probes it before connecting. */
#ifndef LOOM_COMM_LIVENESS_H
#define LOOM_COMM_LIVENESS_H

#include <stddef.h>

#include "core/error.h"

typedef struct {
    int fd;             /* the listening socket; -1 when closed */
    char endpoint[256]; /* "ADDR[,ADDR...]:PORT": this host's IPv4 addresses, the port */
} loom_liveness;

/* Listens on every IPv4 address of this host at a port the kernel picks; endpoint names
 * the non-loopback addresses that are up (127.0.0.1 when there is none). */
loom_status loom_liveness_open(loom_liveness *l, loom_error *err);
void loom_liveness_close(loom_liveness *l);
/* 1 if a process listens at endpoint (a loom_liveness endpoint): one of its addresses
 * completes a TCP handshake within timeout_ms; 0 if every one is refused, unreachable or
 * silent that long, or the endpoint does not parse. */
int loom_liveness_probe(const char *endpoint, double timeout_ms);

#endif
