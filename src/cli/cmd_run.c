#include "cli/cmd_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmd_rl.h"
#include "cli/train_options.h"
#include "core/fault.h"
#include "ft/elastic_workers.h"
#include "ft/run_config.h"
#include "ft/supervisor.h"

int loom_cmd_run(int argc, char **argv) {
    loom_error err = {0};
    loom_run_config cfg;
    int child = -1, help = 0;
    loom_status st = loom_run_config_parse(&cfg, argc, argv, &child, &help, &err);
    if (help) {
        loom_run_config_usage(stdout);
        return 0;
    }
    if (st) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    /* loom run ... -- rl ...: loom rl's ranks (their train options are loom rl's own) */
    const int rl = strcmp(argv[child], "rl") == 0;
    loom_rl_config rc;
    loom_train_options o;
    if (rl) {
        int code = loom_cmd_rl_options(argc - child, argv + child, &rc, &o);
        if (code >= 0) return code;
        child++;
    }
    /* Check the train command here, once, rather than in every rank of every attempt. */
    int train_argc = argc - child;
    char **targv = malloc((size_t)(train_argc + 2) * sizeof *targv);
    if (!targv) return 1;
    targv[0] = "train";
    memcpy(targv + 1, argv + child, (size_t)train_argc * sizeof *targv);
    targv[train_argc + 1] = NULL;
    if (!rl && ((st = loom_train_options_parse(&o, train_argc + 1, targv, &err)) ||
                (st = loom_model_config_validate(&o.model, &err)) ||
                (st = loom_train_config_validate(&o.train, &err)))) {
        fprintf(stderr, "loom run: train options: %s\n", err.msg);
        free(targv);
        return 2;
    }
    loom_fault_list faults = {0}; /* the ranks check again; a typo should not need a launch */
    if ((st = loom_fault_parse(&faults, o.train.inject, "--inject", &err)) ||
        (st = loom_fault_parse(&faults, getenv("LOOM_INJECT"), "LOOM_INJECT", &err))) {
        fprintf(stderr, "loom run: train options: %s\n", err.msg);
        free(targv);
        return 2;
    }
    /* --elastic with DiLoCo worker groups: one job per worker (ft/elastic_workers.h) */
    if (!rl && cfg.elastic && loom_outer_enabled(&o.train.outer) && o.train.outer.workers > 1) {
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        int code = 1;
        if (n <= 0)
            st = loom_error_set(&err, LOOM_ERR_IO, "loom run: cannot find the loom binary");
        else
            exe[n] = 0;
        if (!st)
            st = loom_elastic_workers_run(&cfg, o.train.outer.workers, exe, targv + 1, train_argc,
                                          o.train.ckpt_dir[0] != 0, &code, &err);
        free(targv);
        if (st) fprintf(stderr, "%s\n", err.msg);
        return st ? (st == LOOM_ERR_INPUT ? 2 : 1) : code;
    }
    loom_run_job job = {0};
    snprintf(job.command, sizeof job.command, "%s", rl ? "rl" : "train");
    job.dp = o.train.layout.dp;
    job.model_ranks = o.train.layout.tp * o.train.layout.pp * o.train.layout.cp;
    if (loom_outer_enabled(&o.train.outer)) { /* --workers: --dp is per worker group */
        job.model_ranks *= o.train.outer.workers;
        job.workers = o.train.outer.workers;
    }
    snprintf(job.data, sizeof job.data, "%s", o.train.data);
    job.vocab_size = o.model.vocab_size;
    job.seq_len = o.model.seq_len;
    job.images = o.model.family == LOOM_FAMILY_DIT;
    job.seed = o.train.seed;
    job.global_batch = o.train.global_batch;
    job.micro_batch = o.train.micro_batch;
    job.steps = o.train.steps;
    snprintf(job.skip_steps, sizeof job.skip_steps, "%s", o.train.skip_steps);
    snprintf(job.ckpt_dirs[0], sizeof job.ckpt_dirs[0], "%s", o.train.ckpt_dir);
    snprintf(job.ckpt_dirs[1], sizeof job.ckpt_dirs[1], "%s", o.train.ckpt_fast_dir);
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "loom run: cannot find the loom binary (/proc/self/exe)\n");
        free(targv);
        return 1;
    }
    exe[n] = 0;
    int code = 1;
    st = loom_supervisor_run(&cfg, &job, exe, targv + 1, train_argc, &code, &err);
    free(targv);
    if (st) {
        fprintf(stderr, "%s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    return code;
}
