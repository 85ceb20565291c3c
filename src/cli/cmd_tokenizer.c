/* loom tokenizer encode|decode|train: byte-level BPE (GPT-2's) on stdin/stdout. */
#include "core/flags.h"
#include "cli/cmd_tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/bpe_train.h"
#include "data/tokenizer.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "loom tokenizer: " __VA_ARGS__);                                           \
        fputc('\n', stderr);                                                                       \
        return 2;                                                                                  \
    } while (0)

static int buf_append(loom_byte_buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n) cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->n, data, n);
    b->n += n;
    return 0;
}

static int read_stream(FILE *f, const char *name, loom_byte_buf *b) {
    char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (buf_append(b, chunk, got) != 0) FAIL("%s: out of memory", name);
    if (ferror(f)) FAIL("%s: read failed: %s", name, strerror(errno));
    return 0;
}

typedef struct {
    const char *tokenizer, *input, *out;
    long vocab_size;
} options;

static const loom_flag_group GROUPS[] = {{"encode and decode", "docs/data.md"},
                                         {"train", "docs/data.md"}};

/* The flags of every subcommand (each refuses the others' in parse), in flags. */
static loom_flag_spec spec_of(options *o, loom_flag (*flags)[4]) {
    const loom_flag f[4] = {
        LOOM_FLAG_STR(0, "tokenizer", &o->tokenizer, "gpt2|DIR",
                      "gpt2 (the default) is looked up in $LOOM_TOKENIZER_DIR, then in\n"
                      "<loom's folder>/../third_party/gpt2 (scripts/fetch_gpt2_tokenizer.sh\n"
                      "fills it); a folder holds encoder.json + vocab.bpe"),
        LOOM_FLAG_STR(1, "input", &o->input, "FILE", "the text to learn from"),
        LOOM_FLAG_STR(1, "out", &o->out, "DIR", "writes DIR/encoder.json and DIR/vocab.bpe"),
        LOOM_FLAG_NUM(1, "vocab-size", LOOM_FLAG_LONG, &o->vocab_size, "N",
                      "tokens: 256 bytes + merges + <|endoftext|>", 257, 1 << 24, NULL),
    };
    memcpy(*flags, f, sizeof f);
    return (loom_flag_spec){
        .usage = "usage: loom tokenizer encode [--tokenizer gpt2|DIR]   < text > ids\n"
                 "       loom tokenizer decode [--tokenizer gpt2|DIR]   < ids > text\n"
                 "       loom tokenizer train --input FILE --vocab-size N --out DIR",
        .about =
            "  encode prints the token ids of stdin separated by spaces (newline at the end);\n"
            "  decode reads whitespace-separated ids and writes their bytes;\n"
            "  train learns a byte-level BPE.",
        LOOM_FLAGS_TABLE(*flags, GROUPS)};
}

/* The subcommand's flags: LOOM_FLAGS_GO, or what the subcommand returns (the help was
 * printed, or one line on stderr). */
static loom_flags_outcome parse(int argc, char **argv, options *o, int train) {
    loom_flag flags[4];
    const loom_flag_spec spec = spec_of(o, &flags);
    loom_flags_outcome fo = loom_flags_run(&spec, "loom tokenizer", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    const char *wrong = train           ? (o->tokenizer ? "tokenizer" : NULL)
                        : o->input      ? "input"
                        : o->out        ? "out"
                        : o->vocab_size ? "vocab-size"
                                        : NULL;
    if (!wrong) return LOOM_FLAGS_GO;
    fprintf(stderr, "loom tokenizer: %s: option '--%s' does not apply (see --help)\n", argv[0],
            wrong);
    return LOOM_FLAGS_BAD;
}

static int load(const options *o, loom_tokenizer **tok) {
    loom_error err = {0};
    if (loom_tokenizer_load(tok, o->tokenizer ? o->tokenizer : "gpt2", &err) != LOOM_OK)
        FAIL("%s", err.msg);
    return 0;
}

static int cmd_encode(int argc, char **argv) {
    options o = {0};
    loom_flags_outcome fo = parse(argc, argv, &o, 0);
    if (fo != LOOM_FLAGS_GO) return fo;
    loom_tokenizer *tok = NULL;
    if (load(&o, &tok)) return 2;
    loom_byte_buf text = {0};
    loom_token_buf ids = {0};
    loom_error err = {0};
    int rc = read_stream(stdin, "stdin", &text);
    if (rc == 0 && loom_tokenizer_encode(tok, text.data, text.n, &ids, &err) != LOOM_OK) {
        fprintf(stderr, "loom tokenizer: encode: %s\n", err.msg);
        rc = 2;
    }
    if (rc == 0) {
        char *buf = malloc(ids.n * 12 + 2), *p = buf;
        for (size_t i = 0; buf && i < ids.n; i++) {
            char tmp[12];
            int k = 0;
            uint32_t v = (uint32_t)ids.ids[i];
            do tmp[k++] = (char)('0' + v % 10);
            while ((v /= 10) > 0);
            if (i) *p++ = ' ';
            while (k > 0) *p++ = tmp[--k];
        }
        if (!buf) {
            fprintf(stderr, "loom tokenizer: out of memory printing %zu ids\n", ids.n);
            rc = 2;
        } else if ((*p++ = '\n') &&
                   (fwrite(buf, 1, (size_t)(p - buf), stdout) != (size_t)(p - buf) ||
                    fflush(stdout))) {
            fprintf(stderr, "loom tokenizer: stdout: write failed: %s\n", strerror(errno));
            rc = 2;
        }
        free(buf);
    }
    free(text.data);
    free(ids.ids);
    loom_tokenizer_free(tok);
    return rc;
}

static int cmd_decode(int argc, char **argv) {
    options o = {0};
    loom_flags_outcome fo = parse(argc, argv, &o, 0);
    if (fo != LOOM_FLAGS_GO) return fo;
    loom_tokenizer *tok = NULL;
    if (load(&o, &tok)) return 2;
    loom_byte_buf text = {0}, out = {0};
    loom_token_buf ids = {0};
    loom_error err = {0};
    int rc = read_stream(stdin, "stdin", &text) || buf_append(&text, "", 1) ? 2 : 0;
    int32_t v = loom_tokenizer_vocab_size(tok);
    for (size_t i = 0, k = 0; rc == 0 && i + 1 < text.n; k++) {
        while (i + 1 < text.n && strchr(" \t\r\n\f\v", text.data[i])) i++;
        if (i + 1 >= text.n) break;
        char *s = (char *)text.data + i, *end = NULL;
        errno = 0;
        long id = strtol(s, &end, 10);
        if (end == s || errno || !(*end == '\0' || strchr(" \t\r\n\f\v", *end)) || id < 0 ||
            id >= v) {
            int w = (int)strcspn(s, " \t\r\n\f\v");
            fprintf(stderr,
                    "loom tokenizer: decode: stdin id %zu '%.*s': expected an integer "
                    "in [0, %d)\n",
                    k, w > 40 ? 40 : w, s, v);
            rc = 2;
            break;
        }
        i = (size_t)(end - (char *)text.data);
        int32_t id32 = (int32_t)id;
        if (ids.n == ids.cap) {
            size_t cap = ids.cap ? ids.cap * 2 : 4096;
            int32_t *p = realloc(ids.ids, cap * sizeof *p);
            if (!p) {
                fprintf(stderr, "loom tokenizer: decode: out of memory\n");
                rc = 2;
                break;
            }
            ids.ids = p;
            ids.cap = cap;
        }
        ids.ids[ids.n++] = id32;
    }
    if (rc == 0 && loom_tokenizer_decode(tok, ids.ids, ids.n, &out, &err) != LOOM_OK) {
        fprintf(stderr, "loom tokenizer: decode: %s\n", err.msg);
        rc = 2;
    }
    if (rc == 0 && (fwrite(out.data, 1, out.n, stdout) != out.n || fflush(stdout))) {
        fprintf(stderr, "loom tokenizer: stdout: write failed: %s\n", strerror(errno));
        rc = 2;
    }
    free(text.data);
    free(out.data);
    free(ids.ids);
    loom_tokenizer_free(tok);
    return rc;
}

static int cmd_train(int argc, char **argv) {
    options o = {0};
    loom_flags_outcome fo = parse(argc, argv, &o, 1);
    if (fo != LOOM_FLAGS_GO) return fo;
    if (!o.input || !o.out || !o.vocab_size)
        FAIL("train: %s is required", !o.input ? "--input" : !o.out ? "--out" : "--vocab-size");
    FILE *f = strcmp(o.input, "-") == 0 ? stdin : fopen(o.input, "rb");
    if (!f) FAIL("--input '%s': cannot open: %s", o.input, strerror(errno));
    loom_byte_buf text = {0};
    int rc = read_stream(f, o.input, &text);
    if (f != stdin) fclose(f);
    if (rc == 0 && text.n == 0) {
        fprintf(stderr, "loom tokenizer: --input '%s': empty file, expected text\n", o.input);
        rc = 2;
    }
    if (rc == 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        loom_bpe_train_stats stats = {0};
        loom_error err = {0};
        if (loom_bpe_train(text.data, text.n, (int32_t)o.vocab_size, o.out, &stats, &err) !=
            LOOM_OK) {
            fprintf(stderr, "loom tokenizer: train: %s\n", err.msg);
            rc = 2;
        } else {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            fprintf(stderr,
                    "loom tokenizer: %zu bytes, %lld pieces, %lld distinct -> %d merges, %d "
                    "tokens in %.2f s (%s/encoder.json, %s/vocab.bpe)%s\n",
                    text.n, (long long)stats.n_pieces, (long long)stats.n_words, stats.n_merges,
                    stats.n_tokens, s, o.out, o.out,
                    stats.n_tokens < o.vocab_size ? " [fewer than asked: no pairs left]" : "");
        }
    }
    free(text.data);
    return rc;
}

int loom_cmd_tokenizer(int argc, char **argv) {
    if (argc < 2)
        FAIL("expected a subcommand (encode, decode, train); see 'loom tokenizer --help'");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        options o = {0};
        loom_flag flags[4];
        const loom_flag_spec spec = spec_of(&o, &flags);
        loom_flags_usage(&spec, stdout);
        return 0;
    }
    if (strcmp(argv[1], "encode") == 0) return cmd_encode(argc - 1, argv + 1);
    if (strcmp(argv[1], "decode") == 0) return cmd_decode(argc - 1, argv + 1);
    if (strcmp(argv[1], "train") == 0) return cmd_train(argc - 1, argv + 1);
    FAIL("unknown subcommand '%s' (expected encode, decode, train)", argv[1]);
}
