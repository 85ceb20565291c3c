/* Model configuration: one description for every family (the GPT-2 and Llama language
 * models, the DiT diffusion transformer), presets, and validation with errors that name
 * the offending flag. */
#ifndef LOOM_MODEL_CONFIG_H
#define LOOM_MODEL_CONFIG_H

#include "core/error.h"

typedef enum {
    LOOM_FAMILY_GPT2 = 0,
    LOOM_FAMILY_LLAMA = 1,
    LOOM_FAMILY_DIT = 2,
    LOOM_FAMILY_VLM = 3 /* a ViT encoder + projector feeding a Llama decoder (model/vlm.h) */
} loom_family;

typedef struct {
    loom_family family;
    int n_layer;
    int n_head;
    int n_kv_head; /* == n_head for GPT-2; divides n_head for Llama (grouped-query) */
    int d_model;
    int d_ff;
    int vocab_size;
    int seq_len; /* T: the context length trained on (learned positions for GPT-2) */
    float norm_eps;
    float rope_theta;
    /* Mixture of experts (model/moe.h); n_experts 0: the dense MLP everywhere. */
    int n_experts;         /* E */
    int top_k;             /* K experts per token */
    int moe_every;         /* layers l with l % moe_every == moe_every - 1 are MoE */
    int shared_expert;     /* 1: a dense expert every token also goes through */
    float capacity_factor; /* capacity ceil(cf * N * K / E) per expert; 0: dropless */
    float aux_loss_coef;   /* Switch/GShard load-balancing loss weight */
    float z_loss_coef;     /* router z-loss weight */
    /* Diffusion transformer (family dit, model/dit.h): samples of `frames` x `channels` x
     * `height` x `width` pixels cut into patch_t x patch x patch patches, one token each
     * (seq_len is then the token count, loom_model_dit_tokens); n_classes labels plus the
     * null class of classifier-free guidance. */
    int channels, frames, height, width, patch, patch_t, n_classes;
    /* Multimodal LLM (family vlm, model/vlm.h): the vision encoder's blocks, width, heads
     * and MLP width over channels x height x width images cut into patch x patch patches
     * (the fields above; frames = patch_t = 1), and the image slots of one sample. The
     * decoder is the Llama family's shape above (n_layer, d_model, ...). */
    int vit_layers, vit_d_model, vit_n_head, vit_d_ff, max_images;
    /* vlm: parts that are not trained (--freeze; loom_vlm_part bits, model/vlm.h): the
     * registry marks their tensors frozen, backward computes no gradients for them and the
     * optimizer leaves them as they are. Not part of the saved configuration. */
    int freeze;
    /* 1: the language models' logits stay fp32 under --precision bf16 (loom rl reads them
     * itself for its log-probabilities); 0: bf16 where the backend keeps them so
     * (docs/precision.md). Not part of the saved configuration. */
    int fp32_logits;
} loom_model_config;

/* Fills cfg from a preset name; LOOM_ERR_INPUT naming --model for unknown names. */
loom_status loom_model_preset(loom_model_config *cfg, const char *name, loom_error *err);
/* Comma-separated list of the preset names (for help and errors). */
const char *loom_model_preset_names(void);
/* Shape checks; the message names the flag to change. */
loom_status loom_model_config_validate(const loom_model_config *cfg, loom_error *err);
const char *loom_family_name(loom_family f);
/* Patch tokens of one dit sample: (frames / patch_t) * (height / patch) * (width / patch). */
int loom_model_dit_tokens(const loom_model_config *cfg);
/* Floats of one dit sample (frames * channels * height * width) and of one patch's
 * prediction (patch_t * patch * patch * channels). */
int loom_model_dit_sample_floats(const loom_model_config *cfg);
int loom_model_dit_patch_floats(const loom_model_config *cfg);
/* 1 when layer l of cfg is a mixture-of-experts block. */
int loom_model_layer_is_moe(const loom_model_config *cfg, int layer);

#endif
