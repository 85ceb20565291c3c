/* Sampling a rectified-flow model: integrates dx/dt = v(x, t) from t = 1 (Gaussian noise)
 * to t = 0 (data) over `steps` uniform steps, Euler or Heun, with optional classifier-free
 * guidance. The velocity comes from a callback, so the integrator knows nothing of the
 * model (`loom sample` passes loom_dit_velocity; the unit test passes analytic fields).
 *
 * Times t_i = 1 - i/steps, i = 0..steps, h_i = t_{i+1} - t_i (negative).
 *   Euler: x <- x + h_i * v(x, t_i).
 *   Heun (every step, the last included: v is evaluated at t = 0 there):
 *     v1 = v(x, t_i); xe = x + h_i * v1; v2 = v(xe, t_{i+1}); x <- x + h_i * (v1 + v2) / 2.
 *   Guidance w (cfg): v = vu + w * (vc - vu), vc with each sample's label, vu with the null
 *   class; w == 1: vc alone (the null class is never evaluated).
 * Initial noise: element j of sample k is loom_philox_normal(seed, LOOM_SAMPLE_STREAM,
 * (first + k) * numel + j): a sample's noise depends only on its index, not on how the
 * samples are split into calls. */
#ifndef LOOM_MODEL_FLOW_SAMPLER_H
#define LOOM_MODEL_FLOW_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define LOOM_SAMPLE_STREAM 0x736d706cu /* "smpl" */

typedef enum { LOOM_FLOW_EULER = 0, LOOM_FLOW_HEUN = 1 } loom_flow_solver;

/* The velocity of `count` samples of numel floats each: x [count * numel], t [count],
 * labels [count] -> v [count * numel] (host memory). With guidance every call has the
 * n conditional samples first, then the same n samples (same x and t) with the null
 * class, so a model planned for micro-batch 2n evaluates both in one forward. */
typedef loom_status (*loom_velocity_fn)(void *ctx, int count, const float *x, const float *t,
                                        const int32_t *labels, float *v, loom_error *err);

typedef struct {
    int n;                   /* samples (>= 1; --n) */
    size_t numel;            /* floats per sample, F*C*H*W (>= 1) */
    int steps;               /* >= 1 (--steps) */
    float cfg;               /* guidance scale w >= 0 (--cfg); 1: plain conditional */
    loom_flow_solver solver; /* --solver */
    int32_t null_class;      /* the label of the unconditional branch (needed when cfg != 1) */
    uint64_t seed;           /* of the initial noise */
    uint64_t first;          /* global index of sample 0 (its noise key); 0 usually */
} loom_flow_sample_options;

/* "euler" / "heun" -> *solver; LOOM_ERR_INPUT naming --solver otherwise. */
loom_status loom_flow_solver_parse(const char *name, loom_flow_solver *solver, loom_error *err);
const char *loom_flow_solver_name(loom_flow_solver solver);

/* Options checked alone; errors name the flag (--n, --steps, --cfg, --solver). */
loom_status loom_flow_sample_validate(const loom_flow_sample_options *o, loom_error *err);

/* Model evaluations one sampling run makes (steps or 2*steps; each with n or 2n samples). */
int loom_flow_evaluations(const loom_flow_sample_options *o);

/* Samples o->n samples of labels[n] into x_out [n * numel]; the initial noise also into
 * noise_out [n * numel] unless it is NULL. Scratch is allocated once up front (none of
 * it per step); the callback's first failure stops sampling and is returned, with the
 * step prefixed to its message. */
loom_status loom_flow_sample(const loom_flow_sample_options *o, const int32_t *labels,
                             loom_velocity_fn fn, void *ctx, float *noise_out, float *x_out,
                             loom_error *err);

/* x in [-1, 1] -> pixels: out[i] = clamp(round((x[i] + 1) * 127.5), 0, 255) (round half
 * away from zero; NaN -> 0). */
void loom_flow_images_u8(const float *x, size_t count, uint8_t *out);

#endif
