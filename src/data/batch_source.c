#include "data/batch_source.h"

#include <string.h>

loom_status loom_batch_source_open_tokens(loom_batch_source *s, const char *glob, int vocab_size,
                                          int seq_len, loom_error *err) {
    memset(s, 0, sizeof *s);
    loom_status st = loom_dataset_open(&s->tokens, glob, vocab_size, seq_len, err);
    if (st) return st;
    s->kind = LOOM_BATCH_TOKENS;
    s->record_words = seq_len + 1;
    return LOOM_OK;
}

loom_status loom_batch_source_open_flow(loom_batch_source *s, const char *glob,
                                        const loom_flow_options *flow, loom_error *err) {
    memset(s, 0, sizeof *s);
    loom_status st = loom_image_dataset_open(&s->images, glob, err);
    if (st) return st;
    s->kind = LOOM_BATCH_FLOW;
    s->flow = *flow;
    s->record_words = loom_flow_record_words(&s->images);
    return LOOM_OK;
}

loom_status loom_batch_source_open_vlm(loom_batch_source *s, const char *glob,
                                       const loom_vlm_record_shape *shape, int vocab_size,
                                       loom_error *err) {
    memset(s, 0, sizeof *s);
    loom_status st = loom_vlm_dataset_open(&s->vlm, glob, shape, vocab_size, err);
    if (st) return st;
    s->kind = LOOM_BATCH_VLM;
    s->record_words = loom_vlm_record_size(shape);
    return LOOM_OK;
}

void loom_batch_source_close(loom_batch_source *s) {
    if (s->kind == LOOM_BATCH_VLM) loom_vlm_dataset_close(&s->vlm);
    if (s->kind == LOOM_BATCH_TOKENS) loom_dataset_close(&s->tokens);
    if (s->kind == LOOM_BATCH_FLOW) loom_image_dataset_close(&s->images);
    memset(s, 0, sizeof *s);
}

void loom_batch_source_sample(const loom_batch_source *s, uint64_t seed, int64_t step,
                              int64_t first, int n, int32_t *out) {
    if (s->kind == LOOM_BATCH_TOKENS)
        loom_dataset_sample(&s->tokens, seed, step, first, n, out);
    else if (s->kind == LOOM_BATCH_FLOW)
        loom_flow_batch_sample(&s->images, &s->flow, seed, step, first, n, out);
    else if (s->kind == LOOM_BATCH_VLM)
        loom_vlm_dataset_sample(&s->vlm, seed, step, first, n, out);
}
