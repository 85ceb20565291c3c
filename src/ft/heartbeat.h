/* The rank side of fault tolerance: a thread that sends this rank's progress record to
 * the supervisor (`loom run`) as heartbeats. It beats every LOOM_FT_INTERVAL_MS
 * (default 250 ms) and at once after each completed step, from its own thread, so the
 * beats go on while the training thread is stuck in a collective (a hang) and stop
 * only when the process dies. Configured by the supervisor through the environment:
 * LOOM_FT_ADDR (host:port of its UDP socket), LOOM_FT_TOKEN (the job's secret),
 * LOOM_FT_ATTEMPT (restart count). */
#ifndef LOOM_FT_HEARTBEAT_H
#define LOOM_FT_HEARTBEAT_H

#include "core/error.h"

/* 1 when the supervisor asked for heartbeats (LOOM_FT_ADDR is set). */
int loom_heartbeat_wanted(void);
/* Starts the thread (no-op unless wanted). */
loom_status loom_heartbeat_start(int rank, int world, loom_error *err);
/* Final beat (phase done, or failed with msg) and joins the thread. */
void loom_heartbeat_stop(int failed, const char *msg);

#endif
