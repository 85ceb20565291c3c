/* The progress record of this process: what the trainer and the communication layer are
 * doing right now (step, phase, loss, the collective each communicator is in). Writers
 * are the training thread (train/, comm/); the reader is the heartbeat thread (ft/),
 * which must see a consistent-enough picture while the training thread is stuck inside
 * a collective. Everything is a lock-free atomic, so writing costs a few stores. */
#ifndef LOOM_CORE_PROGRESS_H
#define LOOM_CORE_PROGRESS_H

#include <stdint.h>

typedef enum {
    LOOM_PHASE_INIT = 0,
    LOOM_PHASE_FORWARD,
    LOOM_PHASE_BACKWARD,
    LOOM_PHASE_OPTIMIZER,
    LOOM_PHASE_EVAL,
    LOOM_PHASE_CKPT,
    LOOM_PHASE_DONE,
    LOOM_PHASE_FAILED,
    LOOM_PHASE_COUNT
} loom_phase;

#define LOOM_PROGRESS_COMMS 10 /* world, dp, tp, pp, ep, edp, cp + the engines' */
#define LOOM_PROGRESS_RING 16  /* recent steps kept for the reader (steps can be ms long) */
#define LOOM_PROGRESS_NAME 8
#define LOOM_PROGRESS_OP 16

/* A snapshot of one communicator, as the reader sees it. */
typedef struct {
    char name[LOOM_PROGRESS_NAME];
    /* Which instance of the name: several groups share one (two "tp" groups under tp 2
     * x dp 2); a group is known by the world rank of its rank 0. -1: not known. */
    int32_t group_first, group_size;
    uint64_t started; /* sequence number of the last operation started */
    char started_op[LOOM_PROGRESS_OP];
    uint64_t waiting_seq; /* operation being waited for (0: not waiting) */
    char waiting_op[LOOM_PROGRESS_OP];
    double waited_ms; /* for how long, so far */
} loom_progress_comm;

typedef struct {
    int64_t step; /* 1-based step number */
    double loss, compute_ms;
    double local_loss; /* this rank's own mean loss over its slice of the batch */
    double blocked_ms; /* of the step's wall time, blocked in communication */
} loom_progress_step;

typedef struct {
    int64_t steps_done;     /* last step completed (or restored from a checkpoint) */
    int64_t nonfinite_step; /* a step whose loss was non-finite on this rank (0: none) */
    int64_t start_step;     /* steps already done when this run's loop started (resume) */
    loom_phase phase;
    int n_comms;
    loom_progress_comm comms[LOOM_PROGRESS_COMMS];
    int n_recent; /* recent[0] is the newest */
    loom_progress_step recent[LOOM_PROGRESS_RING];
} loom_progress_snapshot;

const char *loom_phase_name(loom_phase p);

/* Writers (the training thread). */
void loom_progress_phase(loom_phase p);
/* A step starts (its wall time is measured from here by the caller). */
void loom_progress_step_begin(void);
/* A step finished: its number, loss and wall time; the time spent blocked in
 * communication since the previous step is subtracted to give the compute time. */
void loom_progress_step_done(int64_t step, double loss, double wall_ms);
/* This rank's own mean loss of the step in progress (before the reduction), recorded
 * with the step at step_done (a spike of the global loss can then be traced to a rank). */
void loom_progress_local_loss(double loss);
/* This rank's own loss of `step` (before any reduction) was NaN/inf. */
void loom_progress_nonfinite(int64_t step);
/* Training starts (or resumes) after `step` completed steps. */
void loom_progress_set_step(int64_t step);
/* Communication: an operation starts (blocking: the caller waits in it at once), the
 * caller starts waiting for one, the wait ends. */
void loom_progress_comm_start(const char *comm, uint64_t seq, const char *op, int blocking);
void loom_progress_comm_wait(const char *comm, uint64_t seq, const char *op);
void loom_progress_comm_done(const char *comm);
/* The group this rank's communicator `comm` is (world rank of its rank 0, its size). */
void loom_progress_comm_group(const char *comm, int first_world_rank, int size);
/* Like comm_wait, for a thread that only drives non-blocking operations (the
 * communication engine: it waits for the oldest one in flight). Shown in heartbeats as a
 * wait, but not counted as time the training thread was blocked. */
void loom_progress_comm_inflight(const char *comm, uint64_t seq, const char *op);
/* The training thread was blocked for us microseconds waiting for communication that
 * another thread drives (the engine's operations): subtracted from compute time. */
void loom_progress_blocked_us(int64_t us);

/* Reader (any thread). */
void loom_progress_read(loom_progress_snapshot *s);
int64_t loom_progress_steps_done(void);
loom_phase loom_progress_current_phase(void);

#endif
