/* The diffusion transformer (family dit): DiT (Peebles & Xie, facebookresearch/DiT's
 * models.py: tensor names, initialisation and the math) over patch tokens of images or
 * clips, trained with rectified flow / flow matching (SD3's objective).
 *
 * A sample is [F, C, H, W] (F frames; F = 1 for images), cut into pt x p x p patches:
 * token (f', h', w') row-major over (F/pt, H/p, W/p). The patch embedding is a linear
 * layer over each patch flattened in (c, dt, dy, dx) order (DiT's conv weight,
 * x_embedder.proj.weight, stored 2-D as [C_model, C*pt*p*p]); the final layer predicts
 * each patch in DiT's unpatchify order (dt, dy, dx, c). Positions are fixed sin-cos, not
 * parameters: DiT's 2-D table for images, CogVideoX's 3-D one for clips ([1/4 of the
 * channels temporal | 3/4 spatial]), chosen over 3-D RoPE because DiT's and CogVideoX's
 * published checkpoints use them and they keep attention the same kernel as the LMs'.
 * Conditioning c = MLP(sinusoid(1000 t)) + class embedding (row n_classes: the null
 * class of classifier-free guidance); every block and the final layer read silu(c)
 * through their adaLN-Zero modulation (zero-initialised, so each block starts as the
 * identity). Attention is bidirectional.
 *
 * Flow matching: x_t = (1 - t) x0 + t eps, the model predicts v = eps - x0, the loss is the
 * mean squared error over every element (per token: the mean over its patch). A batch
 * record (loom_model_record_words words, see data/flow_batch.h) carries the sample's
 * label (after class dropout), t and x0 and eps as float bits: the randomness is drawn by
 * the data layer from (seed, step, sample), the same for every layout.
 *
 * Parallel layouts: attention and MLP are Megatron-sharded like GPT-2's; the embedders,
 * modulation and final layer are replicated (with sequence parallelism each rank
 * computes them for its own rows: their gradients are partial sums, sp_partial). Between
 * pipeline stages silu(c) travels with the residual stream (m->cond, m->dcond). */
#ifndef LOOM_MODEL_DIT_H
#define LOOM_MODEL_DIT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/config.h"
#include "model/model.h"

/* Words of a flow record before the pixels: [0] label, [1] t (float bits); then x0 and
 * eps, each loom_model_dit_sample_floats floats as bits. */
#define LOOM_DIT_RECORD_HEAD 2

/* x [F, C, H, W] -> patches [T, C*pt*p*p] in (c, dt, dy, dx) order (the embedding's input). */
void loom_dit_patchify(const loom_model_config *cfg, const float *x, float *patches);
/* patches [T, pt*p*p*C] in (dt, dy, dx, c) order (the final layer's output) -> x [F, C, H, W]. */
void loom_dit_unpatchify(const loom_model_config *cfg, const float *patches, float *x);
/* The fixed positions [T, d_model] (2-D or 3-D sin-cos, above). */
void loom_dit_positions(const loom_model_config *cfg, float *pos);

/* The velocity v(x, t, y) for m->B samples (host arrays): x [B, F, C, H, W], t [B],
 * labels [B] (n_classes: the null class) -> v [B, F, C, H, W]. m: a dit built for
 * micro-batch B over the whole model (no tp, no pipeline). */
loom_status loom_dit_velocity(loom_model *m, const float *params, const float *x, const float *t,
                              const int32_t *labels, float *v, loom_error *err);
/* Its first half: the samples patchified and, with t and labels, copied to the model's
 * inputs (the forward and loom_dit_prediction follow: dit_velocity.c). */
loom_status loom_dit_velocity_inputs(loom_model *m, const float *x, const float *t,
                                     const int32_t *labels, loom_error *err);
/* The last forward's prediction (before the loss turns it into its gradient), as samples
 * [B, F, C, H, W] on the host; only for a model without sequence parallelism. */
void loom_dit_prediction(const loom_model *m, float *out);

#endif
