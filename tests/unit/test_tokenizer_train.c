/* BPE training: the learned files load with the same loader, round-trip any bytes,
 * compress the training text, and the first merge is the most frequent pair; bad
 * arguments are LOOM_ERR_INPUT. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "data/bpe_train.h"
#include "test_tokenizer_util.h"

static unsigned char *make_text(size_t n) {
    static const char *const words[] = {
        "the",   "cat",  "sat", "on",          "mat",
        "don't", "I'LL", "42",  "caf\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC",
        "!!"};
    unsigned char *t = malloc(n);
    assert_non_null(t);
    size_t o = 0;
    while (o < n) {
        char rw[9] = {0};
        const char *w = words[rnd() % (sizeof words / sizeof *words)];
        if (rnd() % 4 == 0) { /* a random word: many distinct pairs to learn */
            size_t k = 2 + rnd() % 7;
            for (size_t i = 0; i < k; i++) rw[i] = (char)('a' + rnd() % 26);
            w = rw;
        }
        for (size_t i = 0; w[i] && o < n; i++) t[o++] = (unsigned char)w[i];
        if (o < n) t[o++] = rnd() % 9 ? ' ' : '\n';
    }
    return t;
}

static void test_train_roundtrip(void **state) {
    const char *dir = *state;
    size_t n = 200000;
    unsigned char *text = make_text(n);
    loom_bpe_train_stats st = {0};
    loom_error err = {0};
    assert_int_equal(loom_bpe_train(text, n, 300, dir, &st, &err), LOOM_OK);
    assert_int_equal(st.n_tokens, 300);
    assert_true(st.n_merges >= 43);
    loom_tokenizer *t = NULL;
    assert_int_equal(loom_tokenizer_load(&t, dir, &err), LOOM_OK);
    assert_int_equal(loom_tokenizer_vocab_size(t), 300);
    assert_int_equal(loom_tokenizer_merge_count(t), st.n_merges);
    size_t len = 0;
    const unsigned char *eot = loom_tokenizer_token(t, 299, &len);
    assert_int_equal(len, 13);
    assert_memory_equal(eot, "<|endoftext|>", 13);
    loom_token_buf ids = {0};
    loom_byte_buf back = {0};
    assert_int_equal(loom_tokenizer_encode(t, text, n, &ids, &err), LOOM_OK);
    printf("training text: %zu bytes -> %zu tokens\n", n, ids.n);
    assert_true(ids.n * 10 < n * 6); /* frequent words became whole tokens */
    assert_int_equal(loom_tokenizer_decode(t, ids.ids, ids.n, &back, &err), LOOM_OK);
    assert_int_equal(back.n, n);
    assert_memory_equal(back.data, text, n);
    /* random bytes still round-trip with the learned vocabulary */
    unsigned char buf[1000];
    for (int iter = 0; iter < 100; iter++) {
        size_t m = rnd() % sizeof buf;
        for (size_t i = 0; i < m; i++) buf[i] = (unsigned char)rnd();
        ids.n = back.n = 0;
        assert_int_equal(loom_tokenizer_encode(t, buf, m, &ids, &err), LOOM_OK);
        assert_int_equal(loom_tokenizer_decode(t, ids.ids, ids.n, &back, &err), LOOM_OK);
        assert_int_equal(back.n, m);
        if (m) assert_memory_equal(back.data, buf, m);
    }
    free(ids.ids);
    free(back.data);
    loom_tokenizer_free(t);
    free(text);
}

static void test_train_first_merge(void **state) {
    const char *dir = *state;
    const char *text = "abababab xyxy ab ab";
    loom_error err = {0};
    loom_bpe_train_stats st = {0};
    assert_int_equal(loom_bpe_train((const unsigned char *)text, strlen(text), 258, dir, &st, &err),
                     LOOM_OK);
    assert_int_equal(st.n_merges, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char line[64] = {0};
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "#version: 0.2\n");
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "a b\n"); /* (a,b): 4 + 2 = 6 times, more than any other */
    fclose(f);
    /* tiny text: training stops when no pair is left */
    assert_int_equal(loom_bpe_train((const unsigned char *)"ab", 2, 1000, dir, &st, &err), LOOM_OK);
    assert_int_equal(st.n_merges, 1);
    assert_int_equal(st.n_tokens, 258);
}

static void test_train_errors(void **state) {
    const char *dir = *state;
    loom_error err = {0};
    assert_int_equal(loom_bpe_train((const unsigned char *)"abc", 3, 256, dir, NULL, &err),
                     LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "--vocab-size 256"));
    assert_int_equal(loom_bpe_train((const unsigned char *)"", 0, 300, dir, NULL, &err),
                     LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "empty"));
    char bad[600];
    snprintf(bad, sizeof bad, "%s/file", dir);
    write_text(dir, "file", "x");
    snprintf(bad, sizeof bad, "%s/file/sub", dir);
    assert_int_not_equal(loom_bpe_train((const unsigned char *)"abc", 3, 300, bad, NULL, &err),
                         LOOM_OK);
    assert_non_null(strstr(err.msg, "file/sub"));
}

/* Invalid UTF-8 and binary text train too (pieces of raw bytes). */
static void test_train_binary(void **state) {
    const char *dir = *state;
    size_t n = 50000;
    unsigned char *text = malloc(n);
    assert_non_null(text);
    for (size_t i = 0; i < n; i++) text[i] = (unsigned char)(rnd() % 7 ? rnd() : 0xFF);
    loom_error err = {0};
    loom_bpe_train_stats st = {0};
    assert_int_equal(loom_bpe_train(text, n, 400, dir, &st, &err), LOOM_OK);
    loom_tokenizer *t = NULL;
    assert_int_equal(loom_tokenizer_load(&t, dir, &err), LOOM_OK);
    loom_token_buf ids = {0};
    loom_byte_buf back = {0};
    assert_int_equal(loom_tokenizer_encode(t, text, n, &ids, &err), LOOM_OK);
    assert_int_equal(loom_tokenizer_decode(t, ids.ids, ids.n, &back, &err), LOOM_OK);
    assert_int_equal(back.n, n);
    assert_memory_equal(back.data, text, n);
    free(ids.ids);
    free(back.data);
    free(text);
    loom_tokenizer_free(t);
}

int main(void) {
    seed_rng();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_train_roundtrip, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_train_first_merge, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_train_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_train_binary, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
