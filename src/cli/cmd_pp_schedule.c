#include "core/suggest.h"
#include "cli/cmd_pp_schedule.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/schedule.h"
#include "pipeline/vision_plan.h"

static void usage(FILE *f) {
    fprintf(f, "usage: loom pp-schedule --pp N --micro-batches M [--schedule "
               "gpipe|1f1b|interleaved|zb] [--virtual-stages V]\n"
               "prints each stage's timeline and action list (F forward, B backward-input, W "
               "backward-weight, sa/ra send/receive activation, sg/rg gradient);\n"
               "--vision-encoder R: a vlm's encoder forward costing R x a stage's forward, "
               "placed as --vision-schedule bubbles does (docs/vlm.md)\n"
               "docs/parallelism.md, \"Pipeline parallelism\"\n");
}

int loom_cmd_pp_schedule(int argc, char **argv) {
    static const struct option opts[] = {{"pp", required_argument, 0, 'p'},
                                         {"micro-batches", required_argument, 0, 'm'},
                                         {"schedule", required_argument, 0, 's'},
                                         {"virtual-stages", required_argument, 0, 'v'},
                                         {"vision-encoder", required_argument, 0, 'e'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int pp = 0, m = 0, v = 1, c;
    double enc = -1;
    const char *name = "1f1b";
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'p')
            pp = atoi(optarg);
        else if (c == 'm')
            m = atoi(optarg);
        else if (c == 's')
            name = optarg;
        else if (c == 'v')
            v = atoi(optarg);
        else if (c == 'e')
            enc = atof(optarg);
        else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            char hint[96];
            loom_suggest_option(hint, sizeof hint, argv[optind - 1], opts);
            fprintf(stderr, "loom pp-schedule: unknown option '%s'%s\n", argv[optind - 1], hint);
            return 2;
        }
    }
    loom_error err = {0};
    loom_pp_kind kind;
    loom_pp_schedule s;
    loom_status st = loom_pp_kind_parse(name, &kind, &err);
    if (!st && pp < 2) st = loom_error_set(&err, LOOM_ERR_INPUT, "--pp %d: expected >= 2", pp);
    if (!st && enc != -1 && (!(enc > 0) || v != 1))
        st = loom_error_set(&err, LOOM_ERR_INPUT,
                            "--vision-encoder '%g': expected a positive cost ratio (with "
                            "--virtual-stages 1)",
                            enc);
    if (!st) st = loom_pp_schedule_build(&s, kind, pp, m, v, &err);
    if (st) {
        fprintf(stderr, "loom pp-schedule: %s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    st = loom_pp_schedule_print(&s, stdout, &err);
    if (!st && enc > 0) {
        double fwd[LOOM_PP_MAX_STAGES];
        for (int r = 0; r < pp; r++) fwd[r] = 1.0;
        loom_pp_vision vp;
        if (!(st = loom_pp_vision_build(&vp, &s, fwd, enc, &err))) {
            loom_pp_vision_print(&s, &vp, stdout);
            loom_pp_vision_free(&vp);
        }
    }
    loom_pp_schedule_free(&s);
    if (st) fprintf(stderr, "loom pp-schedule: %s\n", err.msg);
    return st ? 1 : 0;
}
