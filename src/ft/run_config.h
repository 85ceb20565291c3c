/* `loom run` settings: the supervisor's own flags and what it needs to know about the
 * training job it runs (from the train options, parsed by the command line). */
#ifndef LOOM_FT_RUN_CONFIG_H
#define LOOM_FT_RUN_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

#define LOOM_RUN_PATH 1024

typedef struct {
    int ranks;                    /* -n */
    char hosts[LOOM_RUN_PATH];    /* --hosts (mpirun --host), "" = this host only */
    char hostfile[LOOM_RUN_PATH]; /* --hostfile: read into hosts ("" = none) */
    char bind[256];               /* --bind: the heartbeat socket's address */
    int max_restarts;             /* --max-restarts */
    double heartbeat_timeout_s;   /* a silent rank, or a collective waited on this long: failed */
    double step_timeout_s;        /* no step anywhere for this long: a hang (0 = off) */
    double startup_timeout_s;     /* every rank must beat within this after launch */
    double host_wait_s;           /* a lost host: how long to wait for it to answer again */
    double grace_s;               /* SIGTERM, then SIGKILL after this */
    int elastic;                  /* --elastic: shrink the world around a failing rank */
    int min_ranks;                /* --min-ranks */
    int exclude_after;            /* failures of one rank before it is excluded (elastic) */
    double loss_spike_factor;     /* 0 = off */
    double straggler_factor;      /* compute time x this vs the others' median: a straggler */
    int skip_bad_batches;         /* roll back past a spiking/non-finite step's batch */
    char run_dir[LOOM_RUN_PATH];
    char launcher[16]; /* "mpirun" or "srun" (auto: srun inside a Slurm allocation) */
    char launcher_args[LOOM_RUN_PATH]; /* --launcher-args: more words for the launcher */
} loom_run_config;

/* What the supervisor needs to know of the train command (cli fills it). */
typedef struct {
    int dp, global_batch, micro_batch, steps;
    int model_ranks; /* ranks of one data-parallel replica: --tp x --pp x --cp (the rest is --dp) */
    char data[LOOM_RUN_PATH]; /* --data, --vocab-size, --seq-len, --seed: to name a bad */
    int vocab_size, seq_len;  /* batch's sequences in the diagnosis (ft/batch_info.h) */
    int images;               /* 1: --data holds image shards (a dit), samples are named */
    uint64_t seed;
    char skip_steps[LOOM_RUN_PATH];
    char ckpt_dirs[2][LOOM_RUN_PATH]; /* --ckpt-dir, --ckpt-fast-dir ("" = none) */
    int workers;     /* --outer diloco --workers W: checkpoints in DIR/worker_I (0: none) */
    char command[8]; /* the loom command the ranks run: "train" or "rl" */
} loom_run_job;

/* Parses argv up to "--" (argv[0] = "run"); *child_index = the index after "--".
 * LOOM_ERR_INPUT naming the flag on bad input, or when the train command is missing. */
loom_status loom_run_config_parse(loom_run_config *c, int argc, char **argv, int *child_index,
                                  int *help, loom_error *err);
void loom_run_config_usage(FILE *f);

#endif
