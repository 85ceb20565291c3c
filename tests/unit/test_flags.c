/* The one flag-table parser (core/flags.h): typed values and their ranges, the command's
 * own setters, switches and optional values, short names, positional arguments, --help,
 * an unknown flag's one line with the nearest flag (and an outer table's), exact names,
 * loom_flags_take's hand-over of the other words, the grouped help, LOOM_FLAG_NUMBER's
 * kind from the destination's type, and loom_flags_run's outcome and printed lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/flags.h"

typedef struct {
    int steps, quick;
    double lr;
    float temp;
    long n;
    unsigned long long seed;
    const char *out, *mode;
} opts;

static loom_status set_mode(void *dst, const char *name, const char *v, loom_error *err) {
    if (strcmp(v, "1") && strcmp(v, "fast") && strcmp(v, "slow"))
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected fast or slow", name, v);
    *(const char **)dst = v;
    return LOOM_OK;
}

static const char *const MODES[] = {"fast", "slow", NULL};
static const loom_flag_group GROUPS[] = {{"Run", "docs/training.md"}, {"Output", NULL}};

static loom_flag_spec spec_of(loom_flag *f, opts *o) {
    const loom_flag t[] = {
        LOOM_FLAG_NUM(0, "steps", LOOM_FLAG_INT, &o->steps, "N", "steps", 1, 100, NULL),
        LOOM_FLAG_NUM(0, "lr", LOOM_FLAG_DOUBLE, &o->lr, "X", "rate", 0, 1, "expected [0, 1]"),
        {.name = "temperature",
         .kind = LOOM_FLAG_FLOAT,
         .dst = &o->temp,
         .lo = 0,
         .lo_open = 1,
         .hi = 10,
         .expect = "expected (0, 10]",
         .quote_value = 1,
         .help = "t"},
        LOOM_FLAG_NUM(0, "n", LOOM_FLAG_LONG, &o->n, "N", "n", 1, 1 << 20, NULL),
        LOOM_FLAG_NUM(0, "seed", LOOM_FLAG_U64, &o->seed, "S", "seed", 0, 2e19, NULL),
        LOOM_FLAG_SW(0, "quick", &o->quick, "fewer"),
        {.name = "mode",
         .kind = LOOM_FLAG_CALL,
         .dst = &o->mode,
         .set = set_mode,
         .optional = 1,
         .next_words = MODES,
         .help = "m"},
        {.name = "output",
         .short_name = 'o',
         .kind = LOOM_FLAG_STRING,
         .dst = &o->out,
         .arg = "FILE",
         .help = "where",
         .group = 1},
        {.name = "secret", .kind = LOOM_FLAG_SWITCH, .dst = &o->quick, .hidden = 1},
    };
    memcpy(f, t, sizeof t);
    return (loom_flag_spec){.usage = "usage: loom x [flags] FILE...",
                            .flags = f,
                            .n_flags = LOOM_FLAGS_COUNT(t),
                            .groups = GROUPS,
                            .n_groups = 2,
                            .positional = 1};
}

/* Parses the words after "x" (NULL-terminated); LOOM_OK or the error in err. */
static loom_status parse(const loom_flag_spec *spec, opts *o, loom_error *err, int *first,
                         const char *const *words) {
    char *argv[32] = {"x"};
    int argc = 1;
    for (; words[argc - 1]; argc++) argv[argc] = (char *)words[argc - 1];
    memset(o, 0, sizeof *o);
    int help = 0;
    loom_status st = loom_flags_parse(spec, argc, argv, &help, first, err);
    return help ? (loom_status)99 : st;
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_values(void **state) {
    (void)state;
    opts o;
    loom_flag f[16];
    loom_flag_spec spec = spec_of(f, &o);
    loom_error err = {0};
    int first = 0;
    assert_int_equal(
        parse(&spec, &o, &err, &first,
              WORDS("a.txt", "--steps", "7", "--lr=0.5", "--temperature", "2", "--n", "9", "--seed",
                    "18446744073709551615", "--quick", "-o", "out.png", "--mode", "slow", "b.txt")),
        LOOM_OK);
    assert_int_equal(o.steps, 7);
    assert_true(o.lr == 0.5);
    assert_true(o.temp == 2.0f);
    assert_int_equal(o.n, 9);
    assert_true(o.seed == 18446744073709551615ULL);
    assert_int_equal(o.quick, 1);
    assert_string_equal(o.out, "out.png");
    assert_string_equal(o.mode, "slow"); /* a bare optional flag takes a listed next word */
    assert_int_equal(first, 15);         /* the positional words, moved to the end */
    assert_int_equal(parse(&spec, &o, &err, NULL, WORDS("--mode", "--quick")), LOOM_OK);
    assert_string_equal(o.mode, "1");
    assert_int_equal(parse(&spec, &o, &err, NULL, WORDS("--ste", "3")), LOOM_OK); /* prefix */
    assert_int_equal(o.steps, 3);
}

static void test_bad_values(void **state) {
    (void)state;
    opts o;
    loom_flag f[16];
    loom_flag_spec spec = spec_of(f, &o);
    loom_error err = {0};
    const struct {
        const char *const *words;
        const char *msg;
    } cases[] = {
        {WORDS("--steps", "0"), "--steps '0': expected an integer in [1, 100]"},
        {WORDS("--steps", "2x"), "--steps '2x': expected an integer in [1, 100]"},
        {WORDS("--lr", "2"), "--lr: expected [0, 1]"},
        {WORDS("--temperature", "0"), "--temperature '0': expected (0, 10]"},
        {WORDS("--seed", "-1"), "--seed '-1': expected an integer in [0, 2e+19]"},
        {WORDS("--mode=medium"), "--mode 'medium': expected fast or slow"},
        {WORDS("--steps"), "option '--steps' needs a value"},
        {WORDS("-o"), "option '-o' needs a value"},
        {WORDS("--stesp", "3"), "unknown option '--stesp': did you mean --steps? (see --help)"},
        {WORDS("--zzzzzz"), "unknown option '--zzzzzz' (see --help)"},
        {WORDS("-q"), "unknown option '-q' (see --help)"},
        {WORDS("--quick=1"), "option '--quick=1' takes no value (see --help)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(parse(&spec, &o, &err, NULL, cases[i].words), LOOM_ERR_INPUT);
        assert_string_equal(err.msg, cases[i].msg);
    }
    spec.positional = 0;
    assert_int_equal(parse(&spec, &o, &err, NULL, WORDS("--quick", "stray")), LOOM_ERR_INPUT);
    assert_string_equal(err.msg, "unexpected argument 'stray' (see --help)");
    spec.exact = 1;
    spec.see = "see --help; more";
    assert_int_equal(parse(&spec, &o, &err, NULL, WORDS("--ste", "3")), LOOM_ERR_INPUT);
    assert_string_equal(err.msg,
                        "unknown option '--ste': did you mean --steps? (see --help; more)");
    assert_int_equal(parse(&spec, &o, &err, NULL, WORDS("--steps=3", "--quick")), LOOM_OK);
    assert_int_equal(parse(&spec, &o, &err, NULL, WORDS("-h", "--zzz")), 99); /* help first */
}

static void test_take_and_outer(void **state) {
    (void)state;
    opts o = {0};
    loom_flag f[16];
    loom_flag_spec spec = spec_of(f, &o);
    char *argv[] = {"x", "--steps", "4", "--other", "1", "-o", "p", "--lr=0.25", "--more"};
    char *rest[16];
    int n_rest = 0, help = 0;
    loom_error err = {0};
    assert_int_equal(loom_flags_take(&spec, 9, argv, rest, &n_rest, &help, &err), LOOM_OK);
    assert_int_equal(o.steps, 4);
    assert_string_equal(o.out, "p");
    assert_true(o.lr == 0.25);
    assert_int_equal(n_rest, 3);
    assert_string_equal(rest[0], "--other");
    assert_string_equal(rest[1], "1");
    assert_string_equal(rest[2], "--more");
    char *bad[] = {"x", "--steps"};
    n_rest = 0;
    assert_int_equal(loom_flags_take(&spec, 2, bad, rest, &n_rest, &help, &err), LOOM_ERR_INPUT);
    assert_string_equal(err.msg, "option '--steps' needs a value");
    /* an inner table's unknown flag suggests the outer table's nearest name too */
    int x = 0;
    const loom_flag inner_f[] = {LOOM_FLAG_SW(0, "alpha", &x, "a")};
    const loom_flag_spec inner = {.flags = inner_f, .n_flags = 1, .also = &spec};
    char *words[] = {"x", "--quik"};
    assert_int_equal(loom_flags_parse(&inner, 2, words, &help, NULL, &err), LOOM_ERR_INPUT);
    assert_string_equal(err.msg, "unknown option '--quik': did you mean --quick? (see --help)");
}

static void test_usage(void **state) {
    (void)state;
    opts o;
    loom_flag f[16];
    loom_flag_spec spec = spec_of(f, &o);
    char *text = NULL;
    size_t size = 0;
    FILE *mem = open_memstream(&text, &size);
    assert_non_null(mem);
    loom_flags_usage(&spec, mem);
    fclose(mem);
    assert_non_null(strstr(text, "usage: loom x [flags] FILE...\n\nRun (docs/training.md):\n"));
    assert_non_null(strstr(text, "  --steps N              steps\n"));
    assert_non_null(strstr(text, "  -h, --help             this help\n\nOutput:\n"));
    assert_non_null(strstr(text, "  -o, --output FILE      where\n"));
    assert_null(strstr(text, "secret"));
    free(text);
}

/* LOOM_FLAG_NUMBER: the kind follows the destination, a bad value is quoted. */
static void test_number_rows(void **state) {
    (void)state;
    int i = 0;
    long l = 0;
    double d = 0;
    float f = 0;
    unsigned long long u = 0;
    const loom_flag t[] = {
        LOOM_FLAG_NUMBER(0, "i", &i, "N", "", 1, 9, "an integer >= 1"),
        LOOM_FLAG_NUMBER(0, "l", &l, "N", "", 0, 1e9, "an integer >= 0"),
        LOOM_FLAG_NUMBER(0, "d", &d, "X", "", 0.5, 1e9, "a number >= 0.5"),
        LOOM_FLAG_NUMBER(0, "f", &f, "X", "", 0, 1, "a number in [0, 1]"),
        LOOM_FLAG_NUMBER(0, "u", &u, "S", "", 0, 2e19, "a seed"),
    };
    assert_int_equal(t[0].kind, LOOM_FLAG_INT);
    assert_int_equal(t[1].kind, LOOM_FLAG_LONG);
    assert_int_equal(t[2].kind, LOOM_FLAG_DOUBLE);
    assert_int_equal(t[3].kind, LOOM_FLAG_FLOAT);
    assert_int_equal(t[4].kind, LOOM_FLAG_U64);
    const loom_flag_spec spec = {.flags = t, .n_flags = LOOM_FLAGS_COUNT(t)};
    char *good[] = {"x", "--i", "3", "--l=7", "--d", "0.75", "--f", "0.25", "--u", "5"};
    int help = 0;
    loom_error err = {0};
    assert_int_equal(loom_flags_parse(&spec, 10, good, &help, NULL, &err), LOOM_OK);
    assert_true(i == 3 && l == 7 && d == 0.75 && f == 0.25f && u == 5);
    char *bad[] = {"x", "--d", "0.25"};
    assert_int_equal(loom_flags_parse(&spec, 3, bad, &help, NULL, &err), LOOM_ERR_INPUT);
    assert_string_equal(err.msg, "--d '0.25': expected a number >= 0.5");
}

/* Runs loom_flags_run on words; what it printed on stdout and stderr in out and errs. */
static loom_flags_outcome run_capturing(const loom_flag_spec *spec, int argc, char **argv,
                                        char *out, char *errs, size_t cap) {
    FILE *o = tmpfile(), *e = tmpfile();
    assert_true(o && e);
    fflush(stdout);
    fflush(stderr);
    int keep_out = dup(1), keep_err = dup(2);
    dup2(fileno(o), 1);
    dup2(fileno(e), 2);
    loom_flags_outcome fo = loom_flags_run(spec, "loom x", argc, argv, NULL);
    fflush(stdout);
    fflush(stderr);
    dup2(keep_out, 1);
    dup2(keep_err, 2);
    close(keep_out);
    close(keep_err);
    char *bufs[2] = {out, errs};
    FILE *files[2] = {o, e};
    for (int k = 0; k < 2; k++) {
        rewind(files[k]);
        size_t n = fread(bufs[k], 1, cap - 1, files[k]);
        bufs[k][n] = 0;
        fclose(files[k]);
    }
    return fo;
}

static void test_run(void **state) {
    (void)state;
    opts o = {0};
    loom_flag f[16];
    loom_flag_spec spec = spec_of(f, &o);
    char out[4096], errs[512];
    char *good[] = {"x", "--steps", "5", "a.txt"};
    assert_int_equal(run_capturing(&spec, 4, good, out, errs, sizeof out), LOOM_FLAGS_GO);
    assert_int_equal(o.steps, 5);
    assert_string_equal(out, "");
    assert_string_equal(errs, "");
    char *help[] = {"x", "--steps", "5", "--help"};
    assert_int_equal(run_capturing(&spec, 4, help, out, errs, sizeof out), LOOM_FLAGS_HELP);
    assert_int_equal(LOOM_FLAGS_HELP, 0); /* the exit status */
    assert_non_null(strstr(out, "usage: loom x [flags] FILE...\n\nRun (docs/training.md):\n"));
    assert_string_equal(errs, "");
    char *bad[] = {"x", "--stesp", "5"};
    assert_int_equal(run_capturing(&spec, 3, bad, out, errs, sizeof out), LOOM_FLAGS_BAD);
    assert_int_equal(LOOM_FLAGS_BAD, 2);
    assert_string_equal(out, "");
    assert_string_equal(errs,
                        "loom x: unknown option '--stesp': did you mean --steps? (see --help)\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),         cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_take_and_outer), cmocka_unit_test(test_usage),
        cmocka_unit_test(test_number_rows),    cmocka_unit_test(test_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
