/* Checkpoint directories on disk: DIR/step_NNNNNNNN/ holds the rank files
 * (rank_NNNNN.safetensors, rank_NNNNN.index.json) and, once complete, manifest.json;
 * DIR/latest names the newest complete one. */
#ifndef LOOM_CKPT_CKPT_DIR_H
#define LOOM_CKPT_CKPT_DIR_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define LOOM_CKPT_PATH_MAX 1400

typedef struct {
    char path[LOOM_CKPT_PATH_MAX];
    int64_t step;
} loom_ckpt_entry;

/* The step_NNNNNNNN folders of dir (complete or not), newest first, appended to *list
 * (realloc'd). Returns the new count, or -1 when out of memory; a missing dir adds none. */
int loom_ckpt_list(const char *dir, loom_ckpt_entry **list, int n);
/* "DIR/step_%08d". */
void loom_ckpt_step_dir(char *out, size_t size, const char *dir, int64_t step);
/* fsync of a directory (its entries durable); 0 or -1 with errno. */
int loom_ckpt_fsync_dir(const char *dir);
/* Data file and chunk index names of a rank. */
void loom_ckpt_data_name(char *out, size_t size, int rank);
void loom_ckpt_index_name(char *out, size_t size, int rank);
/* Removes a step folder and the plain files in it. */
int loom_ckpt_remove_step(const char *path);

#endif
