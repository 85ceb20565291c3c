/* Flow-matching batches for the diffusion transformer: for sample `seq` of step `step`,
 * the image (data/image_shard.h's pick, the token sampler's draw), the time t, the noise
 * and the class dropout, all from Philox keyed by (seed, step, seq), so every layout and
 * every rank sees the same numbers (the DiT's equivalence invariant).
 *
 * A record is 2 + 2S int32 words (S = F*C*H*W): [0] the label (the model's null class
 * o->n_classes when dropped, always for an unconditional model), [1] t as float bits, then x0 =
 * pixel / 127.5 - 1 and eps ~ N(0, 1), S floats each as bits (model/dit.h turns them into x_t = (1
 * - t) x0 + t eps and the target eps - x0).
 *
 * The draws: s = philox_u64(seed, LOOM_FLOW_STREAM, step, seq) keys the sample; eps[j] =
 * philox_normal(s, LOOM_FLOW_NOISE, j); t = sigmoid(philox_normal(s, LOOM_FLOW_TIME, 0))
 * (logit-normal(0, 1), SD3's default) or uniform(philox_u64(s, LOOM_FLOW_TIME, 0, 0));
 * the label is dropped when uniform(philox_u64(s, LOOM_FLOW_DROP, 0, 0)) < class_dropout. */
#ifndef LOOM_DATA_FLOW_BATCH_H
#define LOOM_DATA_FLOW_BATCH_H

#include <stdint.h>

#include "data/image_shard.h"

#define LOOM_FLOW_STREAM 0x666c6f77u /* "flow" */
#define LOOM_FLOW_NOISE 0x6e6f6973u  /* "nois" */
#define LOOM_FLOW_TIME 0x74696d65u   /* "time" */
#define LOOM_FLOW_DROP 0x64726f70u   /* "drop" */

typedef enum { LOOM_T_LOGIT_NORMAL = 0, LOOM_T_UNIFORM = 1 } loom_t_sampling;

typedef struct {
    loom_t_sampling t_sampling; /* --t-sampling */
    float class_dropout;        /* --class-dropout: probability of the null class */
    int n_classes; /* the model's classes; the null class is n_classes (0: unconditional, every
                      label is the null class 0) */
} loom_flow_options;

/* "logit-normal" / "uniform". */
const char *loom_t_sampling_name(loom_t_sampling s);
/* Parses --t-sampling; LOOM_ERR_INPUT naming the flag otherwise. */
loom_status loom_t_sampling_parse(const char *name, loom_t_sampling *out, loom_error *err);

/* int32 words of one record of a dataset of this shape. */
int loom_flow_record_words(const loom_image_dataset *ds);
/* Records of sequences [first, first + n) of step `step` into out[n][words]. */
void loom_flow_batch_sample(const loom_image_dataset *ds, const loom_flow_options *o, uint64_t seed,
                            int64_t step, int64_t first, int n, int32_t *out);

#endif
