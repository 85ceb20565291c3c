/* loom data vlm (cmd_data_vlm.h): each sample a g x g grid of Fashion-MNIST items (28 x 28
 * each) and a text naming each item by position, or (a share --questions of the samples) a
 * question about the grid and its answer. Tokens are bytes (0..255) plus <image> (256) and
 * <|endoftext|> (257), or with --tokenizer DIR a BPE's (data/vlm_text.h):
 *   caption:  <image> "top left: sneaker; top right: bag; ..." <|endoftext|>
 *   question: <image> "how many bags?\n" "2" <|endoftext|>
 * the answer (the caption, or the text after the question's newline) and the end-of-text
 * token are the loss mask's answer tokens. Train grids come from the training images, val
 * grids from t10k; every draw is Philox keyed by (--seed, split, sample, cell).
 * --input DIR: the user's own pairs (data/vlm_folder.h), NAME.png with NAME.txt beside it,
 * `<image>`, the text's prompt line (not in the loss), its answer and <|endoftext|>; the
 * last --val-samples in name order (default a tenth) are the val split. */
#include "cli/cmd_data_vlm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cmd_data_images.h"
#include "core/fs.h"
#include "core/philox.h"
#include "data/idx.h"
#include "data/vlm_folder.h"
#include "data/vlm_shard.h"
#include "data/vlm_text.h"

#define FMNIST "/usr/share/datasets/fashion-mnist"
#define ITEM 28
#define STREAM 0x766c6d64u /* "vlmd" */

static const char *const CLASS[10] = {"t-shirt/top", "trouser", "pullover", "dress", "coat",
                                      "sandal",      "shirt",   "sneaker",  "bag",   "ankle boot"};
static const char *const PLURAL[10] = {"t-shirts/tops", "trousers",   "pullovers", "dresses",
                                       "coats",         "sandals",    "shirts",    "sneakers",
                                       "bags",          "ankle boots"};
static const char *const POS2[4] = {"top left", "top right", "bottom left", "bottom right"};
static const char *const POS3[9] = {"top left",    "top middle",    "top right",
                                    "middle left", "center",        "middle right",
                                    "bottom left", "bottom middle", "bottom right"};

/* The longest sample: --mixed-images' 8 grids of 9 cells, each at most "bottom middle:
 * t-shirt/top; " (28 bytes), with markers, newlines and end-of-text about 2,040 tokens.
 * A longer text is an error, never a cut one. */
enum { SAMPLE_TOKENS = 4096 };

/* One sample's tokens and loss mask, built piece by piece (each piece's text encoded on
 * its own, so a mask boundary is a token boundary). */
typedef struct {
    int32_t tokens[SAMPLE_TOKENS];
    uint8_t mask[SAMPLE_TOKENS];
    int n;
    loom_vlm_text *vt;      /* bytes or the --tokenizer's BPE */
    loom_token_buf scratch; /* one piece's tokens */
    loom_status st;         /* the first encoding failure, in err */
    loom_error err;
} text;

static void put_token(text *t, int32_t tok, int answer) {
    if (t->st) return;
    if (t->n == SAMPLE_TOKENS) {
        t->st = loom_error_set(&t->err, LOOM_ERR_STATE, "a sample's text over %d tokens",
                               SAMPLE_TOKENS);
        return;
    }
    t->tokens[t->n] = tok;
    t->mask[t->n++] = (uint8_t)answer;
}

static void put(text *t, const char *s, int answer) {
    t->scratch.n = 0;
    if (t->st || (t->st = loom_vlm_text_encode(t->vt, s, strlen(s), &t->scratch, &t->err))) return;
    for (size_t i = 0; i < t->scratch.n; i++) put_token(t, t->scratch.ids[i], answer);
}

/* Grid i of sample s (cells keyed c + 16 i: grid 0 is the one-image samples' grid) into
 * grid, its classes into cls. */
static void draw_grid(const loom_idx_images *img, const uint8_t *lab, int g, uint64_t seed,
                      uint32_t stream, int64_t s, int i, uint8_t *grid, int *cls) {
    const int side = g * ITEM;
    for (int c = 0; c < g * g; c++) {
        const int64_t k =
            (int64_t)(loom_philox_u64(seed, stream, (uint64_t)s, (uint32_t)(c + 16 * i)) %
                      (uint64_t)img->n);
        cls[c] = lab[k];
        const int r0 = (c / g) * ITEM, c0 = (c % g) * ITEM;
        for (int y = 0; y < ITEM; y++)
            memcpy(grid + (size_t)(r0 + y) * side + c0, img->pixels + ((size_t)k * ITEM + y) * ITEM,
                   ITEM);
    }
}

static void put_caption(text *t, const char *const *pos, const int *cls, int cells) {
    char buf[256];
    for (int c = 0; c < cells; c++) {
        snprintf(buf, sizeof buf, "%s%s: %s", c ? "; " : "", pos[c], CLASS[cls[c]]);
        put(t, buf, 1);
    }
}

/* The writer's end: DIR/SPLIT_000000.bin written (st LOOM_OK) or the writer dropped. */
static loom_status finish_split(loom_vlm_writer *w, const char *dir, const char *split,
                                loom_status st, char *path, size_t cap, loom_error *err) {
    snprintf(path, cap, "%s/%s_000000.bin", dir, split);
    if (st) {
        loom_vlm_writer_free(w);
        return st;
    }
    return loom_vlm_writer_finish(w, path, err);
}

static int split_failed(loom_status st, const loom_error *err) {
    fprintf(stderr, "loom data: %s\n",
            st == LOOM_ERR_NOMEM && !err->msg[0] ? "out of memory" : err->msg);
    return 2;
}

/* One split: n samples from the IDX pair into DIR/SPLIT_000000.bin; mixed > 0: sample s
 * holds 0..mixed grids (Philox (seed, split, s, 200)), each `<image>` and its caption, a
 * newline between them; none: "name the items\n" and the answer "none". */
static int make_split(const char *dir, const char *split, const char *images, const char *labels,
                      int g, int64_t n, double questions, int mixed, uint64_t seed,
                      loom_vlm_text *vt) {
    loom_error err = {0};
    loom_idx_images img;
    uint8_t *lab = NULL;
    int64_t nl = 0;
    if (loom_idx_read_images(images, &img, &err) || loom_idx_read_labels(labels, &lab, &nl, &err)) {
        fprintf(stderr, "loom data: --input fashion-mnist: %s\n", err.msg);
        return 2;
    }
    if (nl != img.n || img.rows != ITEM || img.cols != ITEM) {
        fprintf(stderr, "loom data: %s: expected %lld labels and 28 x 28 images\n", labels,
                (long long)img.n);
        loom_idx_images_free(&img);
        free(lab);
        return 2;
    }
    const int side = g * ITEM, cells = g * g, max_grids = mixed > 0 ? mixed : 1;
    const size_t grid_bytes = (size_t)side * side;
    const char *const *pos = g == 2 ? POS2 : POS3;
    const uint32_t stream = STREAM + (strcmp(split, "val") == 0);
    uint8_t *grid = malloc(grid_bytes * max_grids);
    loom_vlm_writer w;
    loom_vlm_writer_init(&w, 1, side, side, vt->image, vt->eot);
    loom_status st = grid ? LOOM_OK : LOOM_ERR_NOMEM;
    text t = {.vt = vt};
    for (int64_t s = 0; s < n && !st; s++) {
        int cls[9] = {0};
        t.n = 0;
        char buf[256];
        if (mixed > 0) {
            const int k =
                (int)(loom_philox_u64(seed, stream, (uint64_t)s, 200) % (uint64_t)(mixed + 1));
            for (int i = 0; i < k; i++) {
                draw_grid(&img, lab, g, seed, stream, s, i, grid + i * grid_bytes, cls);
                if (i) put(&t, "\n", 1);
                put_token(&t, vt->image, 0);
                put_caption(&t, pos, cls, cells);
            }
            if (k == 0) {
                put(&t, "name the items\n", 0);
                put(&t, "none", 1);
            }
            put_token(&t, vt->eot, 1);
            st = t.st ? t.st : loom_vlm_writer_put(&w, t.tokens, t.mask, t.n, grid, k, &err);
            continue;
        }
        draw_grid(&img, lab, g, seed, stream, s, 0, grid, cls);
        const uint64_t r = loom_philox_u64(seed, stream, (uint64_t)s, 100);
        const double u = (double)(r >> 11) * 0x1.0p-53;
        put_token(&t, vt->image, 0);
        if (u < questions) {
            const int pick = (int)((r & 0xffff) % (uint64_t)cells), x = cls[pick];
            int count = 0;
            for (int c = 0; c < cells; c++) count += cls[c] == x;
            if ((r >> 16) & 1 && count == 1) { /* where: only for an item that appears once */
                snprintf(buf, sizeof buf, "where is the %s?\n", CLASS[x]);
                put(&t, buf, 0);
                put(&t, pos[pick], 1);
            } else {
                snprintf(buf, sizeof buf, "how many %s?\n", PLURAL[x]);
                put(&t, buf, 0);
                snprintf(buf, sizeof buf, "%d", count);
                put(&t, buf, 1);
            }
        } else {
            put_caption(&t, pos, cls, cells);
        }
        put_token(&t, vt->eot, 1);
        st = t.st ? t.st : loom_vlm_writer_put(&w, t.tokens, t.mask, t.n, grid, 1, &err);
    }
    if (t.st) err = t.err;
    free(t.scratch.ids);
    char path[4096];
    st = finish_split(&w, dir, split, st, path, sizeof path, &err);
    free(grid);
    loom_idx_images_free(&img);
    free(lab);
    if (st) return split_failed(st, &err);
    if (mixed > 0)
        fprintf(stderr, "loom data: %s: %lld samples of 0 to %d %d x %d grids\n", path,
                (long long)n, mixed, g, g);
    else
        fprintf(stderr, "loom data: %s: %lld samples of %d x %d grids\n", path, (long long)n, g, g);
    return 0;
}

/* Samples [lo, hi) of a folder into DIR/SPLIT_000000.bin. */
static int folder_split(const char *dir, const char *split, const loom_vlm_folder *f, int lo,
                        int hi, loom_vlm_text *vt) {
    loom_error err = {0};
    const size_t S = (size_t)f->channels * f->height * f->width;
    /* a token is at least one byte: the text's bytes + <image> + <|endoftext|> bound it */
    int32_t *tok = malloc((LOOM_VLM_FOLDER_MAX_TEXT + 2) * sizeof *tok);
    uint8_t *mask = malloc(LOOM_VLM_FOLDER_MAX_TEXT + 2);
    loom_token_buf piece = {0};
    loom_vlm_writer w;
    loom_vlm_writer_init(&w, f->channels, f->height, f->width, vt->image, vt->eot);
    loom_status st = tok && mask ? LOOM_OK : LOOM_ERR_NOMEM;
    for (int i = lo; i < hi && !st; i++) {
        int n = 0;
        tok[n] = vt->image;
        mask[n++] = 0;
        const char *txt = f->texts[i];
        const size_t len = strlen(txt), prompt = (size_t)f->prompt_len[i];
        for (int answer = 0; answer < 2 && !st; answer++) { /* the prompt, then the answer */
            piece.n = 0;
            st = answer ? loom_vlm_text_encode(vt, txt + prompt, len - prompt, &piece, &err)
                        : loom_vlm_text_encode(vt, txt, prompt, &piece, &err);
            for (size_t k = 0; k < piece.n && !st; k++) {
                tok[n] = piece.ids[k];
                mask[n++] = (uint8_t)answer;
            }
        }
        tok[n] = vt->eot;
        mask[n++] = 1;
        if (!st) st = loom_vlm_writer_put(&w, tok, mask, n, f->pixels + S * i, 1, &err);
    }
    char path[4096];
    st = finish_split(&w, dir, split, st, path, sizeof path, &err);
    free(piece.ids);
    free(tok);
    free(mask);
    if (st) return split_failed(st, &err);
    fprintf(stderr, "loom data: %s: %d samples of %d x %d x %d images from the folder\n", path,
            hi - lo, f->channels, f->height, f->width);
    return 0;
}

/* --input DIR: the folder's pairs, the last val_samples (-1: a tenth) as val. */
static int make_folder(const char *input, const char *out, int64_t val_samples, loom_vlm_text *vt) {
    loom_error err = {0};
    loom_vlm_folder f;
    if (loom_vlm_folder_read(input, &f, &err)) {
        fprintf(stderr, "loom data: --input %s\n", err.msg);
        return 2;
    }
    const int64_t v = val_samples < 0 ? f.n / 10 : val_samples;
    int rc = 0;
    if (v >= f.n) {
        fprintf(stderr,
                "loom data: --val-samples %lld: the folder %s holds %d samples (expected fewer, "
                "so that some train)\n",
                (long long)v, input, f.n);
        rc = 2;
    }
    if (!rc) rc = folder_split(out, "train", &f, 0, f.n - (int)v, vt);
    if (!rc && v > 0) rc = folder_split(out, "val", &f, f.n - (int)v, f.n, vt);
    loom_vlm_folder_free(&f);
    return rc;
}

/* The output folder created and the text encoder opened (byte-level, or --tokenizer's BPE);
 * 0, or 2 after one line. */
static int open_output(const char *out, const char *tokenizer, loom_vlm_text *vt) {
    if (loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create the folder: %s\n", out,
                strerror(errno));
        return 2;
    }
    loom_error err = {0};
    if (loom_vlm_text_open(vt, tokenizer, &err)) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        return 2;
    }
    return 0;
}

int loom_cmd_data_vlm(int argc, char **argv, const loom_data_help *help) {
    const char *input = NULL, *out = NULL, *tokenizer = NULL;
    /* -1: not given (the defaults below depend on --input) */
    int64_t grid = -1, samples = -1, val_samples = -1, seed = 1, mixed = -1;
    double questions = -1.0;
    const loom_data_flag flags[] = {
        {"input", LOOM_DATA_FLAG_STR, .required = 1, .str = &input},
        {"out", LOOM_DATA_FLAG_STR, .required = 1, .str = &out},
        {"grid", LOOM_DATA_FLAG_INT, .i64 = &grid, .lo = 2, .hi = 3},
        {"samples", LOOM_DATA_FLAG_INT, .i64 = &samples, .lo = 1, .hi = 10000000},
        {"val-samples", LOOM_DATA_FLAG_INT, .i64 = &val_samples, .lo = 0, .hi = 10000000},
        {"questions", LOOM_DATA_FLAG_FRACTION, .f64 = &questions},
        {"mixed-images", LOOM_DATA_FLAG_INT, .i64 = &mixed, .lo = 0, .hi = 8},
        {"seed", LOOM_DATA_FLAG_INT, .i64 = &seed, .lo = 0, .hi = INT64_MAX},
        {"tokenizer", LOOM_DATA_FLAG_STR, .str = &tokenizer},
    };
    int rc = loom_data_parse_flags(argc, argv, flags, LOOM_DATA_N_FLAGS(flags), help);
    if (rc >= 0) return rc;
    struct stat sb;
    const int folder =
        strcmp(input, "fashion-mnist") != 0 && stat(input, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (strcmp(input, "fashion-mnist") != 0 && !folder) {
        fprintf(stderr,
                "loom data: --input '%s': expected fashion-mnist (Debian's "
                "dataset-fashion-mnist) or a folder of NAME.png with NAME.txt beside each\n",
                input);
        return 2;
    }
    if (folder) {
        const char *fixed = grid >= 0          ? "--grid"
                            : samples >= 0     ? "--samples"
                            : mixed >= 0       ? "--mixed-images"
                            : questions >= 0.0 ? "--questions"
                                               : NULL;
        if (fixed) {
            fprintf(stderr,
                    "loom data: %s: for --input fashion-mnist (a folder's samples are its "
                    "files; expected only --out and --val-samples)\n",
                    fixed);
            return 2;
        }
        loom_vlm_text vt;
        if ((rc = open_output(out, tokenizer, &vt))) return rc;
        rc = make_folder(input, out, val_samples, &vt);
        loom_vlm_text_close(&vt);
        return rc;
    }
    if (grid < 0) grid = 2;
    if (samples < 0) samples = 20000;
    if (val_samples < 0) val_samples = 1000;
    if (mixed < 0) mixed = 0;
    if (questions < 0.0) questions = 0.0;
    if (mixed > 0 && questions > 0.0) {
        fprintf(stderr, "loom data: --questions: for one-image samples (expected no "
                        "--questions with --mixed-images)\n");
        return 2;
    }
    loom_vlm_text vt;
    if ((rc = open_output(out, tokenizer, &vt))) return rc;
    rc = make_split(out, "train", FMNIST "/train-images-idx3-ubyte.gz",
                    FMNIST "/train-labels-idx1-ubyte.gz", (int)grid, samples, questions, (int)mixed,
                    (uint64_t)seed, &vt);
    if (!rc && val_samples > 0)
        rc = make_split(out, "val", FMNIST "/t10k-images-idx3-ubyte.gz",
                        FMNIST "/t10k-labels-idx1-ubyte.gz", (int)grid, val_samples, questions,
                        (int)mixed, (uint64_t)seed, &vt);
    loom_vlm_text_close(&vt);
    return rc;
}
