#include "cli/cmd_pp_schedule.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/flags.h"
#include "pipeline/schedule.h"
#include "pipeline/vision_plan.h"

static const loom_flag_group GROUPS[] = {{"Pipeline schedule", "docs/parallelism.md"}};

int loom_cmd_pp_schedule(int argc, char **argv) {
    const char *pp_s = "0", *m_s = "0", *v_s = "1", *enc_s = NULL, *name = "1f1b";
    const loom_flag flags[] = {
        LOOM_FLAG_STR(0, "pp", &pp_s, "N", "pipeline stages (>= 2)"),
        LOOM_FLAG_STR(0, "micro-batches", &m_s, "M", "micro-batches per step"),
        LOOM_FLAG_STR(0, "schedule", &name, "NAME", "gpipe, 1f1b (default), interleaved, zb"),
        LOOM_FLAG_STR(0, "virtual-stages", &v_s, "V", "model chunks per rank (interleaved)"),
        LOOM_FLAG_STR(0, "vision-encoder", &enc_s, "R",
                      "a vlm's encoder forward costing R x a stage's forward (of one chunk\n"
                      "with --virtual-stages), placed as --vision-schedule bubbles does\n"
                      "(the encoder on chunk 0 of stage 0; docs/vlm.md)"),
    };
    const loom_flag_spec spec = {
        .usage = "usage: loom pp-schedule --pp N --micro-batches M [--schedule "
                 "gpipe|1f1b|interleaved|zb] [--virtual-stages V] [--vision-encoder R]",
        .about = "prints each stage's timeline and action list (F forward, B backward-input, W "
                 "backward-weight, sa/ra send/receive activation, sg/rg gradient)",
        LOOM_FLAGS_TABLE(flags, GROUPS)};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom pp-schedule", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    loom_error err = {0};
    const int pp = atoi(pp_s), m = atoi(m_s), v = atoi(v_s);
    char *enc_end = NULL;
    const double enc = enc_s ? strtod(enc_s, &enc_end) : -1;
    loom_pp_kind kind;
    loom_pp_schedule s;
    loom_status st = loom_pp_kind_parse(name, &kind, &err);
    if (!st && pp < 2) st = loom_error_set(&err, LOOM_ERR_INPUT, "--pp %d: expected >= 2", pp);
    if (!st && enc_s && (enc_end == enc_s || *enc_end || !(enc > 0) || enc > 1e12))
        st = loom_error_set(&err, LOOM_ERR_INPUT,
                            "--vision-encoder '%s': expected a positive cost ratio (at most 1e12)",
                            enc_s);
    if (!st) st = loom_pp_schedule_build(&s, kind, pp, m, v, &err);
    if (st) {
        fprintf(stderr, "loom pp-schedule: %s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    st = loom_pp_schedule_print(&s, stdout, &err);
    if (!st && enc > 0) {
        /* every chunk's forward 1 (the run's fwd[r]: the mean of stage r's chunks) */
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
