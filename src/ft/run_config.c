#include "ft/run_config.h"

#include "core/suggest.h"
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

static loom_status to_int(const char *flag, const char *v, int lo, int *out, loom_error *err) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > 1 << 20)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: %s '%s': expected an integer >= %d",
                              flag, v, lo);
    *out = (int)x;
    return LOOM_OK;
}

static loom_status to_num(const char *flag, const char *v, double lo, double *out,
                          loom_error *err) {
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= lo) || x > 1e9)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: %s '%s': expected a number >= %g",
                              flag, v, lo);
    *out = x;
    return LOOM_OK;
}

static loom_status to_str(const char *flag, const char *v, char *out, size_t size,
                          loom_error *err) {
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
    for (; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--") == 0) break;
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            *help = 1;
            return LOOM_OK;
        }
        if (strcmp(f, "--elastic") == 0) {
            c->elastic = 1;
            continue;
        }
        if (strcmp(f, "--skip-bad-batches") == 0) {
            c->skip_bad_batches = 1;
            continue;
        }
        static const char *with_value[] = {"-n",
                                           "--hosts",
                                           "--hostfile",
                                           "--bind",
                                           "--max-restarts",
                                           "--heartbeat-timeout",
                                           "--step-timeout",
                                           "--startup-timeout",
                                           "--host-wait",
                                           "--grace",
                                           "--min-ranks",
                                           "--exclude-after",
                                           "--loss-spike-factor",
                                           "--straggler-factor",
                                           "--run-dir",
                                           "--launcher",
                                           "--launcher-args"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
            known |= strcmp(f, with_value[k]) == 0;
        if (!known) {
            const char *names[sizeof with_value / sizeof *with_value + 3] = {
                "--elastic", "--skip-bad-batches", "--help"};
            for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
                names[3 + k] = with_value[k];
            char hint[96];
            loom_suggest_flag(hint, sizeof hint, f, names, (int)(sizeof names / sizeof *names));
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "loom run: unknown option '%s'%s (see loom run --help; train "
                                  "options go after '--')",
                                  f, hint);
        }
        if (i + 1 >= argc)
            return loom_error_set(err, LOOM_ERR_INPUT, "loom run: option '%s' needs a value", f);
        const char *v = argv[++i];
        loom_status st = LOOM_OK;
        if (!strcmp(f, "-n"))
            st = to_int(f, v, 1, &c->ranks, err);
        else if (!strcmp(f, "--hosts"))
            st = to_str(f, v, c->hosts, sizeof c->hosts, err);
        else if (!strcmp(f, "--hostfile"))
            st = to_str(f, v, c->hostfile, sizeof c->hostfile, err);
        else if (!strcmp(f, "--bind"))
            st = to_str(f, v, c->bind, sizeof c->bind, err);
        else if (!strcmp(f, "--max-restarts"))
            st = to_int(f, v, 0, &c->max_restarts, err);
        else if (!strcmp(f, "--heartbeat-timeout"))
            st = to_num(f, v, 0.5, &c->heartbeat_timeout_s, err);
        else if (!strcmp(f, "--step-timeout"))
            st = to_num(f, v, 0, &c->step_timeout_s, err);
        else if (!strcmp(f, "--startup-timeout"))
            st = to_num(f, v, 1, &c->startup_timeout_s, err);
        else if (!strcmp(f, "--host-wait"))
            st = to_num(f, v, 0, &c->host_wait_s, err);
        else if (!strcmp(f, "--grace"))
            st = to_num(f, v, 0, &c->grace_s, err);
        else if (!strcmp(f, "--min-ranks"))
            st = to_int(f, v, 1, &c->min_ranks, err);
        else if (!strcmp(f, "--exclude-after"))
            st = to_int(f, v, 1, &c->exclude_after, err);
        else if (!strcmp(f, "--loss-spike-factor")) {
            st = to_num(f, v, 0, &c->loss_spike_factor, err);
            if (!st && c->loss_spike_factor > 0 && c->loss_spike_factor <= 1)
                st = loom_error_set(err, LOOM_ERR_INPUT,
                                    "loom run: --loss-spike-factor %s: expected > 1 (or 0 = off)",
                                    v);
        } else if (!strcmp(f, "--straggler-factor"))
            st = to_num(f, v, 1, &c->straggler_factor, err);
        else if (!strcmp(f, "--run-dir"))
            st = to_str(f, v, c->run_dir, sizeof c->run_dir, err);
        else if (!strcmp(f, "--launcher-args"))
            st = to_str(f, v, c->launcher_args, sizeof c->launcher_args, err);
        else if (!strcmp(f, "--launcher")) {
            st = to_str(f, v, c->launcher, sizeof c->launcher, err);
            if (!st && strcmp(v, "mpirun") && strcmp(v, "srun"))
                st = loom_error_set(err, LOOM_ERR_INPUT,
                                    "loom run: --launcher '%s': expected mpirun or srun", v);
        }
        if (st) return st;
    }
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
    fprintf(
        f,
        "usage: loom run -n N [options] -- <loom train options>\n"
        "       loom run -n N [options] -- rl <loom rl options>\n\n"
        "Runs `loom train` (or `loom rl`) on N ranks (mpirun, or srun under Slurm), watches\n"
        "heartbeats, writes a diagnosis on every failure and restarts from the newest\n"
        "checkpoint.\n"
        "\nLaunch and hosts (docs/cluster.md):\n"
        "  -n N                    ranks\n"
        "  --hosts H               mpirun --host list (heartbeats then bind 0.0.0.0)\n"
        "  --hostfile FILE         OpenMPI hostfile ('HOST slots=N' lines, # comments):\n"
        "                          the same as --hosts HOST:N,... (not with --hosts)\n"
        "  --bind ADDR             heartbeat socket address, told to the ranks (default\n"
        "                          127.0.0.1; with --hosts or srun 0.0.0.0, and the ranks\n"
        "                          are told this host's address on the route to the hosts)\n"
        "  --launcher mpirun|srun  default: srun inside a Slurm allocation\n"
        "  --launcher-args \"A B\"   more launcher words, before the program (split at\n"
        "                          blanks), e.g. \"--mca plm_rsh_agent AGENT\"\n"
        "\nDetection and timeouts (docs/fault-tolerance.md):\n"
        "  --heartbeat-timeout S   silent rank / collective waited on for S s (default 10)\n"
        "  --step-timeout S        no step for S s is a hang (default 600, 0 = off)\n"
        "  --startup-timeout S     every rank beats within S s of a launch (default 120)\n"
        "  --loss-spike-factor F   loss > F x median of the last 10 steps: roll back\n"
        "  --straggler-factor F    report ranks computing F x slower (default 1.5)\n"
        "  --host-wait S           a lost or cut-off host: wait up to S s for it to answer\n"
        "                          again, then restart (--elastic: without it; default 60)\n"
        "\nRecovery (docs/fault-tolerance.md):\n"
        "  --max-restarts R        restarts before giving up (default 3)\n"
        "  --grace S               SIGTERM, then SIGKILL after S s (default 5)\n"
        "  --skip-bad-batches      after a loss spike, skip that step's batch (--skip-steps)\n"
        "  --elastic               exclude a rank after repeated failures, shrink --dp\n"
        "  --min-ranks K           never shrink below K ranks (default 1)\n"
        "  --exclude-after N       failures of one rank before exclusion (default 2)\n"
        "\nOutput (docs/fault-tolerance.md):\n"
        "  --run-dir DIR           logs, diagnosis.json, summary.json (default runs/loom_run)\n");
}
