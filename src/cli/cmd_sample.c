/* loom sample: loads a dit model's weights (loom train --save-weights), integrates its flow
 * from Gaussian noise to images (model/flow_sampler.h) and writes a PNG grid, one row per
 * class (clips: an animated GIF or a PNG frame strip), and optionally the raw samples. */
#include "cli/cmd_sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ckpt/safetensors.h"
#include "core/clock.h"
#include "core/cpu_boot.h"
#include "core/flags.h"
#include "data/picture.h"
#include "model/dit.h"
#include "model/flow_sampler.h"
#include "model/gemm_shapes.h"
#include "model/model.h"
#include "model/weights.h"

/* --raw writes "samples" as [N, F, C, H, W]. */
_Static_assert(sizeof(((loom_tensor_view *)0)->shape) / sizeof(int64_t) >= 5,
               "loom_tensor_view needs 5 dimensions for the samples [N, F, C, H, W]");

#define GIF_DELAY_CS 10 /* 10 frames per second */

static int fail(const char *msg) {
    fprintf(stderr, "loom sample: %s\n", msg);
    return 2;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

/* The model as a loom_velocity_fn: the model is planned for B samples; a smaller call (the
 * last batch) is padded to B (padding rows: zeros at the same t, the null class; a sample
 * never sees another, so the padding changes nothing). */
typedef struct {
    loom_model *m;
    const float *params;
    int B;
    size_t numel;
    int32_t null_class;
    float *x, *t, *v; /* [B * numel], [B], [B * numel] padded copies */
    int32_t *labels;  /* [B] */
} dit_ctx;

static loom_status dit_velocity_fn(void *ctx, int count, const float *x, const float *t,
                                   const int32_t *labels, float *v, loom_error *err) {
    dit_ctx *d = ctx;
    if (count == d->B) return loom_dit_velocity(d->m, d->params, x, t, labels, v, err);
    if (count > d->B)
        return loom_error_set(err, LOOM_ERR_STATE, "sample: %d samples for a model built for %d",
                              count, d->B);
    const size_t used = (size_t)count * d->numel, all = (size_t)d->B * d->numel;
    memcpy(d->x, x, used * sizeof(float));
    memset(d->x + used, 0, (all - used) * sizeof(float));
    for (int k = 0; k < d->B; k++) {
        d->t[k] = t[k < count ? k : 0];
        d->labels[k] = k < count ? labels[k] : d->null_class;
    }
    loom_status st = loom_dit_velocity(d->m, d->params, d->x, d->t, d->labels, d->v, err);
    if (!st) memcpy(v, d->v, used * sizeof(float));
    return st;
}

/* The images as the picture writers want them: u8, [n][F][C][H][W] as sampled. */
static loom_status write_pictures(const char *path, const float *x, int n, int cols,
                                  const loom_model_config *c, loom_error *err) {
    const size_t numel = (size_t)c->frames * c->channels * c->height * c->width;
    uint8_t *u8 = malloc((size_t)n * numel);
    if (!u8) return loom_error_set(err, LOOM_ERR_NOMEM, "-o %s: out of memory", path);
    loom_flow_images_u8(x, (size_t)n * numel, u8);
    loom_status st;
    if (c->frames == 1)
        st = loom_picture_write_png_grid(path, u8, n, c->channels, c->height, c->width, cols, err);
    else if (ends_with(path, ".gif"))
        st = loom_picture_write_gif(path, u8, n, c->frames, c->channels, c->height, c->width, cols,
                                    GIF_DELAY_CS, err);
    else
        st = loom_picture_write_png_strip(path, u8, n, c->frames, c->channels, c->height, c->width,
                                          err);
    free(u8);
    return st;
}

static loom_status write_raw(const char *path, const float *x, const float *noise,
                             const int32_t *labels, int n, const loom_model_config *c,
                             const loom_flow_sample_options *o, const char *weights,
                             loom_error *err) {
    loom_tensor_view t[3] = {
        {.name = "samples",
         .dtype = LOOM_DTYPE_F32,
         .ndim = 5,
         .shape = {n, c->frames, c->channels, c->height, c->width},
         .data = x},
        {.name = "labels", .dtype = LOOM_DTYPE_I32, .ndim = 1, .shape = {n}, .data = labels},
        {.name = "noise",
         .dtype = LOOM_DTYPE_F32,
         .ndim = 5,
         .shape = {n, c->frames, c->channels, c->height, c->width},
         .data = noise},
    };
    char steps[32], cfg[32], seed[32], n_classes[32];
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(cfg, sizeof cfg, "%.9g", (double)o->cfg);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    snprintf(n_classes, sizeof n_classes, "%d", c->n_classes);
    const char *keys[] = {"format", "weights", "steps", "cfg", "solver", "seed", "n_classes"};
    const char *values[] = {"loom-samples", weights,  steps, cfg, loom_flow_solver_name(o->solver),
                            seed,           n_classes};
    return loom_safetensors_write_meta(path, t, 3, keys, values, 7, err);
}

int loom_cmd_sample(int argc, char **argv) {
    const char *weights = NULL, *out = "samples.png", *raw = NULL, *solver_name = "euler";
    long cls = -1, n = 8, steps = 50, batch = 16, threads = 0;
    double cfg_w = 1.0;
    unsigned long long seed = 1;
    loom_precision precision = LOOM_PRECISION_FP32;
    const loom_backend *be = NULL; /* NULL: the fp32 CPU table */
    loom_error perr = {0};
    const char *precision_s = NULL;
    char msg[1400];
    const loom_flag flags[] = {
        LOOM_FLAG_STR(0, "weights", &weights, "PATH",
                      "a dit model (loom train --family dit --save-weights)"),
        LOOM_FLAG_NUM(0, "class", LOOM_FLAG_LONG, &cls, "K",
                      "N samples of class K; without it, N samples of every class", 0, 1 << 30,
                      "expected a class index >= 0"),
        LOOM_FLAG_NUM(0, "n", LOOM_FLAG_LONG, &n, "N", "samples (of each class; 8)", 1, 1 << 20,
                      "expected an integer >= 1"),
        LOOM_FLAG_NUM(0, "steps", LOOM_FLAG_LONG, &steps, "S", "uniform steps from t = 1 to 0 (50)",
                      1, 1 << 20, "expected an integer >= 1"),
        LOOM_FLAG_NUM(0, "cfg", LOOM_FLAG_DOUBLE, &cfg_w, "W",
                      "classifier-free guidance: v = v_null + W (v_class - v_null);\n"
                      "1 = plain conditional (one model evaluation per step, not two)",
                      0, 1.7e308, "expected a guidance scale >= 0 (1 = no guidance)"),
        LOOM_FLAG_STR(0, "solver", &solver_name, "euler|heun", "the integrator (euler)"),
        LOOM_FLAG_NUM(0, "seed", LOOM_FLAG_U64, &seed, "S", "the noise seed (1)", 0, 2e19,
                      "expected a non-negative integer"),
        LOOM_FLAG_STR_SHORT(1, "out", 'o', &out, "PATH",
                            "images: a PNG grid (one row per class; samples.png by default);\n"
                            "clips: an animated GIF when PATH ends in .gif, else a PNG strip of\n"
                            "frames (one row per clip)"),
        LOOM_FLAG_STR(1, "raw", &raw, "PATH",
                      "safetensors: \"samples\" [N, F, C, H, W] f32 in [-1, 1] before\n"
                      "clamping, \"labels\" [N] i32, \"noise\" [N, F, C, H, W] (the start)"),
        LOOM_FLAG_NUM(2, "batch", LOOM_FLAG_LONG, &batch, "B",
                      "samples per model evaluation (16; the model is built for B, or 2B\n"
                      "with guidance); the samples do not depend on it",
                      1, 1 << 20, "expected an integer >= 1"),
        LOOM_FLAG_NUM(2, "threads", LOOM_FLAG_LONG, &threads, "N", "0 = all cores", 0, 4096,
                      "expected an integer >= 0 (0 = all cores)"),
        LOOM_FLAG_STR(2, "precision", &precision_s, "fp32|bf16",
                      "the linear layers' GEMMs (docs/precision.md)"),
    };
    static const loom_flag_group groups[] = {
        {"Sampling", "docs/dit.md"}, {"Output", "docs/dit.md"}, {"Speed", "docs/dit.md"}};
    const loom_flag_spec spec = {
        .usage =
            "usage: loom sample --weights PATH [--class K] [--n N] [--steps S] [--cfg W] [-o OUT]",
        .about = "Samples a dit model by integrating its flow from noise (t = 1) to data (t = 0)\n"
                 "over S uniform steps (Euler or Heun).",
        LOOM_FLAGS_TABLE(flags, groups)};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom sample", argc, argv, NULL);
    if (fo != LOOM_FLAGS_GO) return fo;
    if (precision_s && loom_precision_parse(precision_s, "--precision", &precision, &perr))
        return fail(perr.msg);
    if (!weights) return fail("--weights: required (a dit model from loom train --save-weights)");
    loom_error err = {0};
    loom_flow_sample_options o = {.steps = (int)steps, .cfg = (float)cfg_w, .seed = seed};
    if (loom_flow_solver_parse(solver_name, &o.solver, &err)) return fail(err.msg);

    loom_model_config cfg;
    loom_param_table table;
    float *params = NULL;
    if (loom_weights_load(weights, &cfg, &table, &params, &err)) {
        snprintf(msg, sizeof msg, "--weights: %s", err.msg);
        return fail(msg);
    }
    int rc = 0;
    loom_model m;
    int have_model = 0;
    dit_ctx d = {0};
    float *x = NULL, *noise = NULL;
    int32_t *labels = NULL;
    if (cfg.family != LOOM_FAMILY_DIT) {
        snprintf(msg, sizeof msg,
                 "--weights: %s is a %s model; loom sample needs a dit model (loom generate "
                 "samples language models)",
                 weights, loom_family_name(cfg.family));
        rc = fail(msg);
        goto done;
    }
    /* n_classes 0: an unconditional model, whose only label is the null class 0. */
    const int n_classes = cfg.n_classes;
    if (cls >= 0 && cls >= n_classes) {
        if (n_classes == 0)
            snprintf(msg, sizeof msg, "--class %ld: %s has no classes (unconditional)", cls,
                     weights);
        else
            snprintf(msg, sizeof msg, "--class %ld: expected 0..%d (%s has %d classes)", cls,
                     n_classes - 1, weights, n_classes);
        rc = fail(msg);
        goto done;
    }
    if (o.cfg != 1.0f && n_classes == 0) {
        snprintf(msg, sizeof msg,
                 "--cfg %g: %s has no classes, so there is nothing to guide (use --cfg 1)", cfg_w,
                 weights);
        rc = fail(msg);
        goto done;
    }
    const int rows = cls >= 0 || n_classes == 0 ? 1 : n_classes;
    if ((long)rows * n > (1 << 24)) {
        snprintf(msg, sizeof msg, "--n %ld: %d x %ld samples are too many", n, rows, n);
        rc = fail(msg);
        goto done;
    }
    const int total = rows * (int)n;
    const size_t numel = (size_t)cfg.frames * cfg.channels * cfg.height * cfg.width;
    labels = malloc((size_t)total * sizeof(int32_t));
    x = malloc((size_t)total * numel * sizeof(float));
    noise = malloc((size_t)total * numel * sizeof(float));
    if (!labels || !x || !noise) {
        rc = fail("out of memory for the samples (lower --n)");
        goto done;
    }
    for (int k = 0; k < total; k++)
        labels[k] = n_classes == 0 ? 0 : cls >= 0 ? (int32_t)cls : (int32_t)(k / n);
    o.n = total < batch ? total : (int)batch;
    o.numel = numel;
    o.null_class = n_classes;
    if (loom_flow_sample_validate(&o, &err)) {
        rc = fail(err.msg);
        goto done;
    }

    if (threads == 0) threads = loom_cpu_default_threads();
    loom_cpu_set_threads((int)threads);
    const int per_call = o.cfg != 1.0f ? 2 * o.n : o.n;
    if (precision == LOOM_PRECISION_BF16 &&
        loom_backend_cpu_bf16_open(&be, &err)) { /* before the model uses it */
        rc = fail(err.msg);
        goto done;
    }
    /* Forward only: the recomputation plan keeps one block's activations for all layers
     * (the same kernels in the same order, so the same numbers) instead of every layer's. */
    if (loom_model_create(&m,
                          &(loom_model_options){.cfg = &cfg,
                                                .B = per_call,
                                                .T = cfg.seq_len,
                                                .flags = LOOM_MODEL_RECOMPUTE,
                                                .backend = be},
                          &err)) {
        rc = fail(err.msg);
        goto done;
    }
    have_model = 1;
    if (m.table.total != table.total) {
        snprintf(msg, sizeof msg, "--weights: %s holds %zu parameters, the model needs %zu",
                 weights, table.total, m.table.total);
        rc = fail(msg);
        goto done;
    }
    if (be) { /* the GEMMs of one model call: its tokens and its samples (conditioning) */
        const int gemm_rows[2] = {per_call * cfg.seq_len, per_call};
        if (loom_model_prepare_gemms(be, &m.table, gemm_rows, 2, 0, &err)) {
            rc = fail(err.msg);
            goto done;
        }
        loom_backend_cpu_bf16_describe(be, msg, sizeof msg);
        fprintf(stderr, "loom: precision bf16: %s\n", msg);
    }
    d = (dit_ctx){.m = &m,
                  .params = params,
                  .B = per_call,
                  .numel = numel,
                  .null_class = n_classes,
                  .x = malloc((size_t)per_call * numel * sizeof(float)),
                  .t = malloc((size_t)per_call * sizeof(float)),
                  .v = malloc((size_t)per_call * numel * sizeof(float)),
                  .labels = malloc((size_t)per_call * sizeof(int32_t))};
    if (!d.x || !d.t || !d.v || !d.labels) {
        rc = fail("out of memory for the model's inputs (lower --batch)");
        goto done;
    }
    printf("loom sample: %s (dit L%d H%d C%d, %d x %d x %d x %d, patch %d", weights, cfg.n_layer,
           cfg.n_head, cfg.d_model, cfg.frames, cfg.channels, cfg.height, cfg.width, cfg.patch);
    if (cfg.frames > 1) printf("x%d", cfg.patch_t);
    printf(", %d classes): %d samples, %s %d steps, cfg %g, seed %llu, %ld threads, %d per "
           "model call\n",
           n_classes, total, loom_flow_solver_name(o.solver), o.steps, (double)o.cfg,
           (unsigned long long)o.seed, threads, per_call);
    fflush(stdout);
    const double t0 = loom_now_ms();
    const int chunk = o.n;
    for (int first = 0; first < total; first += chunk) {
        o.n = total - first < chunk ? total - first : chunk;
        o.first = (uint64_t)first;
        const size_t at = (size_t)first * numel;
        if (loom_flow_sample(&o, labels + first, dit_velocity_fn, &d, noise + at, x + at, &err)) {
            rc = fail(err.msg);
            goto done;
        }
    }
    const double ms = loom_now_ms() - t0;
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)total * numel; i++) bad += !isfinite(x[i]);
    if (bad)
        fprintf(
            stderr,
            "loom sample: warning: %zu of %zu values are not finite (clamped in the pictures)\n",
            bad, (size_t)total * numel);
    printf("sampled %d %s in %.2f s: %.1f ms per %s (%d model evaluations per sample)\n", total,
           cfg.frames > 1 ? "clips" : "images", ms / 1000.0, ms / total,
           cfg.frames > 1 ? "clip" : "image", loom_flow_evaluations(&o) * (o.cfg != 1.0f ? 2 : 1));
    /* one row per class; one class: rows of up to 16 */
    const int cols = rows > 1 ? (int)n : total < 16 ? total : 16;
    if (write_pictures(out, x, total, cols, &cfg, &err)) {
        snprintf(msg, sizeof msg, "-o: %s", err.msg);
        rc = fail(msg);
        goto done;
    }
    printf("wrote %s\n", out);
    if (be) {
        loom_backend_cpu_bf16_describe(be, msg, sizeof msg);
        fprintf(stderr, "loom: precision bf16 at the end: %s\n", msg);
    }
    if (raw) {
        o.n = total;
        if (write_raw(raw, x, noise, labels, total, &cfg, &o, weights, &err)) {
            snprintf(msg, sizeof msg, "--raw: %s", err.msg);
            rc = fail(msg);
            goto done;
        }
        printf("wrote %s\n", raw);
    }
done:
    free(d.x);
    free(d.t);
    free(d.v);
    free(d.labels);
    if (have_model) loom_model_destroy(&m);
    loom_backend_close(be);
    free(x);
    free(noise);
    free(labels);
    free(params);
    loom_params_free(&table);
    return rc;
}
