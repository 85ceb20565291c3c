#include "model/config_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json_field.h"

json_t *loom_model_config_to_json(const loom_model_config *c) {
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f}", "family",
                          loom_family_name(c->family), "n_layer", c->n_layer, "n_head", c->n_head,
                          "n_kv_head", c->n_kv_head, "d_model", c->d_model, "d_ff", c->d_ff,
                          "vocab_size", c->vocab_size, "seq_len", c->seq_len, "norm_eps",
                          (double)c->norm_eps, "rope_theta", (double)c->rope_theta);
    /* Mixture of experts: recorded only for MoE models (a dense manifest is unchanged). */
    if (j && c->n_experts > 0)
        json_object_set_new(
            j, "moe",
            json_pack("{s:i, s:i, s:i, s:b, s:f, s:f, s:f}", "n_experts", c->n_experts, "top_k",
                      c->top_k, "moe_every", c->moe_every, "shared_expert", c->shared_expert,
                      "capacity_factor", (double)c->capacity_factor, "aux_loss_coef",
                      (double)c->aux_loss_coef, "z_loss_coef", (double)c->z_loss_coef));
    /* Diffusion transformer: the sample shape, patches and classes. */
    if (j && c->family == LOOM_FAMILY_DIT)
        json_object_set_new(j, "dit",
                            json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "channels",
                                      c->channels, "frames", c->frames, "height", c->height,
                                      "width", c->width, "patch", c->patch, "patch_t", c->patch_t,
                                      "n_classes", c->n_classes));
    /* Multimodal LLM: the image shape and the vision encoder. */
    if (j && c->family == LOOM_FAMILY_VLM)
        json_object_set_new(j, "vlm",
                            json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "channels",
                                      c->channels, "height", c->height, "width", c->width, "patch",
                                      c->patch, "vit_layers", c->vit_layers, "vit_d_model",
                                      c->vit_d_model, "vit_n_head", c->vit_n_head, "vit_d_ff",
                                      c->vit_d_ff, "max_images", c->max_images));
    return j;
}

/* model.vlm (family vlm only). */
static loom_status parse_vlm(const loom_json_reader *c, const json_t *j, loom_model_config *mc) {
    if (mc->family != LOOM_FAMILY_VLM) return LOOM_OK;
    const loom_json_int_field ints[] = {
        {"channels", &mc->channels},     {"height", &mc->height},
        {"width", &mc->width},           {"patch", &mc->patch},
        {"vit_layers", &mc->vit_layers}, {"vit_d_model", &mc->vit_d_model},
        {"vit_n_head", &mc->vit_n_head}, {"vit_d_ff", &mc->vit_d_ff},
        {"max_images", &mc->max_images}};
    const size_t n = sizeof ints / sizeof ints[0];
    if (!json_is_object(j)) return loom_json_fail(c, "%s", "model.vlm: missing (family vlm)");
    size_t i = loom_json_ints_in(j, ints, n, 1, 1 << 20);
    if (i < n) return loom_json_fail(c, "model.vlm: '%s' must be a positive integer", ints[i].key);
    mc->frames = mc->patch_t = 1;
    return LOOM_OK;
}

/* model.dit (family dit only). */
static loom_status parse_dit(const loom_json_reader *c, const json_t *j, loom_model_config *mc) {
    if (mc->family != LOOM_FAMILY_DIT) return LOOM_OK;
    const loom_json_int_field ints[] = {
        {"channels", &mc->channels},  {"frames", &mc->frames}, {"height", &mc->height},
        {"width", &mc->width},        {"patch", &mc->patch},   {"patch_t", &mc->patch_t},
        {"n_classes", &mc->n_classes}}; /* the last, from 0: 0 classes is unconditional */
    const size_t n = sizeof ints / sizeof ints[0];
    if (!json_is_object(j)) return loom_json_fail(c, "%s", "model.dit: missing (family dit)");
    size_t i = loom_json_ints_in(j, ints, n - 1, 1, 1 << 20);
    if (i == n - 1) i += loom_json_ints_in(j, ints + i, 1, 0, 1 << 20);
    if (i < n) return loom_json_fail(c, "model.dit: '%s' must be a positive integer", ints[i].key);
    return LOOM_OK;
}

/* model.moe (absent: a dense model). */
static loom_status parse_moe(const loom_json_reader *c, const json_t *j, loom_model_config *mc) {
    mc->n_experts = 0;
    if (!j) return LOOM_OK;
    int64_t e, k, every;
    json_t *shared = json_object_get(j, "shared_expert");
    const char *fkeys[3] = {"capacity_factor", "aux_loss_coef", "z_loss_coef"};
    float *fdst[3] = {&mc->capacity_factor, &mc->aux_loss_coef, &mc->z_loss_coef};
    if (!json_is_object(j) || !loom_json_int_in(json_object_get(j, "n_experts"), 1, 1024, &e) ||
        !loom_json_int_in(json_object_get(j, "top_k"), 1, e, &k) ||
        !loom_json_int_in(json_object_get(j, "moe_every"), 1, mc->n_layer, &every) ||
        !json_is_boolean(shared))
        return loom_json_fail(
            c, "%s",
            "model.moe: needs n_experts (1..1024), top_k (1..n_experts), moe_every "
            "(1..n_layer), shared_expert (true/false)");
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(j, fkeys[i]);
        float x = json_is_number(v) ? (float)json_number_value(v) : -1.0f;
        if (!(isfinite(x) && x >= 0.0f))
            return loom_json_fail(c, "model.moe: '%s' must be a number >= 0", fkeys[i]);
        *fdst[i] = x;
    }
    mc->n_experts = (int)e;
    mc->top_k = (int)k;
    mc->moe_every = (int)every;
    mc->shared_expert = json_is_true(shared);
    return LOOM_OK;
}

loom_status loom_model_config_from_json(loom_model_config *mc, const json_t *j, const char *origin,
                                        loom_error *err) {
    const loom_json_reader cx = {origin, "invalid model configuration", err}, *c = &cx;
    memset(mc, 0, sizeof *mc);
    const char *family = json_string_value(json_object_get(j, "family"));
    if (!json_is_object(j) || !family ||
        (strcmp(family, "gpt2") != 0 && strcmp(family, "llama") != 0 &&
         strcmp(family, "dit") != 0 && strcmp(family, "vlm") != 0))
        return loom_json_fail(c, "%s", "model: needs family gpt2, llama, dit or vlm");
    mc->family = strcmp(family, "gpt2") == 0    ? LOOM_FAMILY_GPT2
                 : strcmp(family, "llama") == 0 ? LOOM_FAMILY_LLAMA
                 : strcmp(family, "vlm") == 0   ? LOOM_FAMILY_VLM
                                                : LOOM_FAMILY_DIT;
    const loom_json_int_field ints[] = {
        {"n_layer", &mc->n_layer}, {"n_head", &mc->n_head}, {"n_kv_head", &mc->n_kv_head},
        {"d_model", &mc->d_model}, {"d_ff", &mc->d_ff},     {"vocab_size", &mc->vocab_size},
        {"seq_len", &mc->seq_len}};
    const size_t n = sizeof ints / sizeof ints[0];
    size_t i = loom_json_ints_in(j, ints, n, 1, 1 << 30);
    if (i < n) return loom_json_fail(c, "model: '%s' must be a positive integer", ints[i].key);
    json_t *eps = json_object_get(j, "norm_eps"), *theta = json_object_get(j, "rope_theta");
    /* As floats: finite and positive (a huge double would become inf). */
    float e = json_is_number(eps) ? (float)json_number_value(eps) : 0.0f;
    float th = json_is_number(theta) ? (float)json_number_value(theta) : 0.0f;
    if (!(isfinite(e) && e > 0.0f && isfinite(th) && th > 0.0f))
        return loom_json_fail(c, "%s",
                              "model: norm_eps and rope_theta must be positive finite numbers");
    mc->norm_eps = e;
    mc->rope_theta = th;
    loom_status st = parse_moe(c, json_object_get(j, "moe"), mc);
    if (!st) st = parse_vlm(c, json_object_get(j, "vlm"), mc);
    return st ? st : parse_dit(c, json_object_get(j, "dit"), mc);
}
