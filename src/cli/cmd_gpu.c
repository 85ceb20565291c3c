/* loom gpu-info: lists the CUDA devices (name, compute capability, SMs, memory) and,
 * with --arena-mb N, carves an N MiB device arena once and prints its report. Exit 0
 * with devices, 1 with "no CUDA device: <reason>" (no driver, no GPU, or a build
 * without -DLOOM_CUDA=ON), 2 on bad flags. */
#include "cli/cmd_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/flags.h"

#ifdef LOOM_CUDA
#include "kernels/cuda/kernels_cuda.h"

static int arena_probe(long mb) {
    loom_error err = {0};
    loom_cuda_arena a;
    if (loom_cuda_arena_create(&a, (size_t)mb << 20, &err) != LOOM_OK) {
        fprintf(stderr, "loom gpu-info: %s\n", err.msg);
        return 1;
    }
    /* Carve it in two halves, as a plan would, so the peak is what was carved. */
    if (!loom_cuda_arena_alloc(&a, a.size / 2, "probe", &err) ||
        !loom_cuda_arena_alloc(&a, a.size / 4, "probe", &err)) {
        fprintf(stderr, "loom gpu-info: %s\n", err.msg);
        loom_cuda_arena_destroy(&a);
        return 1;
    }
    char line[256];
    loom_cuda_arena_report(&a, line, sizeof line);
    printf("%s\n", line);
    loom_cuda_arena_destroy(&a);
    return 0;
}
#endif

static loom_status set_arena_mb(void *dst, const char *name, const char *v, loom_error *err) {
    char *end = NULL;
    long mb = strtol(v, &end, 10);
    if (*end != '\0' || mb <= 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s: expected a positive integer, got '%s'",
                              name, v);
    *(long *)dst = mb;
    return LOOM_OK;
}

static const loom_flag_group GROUPS[] = {{"Devices", "docs/gpu.md"}};

int loom_cmd_gpu_info(int argc, char **argv) {
    long arena_mb = 0;
    const loom_flag flags[] = {LOOM_FLAG_FN(0, "arena-mb", &arena_mb, set_arena_mb, "N",
                                            "also carve an N MiB device arena and print its "
                                            "report")};
    const loom_flag_spec spec = {.usage = "usage: loom gpu-info [--arena-mb N]",
                                 .about =
                                     "Lists the CUDA devices, or says why there are none (exit 1).",
                                 LOOM_FLAGS_TABLE(flags, GROUPS),
                                 .exact = 1};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom gpu-info", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
#ifdef LOOM_CUDA
    loom_cuda_device devs[16];
    int n = 0;
    loom_error err = {0};
    if (loom_cuda_devices(devs, 16, &n, &err) != LOOM_OK) {
        printf("%s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < n && i < 16; i++)
        printf("device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free)\n",
               devs[i].index, devs[i].name, devs[i].cc_major, devs[i].cc_minor, devs[i].sm_count,
               devs[i].total_bytes / 1073741824.0, devs[i].free_bytes / 1073741824.0);
    return arena_mb > 0 ? arena_probe(arena_mb) : 0;
#else
    (void)arena_mb;
    printf("no CUDA device: this loom was built without CUDA (configure with -DLOOM_CUDA=ON)\n");
    return 1;
#endif
}
