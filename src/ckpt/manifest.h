/* The checkpoint manifest (manifest.json): every global tensor (name, dtype, global
 * shape) with the chunks that hold it (box in the global tensor, data file, byte offset,
 * byte count, XXH3-64 checksum), and the run state at save time (step, seed, layout, and
 * the model and training configurations as JSON objects the caller makes and reads). The same
 * structure, without run state, is each rank's chunk index (rank_NNNNN.index.json) that rank 0
 * merges into the manifest. Parsing validates everything a reader relies on: file names
 * inside the directory, boxes inside their tensor, byte counts matching boxes, and (for
 * a manifest) chunks covering each tensor exactly once. */
#ifndef LOOM_CKPT_MANIFEST_H
#define LOOM_CKPT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define LOOM_CKPT_FORMAT "loom-checkpoint-1"
#define LOOM_CKPT_INDEX_FORMAT "loom-checkpoint-index-1"

typedef struct {
    int file;
    int64_t off[2], len[2]; /* rows, columns (1-D tensors: columns 0, 1) */
    uint64_t byte_offset, bytes, checksum;
} loom_ckpt_chunk;

typedef struct {
    char *name;
    int ndim;
    int64_t shape[2]; /* as saved (1-D: shape[1] == 0) */
    loom_ckpt_chunk *chunks;
    int n_chunks, cap;
} loom_ckpt_tensor;

typedef struct {
    int dp, tp, pp, ep, zero, world_size;
    int cp; /* context-parallel ranks (absent in older manifests: 1) */
} loom_ckpt_layout;

typedef struct {
    int64_t step, tokens_seen;
    uint64_t seed;
    loom_ckpt_layout layout;
    char version[32];
    /* The model and training configurations at save time (jansson objects, written and
     * read by the caller: model/config_json.h for the model); the model's is required. */
    void *model, *train;
    char **files;
    int n_files, files_cap;
    loom_ckpt_tensor *tensors;
    int n_tensors, tensors_cap;
} loom_ckpt_manifest;

/* Parses and validates text (index: a rank's chunk index, without run state or the
 * exact-cover check). origin names the file in messages. */
loom_status loom_ckpt_manifest_parse(loom_ckpt_manifest *m, const char *text, size_t len, int index,
                                     const char *origin, loom_error *err);
/* Reads and parses a file (at most 256 MiB). */
loom_status loom_ckpt_manifest_load(loom_ckpt_manifest *m, const char *path, int index,
                                    loom_error *err);
/* The JSON text (malloc'd), or NULL when out of memory. */
char *loom_ckpt_manifest_dump(const loom_ckpt_manifest *m, int index);
void loom_ckpt_manifest_free(loom_ckpt_manifest *m);

/* Building: index of the file (added if new), -1 when out of memory. */
int loom_ckpt_manifest_add_file(loom_ckpt_manifest *m, const char *name);
loom_status loom_ckpt_manifest_add_chunk(loom_ckpt_manifest *m, const char *tensor, int ndim,
                                         const int64_t shape[2], const loom_ckpt_chunk *c,
                                         loom_error *err);
/* Appends src's files and chunks to dst. */
loom_status loom_ckpt_manifest_merge(loom_ckpt_manifest *dst, const loom_ckpt_manifest *src,
                                     loom_error *err);
const loom_ckpt_tensor *loom_ckpt_manifest_find(const loom_ckpt_manifest *m, const char *name);
/* Every tensor covered exactly once by its chunks (no overlap, no hole). */
loom_status loom_ckpt_manifest_check_cover(const loom_ckpt_manifest *m, const char *origin,
                                           loom_error *err);

#endif
