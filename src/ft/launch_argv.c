#include "ft/launch_argv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void loom_launch_rank_log(const char *launcher, const char *attempt_dir, int rank, char *out,
                          size_t size) {
    if (strcmp(launcher, "srun") == 0) /* --output DIR/rank_%t.log: %t is the task (rank) */
        snprintf(out, size, "%s/rank_%d.log", attempt_dir, rank);
    else /* mpirun --output-filename DIR writes DIR/1/rank.N/{stdout,stderr} */
        snprintf(out, size, "%s/ranks/1/rank.%d/stderr", attempt_dir, rank);
}

void loom_launch_cmd_build(loom_launch_cmd *c, const loom_launch_spec *s) {
    int n = 0, k = 0;
#define ARG(...)                                                                                   \
    (k < LOOM_LAUNCH_OWN_ARGS                                                                      \
         ? (snprintf(c->store[k], sizeof c->store[k], __VA_ARGS__), c->argv[n++] = c->store[k++])  \
         : NULL)
    const int hosts = s->hosts && s->hosts[0];
    if (strcmp(s->launcher, "srun") == 0) {
        ARG("srun");
        ARG("-n");
        ARG("%d", s->world);
        ARG("--kill-on-bad-exit=1"); /* one rank's death ends the step: the supervisor sees it */
        ARG("--export=ALL");
        /* OpenMPI 4.1 under Slurm 22.05 wires up through PMIx; --launcher-args --mpi=X
         * chooses another plugin */
        if (!s->launcher_args || !strstr(s->launcher_args, "--mpi")) ARG("--mpi=pmix");
        if (hosts) { /* Slurm's node list: the hosts without mpirun's ":slots" */
            char list[LOOM_LAUNCH_ARG_BYTES - 16];
            size_t m = 0;
            for (const char *p = s->hosts; *p && m + 1 < sizeof list;) {
                size_t w = strcspn(p, ",");
                const char *colon = memchr(p, ':', w);
                size_t keep = colon ? (size_t)(colon - p) : w;
                if (keep && m + keep + 2 < sizeof list)
                    m += (size_t)snprintf(list + m, sizeof list - m, "%s%.*s", m ? "," : "",
                                          (int)keep, p);
                p += w + (p[w] == ',');
            }
            ARG("--nodelist=%s", list);
        }
        ARG("--output=%s/rank_%%t.log", s->attempt_dir);
    } else {
        ARG("mpirun");
        ARG("-n");
        ARG("%d", s->world);
        if (s->as_root) ARG("--allow-run-as-root");
        if (!hosts && s->world > s->cores) {
            ARG("--oversubscribe");
            ARG("--mca");
            ARG("mpi_yield_when_idle");
            ARG("1");
        }
        if (hosts) {
            ARG("--host");
            ARG("%s", s->hosts);
        }
        ARG("--output-filename");
        ARG("%s/ranks", s->attempt_dir);
        const char *vars[] = {"LOOM_FT_ADDR",  "LOOM_FT_TOKEN", "LOOM_FT_ATTEMPT",
                              "LOOM_FT_SLOTS", "LOOM_INJECT",   "LOOM_FT_INTERVAL_MS"};
        for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
            if (getenv(vars[i])) {
                ARG("-x");
                ARG("%s", vars[i]);
            }
    }
    if (s->launcher_args) { /* the user's launcher words, split at blanks (no quoting) */
        snprintf(c->extra, sizeof c->extra, "%s", s->launcher_args);
        for (char *save = NULL, *w = strtok_r(c->extra, " \t\n", &save);
             w && n < LOOM_LAUNCH_MAX_ARGS - 24; w = strtok_r(NULL, " \t\n", &save))
            c->argv[n++] = w;
    }
    ARG("%s", s->loom_exe);
    ARG("%s", s->command && s->command[0] ? s->command : "train");
    for (int i = 0; i < s->train_argc && n < LOOM_LAUNCH_MAX_ARGS - 12; i++)
        c->argv[n++] = s->train_argv[i];
    ARG("--dp");
    ARG("%d", s->dp);
    if (s->skip_list && s->skip_list[0]) {
        ARG("--skip-steps");
        ARG("%s", s->skip_list);
    }
    if (s->resume) {
        ARG("--resume");
        ARG("auto");
    }
#undef ARG
    c->argv[n] = NULL;
    c->argc = n;
}
