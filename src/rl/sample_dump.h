/* The training rollouts' draws, kept when dumping (--dump-dir) so the layout tests can
 * tell a sampling flip caused by rounding (a near tie: model/generate.h's margin) from a
 * bug. Each generation replica's tp rank 0 writes DIR/samples_gen<R>.safetensors with
 *   seq [rows] int32, the sequence's number in the run: iteration x sequences + q,
 *   tok [rows, max_new] int32, its completion (-1 after its end), and
 *   margin [rows, max_new] f32, each draw's margin (0 after the end),
 * one row per iteration and sequence of the replica (seq -1: an iteration not run here,
 * before a resume). */
#ifndef LOOM_RL_SAMPLE_DUMP_H
#define LOOM_RL_SAMPLE_DUMP_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    int32_t *seq, *tok;
    float *margin;
    int iterations, per, max_new;
} loom_sample_dump;

/* per: the replica's sequences an iteration. */
loom_status loom_sample_dump_open(loom_sample_dump *d, int iterations, int per, int max_new,
                                  loom_error *err);
/* Where iteration it's margins go ([per, max_new], loom_rollout_options.margin); NULL
 * when not dumping. */
float *loom_sample_dump_margins(loom_sample_dump *d, int it);
/* Records iteration it's completions: comp [per, max_new] and clen [per] of sequences
 * q0 .. q0 + per of the n_global an iteration. */
void loom_sample_dump_record(loom_sample_dump *d, int it, int n_global, int q0, const int32_t *comp,
                             const int *clen);
loom_status loom_sample_dump_write(const loom_sample_dump *d, const char *dir, int replica,
                                   loom_error *err);
void loom_sample_dump_free(loom_sample_dump *d);

#endif
