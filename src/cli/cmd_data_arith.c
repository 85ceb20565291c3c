/* loom data arith: verifiable arithmetic tasks for supervised fine-tuning and RL
 * (docs/rl.md). Each example is the line "A+B=C\n" (or "A*B=C\n") in loom's byte-level
 * tokens (vocabulary 256, as loom data bytes). The pair (A, B) is held out when a hash of
 * (seed, A, B) falls in the held-out tenth of its range, so the two splits never share a
 * pair and the split depends only on the seed. */
#include "cli/cmd_data_arith.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_data_images.h"
#include "core/fs.h"
#include "core/philox.h"
#include "data/dataset.h"
#include "rl/countdown.h"

#define ARITH_SPLIT_STREAM 0x61726974u /* "arit": which pairs are held out */
#define ARITH_TRAIN_STREAM 0x61727472u /* draws of the training examples */
#define ARITH_VAL_STREAM 0x61727661u   /* draws of the held-out examples */

static int held_out(uint64_t seed, uint64_t a, uint64_t b) {
    return loom_philox_u64(seed, ARITH_SPLIT_STREAM, a * 0x9e3779b97f4a7c15ull ^ b, 0) % 10 == 0;
}

static uint64_t pow10u(int d) {
    uint64_t p = 1;
    while (d-- > 0) p *= 10;
    return p;
}

/* Example k of a split: the first draw (attempt 0, 1, ...) whose pair is in the split. */
static void draw(uint64_t seed, int val, uint64_t k, uint64_t range, uint64_t *a, uint64_t *b) {
    const uint32_t stream = val ? ARITH_VAL_STREAM : ARITH_TRAIN_STREAM;
    for (uint32_t attempt = 0;; attempt += 2) {
        *a = loom_philox_u64(seed, stream, k, attempt) % range;
        *b = loom_philox_u64(seed, stream, k, attempt + 1) % range;
        if (held_out(seed, *a, *b) == val) return;
    }
}

typedef struct {
    char op; /* '+', '*', or 'c': Countdown */
    int digits, numbers, max;
    int64_t n_train, n_val;
    uint64_t seed;
    const char *out;
} arith_options;

/* Writes one split: its shard (examples as bytes), prompts and answers files. */
static int write_split(const arith_options *o, int val, char *path, size_t cap) {
    const uint64_t range = pow10u(o->digits);
    const int64_t n = val ? o->n_val : o->n_train;
    const char *name = val ? "val" : "train";
    const size_t line_max = 192;
    int32_t *tokens = malloc((size_t)n * line_max * sizeof *tokens);
    FILE *prompts = NULL, *answers = NULL;
    int rc = 0;
    snprintf(path, cap, "%s/%s_prompts.txt", o->out, name);
    if (!tokens) {
        fprintf(stderr, "loom data: out of memory for %lld examples\n", (long long)n);
        return 2;
    }
    if (!(prompts = fopen(path, "w"))) rc = 1;
    snprintf(path, cap, "%s/%s_answers.txt", o->out, name);
    if (!rc && !(answers = fopen(path, "w"))) rc = 1;
    int64_t used = 0;
    for (int64_t k = 0; !rc && o->op == 'c' && k < n; k++) {
        char prompt[96], answer[96];
        loom_countdown_draw(o->seed, val, (uint64_t)k, o->numbers, o->max, prompt, answer);
        for (const char *c = prompt; *c; c++) tokens[used++] = (unsigned char)*c;
        for (const char *c = answer; *c; c++) tokens[used++] = (unsigned char)*c;
        if (fprintf(prompts, "%s\n", prompt) < 0 || fprintf(answers, "%s", answer) < 0) rc = 1;
    }
    for (int64_t k = 0; !rc && o->op != 'c' && k < n; k++) {
        uint64_t a, b;
        draw(o->seed, val, (uint64_t)k, range, &a, &b);
        unsigned long long c = o->op == '+' ? a + b : a * b;
        char line[64];
        int len = snprintf(line, sizeof line, "%llu%c%llu=%llu\n", (unsigned long long)a, o->op,
                           (unsigned long long)b, c);
        for (int i = 0; i < len; i++) tokens[used++] = (unsigned char)line[i];
        if (fprintf(prompts, "%llu%c%llu=\n", (unsigned long long)a, o->op, (unsigned long long)b) <
                0 ||
            fprintf(answers, "%llu\n", c) < 0)
            rc = 1;
    }
    if (prompts && fclose(prompts)) rc = 1;
    if (answers && fclose(answers)) rc = 1;
    if (rc) {
        fprintf(stderr, "loom data: %s: cannot write: %s\n", path, strerror(errno));
        free(tokens);
        return 2;
    }
    snprintf(path, cap, "%s/%s_000000.bin", o->out, name);
    loom_error err = {0};
    if (loom_shard_write(path, tokens, used, 2, &err)) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        rc = 2;
    }
    free(tokens);
    return rc;
}

int loom_cmd_data_arith(int argc, char **argv, const loom_data_help *help) {
    const char *out = NULL;
    int op = '+';
    int64_t digits = 3, n_train = 20000, n_val = 500, seed = 1, numbers = 3, max = 25;
    const loom_data_flag flags[] = {
        {"out", LOOM_DATA_FLAG_STR, .required = 1, .str = &out},
        {"op", LOOM_DATA_FLAG_CHOICE, .choice = &op,
         .choices = (const char *const[]){"+", "*", "countdown", NULL},
         .values = (const int[]){'+', '*', 'c'}},
        {"digits", LOOM_DATA_FLAG_INT, .i64 = &digits, .lo = 1, .hi = 9},
        {"numbers", LOOM_DATA_FLAG_INT, .i64 = &numbers, .lo = 2, .hi = LOOM_COUNTDOWN_MAX_NUMBERS},
        {"max", LOOM_DATA_FLAG_INT, .i64 = &max, .lo = 2, .hi = 99},
        {"train", LOOM_DATA_FLAG_INT, .i64 = &n_train, .lo = 1, .hi = 100000000},
        {"val", LOOM_DATA_FLAG_INT, .i64 = &n_val, .lo = 1, .hi = 100000000},
        {"seed", LOOM_DATA_FLAG_INT, .i64 = &seed, .lo = 0, .hi = INT64_MAX},
    };
    int rc = loom_data_parse_flags(argc, argv, flags, LOOM_DATA_N_FLAGS(flags), help);
    if (rc >= 0) return rc;
    if (loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create directory: %s\n", out,
                strerror(errno));
        return 2;
    }
    arith_options o = {(char)op, (int)digits, (int)numbers,   (int)max,
                       n_train,  n_val,       (uint64_t)seed, out};
    size_t cap = strlen(out) + 64;
    char *path = malloc(cap);
    if (!path) {
        fprintf(stderr, "loom data: out of memory\n");
        return 2;
    }
    rc = write_split(&o, 0, path, cap);
    if (!rc) rc = write_split(&o, 1, path, cap);
    if (!rc) {
        snprintf(path, cap, "%s/task.json", out);
        FILE *f = fopen(path, "w");
        const int wrote = !f ? -1
                          : o.op == 'c'
                              ? fprintf(f,
                                        "{\"op\": \"countdown\", \"numbers\": %d, "
                                        "\"max\": %d}\n",
                                        o.numbers, o.max)
                              : fprintf(f, "{\"op\": \"%c\", \"digits\": %d}\n", o.op, o.digits);
        if (!f || wrote < 0 || fclose(f)) {
            fprintf(stderr, "loom data: %s: cannot write: %s\n", path, strerror(errno));
            rc = 2;
        }
    }
    if (!rc && o.op == 'c')
        fprintf(stderr,
                "loom data: %lld train and %lld held-out Countdown instances (%d numbers in "
                "[1, %d]) in %s (train/val_000000.bin, *_prompts.txt, *_answers.txt, task.json)\n",
                (long long)n_train, (long long)n_val, o.numbers, o.max, out);
    else if (!rc)
        fprintf(stderr,
                "loom data: %lld train and %lld held-out examples of %d-digit '%c' in %s "
                "(train/val_000000.bin, *_prompts.txt, *_answers.txt, task.json)\n",
                (long long)n_train, (long long)n_val, o.digits, o.op, out);
    free(path);
    return rc;
}
