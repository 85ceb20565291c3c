/* The file handling the token shards (dataset.h, shard_stream.h) and the image shards
 * (image_shard.h) share. Reading: the files matching a glob in bytewise order, each mapped
 * read-only after checking that it is a regular file long enough for its header. Writing:
 * DIR/SPLIT_NNNNNN.bin is written as NAME.tmp, fsync'd and renamed into place, so a shard
 * either does not exist or is complete. Each format keeps its own header validation and
 * its own messages; the messages here name the file and what failed. */
#ifndef LOOM_DATA_SHARD_FILES_H
#define LOOM_DATA_SHARD_FILES_H

#include <glob.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

/* ---- reading ---- */

/* Expands pattern into g, sorted bytewise (glob's own order follows the locale; the
 * samplers must not). A pattern that matches nothing is not an error here: g->gl_pathc is
 * 0 and the caller says what it expected. On LOOM_OK the caller globfree()s g; on an error
 * g is already freed. Messages start with flag ("--data " or ""): "FLAG'PATTERN': cannot
 * expand the pattern (glob error N)". */
loom_status loom_shard_glob(const char *pattern, const char *flag, glob_t *g, loom_error *err);

/* Copies path into *path_copy (even when the mapping then fails, so the caller frees it),
 * opens it, checks that it is a regular file of at least min_bytes bytes and maps it whole,
 * read-only, into *map / *map_bytes. what is appended to the short-file message "PATH:
 * truncated header: N bytes, expected at least MIN" (e.g. " (an image shard)" or ""). */
loom_status loom_shard_map(const char *path, int64_t min_bytes, const char *what, char **path_copy,
                           void **map, size_t *map_bytes, loom_error *err);

/* Undoes loom_shard_map: unmaps map (if any) and frees path. */
void loom_shard_unmap(char *path, void *map, size_t map_bytes);

/* Of n records `stride` bytes apart whose int64 keys (the first at *first_key) ascend,
 * the last one whose key is <= v: the shard holding global position v, where shards that
 * hold nothing share their successor's first position. n >= 1. */
int loom_shard_find(const int64_t *first_key, size_t stride, int n, int64_t v);

/* ---- writing ---- */

/* Writes DIR/SPLIT_NNNNNN.bin into path[cap]; -1 when it does not fit. */
int loom_shard_numbered_path(char *path, size_t cap, const char *dir, const char *split, int index);

/* Fills tmp[cap] with path + ".tmp" and creates it (truncated, 0644) for writing into *fd:
 * "TMP: cannot create: ...". */
loom_status loom_shard_tmp_open(const char *path, char *tmp, size_t cap, int *fd, loom_error *err);

/* All n bytes of buf to fd (at offset off for the pwrite form), retrying interrupted
 * calls: "TMP: write failed: ...". */
loom_status loom_shard_tmp_write(int fd, const char *tmp, const void *buf, size_t n,
                                 loom_error *err);
loom_status loom_shard_tmp_pwrite(int fd, const char *tmp, const void *buf, size_t n, off_t off,
                                  loom_error *err);

/* fsyncs *fd ("TMP: write failed: ..."), closes it (*fd = -1), renames tmp to path ("TMP:
 * cannot close and rename into place: ...") and, when dir is not NULL, fsyncs dir so the
 * rename is durable (a filesystem that refuses is fine). On an error tmp is removed and
 * *fd closed. */
loom_status loom_shard_tmp_commit(int *fd, const char *tmp, const char *path, const char *dir,
                                  loom_error *err);

/* Drops a half-written shard: closes *fd (if >= 0, then *fd = -1) and removes tmp. */
void loom_shard_tmp_discard(int *fd, const char *tmp);

#endif
