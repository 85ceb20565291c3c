/* Asynchronous checkpoint writing for one rank. At creation the rank's pieces (its ZeRO
 * shard of params, m and v) are planned once, the data file's safetensors header is
 * built and a host staging buffer holding the whole file image is allocated; the
 * background thread touches its pages first thing (so a save never allocates, and faults
 * no pages unless it starts before that is done; creation stays off the path from a
 * restart to the first step). A save (start) runs in a background
 * thread: stage (copy the pieces into the buffer, checksumming each row while it is in
 * cache), then write rank_NNNNN.safetensors through a .tmp file (O_DIRECT from the
 * aligned staging buffer where the filesystem takes it, else buffered in large blocks
 * with writeback started behind each), fsync, rename, and write the chunk index
 * rank_NNNNN.index.json the same way. The training thread may keep computing while the
 * copy runs, but must call wait_staged before it next changes the saved buffers (the
 * optimizer step): that wait is the training stall (CheckFreq's pipelined snapshot).
 * Rank 0's thread also runs the commit (ckpt/ckpt_commit.h) once every rank's write has
 * finished. One job at a time. */
#ifndef LOOM_CKPT_CKPT_WRITER_H
#define LOOM_CKPT_CKPT_WRITER_H

#include <stdint.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_plan.h"
#include "ckpt/manifest.h"
#include "core/error.h"
#include "core/worker.h"

#define LOOM_CKPT_CHUNK_FLOATS ((size_t)1 << 20) /* 4 MiB chunks */

/* What the background thread is asked to do (the last job posted). */
typedef enum {
    LOOM_CKPT_JOB_NONE,   /* none posted yet */
    LOOM_CKPT_JOB_WRITE,  /* stage and write this rank's files */
    LOOM_CKPT_JOB_COMMIT, /* rank 0: merge the indexes into the manifest */
} loom_ckpt_job;

typedef struct {
    int rank;
    loom_ckpt_buffer src[LOOM_CKPT_KINDS]; /* what this rank writes: [lo, hi) of each */
    loom_ckpt_plan plan;
    char (*names)[224];    /* tensor name per piece */
    int (*dims)[3];        /* per piece: ndim, and whether the name is a param (unused) */
    int64_t (*gshape)[2];  /* per piece: global shape as saved */
    uint64_t *file_offset; /* per piece: byte offset in the data file */
    uint64_t *checksum;    /* per piece, filled by the thread */
    void *hash;            /* XXH3 streaming state (the thread's) */
    uint8_t *image;        /* the data file: header then data */
    size_t image_bytes;
    size_t data_start; /* the header's end */
    /* the background thread (core/worker.h: its mutex guards job, staged and the state) */
    loom_worker worker;
    loom_ckpt_job job;
    int staged;                    /* the last write job's staging copy is complete */
    char dir[LOOM_CKPT_PATH_MAX];  /* step directory of the job */
    char tier[LOOM_CKPT_PATH_MAX]; /* commit: the folder holding step directories */
    int keep, world_size;
    loom_ckpt_manifest run;            /* commit: run state (no files or tensors) */
    double stage_ms;                   /* last write job: staging copy + checksums */
    double write_ms;                   /* last write job: wall time after staging (files, index) */
    double data_write_ms;              /* of which write() of the data file */
    double fsync_ms;                   /* of which its fsync */
    double stage_cpu_ms, write_cpu_ms; /* the thread's CPU time in staging / writing */
    int direct_io;                     /* the data file went out with O_DIRECT */
    uint64_t written_bytes;            /* last write job */
} loom_ckpt_writer;

/* t: the tensors in the buffers (kept only during the call). src[k]: the buffer to save
 * from and, in lo/hi, the flat range this rank writes; tensors whose descriptor is not
 * `written` are left out (another rank writes them). */
loom_status loom_ckpt_writer_create(loom_ckpt_writer *w, const loom_ckpt_descs *t,
                                    const loom_ckpt_buffer src[LOOM_CKPT_KINDS], int rank,
                                    loom_error *err);
/* The same for pieces planned by the caller (loom_ckpt_plan_range with written_only
 * and LOOM_CKPT_CHUNK_FLOATS, over any set of ranges: expert parallelism writes dense
 * tensors by dp shard and expert tensors by edp shard); takes the plan (emptied), also
 * on failure. */
loom_status loom_ckpt_writer_create_planned(loom_ckpt_writer *w, const loom_ckpt_descs *t,
                                            const loom_ckpt_buffer src[LOOM_CKPT_KINDS],
                                            loom_ckpt_plan *plan, int rank, loom_error *err);
void loom_ckpt_writer_destroy(loom_ckpt_writer *w);
/* Starts a save into step directory dir (created if needed): the thread stages the
 * buffers, then writes. */
loom_status loom_ckpt_writer_start(loom_ckpt_writer *w, const char *dir, loom_error *err);
/* Blocks until the staging copy of the save started last is complete (immediately when
 * it is, or when none is pending); the ms waited. Call before changing the buffers. */
double loom_ckpt_writer_wait_staged(loom_ckpt_writer *w);
/* Rank 0: starts the commit of dir (world_size ranks' indexes) in the thread; run holds
 * the run state (moved into the writer: the caller must not free it). */
loom_status loom_ckpt_writer_start_commit(loom_ckpt_writer *w, const char *dir, const char *tier,
                                          int keep, int world_size, loom_ckpt_manifest *run,
                                          loom_error *err);
/* Non-blocking: 1 when no job is running. */
int loom_ckpt_writer_idle(loom_ckpt_writer *w);
/* The chunk index (JSON, malloc'd; NULL when out of memory) of the data file image as
 * staged last, naming the data file data_name: valid once the staging copy is complete
 * (the checksums are the staged bytes'). */
char *loom_ckpt_writer_index_text(const loom_ckpt_writer *w, const char *data_name);
/* Blocks until idle; the last job's result (its error in err). */
loom_status loom_ckpt_writer_wait(loom_ckpt_writer *w, loom_error *err);

#endif
