/* core/malloc_policy: with glibc's defaults a large block freed and allocated again
 * faults its pages in again; with loom_malloc_keep_pages it does not, also for a block
 * larger than a thread arena's heap (64 MiB) allocated in a thread other than main.
 * Measured as the minor page faults of touching the block (getrusage), with random block
 * sizes. With loom_malloc_reserve_small, a small block allocated while a large one is live
 * does not keep the large one's freed space from a larger block next: the heap grows by
 * the difference only, not by the larger block (sbrk(0) before and after). */
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/malloc_policy.h"
#include "test_common.h"

#if defined(__SANITIZE_ADDRESS__)
#define LOOM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_ASAN 1
#endif
#endif

#ifndef LOOM_ASAN
static long minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

/* Writes one byte of every page (volatile: a store the compiler may not drop). */
static void touch(char *p, size_t n) {
    volatile char *v = p;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n; i += page) v[i] = (char)(i / page + 1);
}

/* Faults of touching every page of a block of n bytes allocated right after a block of
 * the same size was touched and freed. */
static long faults_of_second_block(size_t n) {
    char *a = malloc(n);
    assert_non_null(a);
    touch(a, n);
    free(a);
    char *b = malloc(n);
    assert_non_null(b);
    const long f0 = minor_faults();
    touch(b, n);
    const long f = minor_faults() - f0;
    free(b);
    return f;
}

/* faults_of_second_block in a thread of its own, without cmocka's asserts (-1: no memory) */
typedef struct {
    size_t n;
    long faults;
} block_arg;

static void *thread_second_block(void *p) {
    block_arg *a = p;
    a->faults = -1;
    char *x = malloc(a->n);
    if (!x) return NULL;
    touch(x, a->n);
    free(x);
    char *y = malloc(a->n);
    if (!y) return NULL;
    const long f0 = minor_faults();
    touch(y, a->n);
    a->faults = minor_faults() - f0;
    free(y);
    return NULL;
}

/* In a child process (mallopt's settings and arenas are the process's): the policy (all:
 * loom_malloc_keep_pages; else only its first two settings, as before M_ARENA_MAX 1), then
 * the second block's faults in a new thread. -1 if anything failed. */
static long faults_in_thread_child(size_t n, int all) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        if (all) {
            loom_malloc_keep_pages();
        } else {
            mallopt(M_MMAP_MAX, 0);
            mallopt(M_TRIM_THRESHOLD, INT_MAX);
        }
        block_arg a = {n, -1};
        pthread_t t;
        if (pthread_create(&t, NULL, thread_second_block, &a) == 0) pthread_join(t, NULL);
        ssize_t w = write(fd[1], &a.faults, sizeof a.faults);
        _exit(w == (ssize_t)sizeof a.faults ? 0 : 1);
    }
    close(fd[1]);
    long f = -1;
    if (pid < 0 || read(fd[0], &f, sizeof f) != (ssize_t)sizeof f) f = -1;
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    return f;
}

/* In a child process: the policy (and the reserve if `reserve`), then a large block A, a
 * small block allocated while A is live and kept, A freed, a block larger than A by
 * `more` bytes: the heap's growth (sbrk) over those last steps, -1 if anything failed. */
static long growth_child(size_t a_bytes, size_t more, size_t small, int reserve) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        long g = -1;
        if (loom_malloc_keep_pages() == 1 && (!reserve || loom_malloc_reserve_small() == 1)) {
            char *top0 = sbrk(0);
            char *a = malloc(a_bytes);
            char *s = malloc(small); /* e.g. libnbc's schedule, grown while A is in flight */
            if (a && s) {
                touch(a, a_bytes);
                s[0] = 1;
                free(a);
                char *b = malloc(a_bytes + more);
                if (b) {
                    touch(b, a_bytes + more);
                    g = (long)((char *)sbrk(0) - top0);
                    free(b);
                }
            }
            free(s);
        }
        ssize_t w = write(fd[1], &g, sizeof g);
        _exit(w == (ssize_t)sizeof g ? 0 : 1);
    }
    close(fd[1]);
    long g = -1;
    if (pid < 0 || read(fd[0], &g, sizeof g) != (ssize_t)sizeof g) g = -1;
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    return g;
}
#endif

static void test_reserve_small(void **state) {
    (void)state;
#ifdef LOOM_ASAN
    skip();
#else
    const size_t a = ((size_t)16 << 20) + (rnd() % 16) * ((size_t)1 << 20) + (rnd() % 4096);
    const size_t more = ((size_t)2 << 20) + rnd() % ((size_t)1 << 20);
    const size_t small = 1100 + rnd() % 3000; /* above the tcache's largest (1032 bytes) */
    const long without = growth_child(a, more, small, 0);
    const long with = growth_child(a, more, small, 1);
    printf("A %zu bytes, then a %zu-byte block, A freed, %zu bytes more: the heap grew %ld "
           "bytes without the reserve, %ld with it\n",
           a, small, more, without, with);
    assert_true(without > (long)(a + more)); /* the test means something: A's space lost */
    assert_true(with >= 0 && with < (long)(a + more + a / 4)); /* reused: A + more + slack */
#endif
}

/* Runs first: the children must not inherit the settings test_keep_pages makes. */
static void test_keep_pages_in_threads(void **state) {
    (void)state;
#ifdef LOOM_ASAN
    skip();
#else
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t n = ((size_t)70 << 20) + (rnd() % 64) * ((size_t)1 << 20) + (rnd() % 4096);
    const long pages = (long)(n / page);
    const long before = faults_in_thread_child(n, 0);
    printf("thread block %zu bytes (%ld pages): %ld faults without one arena\n", n, pages, before);
    assert_true(before > pages / 2); /* the thread's arena mmaps it: new pages each time */
    const long after = faults_in_thread_child(n, 1);
    printf("  %ld faults with loom_malloc_keep_pages\n", after);
    assert_true(after >= 0 && after < pages / 50);
#endif
}

static void test_keep_pages(void **state) {
    (void)state;
#ifdef LOOM_ASAN
    skip(); /* ASan's allocator replaces glibc's: nothing of this applies */
#else
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* above glibc's largest dynamic mmap threshold (32 MiB): always mmapped by default */
    const size_t n = ((size_t)40 << 20) + (rnd() % 64) * ((size_t)1 << 20) + (rnd() % 4096);
    const long pages = (long)(n / page);
    const long before = faults_of_second_block(n);
    printf("block %zu bytes (%ld pages): %ld faults with glibc's defaults\n", n, pages, before);
    assert_true(before > pages / 2); /* the test means something on this libc */
    assert_int_equal(loom_malloc_keep_pages(), 1);
    const long after = faults_of_second_block(n);
    printf("  %ld faults with the pages kept\n", after);
    assert_true(after < pages / 50);
    /* a user's setting of glibc's variables stands */
    setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
    assert_int_equal(loom_malloc_keep_pages(), 0);
    unsetenv("MALLOC_TRIM_THRESHOLD_");
#endif
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_malloc_policy: seed %u (LOOM_TEST_SEED to repeat)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_keep_pages_in_threads),
                                       cmocka_unit_test(test_reserve_small),
                                       cmocka_unit_test(test_keep_pages)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
