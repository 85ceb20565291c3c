/* "Did you mean ...?" (core/suggest.h): a flag mistyped by one random edit (a letter
 * changed, added, dropped, or two neighbours swapped) gets a suggestion, and nothing known is
 * nearer than it by an independent edit distance; words far from every flag get none; the
 * message's form; dashes, "=value", long words. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>

#include <cmocka.h>

#include "core/suggest.h"
#include "test_common.h"

static const char *const FLAGS[] = {
    "model",       "family",     "n-layer",     "n-head",       "n-kv-head",    "d-model",
    "d-ff",        "vocab-size", "seq-len",     "data",         "micro-batch",  "global-batch",
    "steps",       "lr",         "min-lr",      "warmup-steps", "weight-decay", "grad-clip",
    "seed",        "threads",    "metrics",     "dp",           "tp",           "pp",
    "pp-schedule", "zero",       "bucket-mb",   "ckpt-dir",     "ckpt-every",   "resume",
    "val-data",    "eval-every", "tensorboard", "trace",        "recompute",    "inject",
};
#define N_FLAGS (int)(sizeof FLAGS / sizeof FLAGS[0])

/* Optimal string alignment distance, by the textbook recursion's table (the reference). */
static int reference_distance(const char *a, const char *b) {
    int n = (int)strlen(a), m = (int)strlen(b);
    int d[80][80];
    for (int i = 0; i <= n; i++)
        for (int j = 0; j <= m; j++) {
            if (i == 0 || j == 0) {
                d[i][j] = i + j;
                continue;
            }
            int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            v = d[i - 1][j] + 1 < v ? d[i - 1][j] + 1 : v;
            v = d[i][j - 1] + 1 < v ? d[i][j - 1] + 1 : v;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

static void one_edit(const char *in, char *out) {
    int n = (int)strlen(in), k = (int)(rnd() % 4), p = (int)(rnd() % (unsigned)n);
    char c = (char)('a' + rnd() % 26);
    strcpy(out, in);
    if (k == 0) { /* change */
        out[p] = c == in[p] ? (char)(c == 'z' ? 'a' : c + 1) : c;
    } else if (k == 1) { /* add */
        memmove(out + p + 1, out + p, (size_t)(n - p + 1));
        out[p] = c;
    } else if (k == 2 && n > 2) { /* drop */
        memmove(out + p, out + p + 1, (size_t)(n - p));
    } else if (p + 1 < n && in[p] != in[p + 1]) { /* swap neighbours */
        out[p] = in[p + 1];
        out[p + 1] = in[p];
    } else {
        out[p] = (char)(in[p] == 'x' ? 'y' : 'x');
    }
}

static void test_one_edit_is_found(void **state) {
    (void)state;
    for (int t = 0; t < 2000; t++) {
        const char *flag = FLAGS[rnd() % N_FLAGS];
        if (strlen(flag) < 3) continue;
        char typo[80], word[84];
        one_edit(flag, typo);
        snprintf(word, sizeof word, "--%s", typo);
        int exact = 0;
        for (int i = 0; i < N_FLAGS; i++) exact |= strcmp(FLAGS[i], typo) == 0;
        if (exact) continue; /* the edit made another flag */
        const char *s = loom_suggest_nearest(word, FLAGS, N_FLAGS);
        if (!s) fail_msg("'%s' (from '%s'): no suggestion", word, flag);
        int best = 1 << 20;
        for (int i = 0; i < N_FLAGS; i++) {
            int d = reference_distance(typo, FLAGS[i]);
            best = d < best ? d : best;
        }
        int got = reference_distance(typo, s);
        /* a word the start of a flag counts as one edit away */
        int prefix = strncmp(s, typo, strlen(typo)) == 0;
        if (got > best && !(prefix && best >= 1))
            fail_msg("'%s': suggested '%s' at %d edits, a flag is %d away", word, s, got, best);
    }
}

static void test_far_words(void **state) {
    (void)state;
    const char *far[] = {"--outer", "--frobnicate", "--xyz", "--banana-split", "-q"};
    for (size_t i = 0; i < sizeof far / sizeof *far; i++)
        assert_null(loom_suggest_nearest(far[i], FLAGS, N_FLAGS));
    assert_null(loom_suggest_nearest("--", FLAGS, N_FLAGS));
    assert_null(loom_suggest_nearest("x", FLAGS, 0));
}

static void test_forms(void **state) {
    (void)state;
    char out[96];
    loom_suggest_flag(out, sizeof out, "--global-bach", FLAGS, N_FLAGS);
    assert_string_equal(out, ": did you mean --global-batch?");
    loom_suggest_flag(out, sizeof out, "--globa", FLAGS, N_FLAGS); /* a prefix */
    assert_string_equal(out, ": did you mean --global-batch?");
    loom_suggest_flag(out, sizeof out, "--stpes=3", FLAGS, N_FLAGS); /* =value ignored */
    assert_string_equal(out, ": did you mean --steps?");
    loom_suggest_flag(out, sizeof out, "--outer", FLAGS, N_FLAGS);
    assert_string_equal(out, "");
    const char *run_flags[] = {"-n", "--hosts", "--max-restarts"};
    loom_suggest_flag(out, sizeof out, "--max-restart", run_flags, 3); /* dashes kept */
    assert_string_equal(out, ": did you mean --max-restarts?");
    loom_suggest_flag(out, 4, "--global-bach", FLAGS, N_FLAGS); /* truncated, terminated */
    assert_int_equal(strlen(out), 3);
    char longw[300];
    memset(longw, 'a', sizeof longw - 1);
    longw[sizeof longw - 1] = 0;
    assert_null(loom_suggest_nearest(longw, FLAGS, N_FLAGS));
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_suggest: seed %u (LOOM_TEST_SEED to repeat)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_edit_is_found),
        cmocka_unit_test(test_far_words),
        cmocka_unit_test(test_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
