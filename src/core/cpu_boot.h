/* Picks OpenBLAS's fast kernel on this CPU. Debian's OpenBLAS 0.3.21 detects recent Xeons
 * as "Prescott" (~60 GFLOP/s sgemm on 2 threads instead of ~315 with SkylakeX). OpenBLAS
 * reads OPENBLAS_CORETYPE when the library loads, so the entry point sets it from CPUID
 * and re-executes itself once, unless the user set it. */
#ifndef LOOM_CORE_CPU_BOOT_H
#define LOOM_CORE_CPU_BOOT_H

/* The OpenBLAS core type this CPU should use ("SkylakeX", "Haswell") or NULL. */
const char *loom_cpu_blas_coretype(void);
/* Sets OPENBLAS_CORETYPE (if unset) and re-executes /proc/self/exe with argv; returns
 * only if no re-exec was needed or it failed (then the run continues, just slower). */
void loom_cpu_boot(char **argv);
/* Threads to use when --threads is 0: online cores / ranks on this node. */
int loom_cpu_default_threads(void);
/* The kernel OpenBLAS is running ("SkylakeX", "Prescott", ...). */
const char *loom_cpu_blas_corename(void);
/* Applies the thread count to OpenBLAS and OpenMP. */
void loom_cpu_set_threads(int threads);

#endif
