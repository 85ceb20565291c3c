#include "ft/run_config.h"

#include "core/flags.h"
#include "ft/hosts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void defaults(loom_run_config *c) {
    memset(c, 0, sizeof *c);
    c->ranks = 1;
    c->max_restarts = 3;
    c->heartbeat_timeout_s = 10;
    c->step_timeout_s = 600;
    c->startup_timeout_s = 120;
    c->host_wait_s = 60;
    c->grace_s = 5;
    c->min_ranks = 1;
    c->exclude_after = 2;
    c->straggler_factor = 1.5;
    snprintf(c->run_dir, sizeof c->run_dir, "runs/loom_run");
    snprintf(c->launcher, sizeof c->launcher, "%s", getenv("SLURM_JOB_ID") ? "srun" : "mpirun");
}

/* The flags' help lines are loom_run_config_usage's, grouped by purpose. */
enum { RUN_N_FLAGS = 19 };

static const loom_flag_group GROUPS[] = {{"Launch and hosts", "docs/cluster.md"},
                                         {"Detection and timeouts", "docs/fault-tolerance.md"},
                                         {"Recovery", "docs/fault-tolerance.md"},
                                         {"Output", "docs/fault-tolerance.md"}};

typedef struct {
    const char *hosts, *hostfile, *bind, *run_dir, *launcher, *launcher_args;
} run_strings;

/* Counts and seconds: "--NAME 'VALUE': expected an integer >= L" (a number >= E). */
#define RUN_INT(g, nm, d, a, h, l) LOOM_FLAG_NUMBER(g, nm, d, a, h, l, 1 << 20, "an integer >= " #l)
#define RUN_NUM(g, nm, d, a, h, l, e) LOOM_FLAG_NUMBER(g, nm, d, a, h, l, 1e9, "a number >= " e)

static loom_flag_spec run_spec(loom_flag (*flags)[RUN_N_FLAGS], loom_run_config *c,
                               run_strings *s) {
    const loom_flag f[RUN_N_FLAGS] = {
        {.short_name = 'n',
         .kind = LOOM_FLAG_INT,
         .dst = &c->ranks,
         .arg = "N",
         .help = "ranks",
         .lo = 1,
         .hi = 1 << 20,
         .expect = "expected an integer >= 1",
         .quote_value = 1},
        LOOM_FLAG_STR(0, "hosts", &s->hosts, "H",
                      "mpirun --host list (heartbeats then bind 0.0.0.0)"),
        LOOM_FLAG_STR(0, "hostfile", &s->hostfile, "FILE",
                      "OpenMPI hostfile ('HOST slots=N' lines, # comments):\n"
                      "the same as --hosts HOST:N,... (not with --hosts)"),
        LOOM_FLAG_STR(0, "bind", &s->bind, "ADDR",
                      "heartbeat socket address, told to the ranks (default\n"
                      "127.0.0.1; with --hosts or srun 0.0.0.0, and the ranks\n"
                      "are told this host's address on the route to the hosts)"),
        LOOM_FLAG_STR(0, "launcher", &s->launcher, "mpirun|srun",
                      "default: srun inside a Slurm allocation"),
        LOOM_FLAG_STR(0, "launcher-args", &s->launcher_args, "\"A B\"",
                      "more launcher words, before the program (split at\n"
                      "blanks), e.g. \"--mca plm_rsh_agent AGENT\""),
        RUN_NUM(1, "heartbeat-timeout", &c->heartbeat_timeout_s, "S",
                "silent rank / collective waited on for S s (default 10)", 0.5, "0.5"),
        RUN_NUM(1, "step-timeout", &c->step_timeout_s, "S",
                "no step for S s is a hang (default 600, 0 = off)", 0, "0"),
        RUN_NUM(1, "startup-timeout", &c->startup_timeout_s, "S",
                "every rank beats within S s of a launch (default 120)", 1, "1"),
        RUN_NUM(1, "loss-spike-factor", &c->loss_spike_factor, "F",
                "loss > F x median of the last 10 steps: roll back", 0, "0"),
        RUN_NUM(1, "straggler-factor", &c->straggler_factor, "F",
                "report ranks computing F x slower (default 1.5)", 1, "1"),
        RUN_NUM(1, "host-wait", &c->host_wait_s, "S",
                "a lost or cut-off host: wait up to S s for it to answer\n"
                "again, then restart (--elastic: without it; default 60)",
                0, "0"),
        RUN_INT(2, "max-restarts", &c->max_restarts, "R", "restarts before giving up (default 3)",
                0),
        RUN_NUM(2, "grace", &c->grace_s, "S", "SIGTERM, then SIGKILL after S s (default 5)", 0,
                "0"),
        LOOM_FLAG_SW(2, "skip-bad-batches", &c->skip_bad_batches,
                     "after a loss spike, skip that step's batch (--skip-steps)"),
        LOOM_FLAG_SW(2, "elastic", &c->elastic,
                     "exclude a rank after repeated failures, shrink --dp\n"
                     "(with --outer diloco --workers W: one job per worker,\n"
                     "a lost worker restarted with --elastic-join, a lost\n"
                     "worker 0 from its newest checkpoint)"),
        RUN_INT(2, "min-ranks", &c->min_ranks, "K", "never shrink below K ranks (default 1)", 1),
        RUN_INT(2, "exclude-after", &c->exclude_after, "N",
                "failures of one rank before exclusion (default 2)", 1),
        LOOM_FLAG_STR(3, "run-dir", &s->run_dir, "DIR",
                      "logs, diagnosis.json, summary.json (default runs/loom_run)"),
    };
    memcpy(*flags, f, sizeof f);
    return (loom_flag_spec){
        .usage = "usage: loom run -n N [options] -- <loom train options>\n"
                 "       loom run -n N [options] -- rl <loom rl options>",
        .about = "\nRuns `loom train` (or `loom rl`) on N ranks (mpirun, or srun under Slurm), "
                 "watches\nheartbeats, writes a diagnosis on every failure and restarts from the "
                 "newest\ncheckpoint.",
        LOOM_FLAGS_TABLE(*flags, GROUPS),
        .see = "see --help; train options go after '--'",
        .exact = 1};
}

static loom_status copy_str(const char *flag, const char *v, char *out, size_t size,
                            loom_error *err) {
    if (!v) return LOOM_OK;
    if (strlen(v) >= size)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: %s: value too long (max %zu)", flag,
                              size - 1);
    snprintf(out, size, "%s", v);
    return LOOM_OK;
}

loom_status loom_run_config_parse(loom_run_config *c, int argc, char **argv, int *child_index,
                                  int *help, loom_error *err) {
    defaults(c);
    *help = 0;
    *child_index = -1;
    int i = 1;
    while (i < argc && strcmp(argv[i], "--") != 0) i++;
    loom_flag flags[RUN_N_FLAGS];
    run_strings s = {0};
    const loom_flag_spec spec = run_spec(&flags, c, &s);
    loom_error perr = {0};
    if (loom_flags_parse(&spec, i, argv, help, NULL, &perr))
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: %s", perr.msg);
    if (*help) return LOOM_OK;
    loom_status st;
    if ((st = copy_str("--hosts", s.hosts, c->hosts, sizeof c->hosts, err)) ||
        (st = copy_str("--hostfile", s.hostfile, c->hostfile, sizeof c->hostfile, err)) ||
        (st = copy_str("--bind", s.bind, c->bind, sizeof c->bind, err)) ||
        (st = copy_str("--run-dir", s.run_dir, c->run_dir, sizeof c->run_dir, err)) ||
        (st = copy_str("--launcher-args", s.launcher_args, c->launcher_args,
                       sizeof c->launcher_args, err)) ||
        (st = copy_str("--launcher", s.launcher, c->launcher, sizeof c->launcher, err)))
        return st;
    if (s.launcher && strcmp(s.launcher, "mpirun") && strcmp(s.launcher, "srun"))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --launcher '%s': expected mpirun or srun", s.launcher);
    if (c->loss_spike_factor > 0 && c->loss_spike_factor <= 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --loss-spike-factor %g: expected > 1 (or 0 = off)",
                              c->loss_spike_factor);
    int first = i + 1;
    if (first < argc && strcmp(argv[first], "train") == 0) first++;
    if (i >= argc || first >= argc)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: missing the train command (expected: loom run -n N "
                              "[options] -- <loom train options>)");
    if (c->min_ranks > c->ranks)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: --min-ranks %d: more than -n %d",
                              c->min_ranks, c->ranks);
    int hosts_given = c->hosts[0] != 0;
    if (hosts_given && c->hostfile[0])
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --hosts and --hostfile together: expected one of them "
                              "(--hostfile '%s' is the same as --hosts with its hosts)",
                              c->hostfile);
    loom_status hst;
    if (c->hostfile[0] && (hst = loom_hostfile_read(c->hostfile, c->hosts, sizeof c->hosts, err)))
        return hst;
    /* Ranks on other hosts (--hosts, or srun's nodes) reach the supervisor from outside. */
    if (!c->bind[0])
        snprintf(c->bind, sizeof c->bind, "%s",
                 c->hosts[0] || !strcmp(c->launcher, "srun") ? "0.0.0.0" : "127.0.0.1");
    *child_index = first;
    return LOOM_OK;
}

void loom_run_config_usage(FILE *f) {
    loom_run_config c;
    run_strings s = {0};
    loom_flag flags[RUN_N_FLAGS];
    const loom_flag_spec spec = run_spec(&flags, &c, &s);
    loom_flags_usage(&spec, f);
}
