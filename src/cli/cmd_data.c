/* loom data bytes: any file -> byte-level token shards (vocab 256);
 * loom data prepare: text documents -> BPE token shards (data/prepare.h);
 * loom data images: IDX files or PNG folders -> image shards (data/image_shard.h);
 * loom data video: image shards -> moving-object clip shards (data/moving_clips.h). */
#include "cli/cmd_data.h"
#include "core/fs.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/idx.h"
#include "data/image_shard.h"
#include "data/moving_clips.h"
#include "data/picture.h"
#include "data/png_folder.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

static const char usage[] =
    "usage: loom data prepare --input FILE|GLOB|- [--input ...] --tokenizer gpt2|DIR --out DIR\n"
    "                         [--val-fraction F] [--shard-tokens N]\n"
    "                         [--doc-separator blank-line|file]\n"
    "  Encodes text documents with a BPE tokenizer into DIR/train_NNNNNN.bin and\n"
    "  DIR/val_NNNNNN.bin (llm.c shards, uint16 tokens when the vocabulary fits, else\n"
    "  uint32), each document preceded by <|endoftext|>. Globs are expanded in sorted\n"
    "  order; - is stdin. --doc-separator file (default): each file is one document;\n"
    "  blank-line: documents are separated by one or more empty lines. --shard-tokens:\n"
    "  at most N tokens per shard (default 100000000). --val-fraction F (default 0.005):\n"
    "  document k (k = 1, 2, ... in input order) goes to val when floor(k*F) >\n"
    "  floor((k-1)*F), i.e. every (1/F)-th document; the first is always train. The\n"
    "  input is streamed: memory does not grow with the input or shard size.\n"
    "       loom data bytes --input FILE|- --out DIR [--val-fraction F] [--token-bytes 2|4]\n"
    "  Writes DIR/train_000000.bin and DIR/val_000000.bin with one token per input byte\n"
    "  (vocab 256); the last F of the bytes (default 0.01) become the validation shard.\n"
    "       loom data images --input IMAGES [--labels LABELS] --out DIR\n"
    "                        [--val-input I [--val-labels L] | --val-fraction F]\n"
    "                        [--shard-samples N] [--n-classes K] [--channels 1|3|auto]\n"
    "  Packs labelled images into image shards DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin\n"
    "  (docs/IMAGES.md). IMAGES is an IDX image file (.gz or plain; then --labels is its\n"
    "  IDX label file), a folder with one subfolder of PNG files per class (class = the\n"
    "  subfolder's position in sorted order; --channels, default auto: 1 when every pixel\n"
    "  is gray), or fashion-mnist: Debian's dataset-fashion-mnist files, with t10k as val.\n"
    "  --val-input/--val-labels: the val split from other files (same kind); else sample k\n"
    "  (0-based) goes to val when floor((k+1)F) > floor(kF) (--val-fraction, default 0.005).\n"
    "  --n-classes (default: the largest label + 1, or the number of class subfolders).\n"
    "  --shard-samples: at most N samples per shard (default 100000).\n"
    "       loom data video --from-images GLOB --out DIR [--frames 8] [--size 48]\n"
    "                       [--objects 2] [--clips 2000] [--val-clips N] [--seed 1]\n"
    "                       [--val-from-images GLOB] [--shard-samples N] [--preview FILE]\n"
    "  Moving-object clips (\"moving Fashion-MNIST\"): each clip has --frames frames on a\n"
    "  --size x --size canvas with --objects images of the GLOB shards moving at 1-3 px per\n"
    "  frame and bouncing off the borders; label = the first object's class. Written as\n"
    "  video shards DIR/train_*.bin (--clips) and DIR/val_*.bin (--val-clips, default\n"
    "  clips/10, from --val-from-images, default GLOB, on another random stream).\n"
    "  --preview FILE: the first 16 train clips as an animated GIF (.gif) or a PNG strip.\n";

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

static int cmd_prepare(int argc, char **argv) {
    static const struct option opts[] = {
        {"input", required_argument, NULL, 'i'},
        {"out", required_argument, NULL, 'o'},
        {"tokenizer", required_argument, NULL, 't'},
        {"val-fraction", required_argument, NULL, 'v'},
        {"shard-tokens", required_argument, NULL, 's'},
        {"doc-separator", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    loom_prepare_options o = {.val_fraction = 0.005, .shard_tokens = 100000000};
    const char *tokenizer = NULL;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        fprintf(stderr, "loom data: out of memory\n");
        return 2;
    }
    o.inputs = inputs;
    optind = 0;
    opterr = 0;
    int c, rc = -1;
    while (rc < 0 && (c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (c) {
        case 'i':
            inputs[o.n_inputs++] = optarg;
            break;
        case 'o':
            o.out_dir = optarg;
            break;
        case 't':
            tokenizer = optarg;
            break;
        case 'v':
            o.val_fraction = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(o.val_fraction >= 0 && o.val_fraction < 1)) {
                fprintf(stderr, "loom data: --val-fraction '%s': expected a number in [0, 1)\n",
                        optarg);
                rc = 2;
            }
            break;
        case 's':
            o.shard_tokens = strtoll(optarg, &end, 10);
            if (errno || end == optarg || *end || o.shard_tokens < 1 ||
                o.shard_tokens > INT32_MAX) {
                fprintf(stderr,
                        "loom data: --shard-tokens '%s': expected an integer from 1 to %d\n",
                        optarg, INT32_MAX);
                rc = 2;
            }
            break;
        case 'd':
            if (strcmp(optarg, "file") == 0)
                o.doc_sep = LOOM_DOC_SEP_FILE;
            else if (strcmp(optarg, "blank-line") == 0)
                o.doc_sep = LOOM_DOC_SEP_BLANK_LINE;
            else {
                fprintf(stderr, "loom data: --doc-separator '%s': expected blank-line or file\n",
                        optarg);
                rc = 2;
            }
            break;
        case 'h':
            fputs(usage, stdout);
            rc = 0;
            break;
        case ':':
            fprintf(stderr, "loom data: option '%s' needs a value\n", argv[optind - 1]);
            rc = 2;
            break;
        default:
            fprintf(stderr, "loom data: unknown option '%s' (see --help)\n", argv[optind - 1]);
            rc = 2;
        }
    }
    if (rc < 0 && optind < argc) {
        fprintf(stderr, "loom data: unexpected argument '%s'\n", argv[optind]);
        rc = 2;
    }
    if (rc < 0 && (!o.n_inputs || !tokenizer || !o.out_dir)) {
        fprintf(stderr, "loom data: %s is required\n",
                !o.n_inputs  ? "--input"
                : !tokenizer ? "--tokenizer"
                             : "--out");
        rc = 2;
    }
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

/* ---- loom data images / video ---- */

#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Parses an integer flag value in [lo, hi]; prints the one-line error and returns 2. */
static int parse_int64(const char *flag, const char *arg, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "loom data: %s '%s': expected an integer from %lld to %lld\n", flag, arg,
                (long long)lo, (long long)hi);
        return 2;
    }
    *out = v;
    return 0;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One split's samples in memory, from an IDX pair or a PNG folder. */
typedef struct {
    const char *images, *labels; /* the files or folder it came from (for messages) */
    int64_t n;
    int channels, height, width, n_classes; /* n_classes: label max + 1 or subfolder count */
    uint8_t *pixels;
    int32_t *label;
    char **class_names;
    int n_names, is_folder;
} image_source;

static void source_free(image_source *s) {
    free(s->pixels);
    free(s->label);
    for (int i = 0; i < s->n_names; i++) free(s->class_names[i]);
    free(s->class_names);
    memset(s, 0, sizeof *s);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Loads `images` (a folder of class subfolders or an IDX file with its `labels`). The
 * flags name the options for the messages. Returns 0 or 2 (message printed). */
static int source_load(image_source *s, const char *images, const char *labels, int channels,
                       const char *img_flag, const char *lab_flag) {
    memset(s, 0, sizeof *s);
    s->images = images;
    s->labels = labels;
    loom_error err = {0};
    if (is_dir(images)) {
        if (labels) {
            fprintf(stderr,
                    "loom data: %s '%s': not used when %s is a folder of class subfolders\n",
                    lab_flag, labels, img_flag);
            return 2;
        }
        loom_png_folder f;
        if (loom_png_folder_read(images, channels, &f, &err) != LOOM_OK) {
            fprintf(stderr, "loom data: %s: %s\n", img_flag, err.msg);
            return 2;
        }
        *s = (image_source){.images = images,
                            .n = f.n,
                            .channels = f.channels,
                            .height = f.height,
                            .width = f.width,
                            .n_classes = f.n_classes,
                            .pixels = f.pixels,
                            .label = f.labels,
                            .class_names = f.class_names,
                            .n_names = f.n_classes,
                            .is_folder = 1};
        return 0;
    }
    if (!labels) {
        fprintf(stderr, "loom data: %s is required with the IDX file %s '%s'\n", lab_flag, img_flag,
                images);
        return 2;
    }
    if (channels == 3) {
        fprintf(stderr, "loom data: --channels 3: IDX images have 1 channel (%s '%s')\n", img_flag,
                images);
        return 2;
    }
    loom_idx_images img;
    if (loom_idx_read_images(images, &img, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s: %s\n", img_flag, err.msg);
        return 2;
    }
    uint8_t *lab = NULL;
    int64_t n_lab = 0;
    if (loom_idx_read_labels(labels, &lab, &n_lab, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s: %s\n", lab_flag, err.msg);
        loom_idx_images_free(&img);
        return 2;
    }
    int rc = 0;
    if (n_lab != img.n) {
        fprintf(stderr, "loom data: %s '%s': %lld labels, expected %lld like the images of %s\n",
                lab_flag, labels, (long long)n_lab, (long long)img.n, images);
        rc = 2;
    }
    int32_t *l32 = rc ? NULL : malloc((size_t)n_lab * sizeof *l32);
    if (!rc && !l32) {
        fprintf(stderr, "loom data: out of memory for %lld labels\n", (long long)n_lab);
        rc = 2;
    }
    int max_label = -1;
    for (int64_t i = 0; !rc && i < n_lab; i++) {
        l32[i] = lab[i];
        if (lab[i] > max_label) max_label = lab[i];
    }
    free(lab);
    if (rc) {
        loom_idx_images_free(&img);
        return rc;
    }
    *s = (image_source){.images = images,
                        .labels = labels,
                        .n = img.n,
                        .channels = 1,
                        .height = img.rows,
                        .width = img.cols,
                        .n_classes = max_label + 1,
                        .pixels = img.pixels,
                        .label = l32};
    return 0;
}

/* Checks every label against n_classes; 0 or 2. */
static int source_check_classes(const image_source *s, int n_classes, const char *img_flag,
                                const char *lab_flag) {
    if (s->is_folder) {
        if (s->n_classes > n_classes) {
            fprintf(stderr, "loom data: %s '%s': %d class subfolders, more than --n-classes %d\n",
                    img_flag, s->images, s->n_classes, n_classes);
            return 2;
        }
        return 0;
    }
    for (int64_t i = 0; i < s->n; i++)
        if (s->label[i] >= n_classes) {
            fprintf(stderr,
                    "loom data: %s '%s': label %d of sample %lld is out of range (expected "
                    "0..%d for --n-classes %d)\n",
                    lab_flag, s->labels, s->label[i], (long long)i, n_classes - 1, n_classes);
            return 2;
        }
    return 0;
}

/* Writes the samples of s with is_val(k) == want_val into DIR/SPLIT_*.bin. */
static int write_source(const image_source *s, const loom_image_shape *shape, const char *out,
                        const char *split, double val_fraction, int want_val, int64_t n_split,
                        int64_t shard_samples, int *n_shards) {
    loom_image_writer w;
    loom_error err = {0};
    loom_status st = loom_image_writer_open(&w, out, split, shape, n_split, shard_samples, &err);
    int64_t bytes = (int64_t)s->channels * s->height * s->width;
    for (int64_t k = 0; st == LOOM_OK && k < s->n; k++) {
        int v = val_fraction > 0 && loom_prepare_is_val(val_fraction, k);
        if (v == want_val) st = loom_image_writer_put(&w, s->label[k], s->pixels + k * bytes, &err);
    }
    if (st == LOOM_OK) {
        *n_shards = w.n_shards; /* every shard is closed by its last put */
        st = loom_image_writer_finish(&w, &err);
    } else if (w.dir) {
        loom_image_writer_abort(&w);
    }
    if (st != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        return 2;
    }
    return 0;
}

static int cmd_images(int argc, char **argv) {
    static const struct option opts[] = {
        {"input", required_argument, NULL, 'i'},
        {"labels", required_argument, NULL, 'l'},
        {"out", required_argument, NULL, 'o'},
        {"val-input", required_argument, NULL, 'I'},
        {"val-labels", required_argument, NULL, 'L'},
        {"val-fraction", required_argument, NULL, 'v'},
        {"shard-samples", required_argument, NULL, 's'},
        {"n-classes", required_argument, NULL, 'k'},
        {"channels", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *input = NULL, *labels = NULL, *out = NULL, *val_input = NULL, *val_labels = NULL;
    double val_fraction = -1;
    int64_t shard_samples = 100000, n_classes = 0, channels = 0;
    optind = 0;
    opterr = 0;
    int c, rc = -1;
    while (rc < 0 && (c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (c) {
        case 'i':
            input = optarg;
            break;
        case 'l':
            labels = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'I':
            val_input = optarg;
            break;
        case 'L':
            val_labels = optarg;
            break;
        case 'v':
            val_fraction = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(val_fraction >= 0 && val_fraction < 1)) {
                fprintf(stderr, "loom data: --val-fraction '%s': expected a number in [0, 1)\n",
                        optarg);
                rc = 2;
            }
            break;
        case 's':
            if (parse_int64("--shard-samples", optarg, 1, INT32_MAX, &shard_samples)) rc = 2;
            break;
        case 'k':
            if (parse_int64("--n-classes", optarg, 1, LOOM_IMAGE_MAX_DIM, &n_classes)) rc = 2;
            break;
        case 'c':
            if (strcmp(optarg, "auto") == 0) {
                channels = 0;
            } else if (strcmp(optarg, "1") == 0 || strcmp(optarg, "3") == 0) {
                channels = atoi(optarg);
            } else {
                fprintf(stderr, "loom data: --channels '%s': expected 1, 3 or auto\n", optarg);
                rc = 2;
            }
            break;
        case 'h':
            fputs(usage, stdout);
            rc = 0;
            break;
        case ':':
            fprintf(stderr, "loom data: option '%s' needs a value\n", argv[optind - 1]);
            rc = 2;
            break;
        default:
            fprintf(stderr, "loom data: unknown option '%s' (see --help)\n", argv[optind - 1]);
            rc = 2;
        }
    }
    if (rc >= 0) return rc;
    if (optind < argc) {
        fprintf(stderr, "loom data: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!input || !out) {
        fprintf(stderr, "loom data: %s is required\n", !input ? "--input" : "--out");
        return 2;
    }
    if (strcmp(input, "fashion-mnist") == 0) {
        const char *given = labels              ? "--labels"
                            : val_input         ? "--val-input"
                            : val_labels        ? "--val-labels"
                            : val_fraction >= 0 ? "--val-fraction"
                                                : NULL;
        if (given) {
            fprintf(stderr,
                    "loom data: %s: not used with --input fashion-mnist (its train and t10k "
                    "files are the train and val splits)\n",
                    given);
            return 2;
        }
        input = FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz";
        labels = FASHION_MNIST_DIR "/train-labels-idx1-ubyte.gz";
        val_input = FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz";
        val_labels = FASHION_MNIST_DIR "/t10k-labels-idx1-ubyte.gz";
        const char *need[4] = {input, labels, val_input, val_labels};
        for (int i = 0; i < 4; i++)
            if (access(need[i], R_OK) != 0) {
                fprintf(stderr,
                        "loom data: --input fashion-mnist: %s: %s (expected Debian's "
                        "dataset-fashion-mnist package)\n",
                        need[i], strerror(errno));
                return 2;
            }
    }
    if (val_labels && !val_input) {
        fprintf(stderr, "loom data: --val-labels needs --val-input\n");
        return 2;
    }
    if (val_input && val_fraction >= 0) {
        fprintf(stderr, "loom data: --val-fraction: not used with --val-input (the val split "
                        "comes from its files)\n");
        return 2;
    }
    if (val_fraction < 0) val_fraction = val_input ? 0 : 0.005;

    double t0 = seconds_now();
    image_source tr = {0}, va = {0};
    rc = source_load(&tr, input, labels, (int)channels, "--input", "--labels");
    if (!rc && val_input) {
        /* A PNG val folder is read with the train set's channel count. */
        rc = source_load(&va, val_input, val_labels, tr.is_folder ? tr.channels : (int)channels,
                         "--val-input", "--val-labels");
        if (!rc && (va.is_folder != tr.is_folder || va.channels != tr.channels ||
                    va.height != tr.height || va.width != tr.width)) {
            fprintf(stderr,
                    "loom data: --val-input '%s': %s of %dx%dx%d (CxHxW), expected %s of "
                    "%dx%dx%d like --input\n",
                    val_input, va.is_folder ? "a folder" : "IDX images", va.channels, va.height,
                    va.width, tr.is_folder ? "a folder" : "IDX images", tr.channels, tr.height,
                    tr.width);
            rc = 2;
        }
        for (int i = 0; !rc && tr.is_folder && i < va.n_names; i++)
            if (i >= tr.n_names || strcmp(va.class_names[i], tr.class_names[i]) != 0) {
                fprintf(stderr,
                        "loom data: --val-input '%s': class subfolder %d is '%s', expected '%s' "
                        "like --input\n",
                        val_input, i, va.class_names[i],
                        i < tr.n_names ? tr.class_names[i] : "(none)");
                rc = 2;
            }
    }
    int k = (int)n_classes;
    if (!rc && k == 0) k = tr.n_classes > va.n_classes ? tr.n_classes : va.n_classes;
    if (!rc) rc = source_check_classes(&tr, k, "--input", "--labels");
    if (!rc && val_input) rc = source_check_classes(&va, k, "--val-input", "--val-labels");
    if (!rc && loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create directory: %s\n", out,
                strerror(errno));
        rc = 2;
    }
    loom_image_shape shape = {1, tr.channels, tr.height, tr.width, k};
    int64_t n_val = 0;
    if (val_input)
        n_val = va.n;
    else
        for (int64_t i = 0; val_fraction > 0 && i < tr.n; i++)
            n_val += loom_prepare_is_val(val_fraction, i);
    int64_t n_train = tr.n - (val_input ? 0 : n_val);
    int train_shards = 0, val_shards = 0;
    if (!rc && n_train == 0) {
        fprintf(stderr, "loom data: --val-fraction %g leaves no train sample of %lld\n",
                val_fraction, (long long)tr.n);
        rc = 2;
    }
    if (!rc)
        rc = write_source(&tr, &shape, out, "train", val_input ? 0 : val_fraction, 0, n_train,
                          shard_samples, &train_shards);
    if (!rc)
        rc = val_input
                 ? write_source(&va, &shape, out, "val", 0, 0, n_val, shard_samples, &val_shards)
                 : write_source(&tr, &shape, out, "val", val_fraction, 1, n_val, shard_samples,
                                &val_shards);
    if (!rc)
        fprintf(stderr,
                "loom data: %lld train + %lld val samples of %dx%dx%d (CxHxW), %d classes, %d + %d "
                "shard(s) in %s (%.2f s)\n",
                (long long)n_train, (long long)n_val, shape.channels, shape.height, shape.width, k,
                train_shards, val_shards, out, seconds_now() - t0);
    source_free(&tr);
    source_free(&va);
    return rc;
}

/* Opens an image dataset for a flag; 0 or 2 (message printed). */
static int open_images(loom_image_dataset *ds, const char *flag, const char *glob) {
    loom_error err = {0};
    if (loom_image_dataset_open(ds, glob, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s: %s\n", flag, err.msg);
        return 2;
    }
    return 0;
}

/* The first clips of (o) as a GIF (.gif) or a PNG strip (anything else). */
static int write_preview(const char *path, const loom_image_dataset *src,
                         const loom_moving_options *o, int64_t n_clips) {
    int n = n_clips < 16 ? (int)n_clips : 16;
    if (n == 0) return 0;
    size_t clip = (size_t)o->frames * src->channels * o->size * o->size;
    uint8_t *clips = malloc(clip * (size_t)n);
    loom_moving_object *objs = malloc((size_t)o->objects * sizeof *objs);
    loom_error err = {0};
    loom_status st = LOOM_OK;
    if (!clips || !objs) st = loom_error_set(&err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; st == LOOM_OK && i < n; i++)
        loom_moving_render(src, o, i, objs, clips + clip * (size_t)i);
    size_t len = strlen(path);
    if (st == LOOM_OK) {
        if (len > 4 && strcasecmp(path + len - 4, ".gif") == 0)
            st = loom_picture_write_gif(path, clips, n, o->frames, src->channels, o->size, o->size,
                                        4, 10, &err);
        else
            st = loom_picture_write_png_strip(path, clips, n, o->frames, src->channels, o->size,
                                              o->size, &err);
    }
    free(clips);
    free(objs);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom data: --preview: %s\n", err.msg);
        return 2;
    }
    return 0;
}

static int cmd_video(int argc, char **argv) {
    static const struct option opts[] = {
        {"from-images", required_argument, NULL, 'f'},
        {"out", required_argument, NULL, 'o'},
        {"frames", required_argument, NULL, 'F'},
        {"size", required_argument, NULL, 'S'},
        {"objects", required_argument, NULL, 'k'},
        {"clips", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, 'r'},
        {"val-clips", required_argument, NULL, 'v'},
        {"val-from-images", required_argument, NULL, 'V'},
        {"shard-samples", required_argument, NULL, 's'},
        {"preview", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *from = NULL, *out = NULL, *val_from = NULL, *preview = NULL;
    int64_t frames = 8, size = 48, objects = 2, clips = 2000, val_clips = -1, seed = 1;
    int64_t shard_samples = 100000;
    optind = 0;
    opterr = 0;
    int c, rc = -1;
    while (rc < 0 && (c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            from = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'V':
            val_from = optarg;
            break;
        case 'p':
            preview = optarg;
            break;
        case 'F':
            if (parse_int64("--frames", optarg, 1, LOOM_IMAGE_MAX_DIM, &frames)) rc = 2;
            break;
        case 'S':
            if (parse_int64("--size", optarg, 1, LOOM_MOVING_MAX_SIZE, &size)) rc = 2;
            break;
        case 'k':
            if (parse_int64("--objects", optarg, 1, LOOM_MOVING_MAX_OBJECTS, &objects)) rc = 2;
            break;
        case 'n':
            if (parse_int64("--clips", optarg, 1, INT32_MAX, &clips)) rc = 2;
            break;
        case 'v':
            if (parse_int64("--val-clips", optarg, 0, INT32_MAX, &val_clips)) rc = 2;
            break;
        case 'r':
            if (parse_int64("--seed", optarg, 0, INT64_MAX, &seed)) rc = 2;
            break;
        case 's':
            if (parse_int64("--shard-samples", optarg, 1, INT32_MAX, &shard_samples)) rc = 2;
            break;
        case 'h':
            fputs(usage, stdout);
            rc = 0;
            break;
        case ':':
            fprintf(stderr, "loom data: option '%s' needs a value\n", argv[optind - 1]);
            rc = 2;
            break;
        default:
            fprintf(stderr, "loom data: unknown option '%s' (see --help)\n", argv[optind - 1]);
            rc = 2;
        }
    }
    if (rc >= 0) return rc;
    if (optind < argc) {
        fprintf(stderr, "loom data: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!from || !out) {
        fprintf(stderr, "loom data: %s is required\n", !from ? "--from-images" : "--out");
        return 2;
    }
    if (val_clips < 0) val_clips = clips / 10;
    double t0 = seconds_now();
    loom_image_dataset src = {0}, vsrc = {0};
    rc = open_images(&src, "--from-images", from);
    if (!rc && val_from && val_clips > 0) {
        rc = open_images(&vsrc, "--val-from-images", val_from);
        if (!rc && (vsrc.frames != src.frames || vsrc.channels != src.channels ||
                    vsrc.height != src.height || vsrc.width != src.width ||
                    vsrc.n_classes != src.n_classes)) {
            fprintf(stderr,
                    "loom data: --val-from-images '%s': %dx%dx%dx%d (FxCxHxW), %d classes, "
                    "expected %dx%dx%dx%d, %d classes like --from-images\n",
                    val_from, vsrc.frames, vsrc.channels, vsrc.height, vsrc.width, vsrc.n_classes,
                    src.frames, src.channels, src.height, src.width, src.n_classes);
            rc = 2;
        }
    }
    loom_moving_options o = {.frames = (int)frames,
                             .size = (int)size,
                             .objects = (int)objects,
                             .seed = (uint64_t)seed,
                             .stream = LOOM_MOVING_STREAM_TRAIN};
    loom_error err = {0};
    if (!rc && loom_moving_check(&src, &o, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: --from-images '%s': %s\n", from, err.msg);
        rc = 2;
    }
    if (!rc && loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create directory: %s\n", out,
                strerror(errno));
        rc = 2;
    }
    if (!rc && loom_moving_write(&src, &o, clips, out, "train", shard_samples, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        rc = 2;
    }
    loom_moving_options vo = o;
    vo.stream = LOOM_MOVING_STREAM_VAL;
    const loom_image_dataset *vs = vsrc.n_shards ? &vsrc : &src;
    if (!rc && loom_moving_write(vs, &vo, val_clips, out, "val", shard_samples, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        rc = 2;
    }
    if (!rc && preview) rc = write_preview(preview, &src, &o, clips);
    if (!rc) {
        int64_t per = shard_samples;
        fprintf(stderr,
                "loom data: %lld train + %lld val clips of %dx%dx%dx%d (FxCxHxW), %d object(s), "
                "%d classes, %lld + %lld shard(s) in %s (%.2f s)\n",
                (long long)clips, (long long)val_clips, o.frames, src.channels, o.size, o.size,
                o.objects, src.n_classes, (long long)((clips + per - 1) / per),
                (long long)((val_clips + per - 1) / per), out, seconds_now() - t0);
    }
    loom_image_dataset_close(&src);
    loom_image_dataset_close(&vsrc);
    return rc;
}

int loom_cmd_data(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "loom data: expected a subcommand (bytes, prepare, images, video); see 'loom data "
                "--help'\n");
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(argv[1], "bytes") == 0) return cmd_bytes(argc - 1, argv + 1);
    if (strcmp(argv[1], "prepare") == 0) return cmd_prepare(argc - 1, argv + 1);
    if (strcmp(argv[1], "images") == 0) return cmd_images(argc - 1, argv + 1);
    if (strcmp(argv[1], "video") == 0) return cmd_video(argc - 1, argv + 1);
    fprintf(stderr,
            "loom data: unknown subcommand '%s' (expected: bytes, prepare, images, video)\n",
            argv[1]);
    return 2;
}
