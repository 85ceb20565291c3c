#include "cli/cmd_train.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/memory_budget.h"
#include "cli/startup_watchdog.h"
#include "cli/train_options.h"
#include "comm/world.h"
#include "parallel/mesh.h"
#include "parallel/outer_elastic.h"
#include "parallel/param_gather.h"
#include "parallel/placement.h"
#include "model/moe_config.h"
#include "parallel/tp_shards.h"
#include "pipeline/pipeline.h"
#include "core/cpu_boot.h"
#include "core/fault.h"
#include "core/timeline.h"
#include "ft/heartbeat.h"
#include "train/trainer.h"

int loom_cmd_train(int argc, char **argv) {
    loom_timeline_mark("exec");
    loom_error err = {0};
    loom_train_options o;
    loom_status st = loom_train_options_parse(&o, argc, argv, &err);
    if (st) {
        fprintf(stderr, "loom train: %s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    if (o.help) {
        loom_train_options_usage(stdout);
        return 0;
    }
    if ((st = loom_train_config_validate_all(&o.train, &o.model, &err))) {
        fprintf(stderr, "loom train: %s\n", err.msg);
        return 2;
    }
    loom_fault_list faults = {0};
    if ((st = loom_fault_parse(&faults, o.train.inject, "--inject", &err)) ||
        (st = loom_fault_parse(&faults, getenv("LOOM_INJECT"), "LOOM_INJECT", &err))) {
        fprintf(stderr, "loom train: %s\n", err.msg);
        return 2;
    }
    loom_timeline_mark("options");
    loom_world world;
    loom_startup_watchdog watchdog; /* until every rank is in (the mesh is built) */
    loom_startup_watchdog_arm(&watchdog, o.train.startup_timeout);
    if ((st = loom_world_init(&world, &argc, &argv, &err))) {
        loom_startup_watchdog_disarm(&watchdog);
        fprintf(stderr, "loom train: %s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    loom_timeline_mark("mpi_init");
    loom_fault_arm(&faults, loom_fault_slot_of(world.rank), loom_fault_attempt_from_env());
    if ((st = loom_heartbeat_start(world.rank, world.size, &err))) /* under loom run */
        fprintf(stderr, "loom train: rank %d: no heartbeats: %s\n", world.rank, err.msg);
    loom_mesh mesh;
    /* --elastic-worker: this job is one worker of the group (parallel/outer_elastic.h) */
    const int elastic = o.train.outer.elastic_worker >= 0;
    const int workers = loom_outer_enabled(&o.train.outer) && !elastic ? o.train.outer.workers : 1;
    st = loom_mesh_create_workers(&mesh, &world, o.train.layout, workers, &err);
    if (!st && elastic) loom_outer_elastic_mesh(&mesh, &o.train.outer);
    loom_startup_watchdog_disarm(&watchdog);
    loom_timeline_mark("mesh");
    if (st) {
        if (world.rank == 0) fprintf(stderr, "loom train: %s\n", err.msg);
        loom_world_finalize(&world);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    loom_placement_report(&mesh, stderr);
    if (o.train.threads == 0) o.train.threads = loom_cpu_default_threads();
    loom_cpu_set_threads(o.train.threads);
    if (world.rank == 0) {
        fprintf(stderr, "loom train: %d rank(s), OpenBLAS kernel %s, %d thread(s) per rank\n",
                world.size, loom_cpu_blas_corename(), o.train.threads);
        fprintf(stderr, "loom train: effective configuration (usable as --config):\n");
        loom_train_options_print(&o, stderr);
    }
    loom_train_config group; /* --outer diloco: this worker's share (else the same) */
    loom_train_config_for_worker(&o.train, mesh.worker, &group);
    st = loom_memory_budget_check(&o.model, &o.train, world.size, &err);
    if (!st) st = loom_train_run(&o.model, &group, &mesh, &err);
    loom_heartbeat_stop(st != LOOM_OK, err.msg);
    if (st) {
        if (world.size > 1)
            fprintf(stderr, "loom train: rank %d: %s\n", world.rank, err.msg);
        else
            fprintf(stderr, "loom train: %s\n", err.msg);
        /* Ranks may be waiting in a collective for this one: end the whole job. */
        if (world.size > 1) MPI_Abort(MPI_COMM_WORLD, st == LOOM_ERR_INPUT ? 2 : 1);
    }
    loom_mesh_free(&mesh);
    loom_world_finalize(&world);
    return st == LOOM_OK ? 0 : st == LOOM_ERR_INPUT ? 2 : 1;
}
