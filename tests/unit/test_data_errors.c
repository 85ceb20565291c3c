/* Bad shard files are rejected with LOOM_ERR_INPUT and a message naming the file,
 * what was found and what was expected; nothing leaks on any error path (ASan). The
 * bad file is sometimes preceded by good shards so their cleanup is exercised too.
 * Random inputs per run; the seed is printed and LOOM_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_common.h"

#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/dataset.h"

/* Writes a raw file: a header with the given fields (if header_bytes > 0, truncated
 * to header_bytes) followed by body_bytes bytes of token data (u16 value 1s). */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                      size_t header_bytes, size_t body_bytes) {
    int32_t h[256] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, 1, header_bytes, f), header_bytes);
    for (size_t i = 0; i < body_bytes; i++) fputc(i % 2 ? 0 : 1, f);
    assert_int_equal(fclose(f), 0);
}

/* Maybe writes good shards named a_*.bin before the bad one (z.bin sorts last). */
static void maybe_good_shards(const char *dir) {
    int n = (int)(rnd() % 3);
    int32_t t[100] = {0};
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/a_%d.bin", dir, i);
        loom_error err = {0};
        assert_int_equal(loom_shard_write(path, t, 100, i % 2 ? 4 : 2, &err), LOOM_OK);
    }
}

/* Opens every .bin in dir, expects LOOM_ERR_INPUT naming `named` and containing `expect`. */
static void expect_error(const char *dir, int vocab, int seq_len, const char *named,
                         const char *expect) {
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/*.bin", dir);
    loom_dataset ds;
    loom_error err = {0};
    loom_status st = loom_dataset_open(&ds, pattern, vocab, seq_len, &err);
    if (st != LOOM_ERR_INPUT || !strstr(err.msg, named) || !strstr(err.msg, expect))
        fail_msg("status %d, message '%s'; expected '%s' and '%s'", st, err.msg, named, expect);
    assert_int_equal(ds.n_shards, 0); /* cleaned up */
    assert_null(ds.shards);
    loom_dataset_close(&ds);
}

static void bad_file(void **state, int32_t magic, int32_t version, int32_t count,
                     size_t header_bytes, size_t body_bytes, const char *expect) {
    const char *dir = *state;
    maybe_good_shards(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/z.bin", dir);
    write_raw(path, magic, version, count, header_bytes, body_bytes);
    expect_error(dir, 50257, 8, path, expect);
}

static void test_no_match(void **state) {
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/*.nothing", (char *)*state);
    loom_dataset ds;
    loom_error err = {0};
    assert_int_equal(loom_dataset_open(&ds, pattern, 256, 8, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, pattern));
    assert_non_null(strstr(err.msg, "no file matches"));
}

static void test_short_header(void **state) {
    size_t n = rnd() % 1024;
    char expect[64];
    snprintf(expect, sizeof expect, "truncated header: %zu bytes, expected at least 1024", n);
    bad_file(state, LOOM_SHARD_MAGIC_U16, 1, 0, n, 0, expect);
}

static void test_bad_magic(void **state) {
    bad_file(state, 0x1234, 1, 10, 1024, 20,
             "bad magic 0x00001234 (expected 20240520 or 20240801)");
}

static void test_bad_version(void **state) {
    bad_file(state, LOOM_SHARD_MAGIC_U16, 2, 10, 1024, 20, "bad version 2 (expected 1)");
}

static void test_negative_count(void **state) {
    bad_file(state, LOOM_SHARD_MAGIC_U32, 1, -5, 1024, 0, "bad token count -5");
}

static void test_truncated_body(void **state) {
    int32_t n = 20 + (int32_t)(rnd() % 1000);
    char expect[128];
    snprintf(expect, sizeof expect,
             "truncated: header says %d tokens (%d bytes), file has %d bytes", n, 4 * n, 4 * n - 3);
    bad_file(state, LOOM_SHARD_MAGIC_U32, 1, n, 1024, (size_t)(4 * n - 3), expect);
}

static void test_trailing_bytes(void **state) {
    int32_t n = 20 + (int32_t)(rnd() % 1000);
    char expect[128];
    snprintf(expect, sizeof expect, "1 trailing bytes: header says %d tokens (%d bytes)", n, 2 * n);
    bad_file(state, LOOM_SHARD_MAGIC_U16, 1, n, 1024, (size_t)(2 * n + 1), expect);
}

static void test_token_out_of_vocab(void **state) {
    const char *dir = *state;
    maybe_good_shards(dir);
    int64_t n = 50 + (int64_t)(rnd() % 5000), pos = (int64_t)(rnd() % (uint64_t)n);
    int32_t *t = calloc((size_t)n, sizeof *t);
    int32_t value = 50257 + (int32_t)(rnd() % 20000);
    t[pos] = value;
    if (pos + 1 < n) t[pos + 1] = value + 1; /* only the first offender is reported */
    char path[512];
    snprintf(path, sizeof path, "%s/z.bin", dir);
    loom_error err = {0};
    int token_bytes = value < 65536 && (rnd() & 1) ? 2 : 4; /* both scanners */
    assert_int_equal(loom_shard_write(path, t, n, token_bytes, &err), LOOM_OK);
    free(t);
    char expect[128];
    snprintf(expect, sizeof expect, "token %d at position %" PRId64 " is >= vocab size 50257",
             value, pos);
    expect_error(dir, 50257, 8, path, expect);
}

static void test_too_few_tokens(void **state) {
    const char *dir = *state;
    int32_t t[8] = {0};
    for (int i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/s%d.bin", dir, i);
        loom_error err = {0};
        assert_int_equal(loom_shard_write(path, t, 8, 2, &err), LOOM_OK);
    }
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/*.bin", dir);
    expect_error(dir, 256, 8, pattern, "9 tokens");
    /* one more token than seq_len is exactly one window */
    loom_dataset ds;
    loom_error err = {0};
    assert_int_equal(loom_dataset_open(&ds, pattern, 256, 7, &err), LOOM_OK);
    assert_int_equal(ds.total_windows, 2);
    loom_dataset_close(&ds);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    uint64_t seed =
        env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    g_rng = seed;
    printf("test_data_errors: LOOM_TEST_SEED=%" PRIu64 "\n", seed);
#define T(f) cmocka_unit_test_setup_teardown(f, setup_dir, teardown_dir)
    const struct CMUnitTest tests[] = {
        T(test_no_match),       T(test_short_header),       T(test_bad_magic),
        T(test_bad_version),    T(test_negative_count),     T(test_truncated_body),
        T(test_trailing_bytes), T(test_token_out_of_vocab), T(test_too_few_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
