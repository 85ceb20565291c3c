#include "model/config.h"

#include <math.h>
#include <string.h>

typedef struct {
    const char *name;
    loom_model_config cfg;
} preset;

/* Sizes follow GPT-2 (124M = gpt2-small) and Llama conventions; d_ff of the Llama
 * presets is a multiple of 32 near 8/3 * d_model. */
static const preset PRESETS[] = {
#define LM(fam, L, H, KV, C, F, V, T)                                                              \
    {                                                                                              \
        .family = fam, .n_layer = L, .n_head = H, .n_kv_head = KV, .d_model = C, .d_ff = F,        \
        .vocab_size = V, .seq_len = T, .norm_eps = 1e-5f, .rope_theta = 10000.0f, .top_k = 2,      \
        .moe_every = 1, .aux_loss_coef = 0.01f                                                     \
    }
    {"gpt2-tiny", LM(LOOM_FAMILY_GPT2, 4, 4, 4, 128, 512, 50257, 256)},
    {"gpt2-small", LM(LOOM_FAMILY_GPT2, 12, 12, 12, 768, 3072, 50257, 1024)},
    {"llama-tiny", LM(LOOM_FAMILY_LLAMA, 4, 4, 2, 128, 352, 32000, 256)},
    {"llama-100m", LM(LOOM_FAMILY_LLAMA, 8, 12, 4, 768, 2048, 32000, 1024)},
#undef LM
/* DiT (Peebles & Xie) sized for Fashion-MNIST's 28 x 28 gray images and 10 classes:
 * dit-tiny 49 tokens of 4 x 4 patches, dit-small DiT-S's width on 196 tokens of 2 x 2. */
#define DIT(L, H, C, F, p)                                                                         \
    {                                                                                              \
        .family = LOOM_FAMILY_DIT, .n_layer = L, .n_head = H, .n_kv_head = H, .d_model = C,        \
        .d_ff = F, .vocab_size = 1, .seq_len = (28 / p) * (28 / p), .norm_eps = 1e-6f,             \
        .rope_theta = 10000.0f, .top_k = 2, .moe_every = 1, .aux_loss_coef = 0.01f, .channels = 1, \
        .frames = 1, .height = 28, .width = 28, .patch = p, .patch_t = 1, .n_classes = 10          \
    }
    {"dit-tiny", DIT(4, 4, 128, 512, 4)},
    {"dit-small", DIT(12, 6, 384, 1536, 2)},
#undef DIT
/* Multimodal LLMs (model/vlm.h) sized for Fashion-MNIST grids (loom data vlm): vlm-tiny
 * reads 2 x 2 grids (56 x 56, 64 patch tokens of 7 x 7), vlm-small 3 x 3 grids (84 x 84,
 * 144 tokens); byte-level vocabulary 256 + <image> + <|endoftext|>, rounded up to 264. */
#define VLM(L, H, KV, C, F, T, px, VL, VC, VH)                                                     \
    {                                                                                              \
        .family = LOOM_FAMILY_VLM, .n_layer = L, .n_head = H, .n_kv_head = KV, .d_model = C,       \
        .d_ff = F, .vocab_size = 264, .seq_len = T, .norm_eps = 1e-5f, .rope_theta = 10000.0f,     \
        .top_k = 2, .moe_every = 1, .aux_loss_coef = 0.01f, .channels = 1, .frames = 1,            \
        .height = px, .width = px, .patch = 7, .patch_t = 1, .vit_layers = VL, .vit_d_model = VC,  \
        .vit_n_head = VH, .vit_d_ff = 4 * VC, .max_images = 1                                      \
    }
    {"vlm-tiny", VLM(2, 4, 2, 128, 352, 192, 56, 2, 64, 4)},
    {"vlm-small", VLM(4, 8, 4, 256, 704, 400, 84, 4, 192, 6)},
#undef VLM
};
#define N_PRESETS (int)(sizeof PRESETS / sizeof PRESETS[0])

const char *loom_model_preset_names(void) {
    return "gpt2-tiny, gpt2-small, llama-tiny, llama-100m, dit-tiny, dit-small, vlm-tiny, "
           "vlm-small";
}

const char *loom_family_name(loom_family f) {
    return f == LOOM_FAMILY_GPT2    ? "gpt2"
           : f == LOOM_FAMILY_LLAMA ? "llama"
           : f == LOOM_FAMILY_VLM   ? "vlm"
                                    : "dit";
}

loom_status loom_model_preset(loom_model_config *cfg, const char *name, loom_error *err) {
    for (int i = 0; i < N_PRESETS; i++) {
        if (strcmp(PRESETS[i].name, name) == 0) {
            *cfg = PRESETS[i].cfg;
            return LOOM_OK;
        }
    }
    return loom_error_set(err, LOOM_ERR_INPUT, "--model '%s': unknown preset (expected one of %s)",
                          name, loom_model_preset_names());
}

/* --n-experts, --top-k, --moe-every, --capacity-factor, --aux-loss-coef, --z-loss-coef. */
static loom_status validate_moe(const loom_model_config *c, loom_error *err) {
    if (c->n_experts < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--n-experts %d: expected >= 0 (0 = dense MLP)",
                              c->n_experts);
    if (c->n_experts == 0) return LOOM_OK;
    if (c->n_experts > 1024)
        return loom_error_set(err, LOOM_ERR_INPUT, "--n-experts %d: at most 1024", c->n_experts);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--top-k %d: expected 1 <= top-k <= --n-experts %d", c->top_k,
                              c->n_experts);
    if (c->moe_every < 1 || c->moe_every > c->n_layer)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--moe-every %d: expected 1 <= moe-every <= --n-layer %d",
                              c->moe_every, c->n_layer);
    if (!(c->capacity_factor >= 0.0f) || !isfinite(c->capacity_factor))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--capacity-factor %g: expected >= 0 (0 = dropless)",
                              (double)c->capacity_factor);
    if (!(c->aux_loss_coef >= 0.0f) || !isfinite(c->aux_loss_coef))
        return loom_error_set(err, LOOM_ERR_INPUT, "--aux-loss-coef %g: expected >= 0",
                              (double)c->aux_loss_coef);
    if (!(c->z_loss_coef >= 0.0f) || !isfinite(c->z_loss_coef))
        return loom_error_set(err, LOOM_ERR_INPUT, "--z-loss-coef %g: expected >= 0",
                              (double)c->z_loss_coef);
    return LOOM_OK;
}

int loom_model_dit_tokens(const loom_model_config *c) {
    if (c->patch <= 0 || c->patch_t <= 0) return 0;
    return (c->frames / c->patch_t) * (c->height / c->patch) * (c->width / c->patch);
}

int loom_model_dit_sample_floats(const loom_model_config *c) {
    return c->frames * c->channels * c->height * c->width;
}

int loom_model_dit_patch_floats(const loom_model_config *c) {
    return c->patch_t * c->patch * c->patch * c->channels;
}

/* --channels, --frames, --height, --width, --patch, --patch-t, --n-classes. */
static loom_status validate_dit(const loom_model_config *c, loom_error *err) {
    struct {
        const char *flag;
        int value, min, max;
    } range[] = {{"--channels", c->channels, 1, 4},
                 {"--frames", c->frames, 1, 4096},
                 {"--height", c->height, 1, 1 << 14},
                 {"--width", c->width, 1, 1 << 14},
                 {"--patch", c->patch, 1, 64},
                 {"--patch-t", c->patch_t, 1, 64},
                 {"--n-classes", c->n_classes, 0, 1 << 20}}; /* 0 classes: unconditional */
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++)
        if (range[i].value < range[i].min || range[i].value > range[i].max)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s %d: expected %d..%d (dit family)",
                                  range[i].flag, range[i].value, range[i].min, range[i].max);
    if (c->height % c->patch != 0 || c->width % c->patch != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--patch %d: must divide the image size %d x %d (--height, --width)",
                              c->patch, c->height, c->width);
    if (c->frames % c->patch_t != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--patch-t %d: must divide --frames %d",
                              c->patch_t, c->frames);
    const int video = c->frames / c->patch_t > 1, unit = video ? 16 : 4;
    if (c->d_model % unit != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--d-model %d: must be a multiple of %d for the %s sin-cos positions",
                              c->d_model, unit, video ? "3-D (video)" : "2-D");
    if (c->n_kv_head != c->n_head)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-kv-head %d: the dit family has no grouped-query attention "
                              "(expected n_kv_head == n_head == %d)",
                              c->n_kv_head, c->n_head);
    if (c->n_experts != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-experts %d: the dit family has dense MLPs only (expected 0)",
                              c->n_experts);
    if (c->seq_len != loom_model_dit_tokens(c))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--seq-len %d: a dit's sequence is its %d patch tokens "
                              "(frames/patch_t x height/patch x width/patch)",
                              c->seq_len, loom_model_dit_tokens(c));
    return LOOM_OK;
}

/* --vit-layers, --vit-d-model, --vit-n-head, --vit-d-ff, --vit-patch, --max-images and the
 * image shape (family vlm). */
static loom_status validate_vlm(const loom_model_config *c, loom_error *err) {
    struct {
        const char *flag;
        int value, min, max;
    } range[] = {
        {"--vit-layers", c->vit_layers, 1, 1024}, {"--vit-d-model", c->vit_d_model, 4, 1 << 16},
        {"--vit-n-head", c->vit_n_head, 1, 1024}, {"--vit-d-ff", c->vit_d_ff, 1, 1 << 18},
        {"--max-images", c->max_images, 1, 64},   {"--channels", c->channels, 1, 4},
        {"--height", c->height, 1, 4096},         {"--width", c->width, 1, 4096},
        {"--vit-patch", c->patch, 1, 64}};
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++)
        if (range[i].value < range[i].min || range[i].value > range[i].max)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s %d: expected %d..%d (vlm family)",
                                  range[i].flag, range[i].value, range[i].min, range[i].max);
    if (c->height % c->patch != 0 || c->width % c->patch != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--vit-patch %d: must divide the image size %d x %d (--height, "
                              "--width)",
                              c->patch, c->height, c->width);
    if (c->frames != 1 || c->patch_t != 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--frames %d --patch-t %d: the vlm family reads images (expected 1)",
                              c->frames, c->patch_t);
    if (c->vit_d_model % c->vit_n_head != 0 || c->vit_d_model % 4 != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--vit-d-model %d: must be a multiple of 4 (2-D sin-cos positions) "
                              "and of --vit-n-head %d",
                              c->vit_d_model, c->vit_n_head);
    if (c->n_experts != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-experts %d: the vlm family has a dense decoder (expected 0)",
                              c->n_experts);
    const int tokens = loom_model_dit_tokens(c);
    if (tokens >= c->seq_len)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--seq-len %d: must exceed an image's %d patch tokens (vlm family)",
                              c->seq_len, tokens);
    if (c->vocab_size < 258)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--vocab-size %d: the vlm family needs at least 258 (bytes, <image>, "
                              "<|endoftext|>)",
                              c->vocab_size);
    return LOOM_OK;
}

loom_status loom_model_config_validate(const loom_model_config *c, loom_error *err) {
    /* a dit's shape first: its sequence length follows from it */
    if (c->family == LOOM_FAMILY_DIT) {
        loom_status st = validate_dit(c, err);
        if (st) return st;
    }
    if (c->family == LOOM_FAMILY_VLM) {
        loom_status st = validate_vlm(c, err);
        if (st) return st;
    } else if (c->freeze) {
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--freeze: only the vlm family has parts to freeze (--family vlm)");
    }
    if (c->freeze < 0 || c->freeze >= 7)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--freeze: every part frozen leaves nothing to train (expected at "
                              "most two of vision, projector, llm)");
    struct {
        const char *flag;
        int value;
    } positive[] = {{"--n-layer", c->n_layer},     {"--n-head", c->n_head},
                    {"--n-kv-head", c->n_kv_head}, {"--d-model", c->d_model},
                    {"--d-ff", c->d_ff},           {"--vocab-size", c->vocab_size},
                    {"--seq-len", c->seq_len}};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value <= 0)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s %d: expected a positive integer",
                                  positive[i].flag, positive[i].value);
    if (c->d_model % c->n_head != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-head %d: must divide --d-model %d (head dim = d_model / n_head)",
                              c->n_head, c->d_model);
    if (c->n_head % c->n_kv_head != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--n-kv-head %d: must divide --n-head %d",
                              c->n_kv_head, c->n_head);
    if (c->family == LOOM_FAMILY_GPT2 && c->n_kv_head != c->n_head)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-kv-head %d: the gpt2 family has no grouped-query attention "
                              "(expected n_kv_head == n_head == %d)",
                              c->n_kv_head, c->n_head);
    if (c->family != LOOM_FAMILY_GPT2 && c->family != LOOM_FAMILY_DIT &&
        (c->d_model / c->n_head) % 2 != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-head %d: head dim %d must be even for RoPE (llama family)",
                              c->n_head, c->d_model / c->n_head);
    if (c->vocab_size > (1 << 30))
        return loom_error_set(err, LOOM_ERR_INPUT, "--vocab-size %d: too large", c->vocab_size);
    if (!(c->norm_eps > 0.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--norm-eps %g: expected > 0", c->norm_eps);
    if ((c->family == LOOM_FAMILY_LLAMA || c->family == LOOM_FAMILY_VLM) && !(c->rope_theta > 0.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--rope-theta %g: expected > 0", c->rope_theta);
    return validate_moe(c, err);
}

int loom_model_layer_is_moe(const loom_model_config *c, int layer) {
    return c->n_experts > 0 && layer % c->moe_every == c->moe_every - 1;
}
