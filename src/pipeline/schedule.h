/* Pipeline schedules as data: for every stage (pipeline rank) the ordered list of actions
 * it runs in one training step. The model is split into pp x v virtual stages; virtual
 * stage s = chunk * pp + rank lives on `rank` (v > 1: interleaved 1F1B, each rank holds v
 * model chunks). Actions: forward of micro-batch i on a chunk (F), backward-input (B),
 * backward-weight (W; zb only, elsewhere B includes W), and the point-to-point moves:
 * RECV waits for an input that was posted at the step's start, SEND posts the output.
 *   gpipe: all forwards, then all backwards.
 *   1f1b:  warm-up of pp - rank - 1 forwards, then one forward / one backward.
 *   interleaved: Megatron's interleaved 1F1B (m a multiple of pp).
 *   zb:    ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"), the handcrafted
 *          schedule: 1F1B's warm-up, then F/B with stage r's first r W's deferred into
 *          the cooldown; at most pp micro-batches held per stage (1F1B's stage-0 bound). */
#ifndef LOOM_PIPELINE_SCHEDULE_H
#define LOOM_PIPELINE_SCHEDULE_H

#include <stdio.h>

#include "core/error.h"

typedef enum {
    LOOM_PP_GPIPE = 0,
    LOOM_PP_1F1B = 1,
    LOOM_PP_INTERLEAVED = 2,
    LOOM_PP_ZB = 3,
    LOOM_PP_FORWARD_ONLY = 4 /* evaluation: forwards and activation moves only */
} loom_pp_kind;

typedef enum {
    LOOM_PP_F = 0,
    LOOM_PP_B = 1, /* backward-input (with W inside unless the schedule splits it) */
    LOOM_PP_W = 2,
    LOOM_PP_SEND_ACT = 3,
    LOOM_PP_RECV_ACT = 4,
    LOOM_PP_SEND_GRAD = 5,
    LOOM_PP_RECV_GRAD = 6
} loom_pp_op;

typedef struct {
    loom_pp_op op;
    int mb, chunk; /* micro-batch and the model chunk on this rank */
    int peer;      /* sends and receives: the other pipeline rank */
} loom_pp_action;

typedef struct {
    loom_pp_kind kind;
    int pp, m, v;
    int split; /* W separate from B */
    loom_pp_action *acts[64];
    int n[64];
} loom_pp_schedule;

#define LOOM_PP_MAX_STAGES 64

/* Parses "gpipe|1f1b|interleaved|zb" (the message names --pp-schedule). */
loom_status loom_pp_kind_parse(const char *name, loom_pp_kind *kind, loom_error *err);
const char *loom_pp_kind_name(loom_pp_kind kind);
/* Checks (pp, m micro-batches, v virtual stages) for the schedule; messages name flags. */
loom_status loom_pp_schedule_check(loom_pp_kind kind, int pp, int m, int v, loom_error *err);
loom_status loom_pp_schedule_build(loom_pp_schedule *s, loom_pp_kind kind, int pp, int m, int v,
                                   loom_error *err);
void loom_pp_schedule_free(loom_pp_schedule *s);
/* Micro-batches whose activations a stage holds at once (F started, last B/W not done). */
int loom_pp_schedule_max_in_flight(const loom_pp_schedule *s, int stage);
/* Timeline by simulation (F = 1, B = 2 or B = W = 1 when split, moves free) and the
 * action lists; fails if the lists deadlock (a bug). */
loom_status loom_pp_schedule_print(const loom_pp_schedule *s, FILE *out, loom_error *err);
/* One action as loom pp-schedule prints it: F3 (v = 1) or F3.1 (micro-batch 3 on chunk 1);
 * moves as sa3>1 (send activation of micro-batch 3 to rank 1), ra3<0, sg3>0, rg3<1 (with
 * .chunk before the direction when v > 1). */
void loom_pp_format_action(const loom_pp_schedule *s, const loom_pp_action *a, char *buf, size_t n);
/* Replays the lists with the given durations (dur[op] per action kind), returns the
 * step's makespan and each stage's idle fraction; -1 if they deadlock. */
double loom_pp_schedule_simulate(const loom_pp_schedule *s, const double dur[3], double *idle,
                                 int *start_out);
/* The same with each virtual stage's own durations (dur[chunk * pp + rank][op]) on ranks
 * that share `slots` processors: n computing at once each progress at min(1, slots / n)
 * of full speed (slots <= 0: a processor each). busy_out[r]: the wall time rank r's
 * computations took (their work, stretched by the sharing). */
double loom_pp_schedule_simulate_shared(const loom_pp_schedule *s, const double (*dur)[3],
                                        double slots, double *idle, double *busy_out,
                                        int *start_out);

/* The MPI tag of a move (unique within a step): (gradient?, receiving virtual stage, mb). */
int loom_pp_message_tag(const loom_pp_schedule *s, int rank, const loom_pp_action *a);

#endif
