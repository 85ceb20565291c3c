#include "cli/cmd_calibrate.h"

#include <jansson.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "core/clock.h"
#include "core/cpu_boot.h"
#include "core/flags.h"
#include "plan/calibrate.h"
#include "plan/profile.h"

typedef struct {
    const char *out, *validate, *comm_out;
    int quick, threads, comm_worker;
    int groups[8], n_groups;
} cal_opts;

static int comm_worker(const cal_opts *o, int argc, char **argv) {
    loom_world w;
    loom_error err = {0};
    if (loom_world_init(&w, &argc, &argv, &err) || !w.mpi) {
        fprintf(stderr, "loom calibrate --comm-worker: %s\n",
                err.msg[0] ? err.msg : "not started by mpirun");
        return 1;
    }
    loom_cpu_set_threads(1);
    loom_comm c;
    loom_status st = loom_comm_from_mpi(&c, MPI_COMM_WORLD, "world", &err);
    json_t *root = NULL;
    if (!st) st = loom_calibrate_comm(&c, o->quick, &root, &err);
    json_t *corun = NULL;
    if (!st) st = loom_calibrate_corun(&c, o->quick, &corun, &err);
    if (root && corun) json_object_set_new(root, "corun", corun);
    int rc = 0;
    if (st) {
        fprintf(stderr, "loom calibrate --comm-worker (rank %d): %s\n", w.rank, err.msg);
        rc = 1;
    } else if (w.rank == 0) {
        if (json_dump_file(root, o->comm_out, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0) {
            fprintf(stderr, "loom calibrate --comm-worker: cannot write %s\n", o->comm_out);
            rc = 1;
        }
    }
    json_decref(root);
    if (!st) loom_comm_free(&c);
    loom_world_finalize(&w);
    return rc;
}

/* Runs `mpirun -n G <this loom> calibrate --comm-worker --comm-out path`. */
static int launch_worker(int G, int quick, const char *path) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "loom calibrate: cannot find this executable (/proc/self/exe)\n");
        return 1;
    }
    exe[n] = 0;
    char gs[16];
    snprintf(gs, sizeof gs, "%d", G);
    const char *argv[24];
    int a = 0;
    argv[a++] = "mpirun";
    if (geteuid() == 0) argv[a++] = "--allow-run-as-root";
    const char *tail[] = {"--oversubscribe",
                          "--bind-to",
                          "none",
                          "--mca",
                          "mpi_yield_when_idle",
                          "1",
                          "-n",
                          gs,
                          exe,
                          "calibrate",
                          "--comm-worker",
                          "--comm-out",
                          path};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[a++] = tail[i];
    if (quick) argv[a++] = "--quick";
    argv[a] = NULL;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "loom calibrate: fork failed\n");
        return 1;
    }
    if (pid == 0) {
        setenv("OMP_NUM_THREADS", "1", 1);
        execvp("mpirun", (char *const *)argv);
        fprintf(stderr, "loom calibrate: cannot run mpirun (is OpenMPI installed?)\n");
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "loom calibrate: mpirun -n %d %s calibrate --comm-worker failed (%s %d)\n",
                G, exe, WIFEXITED(status) ? "exit" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return 1;
    }
    return 0;
}

static int validate(const char *path) {
    loom_profile *p = NULL;
    loom_error err = {0};
    loom_status st = loom_profile_load(&p, path, &err);
    if (st) {
        fprintf(stderr, "loom calibrate: %s\n", err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    printf("%s: profile \"%s\" (%s), %.1f GiB per device (1 rank per node), %d per node\n", path,
           loom_profile_name(p), loom_profile_source(p),
           loom_profile_memory_bytes(p, 1) / 1073741824.0, loom_profile_devices_per_node(p));
    int threads[2] = {1, 1 << 20};
    for (int i = 0; i < 2; i++) {
        double ms;
        const char *who = i ? "most threads" : "1 thread";
        for (int op = 0; op < LOOM_GEMM_OPS; op++) {
            st = loom_profile_gemm_ms(p, (loom_gemm_op)op, 1024, 1024, 1024, threads[i], &ms, &err);
            if (!st)
                printf("  gemm %s 1024^3, %s: %.4g ms (%.1f GFLOP/s)\n",
                       loom_gemm_op_name((loom_gemm_op)op), who, ms, 2.0 * (1 << 30) / (ms * 1e6));
        }
        for (int op = 0; !st && loom_profile_has_gemm_bf16(p, threads[i]) && op < LOOM_GEMM_OPS;
             op++) {
            st = loom_profile_gemm_bf16_ms(p, (loom_gemm_op)op, 1024, 1024, 1024, threads[i], &ms,
                                           &err);
            if (!st)
                printf("  gemm_bf16 %s 1024^3, %s: %.4g ms (%.1f GFLOP/s)\n",
                       loom_gemm_op_name((loom_gemm_op)op), who, ms, 2.0 * (1 << 30) / (ms * 1e6));
        }
        if (!st)
            st = loom_profile_attention_ms(p, LOOM_ATT_CAUSAL_FWD, 8, 1024, 64, threads[i], &ms,
                                           &err);
        if (!st) printf("  attention causal_fwd 8 heads x T 1024 x hd 64, %s: %.4g ms\n", who, ms);
        if (!st)
            st = loom_profile_elementwise_ms(p, LOOM_EW_LAYERNORM_FWD, 64 << 20, threads[i], &ms,
                                             &err);
        if (!st)
            printf("  layernorm_fwd 64 MiB, %s: %.4g ms (%.1f GB/s)\n", who, ms,
                   64.0 * 1048576 / (ms * 1e6));
        if (!st) st = loom_profile_adamw_ms(p, 124e6, threads[i], &ms, &err);
        if (!st) printf("  adamw 124M parameters, %s: %.4g ms\n", who, ms);
    }
    for (int k = 2; k <= loom_profile_devices_per_node(p) && k <= 8 && !st; k *= 2) {
        double g, m;
        loom_profile_corun(p, k, &g, &m);
        printf("  %d one-thread processes at once: GEMMs x%.3g, memory-bound kernels x%.3g\n", k, g,
               m);
    }
    for (int k = 0; k < LOOM_COLL_KINDS && !st; k++)
        for (int G = 2; G <= 8 && !st; G *= 2) {
            double small, big;
            st = loom_profile_collective_ms(p, (loom_collective_kind)k, G, LOOM_PLACE_ANY, 4096,
                                            &small, &err);
            if (!st)
                st = loom_profile_collective_ms(p, (loom_collective_kind)k, G, LOOM_PLACE_ANY,
                                                64 << 20, &big, &err);
            if (!st)
                printf("  %s group %d: 4 KiB %.4g ms, 64 MiB %.4g ms\n",
                       loom_collective_kind_name((loom_collective_kind)k), G, small, big);
        }
    for (int k = 0; k < LOOM_COLL_KINDS && !st; k++) { /* network entries, where there are */
        double small, big;
        loom_error none = {0};
        if (loom_profile_collective_ms(p, (loom_collective_kind)k, 2, LOOM_PLACE_INTER, 4096,
                                       &small, &none) ||
            loom_profile_collective_ms(p, (loom_collective_kind)k, 2, LOOM_PLACE_INTER, 64 << 20,
                                       &big, &none))
            continue;
        printf("  %s group 2 inter_node: 4 KiB %.4g ms, 64 MiB %.4g ms\n",
               loom_collective_kind_name((loom_collective_kind)k), small, big);
    }
    if (!st)
        printf("  engine: %.2f us CPU per operation (+%.2f per MiB), %.2f us to post\n",
               loom_profile_engine_cpu_us(p, 0),
               loom_profile_engine_cpu_us(p, 1048576) - loom_profile_engine_cpu_us(p, 0),
               loom_profile_engine_post_us(p));
    loom_profile_free(p);
    if (st) {
        fprintf(stderr, "loom calibrate: %s: %s\n", path, err.msg);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    return 0;
}

static int parse_groups(const char *s, cal_opts *o) {
    o->n_groups = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 2 || v > 64 || o->n_groups == 8 || (*end && *end != ',')) return 0;
        o->groups[o->n_groups++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return 0;
    }
    return o->n_groups > 0;
}

int loom_cmd_calibrate(int argc, char **argv) {
    cal_opts o = {.out = "profile.json"};
    const char *groups = NULL;
    const loom_flag flags[] = {
        LOOM_FLAG_STR_SHORT(0, "output", 'o', &o.out, "FILE", "where (default profile.json)"),
        LOOM_FLAG_SW(0, "quick", &o.quick,
                     "a small grid (under a minute); the default takes minutes"),
        LOOM_FLAG_NUM(0, "threads", LOOM_FLAG_INT, &o.threads, "N",
                      "the all-cores thread count measured beside 1 (default: the online cores)", 1,
                      4096, NULL),
        LOOM_FLAG_STR(0, "groups", &groups, "LIST",
                      "MPI group sizes (default 2,4,8; --quick: 2); each runs as\n"
                      "mpirun -n G loom calibrate --comm-worker"),
        LOOM_FLAG_STR(1, "validate", &o.validate, "FILE",
                      "load a profile with the planner's reader, print some lookups"),
        {.name = "comm-worker", .kind = LOOM_FLAG_SWITCH, .dst = &o.comm_worker, .hidden = 1},
        {.name = "comm-out", .kind = LOOM_FLAG_STRING, .dst = &o.comm_out, .hidden = 1},
    };
    static const loom_flag_group group_list[] = {{"Measure this machine", "docs/PROFILE.md"},
                                                 {"Check a profile", "docs/PROFILE.md"}};
    const loom_flag_spec spec = {
        .usage =
            "usage: loom calibrate [-o profile.json] [--quick] [--threads N] [--groups 2,4,8]\n"
            "       loom calibrate --validate PROFILE",
        .about =
            "measures this machine through loom's kernels, AdamW and MPI collectives and writes\n"
            "a machine profile",
        LOOM_FLAGS_TABLE(flags, group_list)};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom calibrate", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    if (groups && !parse_groups(groups, &o)) {
        fprintf(stderr,
                "loom calibrate: --groups '%s': expected comma-separated integers in "
                "[2, 64]\n",
                groups);
        return 2;
    }
    if (o.validate) return validate(o.validate);
    if (o.comm_worker) {
        if (!o.comm_out) {
            fprintf(stderr, "loom calibrate: --comm-worker needs --comm-out FILE\n");
            return 2;
        }
        return comm_worker(&o, argc, argv);
    }
    if (loom_world_launched()) {
        fprintf(stderr, "loom calibrate: run it without mpirun: it launches its own MPI part "
                        "(mpirun -n G loom calibrate --comm-worker) for each group size\n");
        return 2;
    }
    if (!groups) {
        o.groups[0] = 2, o.groups[1] = 4, o.groups[2] = 8;
        o.n_groups = o.quick ? 1 : 3;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!o.threads) o.threads = cores < 1 ? 1 : (int)cores;
    FILE *probe = fopen(o.out, "w"); /* fail before minutes of measuring */
    if (!probe) {
        fprintf(stderr, "loom calibrate: cannot write %s\n", o.out);
        return 2;
    }
    fclose(probe);
    double t_start = loom_now_ms();
    json_t *machine = loom_calibrate_machine(o.quick); /* the load average before we add ours */

    json_t *compute = loom_calibrate_compute(o.quick, o.threads);
    if (!compute) {
        json_decref(machine);
        fprintf(stderr, "loom calibrate: out of memory for the measurement buffers\n");
        return 1;
    }

    json_t *colls = json_array(), *engine = NULL, *corun = json_array();
    char dir[] = "/tmp/loom_calibrate_XXXXXX";
    int rc = mkdtemp(dir) ? 0 : 1;
    if (rc) fprintf(stderr, "loom calibrate: cannot create a folder in /tmp\n");
    for (int i = 0; i < o.n_groups && !rc; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/group%d.json", dir, o.groups[i]);
        fprintf(stderr, "calibrate: collectives over %d ranks (mpirun)\n", o.groups[i]);
        rc = launch_worker(o.groups[i], o.quick, path);
        json_error_t jerr;
        json_t *part = rc ? NULL : json_load_file(path, 0, &jerr);
        if (!rc && !part) {
            fprintf(stderr, "loom calibrate: %s: %s\n", path, jerr.text);
            rc = 1;
        }
        if (part) {
            json_array_extend(colls, json_object_get(part, "collectives"));
            if (!engine) engine = json_incref(json_object_get(part, "engine"));
            json_t *cr = json_object_get(part, "corun"); /* kept by processes, increasing */
            const json_int_t k = json_integer_value(json_object_get(cr, "processes"));
            size_t at = 0;
            while (cr && at < json_array_size(corun) &&
                   json_integer_value(json_object_get(json_array_get(corun, at), "processes")) < k)
                at++;
            if (cr) json_array_insert(corun, at, cr);
            json_decref(part);
        }
        remove(path);
    }
    rmdir(dir);
    if (rc) {
        json_decref(compute), json_decref(colls), json_decref(engine), json_decref(machine);
        json_decref(corun);
        return 1;
    }
    if (json_array_size(corun) > 0) json_object_set(machine, "corun", corun);
    json_decref(corun);
    char name[64];
    snprintf(name, sizeof name, "measured on this machine%s", o.quick ? " (--quick)" : "");
    json_t *root = json_pack("{s:s, s:i, s:s, s:s, s:o, s:o, s:o, s:o}", "format", "loom-profile",
                             "version", 1, "name", name, "source", "measured", "machine", machine,
                             "compute", compute, "collectives", colls, "engine", engine);
    json_object_set_new(root, "seconds", json_real((loom_now_ms() - t_start) / 1e3));
    if (json_dump_file(root, o.out, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0) {
        fprintf(stderr, "loom calibrate: cannot write %s\n", o.out);
        json_decref(root);
        return 1;
    }
    json_decref(root);
    loom_profile *p = NULL;
    loom_error err = {0};
    if (loom_profile_load(&p, o.out, &err)) { /* the reader must accept what we write */
        fprintf(stderr, "loom calibrate: the written profile is refused: %s\n", err.msg);
        return 1;
    }
    loom_profile_free(p);
    fprintf(stderr, "calibrate: wrote %s in %.1f s\n", o.out, (loom_now_ms() - t_start) / 1e3);
    return 0;
}
