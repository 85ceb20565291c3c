/* The launcher's command line for one attempt of `loom run`: mpirun (the default), or
 * srun --mpi=pmix inside a Slurm allocation (tests/hosts/test_slurm.py runs it on a real
 * Slurm cluster of test hosts). The supervisor's own flags come after the user's train
 * options, so they win: --dp, --skip-steps, --resume auto. */
#ifndef LOOM_FT_LAUNCH_ARGV_H
#define LOOM_FT_LAUNCH_ARGV_H

#include <stddef.h>

#define LOOM_LAUNCH_MAX_ARGS 512
#define LOOM_LAUNCH_ARG_BYTES 1100
#define LOOM_LAUNCH_OWN_ARGS 48 /* strings the builder writes (the rest point at train_argv) */

typedef struct {
    const char *launcher; /* "mpirun" or "srun" */
    const char *hosts;    /* "" = this host only (mpirun --host, srun --nodelist) */
    int world, dp;
    const char *attempt_dir; /* rank logs go under it (loom_launch_rank_log) */
    const char *loom_exe;
    const char *command; /* "train" (NULL or "": train) or "rl" */
    char **train_argv;
    int train_argc;
    const char *skip_list;     /* --skip-steps LIST, "" = none */
    int resume;                /* --resume auto */
    int as_root;               /* mpirun: --allow-run-as-root */
    long cores;                /* this host's: mpirun oversubscribes (and yields) beyond */
    const char *launcher_args; /* --launcher-args: split at blanks, before the program */
} loom_launch_spec;

typedef struct {
    char *argv[LOOM_LAUNCH_MAX_ARGS + 1]; /* NULL-terminated */
    int argc;
    char store[LOOM_LAUNCH_OWN_ARGS][LOOM_LAUNCH_ARG_BYTES];
    char extra[LOOM_LAUNCH_ARG_BYTES]; /* launcher_args, split in place */
} loom_launch_cmd;

/* Builds the command line into c (mpirun forwards the LOOM_FT_* and LOOM_INJECT
 * variables that are set with -x; srun --export=ALL passes the environment). The words
 * of launcher_args come last before the program, so they can add to or override the
 * launcher's settings (e.g. mpirun --mca NAME VALUE). */
void loom_launch_cmd_build(loom_launch_cmd *c, const loom_launch_spec *s);
/* Where the launcher writes rank `rank`'s output (stdout and stderr) for attempt_dir. */
void loom_launch_rank_log(const char *launcher, const char *attempt_dir, int rank, char *out,
                          size_t size);

#endif
