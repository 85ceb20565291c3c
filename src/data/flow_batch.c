#include "data/flow_batch.h"

#include <math.h>
#include <string.h>

#include "core/philox.h"

const char *loom_t_sampling_name(loom_t_sampling s) {
    return s == LOOM_T_UNIFORM ? "uniform" : "logit-normal";
}

loom_status loom_t_sampling_parse(const char *name, loom_t_sampling *out, loom_error *err) {
    if (strcmp(name, "logit-normal") == 0)
        *out = LOOM_T_LOGIT_NORMAL;
    else if (strcmp(name, "uniform") == 0)
        *out = LOOM_T_UNIFORM;
    else
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--t-sampling '%s': expected logit-normal or uniform", name);
    return LOOM_OK;
}

int loom_flow_record_words(const loom_image_dataset *ds) {
    return 2 + 2 * (int)ds->sample_bytes;
}

static double uniform_of(uint64_t key, uint32_t stream) {
    return loom_philox_uniform((uint32_t)(loom_philox_u64(key, stream, 0, 0) >> 32));
}

static void put_float(int32_t *word, float x) {
    memcpy(word, &x, sizeof x);
}

void loom_flow_batch_sample(const loom_image_dataset *ds, const loom_flow_options *o, uint64_t seed,
                            int64_t step, int64_t first, int n, int32_t *out) {
    const int64_t S = ds->sample_bytes;
    const int words = loom_flow_record_words(ds);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const int64_t seq = first + i;
        int32_t *rec = out + (size_t)i * words;
        const int64_t idx = loom_image_dataset_pick(ds, seed, step, seq);
        const uint64_t key = loom_philox_u64(seed, LOOM_FLOW_STREAM, (uint64_t)step, (uint32_t)seq);
        const double t = o->t_sampling == LOOM_T_UNIFORM
                             ? uniform_of(key, LOOM_FLOW_TIME)
                             : 1.0 / (1.0 + exp(-loom_philox_normal(key, LOOM_FLOW_TIME, 0)));
        const int drop = uniform_of(key, LOOM_FLOW_DROP) < (double)o->class_dropout;
        rec[0] = drop || o->n_classes == 0 ? o->n_classes : loom_image_dataset_label(ds, idx);
        put_float(&rec[1], (float)t);
        const uint8_t *px = loom_image_dataset_pixels(ds, idx);
        for (int64_t j = 0; j < S; j++) {
            put_float(&rec[2 + j], (float)px[j] / 127.5f - 1.0f);
            put_float(&rec[2 + S + j],
                      (float)loom_philox_normal(key, LOOM_FLOW_NOISE, (uint64_t)j));
        }
    }
}
