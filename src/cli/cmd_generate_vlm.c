/* loom generate --weights W --image FILE.png [--prompt TEXT] [--max-tokens N]
 * [--temperature T] [--seed S] [--threads N]: the text a vlm (family vlm, model/vlm.h) writes for
 * an image, byte tokens. The sequence is <image> then the prompt and a newline (none without a
 * prompt: the caption), as loom data vlm writes its samples; each new token is drawn from
 * the logits at the last position (temperature 0: the most likely), the whole sequence run
 * again each time (no KV cache), until <|endoftext|>, --max-tokens or the context is full. */
#include "cli/cmd_generate_vlm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_boot.h"
#include "core/flags.h"
#include "core/philox.h"
#include "data/png_folder.h"
#include "data/vlm_shard.h"
#include "model/model.h"
#include "model/vlm.h"
#include "model/weights.h"

#define GEN_STREAM 0x67656e01u

static int fail(const char *msg) {
    fprintf(stderr, "loom generate: %s\n", msg);
    return 2;
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

int loom_cmd_generate_vlm(int argc, char **argv) {
    const char *weights = NULL, *image = NULL, *prompt = NULL;
    int max_tokens = 200, threads = 1;
    float temperature = 0.0f;
    unsigned long long seed = 1337;
    const loom_flag flags[] = {
        LOOM_FLAG_STR(0, "weights", &weights, "W", "a vlm's file from loom train --save-weights"),
        LOOM_FLAG_STR(0, "image", &image, "FILE.png", "a PNG of the model's image size"),
        LOOM_FLAG_STR(0, "prompt", &prompt, "TEXT", "the question (without: its caption)"),
        LOOM_FLAG_NUM(0, "max-tokens", LOOM_FLAG_INT, &max_tokens, "N", "tokens at most (200)", 0,
                      2147483647, "expected an integer >= 0"),
        LOOM_FLAG_NUM(0, "temperature", LOOM_FLAG_FLOAT, &temperature, "T", "0: greedy", 0, 3e38,
                      "expected a number >= 0"),
        LOOM_FLAG_NUM(0, "seed", LOOM_FLAG_U64, &seed, "S", "the sampling seed (1337)", 0, 2e19,
                      "expected a non-negative integer"),
        LOOM_FLAG_NUM(0, "threads", LOOM_FLAG_INT, &threads, "N", "1; 0 = all cores", 0, 2147483647,
                      "expected an integer >= 0 (0 = all)"),
    };
    static const loom_flag_group groups[] = {{"A vision-language model", "docs/vlm.md"}};
    const loom_flag_spec spec = {
        .usage = "usage: loom generate --weights W --image FILE.png [--prompt TEXT] [flags]",
        .about = "Prints a vlm's text for the image (without --prompt: its caption).",
        LOOM_FLAGS_TABLE(flags, groups)};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom generate", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    char msg[1200];
    if (!weights) return fail("--weights: required (a file from loom train --save-weights)");
    if (!image) return fail("--image: required (a PNG of the model's image size)");
    loom_cpu_set_threads(threads ? threads : loom_cpu_default_threads());
    loom_error err = {0};
    loom_model_config cfg;
    loom_param_table table;
    float *params = NULL;
    if (loom_weights_load(weights, &cfg, &table, &params, &err)) return fail(err.msg);
    uint8_t *px = NULL;
    int32_t *tokens = NULL, *rec = NULL;
    float *row = NULL;
    loom_model m = {0};
    int rc = 0, h = 0, w = 0;
    if (cfg.family != LOOM_FAMILY_VLM) {
        snprintf(msg, sizeof msg, "--image: %s is a %s model (expected family vlm)", weights,
                 loom_family_name(cfg.family));
        rc = fail(msg);
        goto done;
    }
    if (loom_png_read(image, cfg.channels, &px, &h, &w, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    if (h != cfg.height || w != cfg.width) {
        snprintf(msg, sizeof msg, "--image %s: %d x %d pixels, the model reads %d x %d", image, w,
                 h, cfg.width, cfg.height);
        rc = fail(msg);
        goto done;
    }
    const int T = cfg.seq_len, V = cfg.vocab_size;
    const loom_vlm_record_shape shape = {
        T, loom_vlm_image_tokens(&cfg), cfg.max_images, cfg.channels, cfg.height, cfg.width};
    tokens = malloc((size_t)(T + 2) * sizeof *tokens);
    rec = malloc((size_t)loom_vlm_record_size(&shape) * sizeof *rec);
    row = malloc((size_t)V * sizeof *row);
    if (!tokens || !rec || !row) {
        rc = fail("out of memory");
        goto done;
    }
    int n = 0;
    tokens[n++] = LOOM_VLM_BYTE_IMAGE;
    if (prompt) {
        for (const char *q = prompt; *q && n < T; q++) tokens[n++] = (unsigned char)*q;
        if (n < T) tokens[n++] = '\n';
    }
    if (loom_model_create(&m, &(loom_model_options){.cfg = &cfg, .B = 1, .T = T}, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    for (int step = 0; step < max_tokens; step++) {
        int len = 0;
        if (loom_vlm_record_build(&shape, LOOM_VLM_BYTE_IMAGE, LOOM_VLM_BYTE_EOT, tokens, NULL, n,
                                  px, 1, rec, &len, &err)) {
            if (step == 0) rc = fail("--prompt: too long for the model's context with the image");
            break; /* the context is full */
        }
        if (len > T) break;
        loom_model_load_batch(&m, rec, 0);
        if (loom_model_forward(&m, params)) {
            rc = fail("forward failed");
            break;
        }
        loom_backend_copy_to_host(m.be, row, m.logits + (size_t)(len - 1) * V,
                                  (size_t)V * sizeof(float));
        const int32_t next = pick(row, V, temperature, seed, step);
        if (next == LOOM_VLM_BYTE_EOT || next == LOOM_VLM_BYTE_IMAGE || next > 255) break;
        fputc(next, stdout);
        fflush(stdout);
        tokens[n++] = next;
    }
    fputc('\n', stdout);
done:
    if (m.ops) loom_model_destroy(&m);
    free(px);
    free(tokens);
    free(rec);
    free(row);
    free(params);
    loom_params_free(&table);
    return rc;
}
