#include "rl/sample_dump.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"

loom_status loom_sample_dump_open(loom_sample_dump *d, int iterations, int per, int max_new,
                                  loom_error *err) {
    memset(d, 0, sizeof *d);
    const size_t rows = (size_t)iterations * per, draws = rows * (size_t)max_new;
    d->seq = malloc(rows * sizeof *d->seq);
    d->tok = malloc(draws * sizeof *d->tok);
    d->margin = calloc(draws, sizeof *d->margin);
    if (!d->seq || !d->tok || !d->margin) {
        loom_sample_dump_free(d);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--dump-dir: no memory for the samples");
    }
    for (size_t i = 0; i < rows; i++) d->seq[i] = -1;
    for (size_t i = 0; i < draws; i++) d->tok[i] = -1;
    d->iterations = iterations, d->per = per, d->max_new = max_new;
    return LOOM_OK;
}

float *loom_sample_dump_margins(loom_sample_dump *d, int it) {
    return d->margin ? d->margin + (size_t)it * d->per * d->max_new : NULL;
}

void loom_sample_dump_record(loom_sample_dump *d, int it, int n_global, int q0, const int32_t *comp,
                             const int *clen) {
    if (!d->seq) return;
    for (int i = 0; i < d->per; i++) {
        const size_t row = (size_t)it * d->per + i;
        d->seq[row] = it * n_global + q0 + i;
        for (int k = 0; k < d->max_new; k++) {
            d->tok[row * d->max_new + k] = k < clen[i] ? comp[(size_t)i * d->max_new + k] : -1;
            if (k >= clen[i]) d->margin[row * d->max_new + k] = 0.0f;
        }
    }
}

loom_status loom_sample_dump_write(const loom_sample_dump *d, const char *dir, int replica,
                                   loom_error *err) {
    if (!d->seq) return LOOM_OK;
    const int64_t rows = (int64_t)d->iterations * d->per;
    loom_tensor_view v[3] = {
        {"seq", LOOM_DTYPE_I32, 1, {rows, 0, 0, 0}, d->seq},
        {"tok", LOOM_DTYPE_I32, 2, {rows, d->max_new, 0, 0}, d->tok},
        {"margin", LOOM_DTYPE_F32, 2, {rows, d->max_new, 0, 0}, d->margin},
    };
    char path[2048];
    snprintf(path, sizeof path, "%s/samples_gen%d.safetensors", dir, replica);
    return loom_safetensors_write(path, v, 3, err);
}

void loom_sample_dump_free(loom_sample_dump *d) {
    free(d->seq);
    free(d->tok);
    free(d->margin);
    memset(d, 0, sizeof *d);
}
