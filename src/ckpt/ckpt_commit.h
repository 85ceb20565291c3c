/* Making a checkpoint visible (rank 0, once every rank's data file and chunk index are
 * durable): merge the indexes into the manifest, check that every tensor is covered
 * exactly once, write manifest.json through a .tmp file (fsync, atomic rename, fsync of
 * the folder), then point TIER/latest at it the same way, then remove all but the newest
 * `keep` complete checkpoints of the tier (older incomplete ones too, and the outer
 * optimizer's state TIER/outer/step_N of every step folder removed). A folder without a
 * manifest is never a checkpoint, so a crash at any point leaves the previous one. */
#ifndef LOOM_CKPT_CKPT_COMMIT_H
#define LOOM_CKPT_CKPT_COMMIT_H

#include "ckpt/manifest.h"
#include "core/error.h"

/* run: the run state; its files and tensors are filled in (the caller frees it). tier ""
 * skips latest and pruning; keep <= 0 keeps everything. */
loom_status loom_ckpt_commit(const char *dir, const char *tier, int keep, int world_size,
                             loom_ckpt_manifest *run, loom_error *err);
/* Writes text to path through path.tmp (fsync, rename, fsync of the folder). */
loom_status loom_ckpt_write_atomic(const char *path, const char *text, loom_error *err);

#endif
