/* The byte-level BPE tokenizer: loader errors name file and line/entry; encode/decode
 * round-trip random byte strings (invalid UTF-8 included); the heap algorithm for long
 * pieces equals GPT-2's loop; GPT-2's real files (when fetched) give known ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_tokenizer_util.h"

static const char *const merges[] = {
    "t|h", "th|e", " |t", " t|he", "a|a",    "aa|aa", "aa|a", "i|n",       "in|g", " |a",   "e|r",
    "h|e", "l|l",  "o|w", "ll|o",  "he|llo", "1|2",   "12|3", "\xC3|\xA9", "!|!",  "!!|!!", " | ",
};
#define N_MERGES ((int)(sizeof merges / sizeof *merges))

static loom_tokenizer *load_dir(const char *dir, loom_error *err) {
    loom_tokenizer *t = NULL;
    loom_status st = loom_tokenizer_load(&t, dir, err);
    if (st != LOOM_OK) assert_null(t);
    return t;
}

static void roundtrip(loom_tokenizer *t, const unsigned char *s, size_t n) {
    loom_token_buf ids = {0};
    loom_byte_buf back = {0};
    loom_error err = {0};
    assert_int_equal(loom_tokenizer_encode(t, s, n, &ids, &err), LOOM_OK);
    assert_int_equal(loom_tokenizer_decode(t, ids.ids, ids.n, &back, &err), LOOM_OK);
    assert_int_equal(back.n, n);
    if (n) assert_memory_equal(back.data, s, n);
    free(ids.ids);
    free(back.data);
}

static void test_encode_small(void **state) {
    const char *dir = *state;
    write_vocab(dir, merges, N_MERGES);
    loom_error err = {0};
    loom_tokenizer *t = load_dir(dir, &err);
    assert_non_null(t);
    assert_int_equal(loom_tokenizer_merge_count(t), N_MERGES);
    loom_token_buf ids = {0};
    /* pieces "the", " the", " aaaaa", " hello", "!!!!!"; GPT-2's rule: lowest rank first,
     * all occurrences left to right (" t" loses to "t h"; "a a" x2 then "aa aa"). */
    const char *s = "the the aaaaa hello!!!!!";
    assert_int_equal(loom_tokenizer_encode(t, (const unsigned char *)s, strlen(s), &ids, &err),
                     LOOM_OK);
    const char *want[] = {"the", " ", "the", " ", "aaaa", "a", " ", "hello", "!!!!", "!"};
    assert_int_equal(ids.n, 10);
    for (size_t i = 0; i < ids.n; i++) {
        size_t len = 0;
        const unsigned char *tok = loom_tokenizer_token(t, ids.ids[i], &len);
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(tok, want[i], len);
    }
    ids.n = 0; /* empty input: no tokens, no error */
    assert_int_equal(loom_tokenizer_encode(t, (const unsigned char *)"", 0, &ids, &err), LOOM_OK);
    assert_int_equal(ids.n, 0);
    int32_t bad[] = {5, 100000};
    loom_byte_buf out = {0};
    assert_int_equal(loom_tokenizer_decode(t, bad, 2, &out, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "token 1: id 100000"));
    free(out.data);
    free(ids.ids);
    loom_tokenizer_free(t);
}

static void test_roundtrip_random(void **state) {
    const char *dir = *state;
    write_vocab(dir, merges, N_MERGES);
    loom_error err = {0};
    loom_tokenizer *t = load_dir(dir, &err);
    assert_non_null(t);
    static const char alpha[] = "the aaa!! \xC3\xA9\t\n'sll 123";
    unsigned char buf[3000];
    for (int iter = 0; iter < 400; iter++) {
        size_t n = rnd() % sizeof buf;
        int mode = (int)(rnd() % 3);
        for (size_t i = 0; i < n; i++)
            buf[i] = mode == 0 ? (unsigned char)rnd() /* arbitrary bytes, invalid UTF-8 */
                               : (unsigned char)alpha[rnd() % (sizeof alpha - 1)];
        roundtrip(t, buf, n);
    }
    loom_tokenizer_free(t);
}

/* Pieces longer than heap_min_len use the heap; both algorithms must agree exactly,
 * also for merge lists whose ranks are not in creation order. */
static void test_heap_equals_scan(void **state) {
    const char *dir = *state;
    static const char *const odd[] = {"a|b",  "ab|ab", "b|a",       "aba|b", "a|ba",
                                      "ab|a", "b|b",   "abab|abab", "a|a",   "bb|a"};
    for (int v = 0; v < 2; v++) {
        if (v == 0)
            write_vocab(dir, merges, N_MERGES);
        else
            write_vocab(dir, odd, (int)(sizeof odd / sizeof *odd));
        loom_error err = {0};
        loom_tokenizer *t = load_dir(dir, &err);
        assert_non_null(t);
        unsigned char buf[600];
        for (int iter = 0; iter < 300; iter++) {
            size_t n = 1 + rnd() % sizeof buf;
            static const char alpha[] = "abth!e";
            int k = 2 + (int)(rnd() % 5);
            for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)alpha[rnd() % (size_t)k];
            loom_token_buf a = {0}, b = {0};
            t->heap_min_len = SIZE_MAX;
            loom_strmap_clear(&t->cache);
            t->cache_n = 0;
            assert_int_equal(loom_tokenizer_encode(t, buf, n, &a, &err), LOOM_OK);
            t->heap_min_len = 1;
            loom_strmap_clear(&t->cache);
            t->cache_n = 0;
            assert_int_equal(loom_tokenizer_encode(t, buf, n, &b, &err), LOOM_OK);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.ids, b.ids, a.n * sizeof *a.ids);
            free(a.ids);
            free(b.ids);
        }
        loom_tokenizer_free(t);
    }
}

/* expect_load: writes the two files and checks the error names file and detail. */
static void expect_load(const char *dir, const char *enc, const char *voc, const char *file,
                        const char *detail) {
    if (enc) write_text(dir, "encoder.json", enc);
    if (voc) write_text(dir, "vocab.bpe", voc);
    loom_error err = {0};
    loom_tokenizer *t = load_dir(dir, &err);
    if (t || err.code != LOOM_ERR_INPUT || !strstr(err.msg, file) || !strstr(err.msg, detail))
        fail_msg("expected an error naming '%s' and '%s', got %s: '%s'", file, detail,
                 t ? "success" : "error", err.msg);
}

static void test_loader_errors(void **state) {
    const char *dir = *state;
    expect_load(dir, NULL, NULL, "encoder.json", "cannot open");
    write_vocab(dir, merges, N_MERGES);
    char enc_path[512];
    snprintf(enc_path, sizeof enc_path, "%s/vocab.bpe", dir);
    remove(enc_path);
    expect_load(dir, NULL, NULL, "vocab.bpe", "cannot open");
    write_vocab(dir, merges, N_MERGES);
    expect_load(dir, "{\"a\": 0,\n \"b\": }", NULL, "encoder.json", "line 2");
    expect_load(dir, "[1, 2]", NULL, "encoder.json", "expected a non-empty JSON object");
    expect_load(dir, "{}", NULL, "encoder.json", "expected a non-empty JSON object");
    expect_load(dir, "{\"a\": 0, \"b\": 5}", NULL, "encoder.json", "entry \"b\"");
    expect_load(dir, "{\"a\": 0, \"b\": \"1\"}", NULL, "encoder.json", "expected an integer id");
    expect_load(dir, "{\"a\": 1, \"b\": 1}", NULL, "encoder.json", "used twice");
    expect_load(dir, "{\"a\": 0, \"a\": 1}", NULL, "encoder.json", "duplicate");
    expect_load(dir, "{\"a\": 0, \" \": 1}", NULL, "encoder.json", "U+0020");
    expect_load(dir, "{\"a\": 0, \"b\": 1}", NULL, "encoder.json", "no entry for byte 0x00");
    /* merges against a good encoder.json (bytes + merge results) */
    write_vocab(dir, merges, N_MERGES);
    expect_load(dir, NULL, "#version: 0.2\nt h\nzz q\n", "vocab.bpe line 3", "\"zz\" is not in");
    expect_load(dir, NULL, "#version: 0.2\nt h\nq q\n", "vocab.bpe line 3", "\"qq\" is not in");
    expect_load(dir, NULL, "#version: 0.2\nt h\nth e\nt h\n", "vocab.bpe line 4",
                "duplicate merge (first at line 2)");
    expect_load(dir, NULL, "#version: 0.2\nt h\nthe\n", "vocab.bpe line 3", "two tokens");
    expect_load(dir, NULL, "#version: 0.2\nt h e\n", "vocab.bpe line 2", "two tokens");
    expect_load(dir, NULL, "#version: 0.2\nt h\n\nth e\n", "vocab.bpe line 3", "empty line");
    expect_load(dir, NULL, "#version: 0.2\nt \xff\n", "vocab.bpe line 2", "not in GPT-2's byte");
    /* a trailing blank line, CRLF line ends and no header are fine */
    write_text(dir, "vocab.bpe", "t h\r\nth e\r\n\n");
    loom_error err = {0};
    loom_tokenizer *t = load_dir(dir, &err);
    assert_non_null(t);
    assert_int_equal(loom_tokenizer_merge_count(t), 2);
    loom_tokenizer_free(t);
    /* a folder that does not exist */
    assert_int_equal(loom_tokenizer_load(&t, "/nonexistent/tok", &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "/nonexistent/tok/encoder.json"));
}

static void test_resolve_env(void **state) {
    const char *dir = *state;
    write_vocab(dir, merges, 3);
    setenv("LOOM_TOKENIZER_DIR", dir, 1);
    char got[4096];
    loom_error err = {0};
    assert_int_equal(loom_tokenizer_resolve("gpt2", got, sizeof got, &err), LOOM_OK);
    assert_string_equal(got, dir);
    setenv("LOOM_TOKENIZER_DIR", "/nonexistent/loom_tok", 1);
    loom_status st = loom_tokenizer_resolve("gpt2", got, sizeof got, &err);
    if (st != LOOM_OK) { /* unless the real files sit next to the test binary */
        assert_non_null(strstr(err.msg, "/nonexistent/loom_tok (LOOM_TOKENIZER_DIR)"));
        assert_non_null(strstr(err.msg, "fetch_gpt2_tokenizer.sh"));
    }
    unsetenv("LOOM_TOKENIZER_DIR");
}

/* The real GPT-2 files, when scripts/fetch_gpt2_tokenizer.sh has fetched them. */
static void test_gpt2_known_ids(void **state) {
    (void)state;
    loom_tokenizer *t = NULL;
    loom_error err = {0};
    if (loom_tokenizer_load(&t, "gpt2", &err) != LOOM_OK) {
        printf("SKIP gpt2 known ids: %s\n", err.msg);
        skip();
    }
    assert_int_equal(loom_tokenizer_vocab_size(t), 50257);
    assert_int_equal(loom_tokenizer_merge_count(t), 50000);
    const char *s = "Hello world! I'LL don't 12345abc   spaces";
    const int32_t want[] = {15496, 995,   0,    314,   6,   3069, 836,
                            470,   17031, 2231, 39305, 220, 220,  9029};
    loom_token_buf ids = {0};
    assert_int_equal(loom_tokenizer_encode(t, (const unsigned char *)s, strlen(s), &ids, &err),
                     LOOM_OK);
    assert_int_equal(ids.n, sizeof want / sizeof *want);
    assert_memory_equal(ids.ids, want, sizeof want);
    free(ids.ids);
    unsigned char buf[2000];
    for (int iter = 0; iter < 200; iter++) {
        size_t n = rnd() % sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)rnd();
        roundtrip(t, buf, n);
    }
    loom_tokenizer_free(t);
}

int main(void) {
    seed_rng();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_encode_small, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_roundtrip_random, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_heap_equals_scan, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_loader_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_resolve_env, setup_dir, teardown_dir),
        cmocka_unit_test(test_gpt2_known_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
