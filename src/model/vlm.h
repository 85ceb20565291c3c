/* The multimodal LLM (family vlm): a ViT encoder over image patches, a 2-layer GELU MLP
 * projector and a Llama-family decoder (LLaVA's architecture).
 *
 * Encoder: an image [C, H, W] is cut into p x p patches (the DiT's patchify, token order
 * row-major over (H/p, W/p), each patch flattened (c, dy, dx)), embedded by a linear layer,
 * plus the DiT's fixed 2-D sin-cos positions; then vit_layers pre-norm bidirectional
 * blocks x += proj(attention(qkv(LN1(x)))), x += fc2(gelu(fc1(LN2(x)))) (LayerNorm with
 * weight and bias, fused qkv with bias, GELU tanh approximation; the kernels the GPT-2
 * and DiT blocks use), and a final LayerNorm. Projector: fc2(gelu(fc1(x))), fc1
 * [d_model, vit_d_model], fc2 [d_model, d_model]. Norm epsilon: norm_eps for every norm.
 *
 * Decoder input: the sample's tokens, where each `<image>` marker was expanded by the data
 * layer into image_tokens consecutive slots (token LOOM_VLM_SLOT); the token embedding
 * fills every row and the projector's output replaces the slot rows, image k of a sample
 * in its k-th run of slots (LLaVA). The decoder is the Llama family's (RMSNorm, RoPE,
 * grouped-query attention, SwiGLU) over the whole sequence, causal.
 *
 * Loss: next-token cross-entropy weighted per target position by the record's weights
 * (data/vlm_shard.h: 0 outside the answer, T / answer tokens inside), scaled like every
 * family's by 1 / (global batch x T): the mean over the batch's samples of each sample's
 * mean answer-token loss.
 *
 * Parameters: vision.* and projector.* on the first pipeline stage, in front of the
 * decoder's model.embed_tokens.weight (model/params.h, loom_vlm_params). */
#ifndef LOOM_MODEL_VLM_H
#define LOOM_MODEL_VLM_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/config.h"
#include "model/vlm_parts.h"

/* Image tokens of one image: (height / patch) x (width / patch). */
int loom_vlm_image_tokens(const loom_model_config *cfg);
/* Floats of one image: channels x height x width. */
int loom_vlm_image_floats(const loom_model_config *cfg);
/* int32 words of one vlm batch record (data/vlm_shard.h's layout for this model). */
int loom_vlm_record_words(const loom_model_config *cfg);

/* The cost model --balance-dp weighs samples with (floating-point operations of forward
 * and backward, taken as 3x forward): one image through the encoder (patch embedding,
 * vit_layers blocks with their bidirectional attention over the image's P tokens) and the
 * projector; one record through the decoder (its T positions, padded or not: every layer's
 * linears, causal attention over T/2 keys on average, and the head). */
double loom_vlm_image_flops(const loom_model_config *cfg);
double loom_vlm_record_flops(const loom_model_config *cfg);

#endif
