/* Loading a checkpoint into any layout: the rank plans the pieces it owns now (whatever
 * dp, ZeRO stage, tensor-parallel placement or world size), intersects them with the
 * saved chunks of the same tensors, and reads (pread) only the chunks that intersect.
 * A chunk is read in cache-sized row blocks: each block is checksummed (streaming XXH3)
 * and its overlap copied in while it is in cache; the chunk's checksum is compared at its
 * end, and any mismatch fails the whole load (the destination then holds unverified data
 * and must be discarded: the trainer resets it and tries an older checkpoint). Chunks
 * are at most 4 MiB, so the over-read at shard boundaries is bounded. Every byte range is
 * checked against the file's size first: a bad manifest never causes an out-of-bounds
 * read or sizes an allocation. */
#ifndef LOOM_CKPT_CKPT_LOADER_H
#define LOOM_CKPT_CKPT_LOADER_H

#include <stdint.h>

#include "ckpt/ckpt_plan.h"
#include "ckpt/manifest.h"
#include "core/error.h"

/* Where a load's time went: the phases' milliseconds summed over the reader threads
 * (making the fresh destination pages, the preads, the XXH3 checksums, the user-space
 * copies out of the read buffer), and the bytes read straight into place against those
 * copied from the read buffer. */
typedef struct {
    uint64_t bytes_read;
    int chunks_read;
    double populate_ms, read_ms, hash_ms, copy_ms;
    uint64_t bytes_direct, bytes_copied;
} loom_ckpt_load_stats;

/* t: the tensors this rank holds; dst[k]: where it holds buffer k ([lo, hi) of the flat layout);
 * data NULL: not loaded. Errors name the file, the tensor and what was expected. */
loom_status loom_ckpt_load(const char *dir, const loom_ckpt_manifest *m, const loom_ckpt_descs *t,
                           const loom_ckpt_buffer dst[LOOM_CKPT_KINDS], loom_ckpt_load_stats *stats,
                           loom_error *err);
/* Reads every chunk of every file and checks its checksum; every data file must also be
 * a valid safetensors file. */
loom_status loom_ckpt_verify(const char *dir, const loom_ckpt_manifest *m, uint64_t *bytes,
                             loom_error *err);

#endif
