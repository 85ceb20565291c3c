#include "cli/cmd_train.h"

#include <stdio.h>

#include "cli/train_options.h"
#include "comm/world.h"
#include "core/cpu_boot.h"
#include "train/trainer.h"

int loom_cmd_train(int argc, char **argv) {
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
    if ((st = loom_model_config_validate(&o.model, &err)) ||
        (st = loom_train_config_validate(&o.train, &err))) {
        fprintf(stderr, "loom train: %s\n", err.msg);
        return 2;
    }
    loom_world world;
    if ((st = loom_world_init(&world, &argc, &argv, &err))) {
        fprintf(stderr, "loom train: %s\n", err.msg);
        return 1;
    }
    if (world.size > 1) {
        /* Multi-rank layouts (--dp/--tp/--pp/--ep) are their own issues. */
        if (world.rank == 0)
            fprintf(stderr,
                    "loom train: launched with %d ranks, but this build trains on one "
                    "process only (run without mpirun or with -n 1)\n",
                    world.size);
        loom_world_finalize(&world);
        return 2;
    }
    if (o.train.threads == 0) o.train.threads = loom_cpu_default_threads();
    loom_cpu_set_threads(o.train.threads);
    fprintf(stderr, "loom train: OpenBLAS kernel %s, %d thread(s)\n", loom_cpu_blas_corename(),
            o.train.threads);
    fprintf(stderr, "loom train: effective configuration (usable as --config):\n");
    loom_train_options_print(&o, stderr);
    st = loom_train_run(&o.model, &o.train, &err);
    loom_world_finalize(&world);
    if (st) {
        fprintf(stderr, "loom train: %s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    return 0;
}
