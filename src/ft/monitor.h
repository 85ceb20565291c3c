/* The supervisor's view of the job: the heartbeat socket and, per rank, the last beat,
 * when it came, the steps and compute times seen; the loss of every step. Detection
 * rules (ft/detect.h) read this. */
#ifndef LOOM_FT_MONITOR_H
#define LOOM_FT_MONITOR_H

#include <stdint.h>

#include "core/error.h"
#include "ft/beat.h"

#define LOOM_MONITOR_HISTORY 32 /* compute times kept per rank */

typedef struct {
    int seen;
    loom_beat beat;      /* the last accepted beat */
    double last_beat_ms; /* supervisor clock */
    double steps_changed_ms;
    int64_t hist_step[LOOM_MONITOR_HISTORY];
    double hist_compute[LOOM_MONITOR_HISTORY];
    double hist_local_loss[LOOM_MONITOR_HISTORY]; /* the rank's own loss of hist_step */
    double hist_blocked[LOOM_MONITOR_HISTORY];    /* ms blocked in communication */
    int hist_n;                                   /* entries written (ring) */
    int64_t straggler_since; /* first step of the current out-of-line run (0: in line) */
    int straggler_reported;
    int64_t accepted; /* beats accepted from this rank in this attempt */
    char from[64];    /* the numeric address its beats come from */
} loom_rank_state;

typedef struct {
    int fd;
    uint8_t token[LOOM_BEAT_TOKEN_BYTES];
    char addr[300]; /* host:port the ranks send to */
    int world, attempt;
    loom_rank_state *ranks;
    double *loss; /* loss[s] of step s (NaN: not seen), s <= max_steps */
    int64_t max_steps;
    int64_t rejected; /* datagrams that were not beats of this job */
    int64_t accepted;
} loom_monitor;

/* Binds a UDP socket on bind_addr (an ephemeral port) with a fresh token; addr_for_ranks
 * is the host the ranks should send to ("" = bind_addr). */
loom_status loom_monitor_open(loom_monitor *m, const char *bind_addr, const char *addr_for_ranks,
                              int64_t max_steps, loom_error *err);
void loom_monitor_close(loom_monitor *m);
/* A new attempt with `world` ranks: forgets the ranks (not the losses); beats of other
 * attempts are ignored from now on. */
loom_status loom_monitor_reset(loom_monitor *m, int world, int attempt, loom_error *err);
/* Reads every pending datagram (non-blocking); returns how many beats were accepted. */
int loom_monitor_drain(loom_monitor *m, double now_ms);
/* The supervisor was not scheduled for gap_ms (the machine paused or starved it): every
 * rank's clocks of silence move on by the gap, which nobody's beats could fill. */
void loom_monitor_excuse_gap(loom_monitor *m, double gap_ms);
/* Largest steps_done over the ranks (0 before any beat). */
int64_t loom_monitor_step(const loom_monitor *m);

#endif
