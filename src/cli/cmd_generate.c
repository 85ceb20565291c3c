/* loom generate: loads a weights file written by `loom train --save-weights`, encodes the
 * prompt, and streams sampled tokens to stdout as they come (KV-cache decoding); with
 * --prompt-file, completes every line of a file at once (batched decoding, rl/rollout.h). */
#include "core/flags.h"
#include "cli/cmd_generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_generate_vlm.h"
#include "core/philox.h"
#include "data/tokenizer.h"
#include "model/gemm_shapes.h"
#include "model/generate.h"
#include "model/weights.h"
#include "rl/rollout.h"

#define GEN_STREAM 0x67656e00u /* "gen" */

static int fail(const char *msg) {
    fprintf(stderr, "loom generate: %s\n", msg);
    return 2;
}

/* Writes the bytes of one token. */
static void emit(const loom_tokenizer *tok, int32_t id) {
    if (!tok) {
        fputc(id, stdout);
    } else {
        size_t n = 0;
        const unsigned char *b = loom_tokenizer_token(tok, id, &n);
        if (b) fwrite(b, 1, n, stdout);
    }
    fflush(stdout);
}

/* The prompts of a file: one a line (a final line without a newline counts). */
typedef struct {
    char **lines;
    int n;
} prompt_lines;

static void lines_free(prompt_lines *p) {
    for (int i = 0; i < p->n; i++) free(p->lines[i]);
    free(p->lines);
}

static int read_lines(const char *path, prompt_lines *p) {
    char msg[1200];
    FILE *f = fopen(path, "r");
    memset(p, 0, sizeof *p);
    if (!f) {
        snprintf(msg, sizeof msg, "--prompt-file '%s': cannot open", path);
        return fail(msg);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, alloc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
        if (len > 0 && line[len - 1] == '\r') line[--len] = 0;
        if (len == 0) {
            snprintf(msg, sizeof msg,
                     "--prompt-file %s:%d: empty line (expected one prompt a line)", path,
                     p->n + 1);
            rc = fail(msg);
            break;
        }
        if (p->n == alloc) {
            alloc = alloc ? 2 * alloc : 64;
            char **more = realloc(p->lines, (size_t)alloc * sizeof *more);
            if (!more) {
                rc = fail("--prompt-file: out of memory");
                break;
            }
            p->lines = more;
        }
        if (!(p->lines[p->n] = strdup(line)))
            rc = fail("--prompt-file: out of memory");
        else
            p->n++;
    }
    free(line);
    fclose(f);
    if (!rc && p->n == 0) {
        snprintf(msg, sizeof msg, "--prompt-file '%s': no prompt (expected one a line)", path);
        rc = fail(msg);
    }
    if (rc) lines_free(p);
    return rc;
}

/* Every line's completion, batched (see usage). */
static int generate_file(const char *weights, const char *path, const char *tok_name,
                         int max_tokens, int batch, const loom_sampling *s,
                         unsigned long long seed) {
    char msg[1200];
    prompt_lines pl;
    if (read_lines(path, &pl)) return 2;
    loom_error err = {0};
    loom_model_config cfg;
    loom_param_table table = {0};
    float *params = NULL;
    loom_tokenizer *tok = NULL;
    loom_batch_generator g = {0};
    int rc = 0, n = pl.n;
    int32_t **ids = calloc((size_t)n, sizeof *ids), *comp = NULL;
    int *plen = calloc((size_t)n, sizeof *plen), *clen = calloc((size_t)n, sizeof *clen);
    uint64_t *stream = calloc((size_t)n, sizeof *stream);
    uint8_t *stop = NULL;
    if (!ids || !plen || !clen || !stream) {
        rc = fail("--prompt-file: out of memory");
        goto done;
    }
    if (loom_weights_load(weights, &cfg, &table, &params, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    if (!tok_name) tok_name = cfg.vocab_size == 256 ? "bytes" : "gpt2";
    const int bytes = strcmp(tok_name, "bytes") == 0;
    if (!bytes && loom_tokenizer_load(&tok, tok_name, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    const int vocab = tok ? loom_tokenizer_vocab_size(tok) : 256;
    if (vocab > cfg.vocab_size) {
        snprintf(msg, sizeof msg, "--tokenizer %s has %d tokens but %s has a vocabulary of %d",
                 tok_name, vocab, weights, cfg.vocab_size);
        rc = fail(msg);
        goto done;
    }
    /* Stop tokens: any whose bytes hold a newline, the end-of-text token (a tokenizer's last
     * id), and the padding ids past the tokenizer's vocabulary. */
    if (!(stop = calloc((size_t)cfg.vocab_size, 1))) {
        rc = fail("--prompt-file: out of memory");
        goto done;
    }
    for (int t = 0; t < cfg.vocab_size; t++) {
        size_t len = 1;
        unsigned char b = (unsigned char)t;
        const unsigned char *text = t >= vocab ? NULL
                                    : tok      ? loom_tokenizer_token(tok, t, &len)
                                               : &b;
        stop[t] = !text || memchr(text, '\n', len) != NULL || (tok && t == vocab - 1);
    }
    for (int i = 0; i < n; i++) {
        const size_t len = strlen(pl.lines[i]);
        loom_token_buf buf = {0};
        if (bytes) {
            if (!(buf.ids = malloc(len * sizeof(int32_t)))) {
                rc = fail("--prompt-file: out of memory");
                goto done;
            }
            for (size_t k = 0; k < len; k++) buf.ids[k] = (unsigned char)pl.lines[i][k];
            buf.n = len;
        } else if (loom_tokenizer_encode(tok, (const unsigned char *)pl.lines[i], len, &buf,
                                         &err)) {
            rc = fail(err.msg);
            goto done;
        }
        ids[i] = buf.ids;
        plen[i] = (int)buf.n;
        stream[i] = (uint64_t)i;
        if (buf.n == 0 || (int)buf.n > cfg.seq_len) {
            snprintf(msg, sizeof msg,
                     "--prompt-file %s:%d: %zu tokens (expected 1 to the model's context of %d)",
                     path, i + 1, buf.n, cfg.seq_len);
            rc = fail(msg);
            goto done;
        }
    }
    const int max_new = max_tokens > 0 ? max_tokens : 1;
    if (!(comp = malloc((size_t)n * max_new * sizeof *comp))) {
        rc = fail("--prompt-file: out of memory");
        goto done;
    }
    if (loom_batch_generator_create(&g, &cfg, &table, params, batch < n ? batch : n, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    loom_rollout_options ro = {*s, max_new, stop, seed, NULL};
    if (max_tokens > 0 &&
        loom_rollout_run(&g, &ro, n, (const int32_t *const *)ids, plen, stream, comp, clen, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < clen[i]; k++) {
            const int32_t t = comp[(size_t)i * max_new + k];
            if (stop[t]) break;
            emit(tok, t);
        }
        fputc('\n', stdout);
    }
done:
    loom_batch_generator_free(&g);
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids), free(plen), free(clen), free(stream), free(comp), free(stop);
    loom_tokenizer_free(tok);
    free(params);
    loom_params_free(&table);
    lines_free(&pl);
    return rc;
}

int loom_cmd_generate(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* a vlm's text for an image: cmd_generate_vlm.c */
        if (strcmp(argv[i], "--image") == 0 || strncmp(argv[i], "--image=", 8) == 0)
            return loom_cmd_generate_vlm(argc, argv);
    const char *weights = NULL, *prompt = NULL, *tok_name = NULL, *prompt_file = NULL;
    int max_tokens = 100, batch = 64;
    unsigned long long seed = 1337;
    loom_sampling s = {0.8f, 0, 1.0f};
    loom_precision precision = LOOM_PRECISION_FP32;
    const loom_backend *be = NULL;
    loom_error perr = {0};
    const char *precision_s = NULL, *image = NULL;
    char msg[1200];
    const loom_flag flags[] = {
        LOOM_FLAG_STR(0, "weights", &weights, "PATH", "a file from loom train --save-weights"),
        LOOM_FLAG_STR(0, "prompt", &prompt, "TEXT", "the text to continue"),
        LOOM_FLAG_STR(0, "prompt-file", &prompt_file, "FILE",
                      "one prompt a line (no empty line); writes one completion a line,\n"
                      "in order, each ending before its first newline (or at an end-of-text\n"
                      "token, --max-tokens or the context)"),
        LOOM_FLAG_STR(0, "tokenizer", &tok_name, "gpt2|DIR|bytes",
                      "bytes for a 256-token vocabulary (loom data bytes), else gpt2"),
        LOOM_FLAG_NUM(0, "batch", LOOM_FLAG_INT, &batch, "N",
                      "--prompt-file: sequences decoded together (64); line k samples\n"
                      "from its own random stream (seed, k), whatever the batch",
                      1, 2147483647, "expected an integer >= 1"),
        LOOM_FLAG_STR(0, "image", &image, "FILE.png",
                      "a vlm's text for the image (loom generate --image x --help)"),
        LOOM_FLAG_NUM(1, "max-tokens", LOOM_FLAG_INT, &max_tokens, "N", "tokens at most (100)", 0,
                      2147483647, "expected an integer >= 0"),
        LOOM_FLAG_NUM(1, "temperature", LOOM_FLAG_FLOAT, &s.temperature, "T", "0.8; 0 = greedy", 0,
                      3e38, "expected a number >= 0"),
        LOOM_FLAG_NUM(1, "top-k", LOOM_FLAG_INT, &s.top_k, "K", "0 = off", 0, 2147483647,
                      "expected an integer >= 0"),
        {.name = "top-p",
         .kind = LOOM_FLAG_FLOAT,
         .dst = &s.top_p,
         .arg = "P",
         .help = "nucleus sampling (1 = off)",
         .group = 1,
         .lo = 0,
         .lo_open = 1,
         .hi = 1,
         .expect = "expected (0, 1]"},
        LOOM_FLAG_NUM(1, "seed", LOOM_FLAG_U64, &seed, "S", "the sampling seed (1337)", 0, 2e19,
                      "expected a non-negative integer"),
        LOOM_FLAG_STR(1, "precision", &precision_s, "fp32|bf16",
                      "the linear layers' GEMMs (docs/precision.md)"),
    };
    static const loom_flag_group groups[] = {{"Model and prompt", "docs/training.md"},
                                             {"Sampling", "docs/training.md"}};
    const loom_flag_spec spec = {
        .usage =
            "usage: loom generate --weights PATH (--prompt TEXT | --prompt-file FILE) [flags]\n"
            "       (a vlm: --weights PATH --image FILE.png [--prompt TEXT]; --image --help)",
        .about = "Streams the prompt's continuation to stdout. Generation stops at the model's\n"
                 "context length (--seq-len it was trained with).",
        LOOM_FLAGS_TABLE(flags, groups)};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom generate", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    if (precision_s && loom_precision_parse(precision_s, "--precision", &precision, &perr))
        return fail(perr.msg);
    if (!weights) return fail("--weights: required (a file from loom train --save-weights)");
    if (!prompt == !prompt_file) return fail("--prompt or --prompt-file: give exactly one");
    if (prompt_file && precision != LOOM_PRECISION_FP32)
        return fail("--precision bf16: not with --prompt-file yet (batched decoding computes in "
                    "fp32; docs/precision.md)");
    if (prompt_file)
        return generate_file(weights, prompt_file, tok_name, max_tokens, batch, &s, seed);
    loom_error err = {0};
    loom_model_config cfg;
    loom_param_table table;
    float *params = NULL;
    if (loom_weights_load(weights, &cfg, &table, &params, &err)) return fail(err.msg);
    if (!tok_name) tok_name = cfg.vocab_size == 256 ? "bytes" : "gpt2";
    loom_tokenizer *tok = NULL;
    loom_token_buf ids = {0};
    int rc = 0;
    loom_generator g = {0};
    int *order = NULL; /* the sampler's scratch */
    if (strcmp(tok_name, "bytes") == 0) {
        size_t n = strlen(prompt);
        ids.ids = malloc((n ? n : 1) * sizeof(int32_t));
        for (size_t i = 0; ids.ids && i < n; i++) ids.ids[i] = (unsigned char)prompt[i];
        ids.n = ids.ids ? n : 0;
    } else if (loom_tokenizer_load(&tok, tok_name, &err) ||
               loom_tokenizer_encode(tok, (const unsigned char *)prompt, strlen(prompt), &ids,
                                     &err)) {
        rc = fail(err.msg);
        goto done;
    }
    int vocab = tok ? loom_tokenizer_vocab_size(tok) : 256;
    if (vocab > cfg.vocab_size) {
        snprintf(msg, sizeof msg, "--tokenizer %s has %d tokens but %s has a vocabulary of %d",
                 tok_name, vocab, weights, cfg.vocab_size);
        rc = fail(msg);
        goto done;
    }
    if (ids.n == 0) {
        rc = fail("--prompt: empty (give at least one character)");
        goto done;
    }
    if ((int)ids.n > cfg.seq_len) {
        snprintf(msg, sizeof msg, "--prompt: %zu tokens, longer than the model's context of %d",
                 ids.n, cfg.seq_len);
        rc = fail(msg);
        goto done;
    }
    if (precision == LOOM_PRECISION_BF16) { /* the GEMMs of one token: 1 row each */
        const int one = 1;
        if (loom_backend_cpu_bf16_open(&be, &err) ||
            loom_model_prepare_gemms(be, &table, &one, 1, 0, &err)) {
            rc = fail(err.msg);
            goto done;
        }
        loom_backend_cpu_bf16_describe(be, msg, sizeof msg);
        fprintf(stderr, "loom: precision bf16: %s\n", msg);
    }
    if (loom_generator_create_on(&g, &cfg, &table, params, be, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    if (!(order = malloc((size_t)cfg.vocab_size * sizeof *order))) {
        rc = fail("out of memory");
        goto done;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    int pos = 0; /* the next position to feed */
    for (; pos < (int)ids.n; pos++) loom_generator_step(&g, ids.ids[pos], pos);
    for (int i = 0; i < max_tokens; i++) {
        double u = loom_philox_uniform((uint32_t)loom_philox_u64(seed, GEN_STREAM, (uint64_t)i, 0));
        int32_t next = loom_sample(g.logits, cfg.vocab_size, &s, u, order, NULL);
        if (next >= vocab) break; /* a padding id the tokenizer cannot print */
        emit(tok, next);
        if (pos == cfg.seq_len) break; /* the context is full */
        loom_generator_step(&g, next, pos++);
    }
    fputc('\n', stdout);
done:
    free(order);
    loom_generator_free(&g);
    loom_backend_close(be);
    free(ids.ids);
    loom_tokenizer_free(tok);
    free(params);
    loom_params_free(&table);
    return rc;
}
