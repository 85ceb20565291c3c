/* Failure detection and diagnosis: the rules that turn the supervisor's view of the job
 * (ft/monitor.h) into a failure record, and the record written as diagnosis.json plus a
 * human summary. */
#ifndef LOOM_FT_DETECT_H
#define LOOM_FT_DETECT_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "core/error.h"
#include "ft/monitor.h"

typedef enum {
    LOOM_FAIL_NONE = 0,
    LOOM_FAIL_CRASH,     /* a rank died (signal) */
    LOOM_FAIL_EXIT,      /* a rank or the launcher exited with an error */
    LOOM_FAIL_HEARTBEAT, /* a rank's heartbeats stopped */
    LOOM_FAIL_HANG,      /* a collective waited on for longer than the timeout */
    LOOM_FAIL_STALL,     /* no step for --step-timeout */
    LOOM_FAIL_NONFINITE, /* the loss became NaN/inf */
    LOOM_FAIL_SPIKE,     /* the loss jumped by more than --loss-spike-factor */
    LOOM_FAIL_STARTUP,   /* some rank never beat after the launch */
    LOOM_FAIL_HOST,      /* a whole host lost: every process on it gone */
    LOOM_FAIL_PARTITION, /* a whole host silent while the others beat: cut off */
    LOOM_FAIL_KIND_COUNT
} loom_fail_kind;

#define LOOM_FAIL_LIST 64
#define LOOM_FAIL_WAITS 8

/* One collective some rank waits in: its communicator instance (a name is shared by
 * several groups, e.g. the two "tp" groups of tp 2 x dp 2; a group is known by the world
 * rank of its rank 0), who waits in it and who never entered it. */
typedef struct {
    char comm[LOOM_PROGRESS_NAME], op[LOOM_PROGRESS_OP];
    int comm_first, comm_size; /* -1 / 0: not known */
    char group[96];            /* "tp{2,3}": name and member ranks */
    uint64_t seq;
    double waited_s;
    int members[LOOM_FAIL_LIST], n_members; /* as far as the beats tell */
    int culprits[LOOM_FAIL_LIST], n_culprits;
    int waiting[LOOM_FAIL_LIST], n_waiting;
} loom_wait_record;

typedef struct {
    loom_fail_kind kind;
    int attempt;
    int rank; /* -1: not known */
    char host[64];
    int64_t step; /* the step that failed (steps_done + 1), or the spiking step */
    double loss, baseline_loss;
    /* spike: the loss is global (the mean over every rank's slice of the batch); the
     * ranks whose own loss spiked are the culprits, the first one's own loss here */
    double rank_loss, rank_baseline;
    int64_t batch; /* spike / non-finite: the step's batch (data order, 1-based; 0: ?) */
    int exit_status;
    char detail[512];
    /* hang: the collective, who never entered it and who waits in it */
    char comm[LOOM_PROGRESS_NAME], op[LOOM_PROGRESS_OP];
    uint64_t seq;
    double waited_s;
    int culprits[LOOM_FAIL_LIST], n_culprits;
    int waiting[LOOM_FAIL_LIST], n_waiting;
    loom_wait_record hung;                   /* the collective named (as above) */
    loom_wait_record waits[LOOM_FAIL_WAITS]; /* every collective waited in, longest first */
    int n_waits;
    double detected_ms;
} loom_failure;

typedef struct {
    int rank;
    char host[64];
    double compute_ms, others_ms, slowdown;
    double blocked_ms, others_blocked_ms; /* waiting per step: the slow rank waits least */
} loom_straggler;

/* Round trips from the supervisor to one host while the job trains (a TCP connection to
 * an unused port: the refusal is the answer), the newest LOOM_LINK_SAMPLES kept. */
#define LOOM_LINK_SAMPLES 32
#define LOOM_LINK_WINDOW 16 /* samples judged */
typedef struct {
    char addr[64]; /* the address its ranks' beats come from */
    char host[64]; /* their hostname */
    double rtt_ms[LOOM_LINK_SAMPLES];
    int n;          /* samples written (ring) */
    double next_ms; /* when to probe it next */
    int reported;   /* named once per attempt */
} loom_link_probe;

typedef struct {
    char host[64], addr[64], ranks[256], others[512];
    double rtt_ms, others_rtt_ms;  /* medians of the window; others: the slowest other */
    double blocked_ms, compute_ms; /* per step, the median rank's */
} loom_slow_link;

const char *loom_fail_kind_name(loom_fail_kind k);

/* A collective waited on for >= timeout_ms by some rank: fills f (kind HANG). Culprits
 * that wait in another collective are victims too: the collective named is the longest
 * waited-on one with a culprit that waits in nothing (the root of the chain); every
 * collective waited in is listed in f->waits. */
int loom_detect_hang(const loom_monitor *m, double timeout_ms, loom_failure *f);
/* A rank silent for >= timeout_ms, or (startup) never heard of. */
int loom_detect_silence(const loom_monitor *m, double now_ms, double launch_ms, double timeout_ms,
                        double startup_ms, loom_failure *f);
/* A rank on `host` (this machine) whose process is gone although it never reported
 * finishing or failing: its index, or -1. */
int loom_detect_dead_rank(const loom_monitor *m, const char *host);
/* 1 when some rank reported a failure or a non-finite loss (a dead rank may then be the
 * victim of that error, not a crash of its own). */
int loom_detect_reported(const loom_monitor *m);
/* Fills f for rank `rank` that died without a report (kind CRASH). */
void loom_detect_crash(const loom_monitor *m, int rank, loom_failure *f);
/* The launcher's log names a rank killed by a signal (mpirun "process rank R ... exited on
 * signal S", srun "srun: error: NODE: task R: Killed", the first such line): 1 and f
 * filled (kind CRASH, that rank and host, the step no rank finished), else 0. Under srun
 * a rank on another host dies unseen here; the others die of the step's end after it. */
int loom_detect_launcher_crash(const loom_monitor *m, const char *launcher_log, loom_failure *f);
/* A rank the launcher of an attempt (its logs under attempt_dir, ft/launch_argv.h) could
 * not start because its program is missing or not executable on the rank's node (the loom
 * path is on a filesystem that node does not see, e.g. a node-local /tmp). srun:
 * slurmstepd's "slurmstepd-NODE: error: execve(): PATH: WHY" in a rank's log; mpirun:
 * "could not access or execute an executable" with its "Executable:", "Node:" and "start
 * process rank R" lines in launcher.log. The lowest such rank: 1 with out filled (why in
 * lower case; "" from mpirun, which does not say), else 0. */
typedef struct {
    int rank;
    char node[64], path[1024], why[128];
} loom_not_started;
int loom_detect_not_started(const char *launcher, const char *attempt_dir, int world,
                            loom_not_started *out);
/* The ranks on `host` (a name or address, as the launcher or --hosts knows it): those
 * whose beats name it as their host or come from that address; their count. */
int loom_detect_host_ranks(const loom_monitor *m, const char *host, int *ranks, int max);
/* mpirun's log says it lost its daemon on a host ("ORTE has lost communication with a
 * remote daemon ... Remote daemon: ... on node X"): 1 and f filled (kind HOST, the host,
 * its ranks as culprits, the ranks still heard on other hosts in detail), else 0. */
int loom_detect_host_lost(const loom_monitor *m, const char *launcher_log, loom_failure *f);
/* One host cut off from this supervisor (a partition): a rank of it silent for >=
 * silent_ms, every rank of it that has not finished for >= silent_ms / 2, and a rank of
 * another host heard within silent_ms / 2 or finished (ranks that finished are silent by
 * design, on either side): 1 and f filled (kind PARTITION, the host, its ranks as
 * culprits, which side is still heard), else 0. */
int loom_detect_partition(const loom_monitor *m, double now_ms, double silent_ms, loom_failure *f);
/* The host of `rank` taken as cut off (the supervisor saw the rank silent and its host
 * does not answer on the network): f filled as by loom_detect_partition; 0 when the rank
 * was never heard of. */
int loom_detect_host_cut(const loom_monitor *m, int rank, double now_ms, loom_failure *f);
/* No rank completed a step for >= timeout_ms (while training): fills f (kind STALL). */
int loom_detect_stall(const loom_monitor *m, double now_ms, double timeout_ms, loom_failure *f);
/* The first step in (from, to] whose loss is non-finite or > factor x the median of
 * the up to 10 steps before it (at least 5 known). */
int loom_detect_loss_spike(const loom_monitor *m, double factor, int64_t from, int64_t to,
                           loom_failure *f);
/* After a spike of step f->step (once every rank has reported that step): the ranks
 * whose own loss is > factor x the median of their own previous (up to 10, at least 5)
 * steps, into f->culprits (largest jump first) and f->detail. */
int loom_detect_spike_ranks(const loom_monitor *m, double factor, loom_failure *f);
/* Ranks whose median compute time over the last 8 steps is > factor x the median of
 * the others', eight steps in a row; each rank is reported once per attempt. With two
 * ranks (the median of the others is the other one) the rank must also wait less than
 * the other: the slow rank computes more and the fast one waits for it, so a rank whose
 * compute time only looks long (waits counted as compute) is not blamed. */
int loom_detect_stragglers(loom_monitor *m, double factor, loom_straggler *out, int max);

/* A slow link (e.g. a rate cap on one host's link): every rank of a ring or tree waits
 * alike for it, so the straggler rule (compute time) cannot see it, and with two hosts
 * the transfers between them cannot tell which end is slow. The supervisor is a third
 * point: a host whose median round trip over LOOM_LINK_WINDOW samples while the job
 * trains (its link's queue full of the job's data) is >= 5 ms and >= factor x every other
 * probed host's (at least 0.5 ms), while the median rank waits longer for communication
 * than it computes: 1 and *out filled (the host, its ranks, the others), the probe marked
 * reported; else 0. With one probed host alone nothing is judged (a busy link and a slow
 * one look alike without a second to compare with). */
int loom_detect_slow_link(const loom_monitor *m, loom_link_probe *p, int n, double factor,
                          loom_slow_link *out);

/* The failure of an ended job: reads the final beats (failed ranks, non-finite losses)
 * and the launcher's log (who was killed by which signal). */
void loom_detect_exit(const loom_monitor *m, int exit_status, const char *launcher_log,
                      loom_failure *f);

/* Writes diagnosis.json into dir (and the attempt's folder) and prints the summary to
 * stderr and dir/diagnosis.txt; log_of(rank) names a rank's log file. */
loom_status loom_diagnosis_write(const loom_failure *f, const char *dir, const char *attempt_dir,
                                 const char *rank_log, const char *recovery, json_t *batch,
                                 loom_error *err);
loom_status loom_stragglers_write(const loom_straggler *s, int n, const char *dir, int attempt,
                                  loom_error *err);

#endif
