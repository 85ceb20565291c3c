/* core/malloc_policy: with glibc's defaults a large block freed and allocated again
 * faults its pages in again; with loom_malloc_keep_pages it does not. Measured as the
 * minor page faults of touching the block (getrusage), with random block sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>
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
#endif

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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_keep_pages)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
