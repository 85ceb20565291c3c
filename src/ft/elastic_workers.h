/* `loom run --elastic` with `--outer diloco --workers W`: elastic DiLoCo workers
 * (docs/diloco.md, "Elastic workers"). An ompi-server for the workers' names, then one
 * mpirun of -n / W ranks per worker, each `loom train ... --elastic-worker I`; a worker
 * that ends with an error is started again (at most --max-restarts times in all), with
 * --resume auto when the job writes checkpoints: a worker other than 0 with --elastic-join
 * (it joins the running group), worker 0, the one coordinator, without it (it founds the
 * group again from its newest checkpoint; the members that hear nothing from it leave and
 * are started again as joiners). The run ends when worker 0 ends with exit 0 or with no
 * restarts left: its exit code is the run's, and the others get --grace s to end (a member
 * ends at the same last sync; a joiner never admitted waits for ever and is stopped).
 * Each worker's ranks beat to a heartbeat monitor of its own (ft/monitor.h): one found
 * hung, silent or stalled by the one-job supervisor's rules (ft/detect.h) is stopped and
 * restarted like one that died, the detection in its summary.json entry. */
#ifndef LOOM_FT_ELASTIC_WORKERS_H
#define LOOM_FT_ELASTIC_WORKERS_H

#include "core/error.h"
#include "ft/run_config.h"

/* train_argv[0..train_argc): the loom train options (without "train").
 * checkpoints: the options have --ckpt-dir; a restarted worker then also gets --resume auto
 * (its newest valid checkpoint in DIR/worker_I, or a fresh start when it has none). */
loom_status loom_elastic_workers_run(const loom_run_config *cfg, int workers, const char *loom_exe,
                                     char **train_argv, int train_argc, int checkpoints,
                                     int *exit_code, loom_error *err);

#endif
