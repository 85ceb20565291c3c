/* Model configuration: one description for both families (GPT-2 and Llama), presets,
 * and validation with errors that name the offending flag. */
#ifndef LOOM_MODEL_CONFIG_H
#define LOOM_MODEL_CONFIG_H

#include "core/error.h"

typedef enum { LOOM_FAMILY_GPT2 = 0, LOOM_FAMILY_LLAMA = 1 } loom_family;

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
} loom_model_config;

/* Fills cfg from a preset name; LOOM_ERR_INPUT naming --model for unknown names. */
loom_status loom_model_preset(loom_model_config *cfg, const char *name, loom_error *err);
/* Comma-separated list of the preset names (for help and errors). */
const char *loom_model_preset_names(void);
/* Shape checks; the message names the flag to change. */
loom_status loom_model_config_validate(const loom_model_config *cfg, loom_error *err);
const char *loom_family_name(loom_family f);
/* 1 when layer l of cfg is a mixture-of-experts block. */
int loom_model_layer_is_moe(const loom_model_config *cfg, int layer);

#endif
