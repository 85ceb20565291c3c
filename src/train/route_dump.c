#include "train/route_dump.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"

loom_status loom_route_dump_open(loom_route_dump *d, const loom_model_config *cfg, int N, int steps,
                                 int accum, loom_error *err) {
    memset(d, 0, sizeof *d);
    if (cfg->n_experts == 0) return LOOM_OK;
    for (int l = 0; l < cfg->n_layer; l++) d->n_moe += loom_model_layer_is_moe(cfg, l);
    d->rows = steps * accum, d->N = N, d->K = cfg->top_k;
    const size_t tokens = (size_t)d->rows * d->n_moe * N;
    d->idx = calloc(tokens * d->K, sizeof(int32_t));
    d->gap = calloc(tokens, sizeof(float));
    if (!d->idx || !d->gap) {
        loom_route_dump_free(d);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--dump-dir: no memory for the routes");
    }
    return LOOM_OK;
}

void loom_route_dump_record(loom_route_dump *d, const loom_moe *moe, int step, int accum, int k) {
    if (!d->idx || !moe) return;
    const size_t row = (size_t)step * accum + k, tokens = (size_t)d->n_moe * d->N;
    loom_moe_routes(moe, d->idx + row * tokens * d->K, d->gap + row * tokens);
}

loom_status loom_route_dump_sum(loom_route_dump *d, loom_comm *c, loom_error *err) {
    if (!d->idx) return LOOM_OK;
    const size_t tokens = (size_t)d->rows * d->n_moe * d->N, n = tokens * d->K;
    float *f = malloc(n * sizeof *f); /* expert indices < 2^24: exact as floats */
    if (!f) return loom_error_set(err, LOOM_ERR_NOMEM, "--dump-dir: no memory for the routes");
    for (size_t i = 0; i < n; i++) f[i] = (float)d->idx[i];
    loom_status st = loom_comm_allreduce_sum(c, f, n, err);
    for (size_t i = 0; i < n && !st; i++) d->idx[i] = (int32_t)f[i];
    free(f);
    return st ? st : loom_comm_allreduce_sum(c, d->gap, tokens, err);
}

loom_status loom_route_dump_write(const loom_route_dump *d, const char *dir, int dp_rank,
                                  loom_error *err) {
    if (!d->idx) return LOOM_OK;
    loom_tensor_view v[2] = {
        {"idx", LOOM_DTYPE_I32, 4, {d->rows, d->n_moe, d->N, d->K}, d->idx},
        {"gap", LOOM_DTYPE_F32, 3, {d->rows, d->n_moe, d->N, 0}, d->gap},
    };
    char path[2048];
    snprintf(path, sizeof path, "%s/routes_dp%d.safetensors", dir, dp_rank);
    return loom_safetensors_write(path, v, 2, err);
}

void loom_route_dump_free(loom_route_dump *d) {
    free(d->idx);
    free(d->gap);
    memset(d, 0, sizeof *d);
}
