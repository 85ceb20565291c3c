/* Token shards and the sampler: round trips, determinism, layout independence, and
 * that every sampled sequence is exactly the window the contract says. Random inputs
 * are drawn per run; the seed is printed and LOOM_TEST_SEED overrides it. */
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

#include "core/philox.h"
#include "data/dataset.h"

static uint64_t g_seed;

static int64_t rnd_range(int64_t lo, int64_t hi) {
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static void write_shard(const char *dir, const char *name, const int32_t *t, int64_t n, int tb) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    loom_error err = {0};
    loom_status st = loom_shard_write(path, t, n, tb, &err);
    if (st != LOOM_OK) fail_msg("%s", err.msg);
}

static void open_ok(loom_dataset *ds, const char *dir, const char *glob, int vocab, int seq_len) {
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/%s", dir, glob);
    loom_error err = {0};
    loom_status st = loom_dataset_open(ds, pattern, vocab, seq_len, &err);
    if (st != LOOM_OK) fail_msg("%s", err.msg);
}

static void round_trip(const char *dir, int token_bytes, int vocab) {
    int64_t n = rnd_range(2, 5000);
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(rnd() % (uint64_t)vocab);
    t[rnd() % (uint64_t)n] = vocab - 1; /* the largest id must pass */
    write_shard(dir, "x.bin", t, n, token_bytes);

    loom_dataset ds;
    open_ok(&ds, dir, "*.bin", vocab, 1);
    assert_int_equal(ds.n_shards, 1);
    const loom_shard *sh = &ds.shards[0];
    assert_int_equal(sh->token_bytes, token_bytes);
    assert_int_equal(sh->n_tokens, n);
    assert_int_equal(sh->map_bytes, LOOM_SHARD_HEADER_BYTES + n * token_bytes);
    const int32_t *h = sh->map;
    assert_int_equal(h[0], token_bytes == 2 ? LOOM_SHARD_MAGIC_U16 : LOOM_SHARD_MAGIC_U32);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], n);
    for (int i = 3; i < 256; i++) assert_int_equal(h[i], 0);
    const char *body = (const char *)sh->map + LOOM_SHARD_HEADER_BYTES;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v;
        if (token_bytes == 2) {
            uint16_t v16;
            memcpy(&v16, body + 2 * i, 2);
            v = v16;
        } else {
            memcpy(&v, body + 4 * i, 4);
        }
        assert_int_equal(v, (uint32_t)t[i]);
    }
    assert_int_equal(ds.total_tokens, n);
    assert_int_equal(ds.total_windows, n - 1);
    loom_dataset_close(&ds);
    loom_dataset_close(&ds); /* closing twice is harmless */
    free(t);
}

static void test_round_trip_u16(void **state) {
    round_trip(*state, 2, 65536);
}
static void test_round_trip_u32(void **state) {
    round_trip(*state, 4, 200000);
}

static void test_write_rejects_bad_tokens(void **state) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.bin", (char *)*state);
    int32_t t[4] = {1, 2, 65536, 3};
    loom_error err = {0};
    assert_int_equal(loom_shard_write(path, t, 4, 2, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "token 65536 at position 2"));
    t[2] = -1;
    assert_int_equal(loom_shard_write(path, t, 4, 4, &err), LOOM_ERR_INPUT);
    assert_int_equal(loom_shard_write(path, t, 4, 3, &err), LOOM_ERR_INPUT);
    assert_int_equal(access(path, F_OK), -1); /* nothing half-written is left */

    snprintf(path, sizeof path, "%s/no/such/dir/x.bin", (char *)*state);
    t[2] = 7;
    assert_int_equal(loom_shard_write(path, t, 4, 2, &err), LOOM_ERR_IO);
    assert_non_null(strstr(err.msg, path));
}

/* Several shards, sorted by name, some too short for a window; tokens say where they
 * came from: shard s, position p holds s * 2000 + p. */
typedef struct {
    int n_shards;
    int64_t n[8];
} layout;

static layout make_position_shards(const char *dir, int seq_len) {
    layout l = {.n_shards = (int)rnd_range(1, 8)};
    int32_t t[2000];
    for (int s = 0; s < l.n_shards; s++) {
        int kind = (int)rnd_range(0, 3);
        l.n[s] = kind == 0   ? rnd_range(0, seq_len)
                 : kind == 1 ? seq_len + 1
                             : rnd_range(seq_len + 1, 2000);
        for (int64_t p = 0; p < l.n[s]; p++) t[p] = (int32_t)(s * 2000 + p);
        char name[32];
        snprintf(name, sizeof name, "s_%03d.bin", s);
        write_shard(dir, name, t, l.n[s], rnd() & 1 ? 2 : 4);
    }
    /* at least one window somewhere; zero-window shards may come last */
    int any = 0;
    for (int s = 0; s < l.n_shards; s++) any |= l.n[s] > seq_len;
    if (!any) {
        int s = (int)rnd_range(0, l.n_shards - 1);
        l.n[s] = seq_len + 1 + rnd_range(0, 100);
        for (int64_t p = 0; p < l.n[s]; p++) t[p] = (int32_t)(s * 2000 + p);
        char name[32];
        snprintf(name, sizeof name, "s_%03d.bin", s);
        write_shard(dir, name, t, l.n[s], 4);
    }
    return l;
}

static void test_windows_are_exact(void **state) {
    int seq_len = (int)rnd_range(1, 64);
    layout l = make_position_shards(*state, seq_len);
    loom_dataset ds;
    open_ok(&ds, *state, "s_*.bin", 8 * 2000, seq_len);
    int64_t total = 0;
    for (int s = 0; s < l.n_shards; s++) {
        int64_t w = l.n[s] > seq_len ? l.n[s] - seq_len : 0;
        assert_int_equal(ds.shards[s].n_windows, w);
        assert_int_equal(ds.shards[s].first_window, total);
        total += w;
    }
    assert_int_equal(ds.total_windows, total);

    uint64_t seed = rnd();
    int n_seqs = 64, len = seq_len + 1;
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(n_seqs * len));
    for (int64_t step = 0; step < 20; step++) {
        loom_dataset_sample(&ds, seed, step, 0, n_seqs, out);
        for (int i = 0; i < n_seqs; i++) {
            /* where the contract says sequence i must start */
            int64_t w =
                (int64_t)(loom_philox_u64(seed, LOOM_DATA_STREAM, (uint64_t)step, (uint32_t)i) %
                          (uint64_t)total);
            int s = 0;
            for (int64_t nw; w >= (nw = l.n[s] > seq_len ? l.n[s] - seq_len : 0); s++) w -= nw;
            const int32_t *seq = out + i * len;
            for (int j = 0; j < len; j++) assert_int_equal(seq[j], s * 2000 + w + j);
            assert_true(w + len <= l.n[s]); /* never crosses into the next shard */
        }
    }
    free(out);
    loom_dataset_close(&ds);
}

static void random_shards(const char *dir, int n_shards, int vocab) {
    int32_t t[3000];
    for (int s = 0; s < n_shards; s++) {
        int64_t n = rnd_range(100, 3000);
        for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(rnd() % (uint64_t)vocab);
        char name[32];
        snprintf(name, sizeof name, "r_%02d.bin", s);
        write_shard(dir, name, t, n, 2);
    }
}

static void test_sampler_deterministic(void **state) {
    random_shards(*state, 3, 50257);
    loom_dataset a, b;
    open_ok(&a, *state, "r_*.bin", 50257, 32);
    open_ok(&b, *state, "r_*.bin", 50257, 32); /* a second open must see the same data */
    enum { N = 16, L = 33 };
    int32_t x[N * L], y[N * L];
    uint64_t seed = rnd();
    int64_t step = (int64_t)(rnd() % 100000);
    loom_dataset_sample(&a, seed, step, 0, N, x);
    loom_dataset_sample(&b, seed, step, 0, N, y);
    assert_memory_equal(x, y, sizeof x);
    loom_dataset_sample(&a, seed, step + 1, 0, N, y);
    assert_memory_not_equal(x, y, sizeof x);
    loom_dataset_sample(&a, seed ^ 1, step, 0, N, y);
    assert_memory_not_equal(x, y, sizeof x);
    loom_dataset_close(&a);
    loom_dataset_close(&b);
}

static void test_layout_independent(void **state) {
    random_shards(*state, 4, 256);
    loom_dataset ds;
    open_ok(&ds, *state, "r_*.bin", 256, 16);
    enum { L = 17 };
    int32_t whole[8 * L], parts[8 * L];
    uint64_t seed = rnd();
    for (int64_t step = 0; step < 5; step++) {
        loom_dataset_sample(&ds, seed, step, 0, 8, whole);
        loom_dataset_sample(&ds, seed, step, 0, 3, parts);
        loom_dataset_sample(&ds, seed, step, 3, 5, parts + 3 * L);
        assert_memory_equal(whole, parts, sizeof whole);
        /* any other split, e.g. one sequence per data-parallel rank */
        for (int i = 0; i < 8; i++) loom_dataset_sample(&ds, seed, step, i, 1, parts + i * L);
        assert_memory_equal(whole, parts, sizeof whole);
    }
    loom_dataset_close(&ds);
}

static void test_paths_sorted(void **state) {
    int32_t t[40] = {0};
    const char *names[3] = {"b.bin", "c.bin", "a.bin"};
    int64_t sizes[3] = {20, 30, 40};
    for (int i = 0; i < 3; i++) write_shard(*state, names[i], t, sizes[i], 2);
    loom_dataset ds;
    open_ok(&ds, *state, "*.bin", 10, 4);
    assert_int_equal(ds.n_shards, 3);
    assert_non_null(strstr(ds.shards[0].path, "/a.bin"));
    assert_non_null(strstr(ds.shards[1].path, "/b.bin"));
    assert_non_null(strstr(ds.shards[2].path, "/c.bin"));
    assert_int_equal(ds.total_tokens, 90);
    assert_int_equal(ds.total_windows, 36 + 16 + 26);
    assert_int_equal(ds.shards[2].first_window, 36 + 16);
    loom_dataset_close(&ds);
    loom_dataset zero = {0};
    loom_dataset_close(&zero);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    g_rng = g_seed;
    printf("test_data: LOOM_TEST_SEED=%" PRIu64 "\n", g_seed);
#define T(f) cmocka_unit_test_setup_teardown(f, setup_dir, teardown_dir)
    const struct CMUnitTest tests[] = {
        T(test_round_trip_u16),        T(test_round_trip_u32),     T(test_write_rejects_bad_tokens),
        T(test_windows_are_exact),     T(test_windows_are_exact),  T(test_windows_are_exact),
        T(test_sampler_deterministic), T(test_layout_independent), T(test_paths_sorted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
