/* Checkpoints in peers' memory (--ckpt-peer; Gemini, SOSP'23). Every save's data file,
 * chunk index and run state are kept in this host's memory, a folder of files in shared
 * memory (tmpfs: DIR/HOSTNAME/TAG/step_NNNNNNNN/, DIR = --ckpt-peer-dir, /dev/shm/loom-peer
 * by default; TAG names the job by its --ckpt-dir), so they outlive the training process
 * (OpenMPI has no ULFM: a rank's death ends the job and the supervisor relaunches it) but
 * not its host. A copy of each rank's files goes to one rank on the next host (hosts in the
 * order of their first rank; rank i of a host sends to rank i mod n of the next), over MPI
 * on a communicator of its own, from a background thread that starts once the writer's
 * staging copy is done: the step never waits for it. A shard in memory is complete when its
 * three files are (each written through a .tmp file and renamed, the run state last).
 * Recovery (collective, before the disk tiers are searched): the lowest rank of every host
 * lists what its host holds, rank 0 picks the newest step whose every shard some host still
 * holds; if it is at least as new as the newest step on disk, the hosts that lack a shard
 * get it over MPI from one that holds it, and every rank builds the manifest from the
 * shards' indexes and run state (exact cover checked) and loads from its own host's memory
 * through the usual resharding loader (XXH3 per chunk). Otherwise the disk tier is used and
 * the line says why (which shards no surviving host holds). A host keeps only the newest
 * committed step (every rank's files and copies done) and, while a save is in flight, that
 * one too. */
#ifndef LOOM_CKPT_CKPT_PEER_H
#define LOOM_CKPT_CKPT_PEER_H

#include <mpi.h>
#include <stdint.h>

#include "ckpt/ckpt_writer.h"
#include "ckpt/manifest.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/worker.h"

typedef struct {
    int enabled;
    int rank, world;
    MPI_Comm comm; /* the copies' own communicator (MPI_COMM_NULL: one process) */
    int own_comm;  /* comm was made here (freed on close) */
    char host[64];
    int n_hosts, host_id;          /* hosts in the order of their first rank */
    int *host_of;                  /* per world rank */
    int leader;                    /* the lowest rank of this host: lists, prunes, serves shards */
    int dst;                       /* the rank (next host) that keeps a copy of ours; -1: none */
    int *srcs, n_srcs;             /* the ranks whose copies this rank keeps */
    char dir[LOOM_PATH_MAX + 128]; /* DIR/HOSTNAME/TAG */
    /* the background thread and its one job */
    loom_worker worker; /* core/worker.h */
    loom_ckpt_writer *writer;
    int64_t step;
    char *run_text;
    /* the last job: bytes kept of this rank's own files, received from srcs, wall ms */
    uint64_t own_bytes, recv_bytes;
    double ms;
} loom_ckpt_peer;

/* What open needs of the run (train/checkpointing.c fills it from the flags and the mesh). */
typedef struct {
    int enabled;                   /* --ckpt-peer */
    const char *peer_dir;          /* --ckpt-peer-dir */
    const char *job_dir;           /* --ckpt-dir, else --ckpt-fast-dir: names the job (TAG) */
    int rank, world;               /* this rank in the world */
    MPI_Comm world_comm;           /* the world's communicator (MPI_COMM_NULL: none) */
    int thread_level;              /* MPI's thread level (comm/world.h) */
    const char *thread_level_name; /* ... its name, for the message */
} loom_ckpt_peer_options;

/* Collective over the world: hosts, peers, the memory folder, the thread. Needs MPI's
 * thread level MULTIPLE when there is more than one rank. */
loom_status loom_ckpt_peer_open(loom_ckpt_peer *p, const loom_ckpt_peer_options *o,
                                loom_error *err);
void loom_ckpt_peer_close(loom_ckpt_peer *p);
/* Starts keeping the save of `step` that writer w has started (run_text: the run state,
 * a manifest without tensors; taken over). */
loom_status loom_ckpt_peer_start(loom_ckpt_peer *p, loom_ckpt_writer *w, int64_t step,
                                 char *run_text, loom_error *err);
int loom_ckpt_peer_idle(loom_ckpt_peer *p);
/* Blocks until idle; the last job's result. */
loom_status loom_ckpt_peer_wait(loom_ckpt_peer *p, loom_error *err);
/* Every rank's files and copies of `step` are done (or a restart took `step`; -1: none):
 * the host's leader removes every other step of this job from the host's memory. */
void loom_ckpt_peer_keep_only(loom_ckpt_peer *p, int64_t step);

typedef struct {
    int use;                       /* 1: m and dir hold a complete checkpoint in memory */
    int64_t step;                  /* the newest complete step in memory (-1: none) */
    int world;                     /* its ranks (shards) */
    int shards_copied;             /* shards sent between hosts to complete every host's copy */
    uint64_t bytes_copied;         /* their bytes */
    char why[512];                 /* rank 0: why memory was not used ("" when it was) */
    char dir[LOOM_PATH_MAX + 160]; /* the step folder in this host's memory */
} loom_ckpt_peer_found;

/* Collective: finds the newest complete step in the surviving hosts' memory and, when it
 * is at least as new as disk_newest (rank 0's value; -1: no disk checkpoint), completes
 * every host's copy over MPI and builds the manifest into *m (found->use = 1; the caller
 * frees m). Otherwise found->use = 0 and nothing is changed. */
loom_status loom_ckpt_peer_restore(loom_ckpt_peer *p, int64_t disk_newest, loom_ckpt_manifest *m,
                                   loom_ckpt_peer_found *found, loom_error *err);

#endif
