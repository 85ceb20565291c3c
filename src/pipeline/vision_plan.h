/* --vision-schedule bubbles (Optimus-style): where a vlm's vision encoder runs within one
 * pipeline step. Micro-batch i is encoded by owner[i]: 0 is the first stage, inside its F
 * (the encoder's forward) and the action that runs its embedding backward (B, or W when
 * the schedule splits it), as with --vision-schedule first; a later stage runs the
 * encoder's forward (EF) and backward (EB) as pieces of its own, before action ef_at and
 * eb_at of its list (at equal positions: EBs, then EFs, each in micro-batch order), on a
 * replica of the encoder's weights; the image rows go to the first stage before its F
 * needs them and their gradient comes back after its embedding backward.
 *
 * The placement is greedy over micro-batches in order, on the schedule's timeline
 * (simulated like loom_pp_schedule_simulate, moves free): each micro-batch takes the
 * owner and positions that give the shortest step (ties: the first stage, then the
 * earliest positions), with the stages' forward times and the encoder's from the model's
 * cost (backward = 2 x forward); then re-placing passes and an iterated local search
 * (random moves from a fixed seed, so every rank plans the same). */
#ifndef LOOM_PIPELINE_VISION_PLAN_H
#define LOOM_PIPELINE_VISION_PLAN_H

#include <stdio.h>

#include "model/config.h"
#include "pipeline/schedule.h"

typedef struct {
    int m, pp;
    int *owner, *ef_at, *eb_at;          /* [m] */
    int *enc_slot;                       /* [m] the owner's encoder model the piece uses */
    int slots[LOOM_PP_MAX_STAGES];       /* encoder models a stage needs (pieces in flight) */
    int pieces[LOOM_PP_MAX_STAGES];      /* micro-batches a stage encodes (stage 0: its own) */
    double fwd[LOOM_PP_MAX_STAGES], enc; /* the durations the plan used (forward) */
    double span_first, span;             /* simulated step: all on stage 0 / this plan */
    double idle_first[LOOM_PP_MAX_STAGES], idle[LOOM_PP_MAX_STAGES];
} loom_pp_vision;

/* Plans schedule s's encoder pieces; fwd[r]: stage r's forward of one micro-batch, enc: the
 * encoder's and projector's forward of one micro-batch (any unit). */
loom_status loom_pp_vision_build(loom_pp_vision *vp, const loom_pp_schedule *s, const double *fwd,
                                 double enc, loom_error *err);
void loom_pp_vision_free(loom_pp_vision *vp);
/* The durations the run plans with (loom plan prices the same placement): multiply-adds
 * of one micro-batch, fwd[r] stage r's forward of one model chunk (counts: layers per
 * virtual stage, pp x v of them, the head on the last; with v > 1 the mean of the rank's
 * chunks) and *enc the encoder's and projector's forward (every image slot filled). */
void loom_pp_vision_durations(const loom_model_config *mc, const int *counts, int pp, int v,
                              int micro_batch, double *fwd, double *enc);
/* The plan's step on the timeline (its makespan; idle[r] per stage, may be NULL); -1 if
 * the lists deadlock. */
double loom_pp_vision_simulate(const loom_pp_schedule *s, const loom_pp_vision *vp, double *idle);
/* The timeline and lists of s with the encoder's pieces (loom pp-schedule). */
void loom_pp_vision_print(const loom_pp_schedule *s, const loom_pp_vision *vp, FILE *out);

#endif
