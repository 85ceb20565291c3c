/* What the trainer calls for checkpoints (ckpt/ does the work): resume or import at the
 * start, a cheap per-step call that starts asynchronous saves and commits finished ones,
 * and a final save. Every rank calls every function (they contain collectives over the
 * world communicator, in the same order on all ranks).
 * Per step, while checkpointing is on, the ranks sum three numbers over the world: a stop
 * request (SIGTERM/SIGINT, whose handler only sets a flag), "my write is done", "my write
 * failed". When every rank's write is done, rank 0's background thread commits the
 * manifest; training never waits for it unless the next save comes first.
 * A save's staging copy runs in the writer's thread during the next step's forward and
 * backward; loom_checkpointing_before_update (before the optimizer step) waits for it. */
#ifndef LOOM_TRAIN_CHECKPOINTING_H
#define LOOM_TRAIN_CHECKPOINTING_H

#include "ckpt/ckpt_writer.h"
#include "core/error.h"
#include "model/config.h"
#include "parallel/mesh.h"
#include "parallel/zero.h"
#include "ckpt/ckpt_peer.h"
#include "train/train_config.h"

typedef struct {
    const loom_model_config *mc;
    const loom_train_config *tc;
    loom_mesh *mesh;
    loom_zero *zero;
    float *params;      /* every parameter (ZeRO 0-2), or NULL */
    float *param_shard; /* ZeRO-3: this rank's parameter shard, or NULL */
    int enabled;        /* a tier is configured */
    int loaded;         /* the training state came from a checkpoint (--resume) */
    int reset;          /* a failed load was undone: the state is the initial one */
    int ema_loaded;     /* the moving average came from the checkpoint too */
    char loaded_dir[LOOM_CKPT_PATH_MAX]; /* the step folder it came from ("": memory, none) */
    /* the registry as ckpt/ sees it (train/ckpt_tensors.h) */
    loom_ckpt_descs tensors;
    loom_ckpt_writer writer;
    int writer_ready;
    loom_ckpt_peer peer; /* --ckpt-peer: every save also in memory, here and on a peer host */
    int in_flight;       /* a write started and not yet known complete on every rank */
    int64_t flight_step;
    char flight_dir[LOOM_CKPT_PATH_MAX], flight_tier[LOOM_PATH_MAX];
    int last_saved; /* step of the last save started (-1: none) */
    int staging;    /* the save in flight may still be copying the buffers */
    int saves, waits, commit_waits, failures, stalls;
    double stall_ms_pending, stall_ms_last, stall_ms_max, stall_ms_total, wait_ms_total;
} loom_checkpointing;

/* After the parameters are initialised: applies --init-from or --resume (the buffers are
 * overwritten) and sets *start_step (0 when starting fresh). */
loom_status loom_checkpointing_open(loom_checkpointing *c, const loom_model_config *mc,
                                    const loom_train_config *tc, loom_mesh *mesh, loom_zero *zero,
                                    float *params, float *param_shard, int *start_step,
                                    loom_error *err);
/* An elastic joiner (parallel/outer.h's loom_outer_reload_fn): the checkpoint of `step` in
 * the folder tier (tier/step_%08d) instead of the one loaded at the start (of step `back`,
 * from loaded_dir, whichever tier that was). *loaded 1: loaded; 0: none complete there, or
 * it failed to load and the checkpoint of `back` was loaded again (each rank's line says
 * why; back 0: the initial state again); an error when that fails too (the state is then
 * the initial one). Collective over the world. */
loom_status loom_checkpointing_load_step(loom_checkpointing *c, const char *tier, int step,
                                         int back, int *loaded, loom_error *err);
/* After optimizer step `step` (1-based). *stop = 1 when a signal asked every rank to stop. */
loom_status loom_checkpointing_step(loom_checkpointing *c, int step, int *stop, loom_error *err);
/* 1 when loom_checkpointing_step(c, step) starts a save (it reads the buffers). */
int loom_checkpointing_saves_at(const loom_checkpointing *c, int step);
/* The tier folder (--ckpt-dir or --ckpt-fast-dir) that the save after step `step` goes to:
 * final 0, the periodic save loom_checkpointing_step starts (NULL: none); final 1, the final
 * save loom_checkpointing_finish makes (NULL: checkpointing is off). State saved beside a
 * checkpoint (--outer diloco) goes to the same folder, so it is pruned with it. */
const char *loom_checkpointing_tier(const loom_checkpointing *c, int step, int final);
/* Before the buffers change (the optimizer step): waits until a save started at the
 * previous step has copied them (the copy overlaps this step's forward and backward). */
void loom_checkpointing_before_update(loom_checkpointing *c);
/* The final checkpoint at `step` (unless already saved) and every pending commit. */
loom_status loom_checkpointing_finish(loom_checkpointing *c, int step, loom_error *err);
void loom_checkpointing_close(loom_checkpointing *c);

#endif
