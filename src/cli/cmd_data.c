/* loom data bytes: any file -> byte-level token shards (vocab 256);
 * loom data prepare: text documents -> BPE token shards (data/prepare.h);
 * loom data images / video: see cmd_data_images.c. */
#include "cli/cmd_data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmd_data_arith.h"
#include "cli/cmd_data_images.h"
#include "cli/cmd_data_vlm.h"
#include "core/fs.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/shard_stream.h"
#include "data/tokenizer.h"

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

static int cmd_bytes(int argc, char **argv, const loom_data_help *help) {
    const char *input = NULL, *out = NULL;
    double val_fraction = 0.01;
    int token_bytes = 2;
    const loom_data_flag flags[] = {
        {"input", LOOM_DATA_FLAG_STR, .required = 1, .str = &input},
        {"out", LOOM_DATA_FLAG_STR, .required = 1, .str = &out},
        {"val-fraction", LOOM_DATA_FLAG_FRACTION, .f64 = &val_fraction},
        {"token-bytes", LOOM_DATA_FLAG_CHOICE, .choice = &token_bytes,
         .choices = (const char *const[]){"2", "4", NULL}, .values = (const int[]){2, 4}},
    };
    int rc = loom_data_parse_flags(argc, argv, flags, LOOM_DATA_N_FLAGS(flags), help);
    if (rc >= 0) return rc;

    unsigned char *bytes = NULL;
    size_t n = 0;
    if (read_all(input, &bytes, &n) != 0) return 2;
    size_t n_val = (size_t)llround(val_fraction * (double)n);
    if (val_fraction > 0 && n_val == 0 && n > 1) n_val = 1; /* a val file should not be empty */
    if (n_val >= n) n_val = n ? n - 1 : 0;
    size_t n_train = n - n_val;
    rc = 0;
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

/* Progress on stderr: redrawn with \r on a terminal (10 per second), else a line every 10 s. */
typedef struct {
    int tty, drawn;
    double last;
} progress_state;

static void show_progress(void *ctx, const loom_prepare_stats *s) {
    progress_state *p = ctx;
    if (s->seconds - p->last < (p->tty ? 0.1 : 10.0)) return;
    p->last = s->seconds;
    double mb = (double)s->bytes_read / 1e6, rate = s->seconds > 0 ? mb / s->seconds : 0;
    char total[64] = "";
    if (s->bytes_total > 0)
        snprintf(total, sizeof total, " / %.1f MB (%.0f%%)", (double)s->bytes_total / 1e6,
                 100.0 * (double)s->bytes_read / (double)s->bytes_total);
    fprintf(stderr, "%sloom data: %.1f MB%s, %.1f MB/s, %lld documents, %lld tokens%s",
            p->tty ? "\r" : "", mb, total, rate, (long long)s->n_docs,
            (long long)(s->train_tokens + s->val_tokens), p->tty ? "\033[K" : "\n");
    p->drawn = p->tty;
}

static void print_split(const char *out, const char *split, int64_t tokens, int shards) {
    char first[4096], last[4096];
    if (shards == 0) {
        fprintf(stderr, "loom data: %s: 0 tokens, no shard written\n", split);
        return;
    }
    loom_prepare_shard_path(first, sizeof first, out, split, 0);
    loom_prepare_shard_path(last, sizeof last, out, split, shards - 1);
    fprintf(stderr, "loom data: %s: %lld tokens in %d shard%s: %s%s%s\n", split, (long long)tokens,
            shards, shards == 1 ? "" : "s", first, shards > 1 ? " .. " : "",
            shards > 1 ? last : "");
}

static int cmd_prepare(int argc, char **argv, const loom_data_help *help) {
    loom_prepare_options o = {.val_fraction = 0.005, .shard_tokens = 100000000};
    const char *tokenizer = NULL;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        fprintf(stderr, "loom data: out of memory\n");
        return 2;
    }
    o.inputs = inputs;
    int doc_sep = LOOM_DOC_SEP_FILE;
    const loom_data_flag flags[] = {
        {"input", LOOM_DATA_FLAG_STRS, .required = 1, .str = inputs, .count = &o.n_inputs},
        {"tokenizer", LOOM_DATA_FLAG_STR, .required = 1, .str = &tokenizer},
        {"out", LOOM_DATA_FLAG_STR, .required = 1, .str = &o.out_dir},
        {"val-fraction", LOOM_DATA_FLAG_FRACTION, .f64 = &o.val_fraction},
        {"shard-tokens", LOOM_DATA_FLAG_INT, .i64 = &o.shard_tokens, .lo = 1, .hi = INT32_MAX},
        {"doc-separator", LOOM_DATA_FLAG_CHOICE, .choice = &doc_sep,
         .choices = (const char *const[]){"blank-line", "file", NULL},
         .values = (const int[]){LOOM_DOC_SEP_BLANK_LINE, LOOM_DOC_SEP_FILE}},
    };
    int rc = loom_data_parse_flags(argc, argv, flags, LOOM_DATA_N_FLAGS(flags), help);
    o.doc_sep = (loom_doc_sep)doc_sep;
    loom_tokenizer *tok = NULL;
    loom_error err = {0};
    if (rc < 0 && loom_tokenizer_load(&tok, tokenizer, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        rc = 2;
    }
    if (rc < 0) {
        progress_state ps = {.tty = isatty(2)};
        o.progress = show_progress;
        o.progress_ctx = &ps;
        loom_prepare_stats s;
        loom_status st = loom_prepare_run(tok, &o, &s, &err);
        if (ps.drawn) fputc('\n', stderr);
        if (st != LOOM_OK) {
            fprintf(stderr, "loom data: %s\n", err.msg);
            rc = 2;
        } else {
            double mb = (double)s.bytes_read / 1e6;
            fprintf(stderr,
                    "loom data: %lld documents (%lld train, %lld val) from %lld file(s), %.2f MB "
                    "in %.2f s (%.1f MB/s)\n",
                    (long long)s.n_docs, (long long)(s.n_docs - s.n_val_docs),
                    (long long)s.n_val_docs, (long long)s.n_files, mb, s.seconds,
                    s.seconds > 0 ? mb / s.seconds : 0.0);
            print_split(o.out_dir, "train", s.train_tokens, s.train_shards);
            print_split(o.out_dir, "val", s.val_tokens, s.val_shards);
            if (s.stale_removed)
                fprintf(stderr, "loom data: removed %d shard file(s) of an earlier run\n",
                        s.stale_removed);
            rc = 0;
        }
    }
    loom_tokenizer_free(tok);
    free(inputs);
    return rc;
}

/* Each subcommand and its help; loom data --help prints every help, in this order, under
 * their groups' headings. */
static const struct {
    loom_data_help help;
    int (*run)(int argc, char **argv, const loom_data_help *help);
} SUB[] = {
    {{"prepare", "Text to token shards", "docs/data.md",
      "loom data prepare --input FILE|GLOB|- [--input ...] --tokenizer gpt2|DIR --out DIR\n"
      "                         [--val-fraction F] [--shard-tokens N]\n"
      "                         [--doc-separator blank-line|file]",
      "  Encodes text documents with a BPE tokenizer into DIR/train_NNNNNN.bin and\n"
      "  DIR/val_NNNNNN.bin (llm.c shards, uint16 tokens when the vocabulary fits, else\n"
      "  uint32), each document preceded by <|endoftext|>. Globs are expanded in sorted\n"
      "  order; - is stdin. --doc-separator file (default): each file is one document;\n"
      "  blank-line: documents are separated by one or more empty lines. --shard-tokens:\n"
      "  at most N tokens per shard (default 100000000). --val-fraction F (default 0.005):\n"
      "  document k (k = 1, 2, ... in input order) goes to val when floor(k*F) >\n"
      "  floor((k-1)*F), i.e. every (1/F)-th document; the first is always train. The\n"
      "  input is streamed: memory does not grow with the input or shard size."},
     cmd_prepare},
    {{"bytes", "Text to token shards", "docs/data.md",
      "loom data bytes --input FILE|- --out DIR [--val-fraction F] [--token-bytes 2|4]",
      "  Writes DIR/train_000000.bin and DIR/val_000000.bin with one token per input byte\n"
      "  (vocab 256); the last F of the bytes (default 0.01) become the validation shard."},
     cmd_bytes},
    {{"images", "Images and clips", "docs/data.md",
      "loom data images --input IMAGES [--labels LABELS] --out DIR\n"
      "                        [--val-input I [--val-labels L] | --val-fraction F]\n"
      "                        [--shard-samples N] [--n-classes K] [--channels 1|3|auto]",
      "  Packs labelled images into image shards DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin\n"
      "  (docs/data.md). IMAGES is an IDX image file (.gz or plain; then --labels is its\n"
      "  IDX label file), a folder with one subfolder of PNG files per class (class = the\n"
      "  subfolder's position in sorted order; --channels, default auto: 1 when every pixel\n"
      "  is gray), or fashion-mnist: Debian's dataset-fashion-mnist files, with t10k as val.\n"
      "  --val-input/--val-labels: the val split from other files (same kind); else sample k\n"
      "  (0-based) goes to val when floor((k+1)F) > floor(kF) (--val-fraction, default 0.005).\n"
      "  --n-classes (default: the largest label + 1, or the number of class subfolders).\n"
      "  --shard-samples: at most N samples per shard (default 100000)."},
     loom_cmd_data_images},
    {{"video", "Images and clips", "docs/data.md",
      "loom data video --from-images GLOB --out DIR [--frames 8] [--size 48]\n"
      "                       [--objects 2] [--clips 2000] [--val-clips N] [--seed 1]\n"
      "                       [--val-from-images GLOB] [--shard-samples N] [--preview FILE]",
      "  Moving-object clips (\"moving Fashion-MNIST\"): each clip has --frames frames on a\n"
      "  --size x --size canvas with --objects images of the GLOB shards moving at 1-3 px per\n"
      "  frame and bouncing off the borders; label = the first object's class. Written as\n"
      "  video shards DIR/train_*.bin (--clips) and DIR/val_*.bin (--val-clips, default\n"
      "  clips/10, from --val-from-images, default GLOB, on another random stream).\n"
      "  --preview FILE: the first 16 train clips as an animated GIF (.gif) or a PNG strip."},
     loom_cmd_data_video},
    {{"arith", "Arithmetic for RL", "docs/rl.md",
      "loom data arith --out DIR [--op +|*|countdown] [--digits D (3)] [--train N (20000)]\n"
      "                       [--val N (500)] [--seed S (1)] [--numbers K (3)] [--max M (25)]",
      "  Verifiable arithmetic (docs/rl.md): lines \"A+B=C\\n\" with A, B uniform in [0, 10^D),\n"
      "  as byte tokens in DIR/train_000000.bin and DIR/val_000000.bin (held-out pairs chosen\n"
      "  by the seed, never in train), the prompts \"A+B=\" one a line in DIR/train_prompts.txt\n"
      "  and DIR/val_prompts.txt, the answers in DIR/*_answers.txt, and DIR/task.json.\n"
      "  --op countdown: K numbers in [1, M] and a target reached by an expression over them,\n"
      "  prompt \"3 7 25>75=\", answer an expression (each number at most once) and a newline."},
     loom_cmd_data_arith},
    {{"vlm", "Image-text for a vlm", "docs/vlm.md",
      "loom data vlm --input fashion-mnist --out DIR [--grid 2|3] [--samples N]\n"
      "                     [--val-samples N] [--questions F] [--mixed-images K]\n"
      "                     [--seed S] [--tokenizer DIR]\n"
      "       loom data vlm --input DIR --out DIR [--val-samples N] [--tokenizer DIR]",
      "  Image-text shards for --family vlm (docs/vlm.md): each sample a grid of Fashion-MNIST\n"
      "  items (2: 56 x 56, 3: 84 x 84) named by position, \"top left: sneaker; top right: bag;\n"
      "  ...\", or with probability F a question (\"how many bags?\", \"where is the coat?\") and\n"
      "  its answer. DIR/train_000000.bin from the training images (--samples, default\n"
      "  20000), DIR/val_000000.bin from t10k (--val-samples, default 1000). Byte tokens, or\n"
      "  --tokenizer DIR's BPE (loom tokenizer train; <image> one past its last token).\n"
      "  --mixed-images K: each sample 0 to K grids, each <image> and its caption (--balance-dp's\n"
      "  mixed workload).\n"
      "  --input DIR: your own NAME.png with NAME.txt beside each (a caption, or a prompt line\n"
      "  and its answer), the last --val-samples (default a tenth) as val."},
     loom_cmd_data_vlm},
};

enum { N_SUB = (int)(sizeof SUB / sizeof *SUB) };

static void print_help(FILE *f) {
    fprintf(f, "usage: loom data bytes|prepare|images|video|arith|vlm [flags]\n");
    for (int k = 0; k < N_SUB; k++) {
        const loom_data_help *h = &SUB[k].help;
        if (k == 0 || strcmp(h->group, SUB[k - 1].help.group) != 0)
            fprintf(f, "\n%s (%s):\n", h->group, h->page);
        fprintf(f, "       %s\n%s\n", h->synopsis, h->about);
    }
}

int loom_cmd_data(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "loom data: expected a subcommand (bytes, prepare, images, video, arith, "
                        "vlm); see 'loom data --help'\n");
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_help(stdout);
        return 0;
    }
    for (int k = 0; k < N_SUB; k++)
        if (strcmp(argv[1], SUB[k].help.name) == 0)
            return SUB[k].run(argc - 1, argv + 1, &SUB[k].help);
    fprintf(stderr,
            "loom data: unknown subcommand '%s' (expected: bytes, prepare, images, video, arith, "
            "vlm)\n",
            argv[1]);
    return 2;
}
