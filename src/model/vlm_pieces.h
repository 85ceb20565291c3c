/* The vision encoder's pieces on their own, for --vision-schedule bubbles (Optimus-style,
 * pipeline/vision_plan.h): a micro-batch's images are encoded on another pipeline stage
 * (by a model of the first stage's embedding, holding a replica of the encoder and
 * projector), their rows sent to the first stage, and the rows' gradient sent back. */
#ifndef LOOM_MODEL_VLM_PIECES_H
#define LOOM_MODEL_VLM_PIECES_H

#include <stddef.h>

#include "model/model.h"

/* Floats of one micro-batch's projected image rows (B x max_images x image tokens x
 * d_model): the size of the messages (the images present come first). */
size_t loom_vlm_image_rows_floats(const loom_model *m);
/* The first stage: the loaded micro-batch's image rows come from `emb` (host memory) in
 * embed_forward, and embed_backward writes their gradient to `demb` instead of running
 * the encoder's backward; both NULL: the encoder runs here (the default). */
void loom_vlm_set_remote(loom_model *m, const float *emb, float *demb);
/* An encoding stage, after loom_model_load_batch: the encoder and projector's forward
 * with the parameters p (the first stage's offsets), the image rows to `emb` (host). */
void loom_vlm_encode(loom_model *m, const float *p, float *emb);
/* ... and their backward from the rows' gradient `demb` (host), accumulated into g. */
void loom_vlm_encode_backward(loom_model *m, const float *p, float *g, const float *demb);

#endif
