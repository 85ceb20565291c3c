/* loom generate: loads a weights file written by `loom train --save-weights`, encodes the
 * prompt, and streams sampled tokens to stdout as they come (KV-cache decoding). */
#include "cli/cmd_generate.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_generate_vlm.h"
#include "core/philox.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "model/weights.h"

#define GEN_STREAM 0x67656e00u /* "gen" */

static void usage(FILE *f) {
    fprintf(f, "usage: loom generate --weights PATH --prompt TEXT [--tokenizer gpt2|DIR|bytes]\n"
               "       (a vlm: --weights PATH --image FILE.png [--prompt TEXT]; --image --help)\n"
               "       [--max-tokens N (100)] [--temperature T (0.8; 0 = greedy)]\n"
               "       [--top-k K (0 = off)] [--top-p P (1 = off)] [--seed S]\n"
               "Streams the prompt's continuation to stdout. The tokenizer defaults to bytes for\n"
               "a 256-token vocabulary (loom data bytes) and gpt2 otherwise. Generation stops at\n"
               "the model's context length (--seq-len it was trained with).\n");
}

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

int loom_cmd_generate(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* a vlm's text for an image: cmd_generate_vlm.c */
        if (strcmp(argv[i], "--image") == 0 || strncmp(argv[i], "--image=", 8) == 0)
            return loom_cmd_generate_vlm(argc, argv);
    const char *weights = NULL, *prompt = NULL, *tok_name = NULL;
    int max_tokens = 100;
    unsigned long long seed = 1337;
    loom_sampling s = {0.8f, 0, 1.0f};
    static const struct option opts[] = {
        {"weights", 1, NULL, 'w'},     {"prompt", 1, NULL, 'p'},
        {"tokenizer", 1, NULL, 't'},   {"max-tokens", 1, NULL, 'n'},
        {"temperature", 1, NULL, 'T'}, {"top-k", 1, NULL, 'k'},
        {"top-p", 1, NULL, 'P'},       {"seed", 1, NULL, 's'},
        {"help", 0, NULL, 'h'},        {0, 0, 0, 0}};
    optind = 0;
    opterr = 0;
    int c;
    char *end;
    char msg[1200];
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'w':
            weights = optarg;
            break;
        case 'p':
            prompt = optarg;
            break;
        case 't':
            tok_name = optarg;
            break;
        case 'n':
            max_tokens = (int)strtol(optarg, &end, 10);
            if (*end || max_tokens < 0) return fail("--max-tokens: expected an integer >= 0");
            break;
        case 'T':
            s.temperature = strtof(optarg, &end);
            if (*end || s.temperature < 0) return fail("--temperature: expected a number >= 0");
            break;
        case 'k':
            s.top_k = (int)strtol(optarg, &end, 10);
            if (*end || s.top_k < 0) return fail("--top-k: expected an integer >= 0");
            break;
        case 'P':
            s.top_p = strtof(optarg, &end);
            if (*end || !(s.top_p > 0 && s.top_p <= 1)) return fail("--top-p: expected (0, 1]");
            break;
        case 's':
            seed = strtoull(optarg, &end, 10);
            if (*end) return fail("--seed: expected a non-negative integer");
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            snprintf(msg, sizeof msg, "unknown option or missing value '%s' (see --help)",
                     argv[optind - 1]);
            return fail(msg);
        }
    }
    if (!weights) return fail("--weights: required (a file from loom train --save-weights)");
    if (!prompt) return fail("--prompt: required");
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
    if (loom_generator_create(&g, &cfg, &table, params, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    int pos = 0; /* the next position to feed */
    for (; pos < (int)ids.n; pos++) loom_generator_step(&g, ids.ids[pos], pos);
    for (int i = 0; i < max_tokens; i++) {
        double u = loom_philox_uniform((uint32_t)loom_philox_u64(seed, GEN_STREAM, (uint64_t)i, 0));
        int32_t next = loom_sample(g.logits, cfg.vocab_size, &s, u);
        if (next >= vocab) break; /* a padding id the tokenizer cannot print */
        emit(tok, next);
        if (pos == cfg.seq_len) break; /* the context is full */
        loom_generator_step(&g, next, pos++);
    }
    fputc('\n', stdout);
done:
    loom_generator_free(&g);
    free(ids.ids);
    loom_tokenizer_free(tok);
    free(params);
    loom_params_free(&table);
    return rc;
}
