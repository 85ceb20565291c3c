/* The parts of a multimodal LLM (family vlm, model/vlm.h) that --freeze names: the vision
 * encoder (tensors vision.*), the projector (projector.*) and the language model (the
 * rest). */
#ifndef LOOM_MODEL_VLM_PARTS_H
#define LOOM_MODEL_VLM_PARTS_H

#include "ckpt/safetensors.h"
#include "core/error.h"

/* Which parts of a vlm are frozen (--freeze): bit flags. */
typedef enum {
    LOOM_VLM_PART_VISION = 1,
    LOOM_VLM_PART_PROJECTOR = 2,
    LOOM_VLM_PART_LLM = 4
} loom_vlm_part;
#define LOOM_VLM_PARTS_ALL 7

/* "vision,projector,llm" (any non-empty subset; "" or "none": nothing) -> bit flags;
 * LOOM_ERR_INPUT naming --freeze for an unknown part or all three. */
loom_status loom_vlm_parse_freeze(const char *list, int *parts, loom_error *err);
/* The part a parameter belongs to, from its name (vision.*, projector.*, else llm). */
loom_vlm_part loom_vlm_param_part(const char *name);

/* The parts a weights file holds none of (loom_vlm_part bits): a part is there when its
 * first tensor is (vision.patch_embed.weight, projector.fc1.weight,
 * model.embed_tokens.weight); --init-from keeps the absent parts' initialisation. */
int loom_vlm_parts_absent(const loom_safetensors *f);

#endif
