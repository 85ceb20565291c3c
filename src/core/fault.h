/* Fault injection, so that every failure path of the supervisor is tested. A fault is
 * `KIND@STEP[:RANK[:ARG]][+|/ATTEMPT]`, given by `loom train --inject` (repeatable) or the
 * LOOM_INJECT environment variable (comma-separated); RANK defaults to 0.
 *   crash@S             SIGKILL itself at the start of step S
 *   hang@S              stop forever in the first collective of step S (keeps beating)
 *   slow@S[:R[:F]]      from step S on, stretch each step's compute to F times (default 3)
 *                       (priced on the shorter of this step's compute and the last one's)
 *   nan@S               the loss of step S becomes NaN
 *   spike@S             this rank's loss of step S is reported 100x (gradients untouched)
 *   corrupt-ckpt@S      damage the checkpoint written at step S after it is complete
 *   kill-during-save@S  SIGKILL itself while the checkpoint of step S is being written
 *   segv@S              call through a NULL function pointer at the start of step S
 *                       (SIGSEGV: the crash report's path, core/crash_report.h)
 *   admit@S             elastic DiLoCo coordinator: returning workers are admitted at the
 *                       outer step S only, where it waits (up to 60 s) until every missing
 *                       worker joined (a rejoin at a known step, for tests)
 * The supervisor restarts jobs with the same command line, so a fault fires only on the
 * first attempt (LOOM_FT_ATTEMPT unset or 0) unless it ends with '+' (every attempt,
 * a rank that fails again and again) or '/A' (only attempt A: a later, different
 * failure). Faults are off unless given. */
#ifndef LOOM_CORE_FAULT_H
#define LOOM_CORE_FAULT_H

#include <stdint.h>

#include "core/error.h"

typedef enum {
    LOOM_FAULT_CRASH,
    LOOM_FAULT_HANG,
    LOOM_FAULT_SLOW,
    LOOM_FAULT_NAN,
    LOOM_FAULT_CORRUPT_CKPT,
    LOOM_FAULT_KILL_DURING_SAVE,
    LOOM_FAULT_SPIKE,
    LOOM_FAULT_ADMIT,
    LOOM_FAULT_SEGV,
    LOOM_FAULT_KIND_COUNT
} loom_fault_kind;

typedef struct {
    loom_fault_kind kind;
    int64_t step;
    int rank;
    double arg;  /* slow: the factor */
    int every;   /* '+': fires on every attempt */
    int attempt; /* the attempt it fires on (when not every) */
} loom_fault;

#define LOOM_FAULT_MAX 16

typedef struct {
    loom_fault items[LOOM_FAULT_MAX];
    int n;
} loom_fault_list;

/* Appends the comma-separated specs of `text` (what names its origin in messages, e.g.
 * "--inject" or "LOOM_INJECT"); LOOM_ERR_INPUT naming the spec on bad input. */
loom_status loom_fault_parse(loom_fault_list *list, const char *text, const char *what,
                             loom_error *err);
const char *loom_fault_kind_name(loom_fault_kind k);

/* LOOM_FT_ATTEMPT (set by the supervisor): 0 when unset or not a number >= 0. */
int loom_fault_attempt_from_env(void);
/* The slot (the rank's place in the original world: a machine, in effect) of a rank.
 * After an elastic shrink the supervisor renumbers the ranks and passes LOOM_FT_SLOTS
 * (comma-separated, by new rank); faults name slots, so a fault of an excluded slot
 * never fires again. Without it, the slot is the rank. */
int loom_fault_slot_of(int rank);
/* Arms the faults meant for this rank and attempt (the process-wide injection state). */
void loom_fault_arm(const loom_fault_list *list, int rank, int attempt);

/* Hooks, cheap when nothing is armed. */
void loom_fault_on_step(int64_t step);                              /* a step starts: crash */
void loom_fault_at_collective(void);                                /* comm: hang */
void loom_fault_after_compute(double *loss_sum, double compute_ms); /* slow, nan, spike */
int loom_fault_armed(loom_fault_kind kind, int64_t step);
/* Whether a fault of `kind` is armed at any step (0: none). */
int loom_fault_any(loom_fault_kind kind);
/* Checkpoint writer (its thread), after this rank's data file of step_dir is written:
 * kill-during-save (SIGKILL before the checkpoint can be committed) and corrupt-ckpt
 * (flips bytes inside the tensor data, so the checksums no longer match). The step is
 * read from the folder name (DIR/step_NNNNNNNN), as the write runs after the training
 * thread moved on. */
void loom_fault_in_save(const char *step_dir, const char *data_file);
void loom_fault_kill_self(const char *why); /* SIGKILL, after a log line */

#endif
