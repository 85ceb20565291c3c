#include "train/metrics.h"

#include "core/fs.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_metrics_open(loom_metrics *mx, const char *path, loom_error *err) {
    mx->file = NULL;
    if (!path || !path[0]) return LOOM_OK;
    loom_mkdir_parent(path); /* fopen reports what still fails */
    mx->file = fopen(path, "w");
    if (!mx->file)
        return loom_error_set(err, LOOM_ERR_INPUT, "--metrics '%s': cannot open for writing: %s",
                              path, strerror(errno));
    return LOOM_OK;
}

loom_status loom_metrics_write(loom_metrics *mx, const loom_step_metrics *s, loom_error *err) {
    if (!mx->file) return LOOM_OK;
    json_t *o = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:I, s:f}", "step", s->step, "loss",
                          s->loss, "lr", s->lr, "grad_norm", s->grad_norm, "tokens_per_s",
                          s->tokens_per_s, "step_ms", s->step_ms, "tokens",
                          (json_int_t)s->tokens_seen, "grad_wait_ms", s->grad_wait_ms);
    if (o && isfinite(s->val_loss)) json_object_set_new(o, "val_loss", json_real(s->val_loss));
    if (o && s->has_moe) {
        json_t *m = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "load_min", s->moe.load_min,
                              "load_max", s->moe.load_max, "load_mean", s->moe.load_mean, "dropped",
                              s->moe.dropped, "aux_loss", s->moe.aux_loss, "z_loss", s->moe.z_loss);
        if (m) json_object_set_new(o, "moe", m);
    }
    if (o && s->dp) {
        const loom_zero_step_times *d = s->dp;
        json_t *m =
            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "compute_ms", d->compute_ms,
                      "compute_cpu_ms", d->compute_cpu_ms, "optimizer_ms", d->optimizer_ms,
                      "optimizer_cpu_ms", d->optimizer_cpu_ms, "param_gather_ms",
                      d->param_gather_ms, "param_wait_ms", d->param_wait_ms, "engine_cpu_ms",
                      d->engine_cpu_ms, "grad_bytes", d->grad_bytes);
        if (m) json_object_set_new(o, "dp", m);
    }
    if (o && s->outer) {
        const loom_outer_step_stats *d = s->outer;
        json_t *m = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:i}", "bytes_step", d->bytes_step,
                              "bytes_total", d->bytes_total, "bytes_per_token",
                              s->tokens_total > 0 ? d->bytes_total / s->tokens_total : 0.0,
                              "exposed_ms", d->exposed_ms, "hidden_ms", d->hidden_ms, "grad_norm",
                              d->grad_norm, "syncs", d->syncs);
        if (m) json_object_set_new(o, "outer", m);
    }
    if (o && s->balance) {
        const loom_dp_balance_stats *b = s->balance;
        json_t *m = json_pack(
            "{s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "balanced", b->balanced, "predicted",
            b->predicted, "predicted_slices", b->predicted_slices, "compute_max_ms",
            b->compute_max_ms, "compute_mean_ms", b->compute_mean_ms, "compute_max_over_mean",
            b->compute_mean_ms > 0 ? b->compute_max_ms / b->compute_mean_ms : 1.0,
            "compute_cpu_max_ms", b->compute_cpu_max_ms, "compute_cpu_mean_ms",
            b->compute_cpu_mean_ms, "compute_cpu_max_over_mean",
            b->compute_cpu_mean_ms > 0 ? b->compute_cpu_max_ms / b->compute_cpu_mean_ms : 1.0);
        if (m) json_object_set_new(o, "dp_balance", m);
    }
    char *line =
        o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    int ok = line && fprintf(mx->file, "%s\n", line) > 0 && fflush(mx->file) == 0;
    free(line);
    if (!ok) return loom_error_set(err, LOOM_ERR_IO, "metrics: write failed: %s", strerror(errno));
    return LOOM_OK;
}

void loom_metrics_close(loom_metrics *mx) {
    if (mx->file) fclose(mx->file);
    mx->file = NULL;
}
