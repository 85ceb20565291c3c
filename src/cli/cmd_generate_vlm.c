/* loom generate --weights W --image FILE.png|DIR [--prompt TEXT] [--max-tokens N]
 * [--temperature T] [--seed S] [--threads N] [--sheet OUT.png] [--no-kv-cache] [--tokenizer DIR]:
 * the text a vlm (family vlm, model/vlm.h) writes for an image, in byte tokens or the BPE it
 * was trained on (data/vlm_text.h); for a folder, each .png's
 * "NAME<tab>TEXT" line in name order (the model loaded once); --sheet draws the images with
 * their texts under them (data/picture_text.h). The sequence is <image> then the prompt and a
 * newline (none without a prompt: the caption), as loom data vlm writes its samples; each new token
 * is drawn from the logits at the last position (temperature 0: the most likely), until
 * <|endoftext|>,
 * --max-tokens or the context is full. With the KV cache (the default) the image is encoded
 * once, the prompt's positions fed through the decoder one at a time (an image slot's row is
 * the projector's output, model/generate.h's loom_generator_step_row) and each new token
 * attends to the cached keys and values; --no-kv-cache runs the whole sequence through the
 * training forward again for every token (the reference the cache is tested against). */
#include "cli/cmd_generate_vlm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <sys/stat.h>

#include "core/cpu_boot.h"
#include "core/flags.h"
#include "core/philox.h"
#include "data/picture_text.h"
#include "data/png_folder.h"
#include "data/vlm_shard.h"
#include "data/vlm_text.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/vlm.h"
#include "model/vlm_pieces.h"
#include "model/weights.h"

#define GEN_STREAM 0x67656e01u

static int fail(const char *msg) {
    fprintf(stderr, "loom generate: %s\n", msg);
    return 2;
}

/* Generated text: bytes, NUL-terminated. */
typedef struct {
    char *s;
    size_t n, cap;
} text_buf;

static int text_add(text_buf *b, const unsigned char *bytes, size_t len) {
    if (b->n + len + 1 > b->cap) {
        const size_t cap = 2 * (b->n + len + 1) + 64;
        char *s = realloc(b->s, cap);
        if (!s) return -1;
        b->s = s, b->cap = cap;
    }
    memcpy(b->s + b->n, bytes, len);
    b->n += len;
    b->s[b->n] = '\0';
    return 0;
}

/* Appends token next's bytes to out: 0, or 1 where the text ends (<image>, <|endoftext|>,
 * an id past the vocabulary's text tokens), -1 out of memory. */
static int emit(const loom_vlm_text *vt, int32_t next, text_buf *out) {
    size_t len = 0;
    const unsigned char *bytes = loom_vlm_text_bytes(vt, next, &len);
    if (!bytes) return 1;
    return text_add(out, bytes, len);
}

/* The next token from logits[V]: the arg max at temperature 0, else a softmax draw. */
static int32_t pick(const float *logits, int V, float temperature, uint64_t seed, int step) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0f) return best;
    double z = 0.0;
    for (int i = 0; i < V; i++) z += exp((logits[i] - logits[best]) / temperature);
    const uint64_t r = loom_philox_u64(seed, GEN_STREAM, (uint64_t)step, 0);
    double u = (double)(r >> 11) * 0x1.0p-53 * z;
    for (int i = 0; i < V; i++) {
        u -= exp((logits[i] - logits[best]) / temperature);
        if (u <= 0.0) return i;
    }
    return best;
}

/* Without a cache: the whole record (image, prompt, the tokens so far) through the
 * training forward for every new token. tokens holds room for T + 2. */
static int generate_uncached(loom_model *m, const loom_vlm_record_shape *shape, const float *params,
                             const loom_vlm_text *vt, int32_t *tokens, int n, const uint8_t *px,
                             int max_tokens, float temperature, uint64_t seed, text_buf *out) {
    const int T = shape->seq_len, V = m->cfg.vocab_size;
    loom_error err = {0};
    int32_t *rec = malloc((size_t)loom_vlm_record_size(shape) * sizeof *rec);
    float *row = malloc((size_t)V * sizeof *row);
    int rc = 0;
    if (!rec || !row) rc = fail("out of memory");
    for (int step = 0; !rc && step < max_tokens; step++) {
        int len = 0;
        if (loom_vlm_record_build(shape, vt->image, vt->eot, tokens, NULL, n, px, 1, rec, &len,
                                  &err)) {
            if (step == 0) rc = fail("--prompt: too long for the model's context with the image");
            break; /* the context is full */
        }
        if (len > T) {
            if (step == 0) rc = fail("--prompt: too long for the model's context with the image");
            break;
        }
        loom_model_load_batch(m, rec, 0);
        if (loom_model_forward(m, params)) {
            rc = fail("forward failed");
            break;
        }
        loom_backend_copy_to_host(m->be, row, m->logits + (size_t)(len - 1) * V,
                                  (size_t)V * sizeof(float));
        const int32_t next = pick(row, V, temperature, seed, step);
        const int end = emit(vt, next, out);
        if (end) {
            if (end < 0) rc = fail("out of memory");
            break;
        }
        tokens[n++] = next;
    }
    free(rec);
    free(row);
    return rc;
}

/* With the KV cache: the image encoded once (the record's forward up to the projector),
 * the record's positions fed one at a time (slots: the projector's rows), then one position
 * per new token. Stops where the uncached loop does: the context full at T positions. */
static int generate_cached(loom_model *m, const loom_vlm_record_shape *shape,
                           const loom_param_table *table, const float *params,
                           const loom_vlm_text *vt, const int32_t *tokens, int n, const uint8_t *px,
                           int max_tokens, float temperature, uint64_t seed, text_buf *out) {
    const int T = shape->seq_len, V = m->cfg.vocab_size, C = m->cfg.d_model;
    loom_error err = {0};
    loom_generator g = {0};
    int32_t *rec = malloc((size_t)loom_vlm_record_size(shape) * sizeof *rec);
    float *emb = malloc(loom_vlm_image_rows_floats(m) * sizeof *emb);
    float *row = malloc((size_t)V * sizeof *row);
    int rc = 0, len = 0;
    if (!rec || !emb || !row) rc = fail("out of memory");
    if (!rc && (loom_vlm_record_build(shape, vt->image, vt->eot, tokens, NULL, n, px, 1, rec, &len,
                                      &err) ||
                len > T))
        rc = fail("--prompt: too long for the model's context with the image");
    if (!rc && loom_generator_create(&g, &m->cfg, table, params, &err)) rc = fail(err.msg);
    if (!rc) {
        loom_model_load_batch(m, rec, 0);
        loom_vlm_encode(m, params, emb);
        for (int pos = 0, k = 0; pos < len; pos++)
            if (rec[pos] == LOOM_VLM_SLOT)
                loom_generator_step_row(&g, emb + (size_t)k++ * C, pos);
            else
                loom_generator_step(&g, rec[pos], pos);
    }
    for (int step = 0, pos = len; !rc && step < max_tokens; step++, pos++) {
        memcpy(row, g.logits, (size_t)V * sizeof *row);
        const int32_t next = pick(row, V, temperature, seed, step);
        const int end = emit(vt, next, out);
        if (end) {
            if (end < 0) rc = fail("out of memory");
            break;
        }
        if (pos >= T) break; /* the context is full */
        loom_generator_step(&g, next, pos);
    }
    if (g.be) loom_generator_free(&g);
    free(rec);
    free(emb);
    free(row);
    return rc;
}

/* --sheet: each image scaled SHEET_SCALE times, SHEET_COLUMNS per row, its text under it
 * in up to SHEET_LINES lines of SHEET_FONT_PIXELS-pixel DejaVu Sans (data/picture_text.h). */
enum { SHEET_SCALE = 2, SHEET_COLUMNS = 8, SHEET_LINES = 6, SHEET_FONT_PIXELS = 9 };

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* --image: one file, or a folder's *.png files (hidden ones skipped) in bytewise order. */
static int list_images(const char *image, char ***files, int *n, int *is_dir, char *msg,
                       size_t cap) {
    struct stat sb;
    if (stat(image, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        *is_dir = 0;
        *files = malloc(sizeof **files);
        if (!*files || !((*files)[0] = strdup(image))) return snprintf(msg, cap, "out of memory");
        *n = 1;
        return 0;
    }
    *is_dir = 1;
    DIR *d = opendir(image);
    if (!d) return snprintf(msg, cap, "--image %s: cannot open the folder", image);
    int cap_n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 5 || strcasecmp(e->d_name + len - 4, ".png") != 0)
            continue;
        if (*n == cap_n) {
            cap_n = cap_n ? 2 * cap_n : 64;
            char **grown = realloc(*files, (size_t)cap_n * sizeof *grown);
            if (!grown) break;
            *files = grown;
        }
        const size_t bytes = strlen(image) + len + 2;
        if (!((*files)[*n] = malloc(bytes))) break;
        snprintf((*files)[*n], bytes, "%s/%s", image, e->d_name);
        (*n)++;
    }
    closedir(d);
    if (*n == 0) return snprintf(msg, cap, "--image %s: a folder without .png files", image);
    qsort(*files, (size_t)*n, sizeof **files, by_name);
    return 0;
}

int loom_cmd_generate_vlm(int argc, char **argv) {
    const char *weights = NULL, *image = NULL, *prompt = NULL, *sheet = NULL, *tokenizer = NULL;
    int max_tokens = 200, threads = 1, no_cache = 0;
    float temperature = 0.0f;
    unsigned long long seed = 1337;
    const loom_flag flags[] = {
        LOOM_FLAG_STR(0, "weights", &weights, "W", "a vlm's file from loom train --save-weights"),
        LOOM_FLAG_STR(0, "image", &image, "FILE.png|DIR",
                      "a PNG of the model's image size, or a folder of them (each its line)"),
        LOOM_FLAG_STR(0, "prompt", &prompt, "TEXT", "the question (without: its caption)"),
        LOOM_FLAG_NUM(0, "max-tokens", LOOM_FLAG_INT, &max_tokens, "N", "tokens at most (200)", 0,
                      2147483647, "expected an integer >= 0"),
        LOOM_FLAG_NUM(0, "temperature", LOOM_FLAG_FLOAT, &temperature, "T", "0: greedy", 0, 3e38,
                      "expected a number >= 0"),
        LOOM_FLAG_NUM(0, "seed", LOOM_FLAG_U64, &seed, "S", "the sampling seed (1337)", 0, 2e19,
                      "expected a non-negative integer"),
        LOOM_FLAG_NUM(0, "threads", LOOM_FLAG_INT, &threads, "N", "1; 0 = all cores", 0, 2147483647,
                      "expected an integer >= 0 (0 = all)"),
        LOOM_FLAG_STR(0, "sheet", &sheet, "OUT.png", "also draw the images with their texts"),
        LOOM_FLAG_SW(0, "no-kv-cache", &no_cache,
                     "run the whole sequence again for each token (the cache's reference)"),
        LOOM_FLAG_STR(0, "tokenizer", &tokenizer, "DIR|bytes",
                      "the BPE of the model's data (loom data vlm --tokenizer; default bytes)"),
    };
    static const loom_flag_group groups[] = {{"A vision-language model", "docs/vlm.md"}};
    const loom_flag_spec spec = {
        .usage = "usage: loom generate --weights W --image FILE.png|DIR [--prompt TEXT] [flags]",
        .about = "Prints a vlm's text for the image (without --prompt: its caption).",
        LOOM_FLAGS_TABLE(flags, groups)};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom generate", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    char msg[1200];
    if (!weights) return fail("--weights: required (a file from loom train --save-weights)");
    if (!image) return fail("--image: required (a PNG of the model's image size, or a folder)");
    loom_cpu_set_threads(threads ? threads : loom_cpu_default_threads());
    loom_error err = {0};
    loom_model_config cfg;
    loom_param_table table;
    float *params = NULL;
    if (loom_weights_load(weights, &cfg, &table, &params, &err)) return fail(err.msg);
    uint8_t *px = NULL;
    int32_t *tokens = NULL;
    char **files = NULL, **texts = NULL;
    uint8_t *all = NULL;
    loom_model m = {0};
    loom_font font = {0};
    loom_vlm_text vt = {0};
    loom_token_buf asked = {0}; /* the prompt's tokens */
    int rc = 0, h = 0, w = 0, n_files = 0, is_dir = 0;
    if (cfg.family != LOOM_FAMILY_VLM) {
        snprintf(msg, sizeof msg, "--image: %s is a %s model (expected family vlm)", weights,
                 loom_family_name(cfg.family));
        rc = fail(msg);
        goto done;
    }
    if (loom_vlm_text_open(&vt, tokenizer, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    if (vt.vocab > cfg.vocab_size) {
        snprintf(msg, sizeof msg,
                 "--tokenizer %s: its tokens and <image> need a vocabulary of %d, %s has one of "
                 "%d (expected the tokenizer of the model's data)",
                 tokenizer ? tokenizer : "bytes", vt.vocab, weights, cfg.vocab_size);
        rc = fail(msg);
        goto done;
    }
    if (prompt) { /* as loom data vlm writes a question: its line, then the answer */
        const size_t len = strlen(prompt);
        char *line = malloc(len + 1);
        if (!line) {
            rc = fail("out of memory");
            goto done;
        }
        memcpy(line, prompt, len);
        line[len] = '\n';
        const loom_status st = loom_vlm_text_encode(&vt, line, len + 1, &asked, &err);
        free(line);
        if (st) {
            rc = fail(err.msg);
            goto done;
        }
    }
    if (list_images(image, &files, &n_files, &is_dir, msg, sizeof msg)) {
        rc = fail(msg);
        goto done;
    }
    const int T = cfg.seq_len;
    const loom_vlm_record_shape shape = {
        T, loom_vlm_image_tokens(&cfg), cfg.max_images, cfg.channels, cfg.height, cfg.width};
    tokens = malloc((size_t)(T + 2) * sizeof *tokens);
    texts = calloc((size_t)n_files, sizeof *texts);
    all = sheet ? malloc((size_t)n_files * cfg.height * cfg.width) : NULL;
    if (!tokens || !texts || (sheet && !all)) {
        rc = fail("out of memory");
        goto done;
    }
    if (sheet && loom_font_open(&font, SHEET_FONT_PIXELS, &err)) { /* before generating */
        snprintf(msg, sizeof msg, "--sheet: %s", err.msg);
        rc = fail(msg);
        goto done;
    }
    if (loom_model_create(&m, &(loom_model_options){.cfg = &cfg, .B = 1, .T = T}, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    for (int i = 0; i < n_files && !rc; i++) {
        free(px);
        px = NULL;
        if (loom_png_read(files[i], cfg.channels, &px, &h, &w, &err)) {
            rc = fail(err.msg);
            break;
        }
        if (h != cfg.height || w != cfg.width) {
            snprintf(msg, sizeof msg, "--image %s: %d x %d pixels, the model reads %d x %d",
                     files[i], w, h, cfg.width, cfg.height);
            rc = fail(msg);
            break;
        }
        int n = 0;
        tokens[n++] = vt.image;
        for (size_t k = 0; k < asked.n && n < T; k++) tokens[n++] = asked.ids[k];
        text_buf out = {0};
        if (no_cache)
            rc = generate_uncached(&m, &shape, params, &vt, tokens, n, px, max_tokens, temperature,
                                   seed, &out);
        else
            rc = generate_cached(&m, &shape, &table, params, &vt, tokens, n, px, max_tokens,
                                 temperature, seed, &out);
        if (!rc && !out.s && text_add(&out, (const unsigned char *)"", 0))
            rc = fail("out of memory");
        texts[i] = out.s;
        if (rc) break;
        if (is_dir)
            printf("%s\t%s\n", strrchr(files[i], '/') + 1, texts[i]);
        else
            printf("%s\n", texts[i]);
        fflush(stdout);
        if (all) /* the sheet is gray: the mean of the channels */
            for (int k = 0; k < cfg.height * cfg.width; k++) {
                int sum = 0;
                for (int c = 0; c < cfg.channels; c++) sum += px[c * cfg.height * cfg.width + k];
                all[(size_t)i * cfg.height * cfg.width + k] = (uint8_t)(sum / cfg.channels);
            }
    }
    if (!rc && sheet &&
        loom_picture_write_captioned(sheet, all, n_files, cfg.height, cfg.width, SHEET_SCALE,
                                     SHEET_COLUMNS, (const char *const *)texts, &font, SHEET_LINES,
                                     &err)) {
        snprintf(msg, sizeof msg, "--sheet: %s", err.msg);
        rc = fail(msg);
    }
done:
    loom_vlm_text_close(&vt);
    free(asked.ids);
    if (font.face) loom_font_close(&font);
    if (m.ops) loom_model_destroy(&m);
    for (int i = 0; i < n_files; i++) {
        free(files[i]);
        if (texts) free(texts[i]);
    }
    free(files);
    free(texts);
    free(all);
    free(px);
    free(tokens);
    free(params);
    loom_params_free(&table);
    return rc;
}
