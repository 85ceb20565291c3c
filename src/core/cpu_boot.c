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

/* OpenBLAS packs a GEMM's operands into a buffer it maps on its first call (one per
 * thread), in 4 KiB pages where transparent huge pages are madvise-only (Debian's
 * default): which physical pages back it follows the order that first call touched it
 * in, and a small first call leaves a layout on which later GEMMs run several times
 * slower, for the life of the process. Measured here (AMD EPYC, OpenBLAS 0.3.21 Haswell,
 * one thread): 512 x 128 x 256 took 3.27 ms after a small first call, 0.84 ms after a
 * 512^3 one, 0.84 ms with the buffer on huge pages; the 32,000-token head's 128 x 32,000
 * x 128 35.5 against 29.0 ms; a GPT-2 tp 2 step (8 x 128, bench_plan's) 1,819-1,875 ms
 * against 964-972 (bench/blas_first_call.c). So one 512^3 product runs first, at each
 * thread count used, and touches the buffer as large calls do. */
static void warm_blas(int threads) {
    static unsigned long long warmed; /* bit t-1: warmed at t threads (t <= 64) */
    const unsigned long long bit = threads >= 1 && threads <= 64 ? 1ull << (threads - 1) : 0;
    if (!bit || (warmed & bit)) return;
    enum { N = 512 };
    float *m = calloc((size_t)3 * N * N, sizeof *m);
    if (!m) return; /* only slower */
    for (size_t i = 0; i < (size_t)2 * N * N; i++) m[i] = (float)(i % 7) * 0.125f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, m, N, m + N * N, N, 0.0f,
                m + 2 * N * N, N);
    free(m);
    warmed |= bit;
}

void loom_cpu_set_thread_count(int threads) {
    openblas_set_num_threads(threads);
    omp_set_num_threads(threads);
}

void loom_cpu_set_threads(int threads) {
    loom_cpu_set_thread_count(threads);
    warm_blas(threads);
}

const char *loom_cpu_blas_corename(void) {
    return openblas_get_corename();
}
