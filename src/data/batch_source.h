/* Where a training run's batches come from, whatever the model family: a token dataset
 * (data/dataset.h: windows of T+1 tokens) or an image/clip dataset drawn as flow-matching
 * records (data/flow_batch.h). Chosen when the run is set up; the training loop only asks
 * for the records of step s. */
#ifndef LOOM_DATA_BATCH_SOURCE_H
#define LOOM_DATA_BATCH_SOURCE_H

#include <stdint.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/flow_batch.h"
#include "data/image_shard.h"
#include "data/vlm_shard.h"

typedef enum {
    LOOM_BATCH_NONE = 0,
    LOOM_BATCH_TOKENS,
    LOOM_BATCH_FLOW,
    LOOM_BATCH_VLM /* image-text records (data/vlm_shard.h) */
} loom_batch_kind;

typedef struct {
    loom_batch_kind kind;
    int record_words; /* int32 words per record */
    loom_dataset tokens;
    loom_image_dataset images;
    loom_flow_options flow;
    loom_vlm_dataset vlm;
} loom_batch_source;

/* Token shards (glob) for a vocabulary and sequence length (loom_dataset_open's checks). */
loom_status loom_batch_source_open_tokens(loom_batch_source *s, const char *glob, int vocab_size,
                                          int seq_len, loom_error *err);
/* Image or clip shards (glob) drawn as flow-matching records. */
loom_status loom_batch_source_open_flow(loom_batch_source *s, const char *glob,
                                        const loom_flow_options *flow, loom_error *err);
/* Image-text shards (glob) made into records for a vlm of this shape and vocabulary. */
loom_status loom_batch_source_open_vlm(loom_batch_source *s, const char *glob,
                                       const loom_vlm_record_shape *shape, int vocab_size,
                                       loom_error *err);
void loom_batch_source_close(loom_batch_source *s);

/* Records [first, first + n) of step `step` into out[n][record_words]. */
void loom_batch_source_sample(const loom_batch_source *s, uint64_t seed, int64_t step,
                              int64_t first, int n, int32_t *out);

#endif
