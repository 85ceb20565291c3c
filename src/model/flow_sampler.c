/* The rectified-flow ODE integrator (model/flow_sampler.h): Euler or Heun from t = 1 to 0,
 * classifier-free guidance as one call of 2n samples per evaluation. */
#include "model/flow_sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"

loom_status loom_flow_solver_parse(const char *name, loom_flow_solver *solver, loom_error *err) {
    if (strcmp(name, "euler") == 0) {
        *solver = LOOM_FLOW_EULER;
    } else if (strcmp(name, "heun") == 0) {
        *solver = LOOM_FLOW_HEUN;
    } else {
        return loom_error_set(err, LOOM_ERR_INPUT, "--solver: expected euler or heun, got '%s'",
                              name);
    }
    return LOOM_OK;
}

const char *loom_flow_solver_name(loom_flow_solver solver) {
    return solver == LOOM_FLOW_HEUN ? "heun" : "euler";
}

static int guided(const loom_flow_sample_options *o) {
    return o->cfg != 1.0f;
}

loom_status loom_flow_sample_validate(const loom_flow_sample_options *o, loom_error *err) {
    if (o->n < 1) return loom_error_set(err, LOOM_ERR_INPUT, "--n: expected >= 1, got %d", o->n);
    if (o->steps < 1)
        return loom_error_set(err, LOOM_ERR_INPUT, "--steps: expected >= 1, got %d", o->steps);
    if (!isfinite(o->cfg) || o->cfg < 0.0f)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--cfg: expected a guidance scale >= 0 (1 = no guidance), got %g",
                              (double)o->cfg);
    if (o->solver != LOOM_FLOW_EULER && o->solver != LOOM_FLOW_HEUN)
        return loom_error_set(err, LOOM_ERR_INPUT, "--solver: expected euler or heun (solver %d)",
                              (int)o->solver);
    if (guided(o) && o->null_class < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--cfg %g: guidance needs a null class, and there is none "
                              "(use --cfg 1)",
                              (double)o->cfg);
    if (o->numel < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "sampling: a sample of %zu floats (expected >= 1)", o->numel);
    /* The arrays of 2n samples must be addressable and 2n an int (the callback's count). */
    if ((size_t)o->n > (size_t)INT32_MAX / 2 ||
        o->numel > SIZE_MAX / sizeof(float) / 2 / (size_t)o->n)
        return loom_error_set(err, LOOM_ERR_INPUT, "--n: %d samples of %zu floats are too many",
                              o->n, o->numel);
    return LOOM_OK;
}

int loom_flow_evaluations(const loom_flow_sample_options *o) {
    return o->solver == LOOM_FLOW_HEUN ? 2 * o->steps : o->steps;
}

/* Everything one run needs, allocated once. */
typedef struct {
    const loom_flow_sample_options *o;
    const int32_t *labels;
    loom_velocity_fn fn;
    void *ctx;
    size_t len;     /* n * numel */
    float *t;       /* [m] the time of every sample of a call */
    int32_t *lab;   /* [2n] labels then the null class (guided only) */
    float *xin;     /* [2n * numel] the state twice (guided only) */
    float *vraw;    /* [2n * numel] the callback's output (guided only) */
    float *v1, *v2; /* [len] velocities (v2: Heun only) */
    float *xe;      /* [len] Euler predictor (Heun only) */
} flow_run;

/* v(x, t) of all n samples into dst [len]. */
static loom_status velocity(flow_run *r, const float *x, double t, float *dst, loom_error *err) {
    const loom_flow_sample_options *o = r->o;
    if (!guided(o)) {
        for (int i = 0; i < o->n; i++) r->t[i] = (float)t;
        return r->fn(r->ctx, o->n, x, r->t, r->labels, dst, err);
    }
    for (int i = 0; i < 2 * o->n; i++) r->t[i] = (float)t;
    memcpy(r->xin, x, r->len * sizeof(float));
    memcpy(r->xin + r->len, x, r->len * sizeof(float));
    loom_status st = r->fn(r->ctx, 2 * o->n, r->xin, r->t, r->lab, r->vraw, err);
    if (st) return st;
    const float w = o->cfg, *vc = r->vraw, *vu = r->vraw + r->len;
    for (size_t i = 0; i < r->len; i++) dst[i] = vu[i] + w * (vc[i] - vu[i]);
    return LOOM_OK;
}

static void run_free(flow_run *r) {
    free(r->t);
    free(r->lab);
    free(r->xin);
    free(r->vraw);
    free(r->v1);
    free(r->v2);
    free(r->xe);
}

loom_status loom_flow_sample(const loom_flow_sample_options *o, const int32_t *labels,
                             loom_velocity_fn fn, void *ctx, float *noise_out, float *x_out,
                             loom_error *err) {
    loom_status st = loom_flow_sample_validate(o, err);
    if (st) return st;
    if (!labels || !fn || !x_out)
        return loom_error_set(err, LOOM_ERR_STATE, "loom_flow_sample: labels, fn and x_out needed");
    const int n = o->n, heun = o->solver == LOOM_FLOW_HEUN, g = guided(o);
    const size_t numel = o->numel;
    flow_run r = {.o = o, .labels = labels, .fn = fn, .ctx = ctx, .len = (size_t)n * numel};
    const size_t bytes = r.len * sizeof(float);
    r.t = malloc((size_t)(g ? 2 * n : n) * sizeof(float));
    r.v1 = malloc(bytes);
    int ok = r.t && r.v1;
    if (g) {
        r.lab = malloc(2 * (size_t)n * sizeof(int32_t));
        r.xin = malloc(2 * bytes);
        r.vraw = malloc(2 * bytes);
        ok = ok && r.lab && r.xin && r.vraw;
    }
    if (heun) {
        r.v2 = malloc(bytes);
        r.xe = malloc(bytes);
        ok = ok && r.v2 && r.xe;
    }
    if (!ok) {
        run_free(&r);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "sampling: out of memory for %d samples of %zu "
                              "floats",
                              n, numel);
    }
    if (g) {
        memcpy(r.lab, labels, (size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++) r.lab[n + i] = o->null_class;
    }
    /* The start: noise keyed by each sample's global index and element. */
    for (int k = 0; k < n; k++) {
        const uint64_t base = (o->first + (uint64_t)k) * (uint64_t)numel;
        float *xk = x_out + (size_t)k * numel;
        for (size_t j = 0; j < numel; j++)
            xk[j] = (float)loom_philox_normal(o->seed, LOOM_SAMPLE_STREAM, base + j);
    }
    if (noise_out) memcpy(noise_out, x_out, bytes);

    float *x = x_out;
    int i = 0;
    for (; i < o->steps; i++) {
        const double t0 = 1.0 - (double)i / o->steps, t1 = 1.0 - (double)(i + 1) / o->steps;
        const float h = (float)(t1 - t0);
        if ((st = velocity(&r, x, t0, r.v1, err))) break;
        if (!heun) {
            for (size_t e = 0; e < r.len; e++) x[e] += h * r.v1[e];
            continue;
        }
        for (size_t e = 0; e < r.len; e++) r.xe[e] = x[e] + h * r.v1[e];
        if ((st = velocity(&r, r.xe, t1, r.v2, err))) break;
        for (size_t e = 0; e < r.len; e++) x[e] += h * (0.5f * (r.v1[e] + r.v2[e]));
    }
    if (st)
        loom_error_prefix(err, "sampling (%s) step %d of %d", loom_flow_solver_name(o->solver),
                          i + 1, o->steps);
    run_free(&r);
    return st;
}

void loom_flow_images_u8(const float *x, size_t count, uint8_t *out) {
    for (size_t i = 0; i < count; i++) {
        float u = roundf((x[i] + 1.0f) * 127.5f);
        out[i] = u > 0.0f ? (u < 255.0f ? (uint8_t)u : 255) : 0; /* NaN -> 0 */
    }
}
