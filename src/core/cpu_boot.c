#include "core/cpu_boot.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

const char *loom_cpu_blas_coretype(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

void loom_cpu_boot(char **argv) {
    if (getenv("LOOM_BOOTED")) return;
    int again = 0;
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : loom_cpu_blas_coretype();
    if (core) setenv("OPENBLAS_CORETYPE", core, 1), again = 1;
    if (!getenv("GLIBC_TUNABLES")) setenv("GLIBC_TUNABLES", LOOM_GLIBC_TUNABLES, 1), again = 1;
    if (!again) return;
    setenv("LOOM_BOOTED", "1", 1); /* never loop, even if exec'ing ourselves misbehaves */
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the kernel OpenBLAS chose and glibc's defaults. */
}

int loom_cpu_default_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long ranks = local ? atol(local) : 1;
    if (cores < 1) cores = 1;
    if (ranks < 1) ranks = 1;
    long t = cores / ranks;
    return t < 1 ? 1 : (int)t;
}

void loom_cpu_set_threads(int threads) {
    openblas_set_num_threads(threads);
    omp_set_num_threads(threads);
}

const char *loom_cpu_blas_corename(void) {
    return openblas_get_corename();
}
