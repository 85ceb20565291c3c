/* What the libraries read from the environment when they load, set by the entry point,
 * which re-executes itself once when it set anything (a user's setting stands):
 * - OPENBLAS_CORETYPE, OpenBLAS's fast kernel on this CPU: Debian's OpenBLAS 0.3.21
 *   detects recent Xeons as "Prescott" (~60 GFLOP/s sgemm on 2 threads instead of ~315
 *   with SkylakeX);
 * - GLIBC_TUNABLES=glibc.malloc.hugetlb=1: malloc's memory on transparent huge pages.
 *   First writes to new memory cost ~0.3 GB/s in 4 KiB pages on this machine's VM and
 *   ~10 GB/s in 2 MiB pages; with core/malloc_policy's kept pages a 2-rank 16 MiB
 *   MPI_Allreduce took 3.1 ms against 6.1 ms without (docs/ARCHITECTURE.md, "Memory the
 *   allocator keeps"). */
#ifndef LOOM_CORE_CPU_BOOT_H
#define LOOM_CORE_CPU_BOOT_H

#define LOOM_GLIBC_TUNABLES "glibc.malloc.hugetlb=1"

/* The OpenBLAS core type this CPU should use ("SkylakeX", "Haswell") or NULL. */
const char *loom_cpu_blas_coretype(void);
/* Sets OPENBLAS_CORETYPE and GLIBC_TUNABLES (each if unset) and re-executes
 * /proc/self/exe with argv; returns only if no re-exec was needed or it failed (then the
 * run continues, just slower). */
void loom_cpu_boot(char **argv);
/* Threads to use when --threads is 0: online cores / ranks on this node. */
int loom_cpu_default_threads(void);
/* The kernel OpenBLAS is running ("SkylakeX", "Prescott", ...). */
const char *loom_cpu_blas_corename(void);
/* Applies the thread count to OpenBLAS and OpenMP (and, once per count, lays out
 * OpenBLAS's packing buffer with one large GEMM: src/core/cpu_boot.c). */
void loom_cpu_set_threads(int threads);
/* The thread count alone, without the warm-up: for code that only sizes per-thread
 * scratch and runs no GEMM (loom plan's memory model). */
void loom_cpu_set_thread_count(int threads);

#endif
