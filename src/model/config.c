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
    {"gpt2-tiny",
     {LOOM_FAMILY_GPT2, 4, 4, 4, 128, 512, 50257, 256, 1e-5f, 10000.0f, 0, 2, 1, 0, 0.0f, 0.01f,
      0.0f}},
    {"gpt2-small",
     {LOOM_FAMILY_GPT2, 12, 12, 12, 768, 3072, 50257, 1024, 1e-5f, 10000.0f, 0, 2, 1, 0, 0.0f,
      0.01f, 0.0f}},
    {"llama-tiny",
     {LOOM_FAMILY_LLAMA, 4, 4, 2, 128, 352, 32000, 256, 1e-5f, 10000.0f, 0, 2, 1, 0, 0.0f, 0.01f,
      0.0f}},
    {"llama-100m",
     {LOOM_FAMILY_LLAMA, 8, 12, 4, 768, 2048, 32000, 1024, 1e-5f, 10000.0f, 0, 2, 1, 0, 0.0f, 0.01f,
      0.0f}},
};
#define N_PRESETS (int)(sizeof PRESETS / sizeof PRESETS[0])

const char *loom_model_preset_names(void) {
    return "gpt2-tiny, gpt2-small, llama-tiny, llama-100m";
}

const char *loom_family_name(loom_family f) {
    return f == LOOM_FAMILY_GPT2 ? "gpt2" : "llama";
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

loom_status loom_model_config_validate(const loom_model_config *c, loom_error *err) {
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
    if (c->family == LOOM_FAMILY_LLAMA && (c->d_model / c->n_head) % 2 != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--n-head %d: head dim %d must be even for RoPE (llama family)",
                              c->n_head, c->d_model / c->n_head);
    if (c->vocab_size > (1 << 30))
        return loom_error_set(err, LOOM_ERR_INPUT, "--vocab-size %d: too large", c->vocab_size);
    if (!(c->norm_eps > 0.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--norm-eps %g: expected > 0", c->norm_eps);
    if (c->family == LOOM_FAMILY_LLAMA && !(c->rope_theta > 0.0f))
        return loom_error_set(err, LOOM_ERR_INPUT, "--rope-theta %g: expected > 0", c->rope_theta);
    return validate_moe(c, err);
}

int loom_model_layer_is_moe(const loom_model_config *c, int layer) {
    return c->n_experts > 0 && layer % c->moe_every == c->moe_every - 1;
}
