#include "model/weights.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "kernels/bf16.h"

#define N_META 11
#define N_MOE_META 7 /* written only for MoE models */
#define N_DIT_META 7 /* written only for dit models */
static const char *const DIT_KEYS[N_DIT_META] = {"channels", "frames",  "height",   "width",
                                                 "patch",    "patch_t", "n_classes"};

#define N_VLM_META 9 /* written only for vlm models */
static const char *const VLM_KEYS[N_VLM_META] = {"channels",   "height",     "width",
                                                 "patch",      "vit_layers", "vit_d_model",
                                                 "vit_n_head", "vit_d_ff",   "max_images"};

static void vlm_fields(loom_model_config *c, int *out[N_VLM_META]) {
    int *f[N_VLM_META] = {&c->channels,   &c->height,     &c->width,
                          &c->patch,      &c->vit_layers, &c->vit_d_model,
                          &c->vit_n_head, &c->vit_d_ff,   &c->max_images};
    for (int i = 0; i < N_VLM_META; i++) out[i] = f[i];
}

static void dit_fields(loom_model_config *c, int *out[N_DIT_META]) {
    int *f[N_DIT_META] = {&c->channels, &c->frames,  &c->height,   &c->width,
                          &c->patch,    &c->patch_t, &c->n_classes};
    for (int i = 0; i < N_DIT_META; i++) out[i] = f[i];
}

static loom_status write_tensors(const char *path, const loom_param_table *t, const void *flat,
                                 loom_dtype dtype, const char *const *meta_keys,
                                 const char *const *meta_values, int n_meta, loom_error *err);

loom_status loom_weights_save(const char *path, const loom_model_config *c,
                              const loom_param_table *t, const float *params, loom_error *err) {
    return loom_weights_save_as(path, c, t, params, LOOM_DTYPE_F32, err);
}

loom_status loom_weights_save_as(const char *path, const loom_model_config *c,
                                 const loom_param_table *t, const float *params, loom_dtype dtype,
                                 loom_error *err) {
    char vals[N_META + N_MOE_META + N_DIT_META + N_VLM_META][32];
    const char *keys[N_META + N_MOE_META + N_DIT_META + N_VLM_META] = {
        "format", "family",     "n_layer",       "n_head",          "n_kv_head",     "d_model",
        "d_ff",   "vocab_size", "seq_len",       "norm_eps",        "rope_theta",    "n_experts",
        "top_k",  "moe_every",  "shared_expert", "capacity_factor", "aux_loss_coef", "z_loss_coef"};
    snprintf(vals[0], 32, "loom-weights-1");
    snprintf(vals[1], 32, "%s", loom_family_name(c->family));
    snprintf(vals[2], 32, "%d", c->n_layer);
    snprintf(vals[3], 32, "%d", c->n_head);
    snprintf(vals[4], 32, "%d", c->n_kv_head);
    snprintf(vals[5], 32, "%d", c->d_model);
    snprintf(vals[6], 32, "%d", c->d_ff);
    snprintf(vals[7], 32, "%d", c->vocab_size);
    snprintf(vals[8], 32, "%d", c->seq_len);
    snprintf(vals[9], 32, "%.9g", (double)c->norm_eps);
    snprintf(vals[10], 32, "%.9g", (double)c->rope_theta);
    snprintf(vals[11], 32, "%d", c->n_experts);
    snprintf(vals[12], 32, "%d", c->top_k);
    snprintf(vals[13], 32, "%d", c->moe_every);
    snprintf(vals[14], 32, "%d", c->shared_expert);
    snprintf(vals[15], 32, "%.9g", (double)c->capacity_factor);
    snprintf(vals[16], 32, "%.9g", (double)c->aux_loss_coef);
    snprintf(vals[17], 32, "%.9g", (double)c->z_loss_coef);
    int n = N_META + (c->n_experts > 0 ? N_MOE_META : 0);
    if (c->family == LOOM_FAMILY_DIT) { /* the sample shape, after the common fields */
        loom_model_config copy = *c;
        int *f[N_DIT_META];
        dit_fields(&copy, f);
        for (int i = 0; i < N_DIT_META; i++, n++) {
            keys[n] = DIT_KEYS[i];
            snprintf(vals[n], 32, "%d", *f[i]);
        }
    }
    if (c->family == LOOM_FAMILY_VLM) { /* the image shape and the encoder */
        loom_model_config copy = *c;
        int *f[N_VLM_META];
        vlm_fields(&copy, f);
        for (int i = 0; i < N_VLM_META; i++, n++) {
            keys[n] = VLM_KEYS[i];
            snprintf(vals[n], 32, "%d", *f[i]);
        }
    }
    const char *values[N_META + N_MOE_META + N_DIT_META + N_VLM_META];
    for (int i = 0; i < n; i++) values[i] = vals[i];
    if (dtype == LOOM_DTYPE_F32) return write_tensors(path, t, params, dtype, keys, values, n, err);
    if (dtype != LOOM_DTYPE_BF16)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: weights are stored as F32 or BF16", path);
    loom_bf16 *half = malloc((t->total ? t->total : 1) * sizeof *half);
    if (!half) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    loom_bf16_from_f32_n(half, params, t->total);
    loom_status st = write_tensors(path, t, half, dtype, keys, values, n, err);
    free(half);
    return st;
}

loom_status loom_params_write_safetensors(const char *path, const loom_param_table *t,
                                          const float *flat, const char *const *meta_keys,
                                          const char *const *meta_values, int n_meta,
                                          loom_error *err) {
    return write_tensors(path, t, flat, LOOM_DTYPE_F32, meta_keys, meta_values, n_meta, err);
}

/* flat: table->total elements of dtype (4 or 2 bytes each). */
static loom_status write_tensors(const char *path, const loom_param_table *t, const void *flat,
                                 loom_dtype dtype, const char *const *meta_keys,
                                 const char *const *meta_values, int n_meta, loom_error *err) {
    loom_tensor_view *views = calloc((size_t)t->n_params, sizeof *views);
    if (!views) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    const size_t size = dtype == LOOM_DTYPE_BF16 ? sizeof(loom_bf16) : sizeof(float);
    for (int i = 0; i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        views[i] = (loom_tensor_view){p->name,
                                      dtype,
                                      p->ndim,
                                      {p->shape[0], p->shape[1]},
                                      (const char *)flat + p->offset * size};
    }
    loom_status st =
        loom_safetensors_write_meta(path, views, t->n_params, meta_keys, meta_values, n_meta, err);
    free(views);
    return st;
}

/* Integer metadata field `key`; an error names the file and the field. */
static loom_status meta_int_from(const loom_safetensors *f, const char *key, long lo, int *out,
                                 loom_error *err) {
    const char *v = loom_safetensors_meta(f, key);
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > (1L << 30))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: metadata '%s' is %s (expected an integer >= %ld; is this a "
                              "file written by loom train --save-weights?)",
                              f->path, key, v ? v : "missing", lo);
    *out = (int)x;
    return LOOM_OK;
}

static loom_status meta_int(const loom_safetensors *f, const char *key, int *out, loom_error *err) {
    return meta_int_from(f, key, 1, out, err);
}

static loom_status meta_float(const loom_safetensors *f, const char *key, float *out,
                              loom_error *err) {
    const char *v = loom_safetensors_meta(f, key);
    char *end = NULL;
    float x = v ? strtof(v, &end) : 0.0f;
    if (!v || !*v || *end)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: metadata '%s' is %s (expected a number)",
                              f->path, key, v ? v : "missing");
    *out = x;
    return LOOM_OK;
}

/* The MoE fields (absent: a dense model, as files before they were written). */
static loom_status meta_moe(const loom_safetensors *f, loom_model_config *c, loom_error *err) {
    if (!loom_safetensors_meta(f, "n_experts")) return LOOM_OK;
    loom_status st;
    if ((st = meta_int(f, "n_experts", &c->n_experts, err)) ||
        (st = meta_int(f, "top_k", &c->top_k, err)) ||
        (st = meta_int(f, "moe_every", &c->moe_every, err)) ||
        (st = meta_float(f, "capacity_factor", &c->capacity_factor, err)) ||
        (st = meta_float(f, "aux_loss_coef", &c->aux_loss_coef, err)) ||
        (st = meta_float(f, "z_loss_coef", &c->z_loss_coef, err)))
        return st;
    const char *sh = loom_safetensors_meta(f, "shared_expert");
    if (!sh || (strcmp(sh, "0") != 0 && strcmp(sh, "1") != 0))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: metadata 'shared_expert' is %s (expected 0 or 1)", f->path,
                              sh ? sh : "missing");
    c->shared_expert = sh[0] == '1';
    return LOOM_OK;
}

loom_status loom_weights_load(const char *path, loom_model_config *c, loom_param_table *t,
                              float **params, loom_error *err) {
    memset(t, 0, sizeof *t);
    *params = NULL;
    loom_safetensors f;
    loom_status st = loom_safetensors_open(&f, path, err);
    if (st) return st;
    const char *family = loom_safetensors_meta(&f, "family");
    memset(c, 0, sizeof *c);
    if (!family || (strcmp(family, "gpt2") != 0 && strcmp(family, "llama") != 0 &&
                    strcmp(family, "dit") != 0 && strcmp(family, "vlm") != 0)) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: metadata 'family' is %s (expected gpt2, llama, dit or vlm)", path,
                            family ? family : "missing");
    } else {
        c->family = strcmp(family, "gpt2") == 0    ? LOOM_FAMILY_GPT2
                    : strcmp(family, "llama") == 0 ? LOOM_FAMILY_LLAMA
                    : strcmp(family, "vlm") == 0   ? LOOM_FAMILY_VLM
                                                   : LOOM_FAMILY_DIT;
        int *vshape[N_VLM_META];
        vlm_fields(c, vshape);
        for (int i = 0; i < N_VLM_META && c->family == LOOM_FAMILY_VLM && !st; i++)
            st = meta_int(&f, VLM_KEYS[i], vshape[i], err);
        if (c->family == LOOM_FAMILY_VLM) c->frames = c->patch_t = 1;
        int *shape[N_DIT_META];
        dit_fields(c, shape);
        for (int i = 0; i < N_DIT_META && c->family == LOOM_FAMILY_DIT && !st; i++)
            st = meta_int_from(&f, DIT_KEYS[i], shape[i] == &c->n_classes ? 0 : 1, shape[i], err);

        if (!st && !(st = meta_int(&f, "n_layer", &c->n_layer, err)) &&
            !(st = meta_int(&f, "n_head", &c->n_head, err)) &&
            !(st = meta_int(&f, "n_kv_head", &c->n_kv_head, err)) &&
            !(st = meta_int(&f, "d_model", &c->d_model, err)) &&
            !(st = meta_int(&f, "d_ff", &c->d_ff, err)) &&
            !(st = meta_int(&f, "vocab_size", &c->vocab_size, err)) &&
            !(st = meta_int(&f, "seq_len", &c->seq_len, err)) &&
            !(st = meta_float(&f, "norm_eps", &c->norm_eps, err)) &&
            !(st = meta_float(&f, "rope_theta", &c->rope_theta, err)) &&
            !(st = meta_moe(&f, c, err)) && (st = loom_model_config_validate(c, err)))
            loom_error_prefix(err, "%s", path);
    }
    if (!st) st = loom_params_build(t, c, NULL, err);
    if (!st && !(*params = malloc(t->total * sizeof(float))))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; !st && i < t->n_params; i++) {
        const loom_param *p = &t->params[i];
        const void *src;
        loom_dtype dtype;
        if ((st = loom_safetensors_get_float(&f, p->name, p->numel, &dtype, &src, err))) break;
        if (dtype == LOOM_DTYPE_BF16)
            loom_bf16_to_f32_n(*params + p->offset, src, p->numel);
        else
            memcpy(*params + p->offset, src, p->numel * sizeof(float));
    }
    loom_safetensors_close(&f);
    if (st) {
        free(*params);
        *params = NULL;
        loom_params_free(t);
    }
    return st;
}
