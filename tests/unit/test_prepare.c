/* loom data prepare (data/prepare.h) with a small BPE trained here: shards read back
 * equal <|endoftext|> + encode(document) per document in the documented split, shard
 * sizes respect the limit, the val rule, deterministic output, the streaming writer's
 * uint32 shards, and one-line errors for bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/bpe_train.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "test_tokenizer_util.h"

static char g_tok_dir[64];
static loom_tokenizer *g_tok;

static const char *const g_words[] = {"the", "cat",   "sat",  "on",  "mat",         "don't",
                                      "42",  "1999",  "I'LL", "!!",  "caf\xC3\xA9", "\xE6\x97\xA5",
                                      "a-b", "x\xFF", "\xC3", "(y)", "Zebra",       "\t"};

/* Appends random words separated by spaces; newlines when `lines` (never two in a row). */
static void gen_words(loom_byte_buf *b, size_t len, int lines) {
    size_t start = b->n;
    while (b->n - start < len) {
        const char *w = g_words[rnd() % (sizeof g_words / sizeof *g_words)];
        loom_byte_buf_append(b, w, strlen(w));
        const char *sep = " ";
        if (lines && rnd() % 8 == 0) sep = rnd() % 3 ? "\n" : "\r\n";
        if (b->n - start < len) loom_byte_buf_append(b, sep, strlen(sep));
    }
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Reads every DIR/SPLIT_NNNNNN.bin: checks headers and sizes, returns the tokens. */
static int32_t *read_split(const char *dir, const char *split, int64_t max_tokens, int expect_magic,
                           size_t *n_out, int *shards_out) {
    int32_t *all = NULL;
    size_t n = 0;
    int shards = 0;
    int64_t prev = max_tokens;
    for (;; shards++) {
        char path[512];
        assert_int_equal(loom_prepare_shard_path(path, sizeof path, dir, split, shards), 0);
        FILE *f = fopen(path, "rb");
        if (!f) break;
        assert_int_equal(prev, max_tokens); /* only the last shard may be short */
        int32_t h[256];
        assert_int_equal(fread(h, 4, 256, f), 256);
        assert_int_equal(h[0], expect_magic);
        assert_int_equal(h[1], 1);
        assert_true(h[2] >= 1 && h[2] <= max_tokens);
        int tb = expect_magic == LOOM_SHARD_MAGIC_U16 ? 2 : 4;
        all = realloc(all, (n + (size_t)h[2] + 1) * sizeof *all);
        assert_non_null(all);
        for (int32_t i = 0; i < h[2]; i++) {
            uint32_t v = 0;
            assert_int_equal(fread(&v, (size_t)tb, 1, f), 1);
            all[n++] = (int32_t)v;
        }
        assert_int_equal(fgetc(f), EOF); /* size matches the header */
        fclose(f);
        prev = h[2];
    }
    *n_out = n;
    *shards_out = shards;
    return all;
}

typedef struct {
    loom_token_buf train, val;
    int64_t n_docs, n_val;
} expected;

static void expect_doc(expected *e, double f, const unsigned char *text, size_t n) {
    int val = loom_prepare_is_val(f, e->n_docs++);
    e->n_val += val;
    loom_token_buf *b = val ? &e->val : &e->train;
    int32_t eot = loom_tokenizer_vocab_size(g_tok) - 1;
    loom_error err = {0};
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->ids = realloc(b->ids, b->cap * sizeof *b->ids);
        assert_non_null(b->ids);
    }
    b->ids[b->n++] = eot;
    assert_int_equal(loom_tokenizer_encode(g_tok, text, n, b, &err), LOOM_OK);
}

/* On a mismatch, prints the text around the first differing token. */
static void show_diff(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want) {
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i]) i++;
    if (i == n_got && i == n_want) return;
    size_t from = i > 8 ? i - 8 : 0;
    for (int w = 0; w < 2; w++) {
        const int32_t *ids = w ? want : got;
        size_t n = w ? n_want : n_got, to = i + 8 < n ? i + 8 : n;
        loom_byte_buf text = {0};
        loom_error err = {0};
        loom_tokenizer_decode(g_tok, ids + from, to - from, &text, &err);
        char shown[512];
        loom_bytes_show(text.data, text.n, shown, sizeof shown);
        printf("%s at token %zu: \"%s\"\n", w ? "want" : "got", i, shown);
        free(text.data);
    }
}

/* Runs prepare and compares both splits with e. */
static void check_run(const loom_prepare_options *o, expected *e) {
    loom_prepare_stats st;
    loom_error err = {0};
    assert_int_equal(loom_prepare_run(g_tok, o, &st, &err), LOOM_OK);
    assert_int_equal(st.n_docs, e->n_docs);
    assert_int_equal(st.n_val_docs, e->n_val);
    const char *splits[2] = {"train", "val"};
    loom_token_buf *want[2] = {&e->train, &e->val};
    for (int s = 0; s < 2; s++) {
        size_t n = 0;
        int shards = 0;
        int32_t *got =
            read_split(o->out_dir, splits[s], o->shard_tokens, LOOM_SHARD_MAGIC_U16, &n, &shards);
        printf("%s: %zu tokens in %d shards of <= %lld\n", splits[s], n, shards,
               (long long)o->shard_tokens);
        show_diff(got, n, want[s]->ids, want[s]->n);
        assert_int_equal(n, want[s]->n);
        if (n) assert_memory_equal(got, want[s]->ids, n * sizeof *got);
        assert_int_equal(shards,
                         (int)((n + (size_t)o->shard_tokens - 1) / (size_t)o->shard_tokens));
        assert_int_equal(s ? st.val_tokens : st.train_tokens, (int64_t)n);
        assert_int_equal(s ? st.val_shards : st.train_shards, shards);
        free(got);
    }
    free(e->train.ids);
    free(e->val.ids);
    memset(e, 0, sizeof *e);
}

static void test_file_documents(void **state) {
    const char *dir = *state;
    char in[256], out[256], path[300];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    assert_int_equal(mkdir(in, 0755), 0);
    expected e = {0};
    loom_prepare_options o = {.n_inputs = 1,
                              .out_dir = out,
                              .val_fraction = 0.2,
                              .doc_sep = LOOM_DOC_SEP_FILE,
                              .chunk_bytes = 256};
    o.shard_tokens = 50 + (int64_t)(rnd() % 100);
    int n_docs = 15 + (int)(rnd() % 20);
    for (int d = 0; d < n_docs; d++) {
        loom_byte_buf doc = {0};
        size_t len = d % 7 == 3 ? 0 : rnd() % 5 == 0 ? 2000 + rnd() % 8000 : rnd() % 300;
        gen_words(&doc, len, 1);
        if (d % 5 == 1 && len) doc.data[rnd() % doc.n] = 0; /* NUL bytes are text too */
        snprintf(path, sizeof path, "%s/doc_%03d.txt", in, d);
        write_bytes(path, doc.data ? doc.data : (unsigned char *)"", doc.n);
        if (doc.n) expect_doc(&e, o.val_fraction, doc.data, doc.n); /* empty files: skipped */
        free(doc.data);
    }
    snprintf(path, sizeof path, "%s/doc_*.txt", in);
    const char *inputs[] = {path};
    o.inputs = inputs;
    check_run(&o, &e);
}

static void test_blank_line_documents(void **state) {
    const char *dir = *state;
    char out[256], paths[2][300];
    snprintf(out, sizeof out, "%s/out", dir);
    expected e = {0};
    loom_prepare_options o = {.n_inputs = 2,
                              .out_dir = out,
                              .val_fraction = 0.25,
                              .doc_sep = LOOM_DOC_SEP_BLANK_LINE,
                              .chunk_bytes = 64};
    o.shard_tokens = 20 + (int64_t)(rnd() % 60);
    const char *inputs[2] = {paths[0], paths[1]};
    o.inputs = inputs;
    for (int file = 0; file < 2; file++) {
        loom_byte_buf text = {0};
        for (int b = (int)(rnd() % 3); b > 0; b--) { /* leading blank lines */
            const char *blank = rnd() % 2 ? "\n" : "\r\n";
            loom_byte_buf_append(&text, blank, strlen(blank));
        }
        int n_docs = 10 + (int)(rnd() % 15);
        for (int d = 0; d < n_docs; d++) {
            loom_byte_buf doc = {0};
            gen_words(&doc, 1 + rnd() % (rnd() % 6 ? 200 : 2000), 1);
            while (doc.n && (doc.data[doc.n - 1] == '\n' || doc.data[doc.n - 1] == '\r')) doc.n--;
            if (!doc.n) loom_byte_buf_append(&doc, "z", 1);
            expect_doc(&e, o.val_fraction, doc.data, doc.n);
            loom_byte_buf_append(&text, doc.data, doc.n);
            free(doc.data);
            if (d == n_docs - 1 && rnd() % 2) break; /* no newline at the end of the file */
            loom_byte_buf_append(&text, "\n", 1);
            for (int b = 1 + (int)(rnd() % 3); b > 0 && d < n_docs - 1; b--) {
                if (rnd() % 2)
                    loom_byte_buf_append(&text, "\n", 1);
                else
                    loom_byte_buf_append(&text, "\r\n", 2);
            }
        }
        snprintf(paths[file], sizeof paths[file], "%s/part%d.txt", dir, file);
        write_bytes(paths[file], text.data, text.n);
        free(text.data);
    }
    check_run(&o, &e);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *d = malloc(*n + 1);
    assert_non_null(d);
    assert_int_equal(fread(d, 1, *n, f), *n);
    fclose(f);
    return d;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_deterministic_and_stale(void **state) {
    const char *dir = *state;
    char in[300], a[300], b[300];
    snprintf(in, sizeof in, "%s/in.txt", dir);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    loom_byte_buf text = {0};
    for (int d = 0; d < 40; d++) {
        gen_words(&text, 50 + rnd() % 200, 1);
        loom_byte_buf_append(&text, "\n\n", 2);
    }
    write_bytes(in, text.data, text.n);
    free(text.data);
    const char *inputs[] = {in};
    loom_prepare_options o = {.inputs = inputs,
                              .n_inputs = 1,
                              .out_dir = a,
                              .val_fraction = 0.1,
                              .shard_tokens = 10,
                              .doc_sep = LOOM_DOC_SEP_BLANK_LINE};
    loom_prepare_stats s1, s2, s3;
    loom_error err = {0};
    assert_int_equal(loom_prepare_run(g_tok, &o, &s1, &err), LOOM_OK);
    o.shard_tokens = 1000;
    assert_int_equal(loom_prepare_run(g_tok, &o, &s2, &err), LOOM_OK);
    assert_int_equal(s2.stale_removed,
                     s1.train_shards + s1.val_shards - s2.train_shards - s2.val_shards);
    o.out_dir = b;
    assert_int_equal(loom_prepare_run(g_tok, &o, &s3, &err), LOOM_OK);
    assert_int_equal(count_files(a), s3.train_shards + s3.val_shards);
    assert_int_equal(count_files(b), s3.train_shards + s3.val_shards);
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < (v ? s3.val_shards : s3.train_shards); i++) {
            char pa[400], pb[400];
            size_t na, nb;
            loom_prepare_shard_path(pa, sizeof pa, a, v ? "val" : "train", i);
            loom_prepare_shard_path(pb, sizeof pb, b, v ? "val" : "train", i);
            unsigned char *da = slurp(pa, &na), *db = slurp(pb, &nb);
            assert_int_equal(na, nb);
            assert_memory_equal(da, db, na);
            free(da);
            free(db);
        }
    }
}

static void test_val_rule(void **state) {
    (void)state;
    for (int64_t k = 0; k < 2000; k++) {
        assert_int_equal(loom_prepare_is_val(0.005, k), (k + 1) % 200 == 0);
        assert_int_equal(loom_prepare_is_val(0.25, k), (k + 1) % 4 == 0);
        assert_int_equal(loom_prepare_is_val(0.1, k), (k + 1) % 10 == 0);
        assert_false(loom_prepare_is_val(0, k));
    }
    const double fs[] = {0.3, 0.01, 0.999, 1.0 / 3, 0.5};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) {
        int64_t n_val = 0;
        assert_false(loom_prepare_is_val(fs[i], 0)); /* the first document is train */
        for (int64_t k = 0; k < 1000; k++) {
            n_val += loom_prepare_is_val(fs[i], k);
            assert_int_equal(n_val, (int64_t)floor((double)(k + 1) * fs[i] + 1e-9));
        }
    }
}

static void test_stream_u32(void **state) {
    const char *dir = *state;
    loom_shard_stream s;
    loom_error err = {0};
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = i == 11 ? 70000 : (int32_t)(rnd() % 100000);
    assert_int_equal(loom_shard_stream_open(&s, dir, "train", 4, 7, &err), LOOM_OK);
    assert_int_equal(loom_shard_stream_put(&s, ids, 13, &err), LOOM_OK);
    assert_int_equal(loom_shard_stream_put(&s, ids + 13, 17, &err), LOOM_OK);
    assert_int_equal(loom_shard_stream_finish(&s, &err), LOOM_OK);
    size_t n = 0;
    int shards = 0;
    int32_t *got = read_split(dir, "train", 7, LOOM_SHARD_MAGIC_U32, &n, &shards);
    assert_int_equal(n, 30);
    assert_int_equal(shards, 5);
    assert_memory_equal(got, ids, sizeof ids);
    free(got);
    /* 70000 does not fit in uint16: an error, and no .tmp file left behind */
    assert_int_equal(loom_shard_stream_open(&s, dir, "val", 2, 100, &err), LOOM_OK);
    assert_int_equal(loom_shard_stream_put(&s, ids, 30, &err), LOOM_ERR_INPUT);
    printf("expected error: %s\n", err.msg);
    loom_shard_stream_abort(&s);
    assert_int_equal(count_files(dir), 5);
    assert_int_equal(loom_shard_stream_open(&s, dir, "val", 3, 100, &err), LOOM_ERR_INPUT);
}

static void expect_fail(const loom_prepare_options *o, const char *needle) {
    loom_prepare_stats st;
    loom_error err = {0};
    assert_int_equal(loom_prepare_run(g_tok, o, &st, &err), LOOM_ERR_INPUT);
    printf("expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, needle));
    assert_null(strchr(err.msg, '\n'));
}

static void test_errors(void **state) {
    const char *dir = *state;
    char out[300], empty[300], blank[300], nomatch[300];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(empty, sizeof empty, "%s/empty.txt", dir);
    snprintf(blank, sizeof blank, "%s/blank.txt", dir);
    snprintf(nomatch, sizeof nomatch, "%s/nosuch_*.txt", dir);
    write_bytes(empty, "", 0);
    write_bytes(blank, "\n\r\n\n\r", 5);
    const char *inputs[1] = {nomatch};
    loom_prepare_options o = {.inputs = inputs,
                              .n_inputs = 1,
                              .out_dir = out,
                              .val_fraction = 0.005,
                              .shard_tokens = 100};
    expect_fail(&o, nomatch);
    inputs[0] = dir;
    expect_fail(&o, "folder");
    inputs[0] = blank;
    o.val_fraction = 1;
    expect_fail(&o, "--val-fraction");
    o.val_fraction = -0.1;
    expect_fail(&o, "--val-fraction");
    o.val_fraction = 0;
    o.shard_tokens = 0;
    expect_fail(&o, "--shard-tokens");
    o.shard_tokens = (int64_t)INT32_MAX + 1;
    expect_fail(&o, "--shard-tokens");
    assert_int_equal(access(out, F_OK), -1); /* nothing was written */
    o.shard_tokens = 100;
    inputs[0] = empty;
    expect_fail(&o, "no documents");
    inputs[0] = blank;
    o.doc_sep = LOOM_DOC_SEP_BLANK_LINE;
    expect_fail(&o, "no documents");
    assert_int_equal(count_files(out), 0);
    /* a vocabulary without <|endoftext|> last */
    static const char *const merges[] = {"a|b"};
    write_vocab(dir, merges, 1);
    loom_tokenizer *t = NULL, *keep = g_tok;
    loom_error err = {0};
    assert_int_equal(loom_tokenizer_load(&t, dir, &err), LOOM_OK);
    g_tok = t;
    expect_fail(&o, "<|endoftext|>");
    g_tok = keep;
    loom_tokenizer_free(t);
}

static int setup_tokenizer(void **state) {
    (void)state;
    snprintf(g_tok_dir, sizeof g_tok_dir, "/tmp/loom_test_prep_tok_XXXXXX");
    if (!mkdtemp(g_tok_dir)) return -1;
    loom_byte_buf text = {0};
    gen_words(&text, 100000, 1);
    loom_bpe_train_stats st;
    loom_error err = {0};
    loom_status s = loom_bpe_train(text.data, text.n, 300, g_tok_dir, &st, &err);
    free(text.data);
    if (s == LOOM_OK) s = loom_tokenizer_load(&g_tok, g_tok_dir, &err);
    if (s != LOOM_OK) printf("tokenizer: %s\n", err.msg);
    return s == LOOM_OK ? 0 : -1;
}

static int teardown_tokenizer(void **state) {
    (void)state;
    loom_tokenizer_free(g_tok);
    nftw(g_tok_dir, test_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(void) {
    seed_rng();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_file_documents, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_blank_line_documents, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_deterministic_and_stale, setup_dir, teardown_dir),
        cmocka_unit_test(test_val_rule),
        cmocka_unit_test_setup_teardown(test_stream_u32, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_errors, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, setup_tokenizer, teardown_tokenizer);
}
