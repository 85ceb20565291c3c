/* loom data bytes: turns any file into byte-level token shards (vocab 256). */
#include "cli/cmd_data.h"
#include "core/fs.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/dataset.h"

static const char usage[] =
    "usage: loom data bytes --input FILE|- --out DIR [--val-fraction F] [--token-bytes 2|4]\n"
    "  Writes DIR/train_000000.bin and DIR/val_000000.bin with one token per input byte\n"
    "  (vocab 256); the last F of the bytes (default 0.01) become the validation shard.\n";

/* Reads a whole file ("-" = stdin) into a malloc'd buffer. */
static int read_all(const char *path, unsigned char **data, size_t *n) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "loom data: --input '%s': cannot open: %s\n", path, strerror(errno));
        return 2;
    }
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            unsigned char *bigger = realloc(buf, cap * 2);
            if (!bigger) break;
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int failed = !buf || len == cap || ferror(f);
    int e = errno;
    if (f != stdin) fclose(f);
    if (failed) {
        fprintf(stderr, "loom data: --input '%s': read failed: %s\n", path,
                buf ? strerror(e) : "out of memory");
        free(buf);
        return 2;
    }
    *data = buf;
    *n = len;
    return 0;
}

/* Converts bytes [from, from + n) to tokens and writes DIR/NAME. */
static int write_split(const char *dir, const char *name, const unsigned char *bytes, size_t n,
                       int token_bytes, char *path, size_t path_cap) {
    snprintf(path, path_cap, "%s/%s", dir, name);
    int32_t *tokens = malloc((n ? n : 1) * sizeof *tokens);
    if (!tokens) {
        fprintf(stderr, "loom data: %s: out of memory for %zu tokens\n", path, n);
        return 2;
    }
    for (size_t i = 0; i < n; i++) tokens[i] = bytes[i];
    loom_error err = {0};
    loom_status st = loom_shard_write(path, tokens, (int64_t)n, token_bytes, &err);
    free(tokens);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        return 2;
    }
    return 0;
}

static int cmd_bytes(int argc, char **argv) {
    static const struct option opts[] = {
        {"input", required_argument, NULL, 'i'},
        {"out", required_argument, NULL, 'o'},
        {"val-fraction", required_argument, NULL, 'v'},
        {"token-bytes", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *input = NULL, *out = NULL;
    double val_fraction = 0.01;
    int token_bytes = 2;
    optind = 0; /* glibc: full reset, so the command can run twice in one process */
    opterr = 0; /* we print our own one-line messages */
    int c;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'i':
            input = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'v':
            errno = 0;
            val_fraction = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(val_fraction >= 0 && val_fraction < 1)) {
                fprintf(stderr, "loom data: --val-fraction '%s': expected a number in [0, 1)\n",
                        optarg);
                return 2;
            }
            break;
        case 't':
            if (strcmp(optarg, "2") != 0 && strcmp(optarg, "4") != 0) {
                fprintf(stderr, "loom data: --token-bytes '%s': expected 2 or 4\n", optarg);
                return 2;
            }
            token_bytes = atoi(optarg);
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        case ':':
            fprintf(stderr, "loom data: option '%s' needs a value\n", argv[optind - 1]);
            return 2;
        default:
            if (optopt)
                fprintf(stderr, "loom data: unknown option '-%c' (see --help)\n", optopt);
            else
                fprintf(stderr, "loom data: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "loom data: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!input || !out) {
        fprintf(stderr, "loom data: %s is required\n", !input ? "--input" : "--out");
        return 2;
    }

    unsigned char *bytes = NULL;
    size_t n = 0;
    if (read_all(input, &bytes, &n) != 0) return 2;
    size_t n_val = (size_t)llround(val_fraction * (double)n);
    if (val_fraction > 0 && n_val == 0 && n > 1) n_val = 1; /* a val file should not be empty */
    if (n_val >= n) n_val = n ? n - 1 : 0;
    size_t n_train = n - n_val;
    int rc = 0;
    if (n_train == 0) {
        fprintf(stderr, "loom data: --input '%s': empty input, expected at least 1 byte\n", input);
        rc = 2;
    } else if (loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create directory: %s\n", out,
                strerror(errno));
        rc = 2;
    }
    size_t cap = strlen(out) + 32;
    char *train_path = malloc(cap), *val_path = malloc(cap);
    if (rc == 0 && (!train_path || !val_path)) {
        fprintf(stderr, "loom data: out of memory\n");
        rc = 2;
    }
    if (rc == 0)
        rc = write_split(out, "train_000000.bin", bytes, n_train, token_bytes, train_path, cap);
    if (rc == 0 && val_fraction > 0)
        rc = write_split(out, "val_000000.bin", bytes + n_train, n_val, token_bytes, val_path, cap);
    if (rc == 0)
        fprintf(stderr, "loom data: %zu bytes -> %zu train tokens (%s), %zu val tokens (%s)\n", n,
                n_train, train_path, n_val, val_fraction > 0 ? val_path : "no val file");
    free(train_path);
    free(val_path);
    free(bytes);
    return rc;
}

int loom_cmd_data(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "loom data: expected a subcommand (bytes); see 'loom data --help'\n");
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(argv[1], "bytes") == 0) return cmd_bytes(argc - 1, argv + 1);
    fprintf(stderr, "loom data: unknown subcommand '%s' (expected: bytes)\n", argv[1]);
    return 2;
}
