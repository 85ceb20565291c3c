/* blas_first_call: how OpenBLAS's first call in a process sets the speed of the later ones.
 *
 * OpenBLAS maps the buffer it packs operands into on its first GEMM; with transparent huge
 * pages madvise-only (Debian's default) it is 4 KiB pages, laid out in physical memory in
 * the order that first call touched them. A small first call leaves a layout on which
 * later GEMMs of some shapes run several times slower, for the life of the process;
 * loom_cpu_set_threads (src/core/cpu_boot.c) runs one 512^3 product first.
 *
 * Each case runs in a fresh process (this program again): a 16^3 first call, a 512^3
 * first call, or loom_cpu_set_threads first; then the 512 x 128 x 256 GEMM of a GPT-2 tp 2
 * MLP (out = inp[512, 256] W[128, 256]^T) is timed, mean ms over 0.5 s. Prints one JSON
 * line. Usage: blas_first_call [THREADS] (default 1).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cpu_boot.h"

enum { M = 512, N = 128, K = 256 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void square(int n, float *m) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, m, n, m + n * n, n, 0.0f,
                m + 2 * n * n, n);
}

/* One case in this process: prints the mean ms of the timed GEMM. */
static int run_case(const char *first, int threads) {
    float *m = malloc(sizeof(float) * 3 * 512 * 512);
    if (!m) return 1;
    for (size_t i = 0; i < (size_t)3 * 512 * 512; i++) m[i] = (float)((i * 7) % 13) * 0.01f;
    if (strcmp(first, "loom") == 0) {
        loom_cpu_set_threads(threads);
    } else {
        openblas_set_num_threads(threads);
        square(strcmp(first, "small") == 0 ? 16 : 512, m);
    }
    const float *a = m, *w = m + M * K;
    float *c = m + M * K + N * K;
    int calls = 0;
    const double t0 = now_s();
    while (now_s() - t0 < 0.5 || calls < 3) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, 0.0f, c, N);
        calls++;
    }
    printf("%.4f\n", (now_s() - t0) / calls * 1e3);
    free(m);
    return 0;
}

/* Runs `self case threads` and reads the number it prints. */
static double child(const char *self, const char *which, const char *threads) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        execl(self, self, "--case", which, threads, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[64] = {0};
    ssize_t got = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? atof(buf) : -1;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--case") == 0) return run_case(argv[2], atoi(argv[3]));
    const char *threads = argc > 1 ? argv[1] : "1";
    if (atoi(threads) < 1 || atoi(threads) > 64) {
        fprintf(stderr, "blas_first_call: THREADS must be an integer in [1, 64], got '%s'\n",
                threads);
        return 2;
    }
    const char *cases[] = {"small", "large", "loom"};
    double ms[3];
    for (int i = 0; i < 3; i++)
        if ((ms[i] = child("/proc/self/exe", cases[i], threads)) < 0) {
            fprintf(stderr, "blas_first_call: the %s case failed\n", cases[i]);
            return 1;
        }
    printf("{\"bench\": \"blas_first_call\", \"gemm\": \"%d x %d x %d nt\", \"threads\": %s, "
           "\"openblas_coretype\": \"%s\", \"small_first_ms\": %.4f, \"large_first_ms\": %.4f, "
           "\"loom_set_threads_first_ms\": %.4f, \"small_over_large\": %.2f}\n",
           M, N, K, threads, getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset",
           ms[0], ms[1], ms[2], ms[0] / ms[1]);
    return 0;
}
