/* The outer optimizer (parallel/outer.h) on one process, against float64 re-computations:
 *  - the wire formats: exact sizes; fp32 round trips exactly, bf16 within 2^-8 relative,
 *    int8 / int4 within half a step (block absmax / 127, / 7) of every value, zero blocks
 *    stay zero, int4 packs two values per byte (odd lengths too);
 *  - plain DiLoCo (one fragment): every H steps start -= lr * (Nesterov) momentum of
 *    (start - params), params = start; a last, shorter round at the run's last step;
 *  - streaming (F fragments): fragment f sent after steps (f + 1) H / F + k H, its update
 *    computed from the outer gradient of the send step and applied two steps later, the
 *    local parameters mixed alpha : 1 - alpha with the new global ones; at the last step
 *    whatever is in flight lands and every fragment is synced and replaced;
 *  - a buffer valid on some ranges only (ZeRO-3's shard with --ep): those alone are synced.
 * The parameters between syncs are moved by random "inner steps".
 * bf16 on the wire is checked bitwise: every decoded value is its fp32 value rounded to the
 * nearest bf16, ties to even (bf16_reference: frexp and nearbyint, not kernels/bf16.h's bit
 * arithmetic), so a bf16 outer sync sends exactly the fp32 outer gradient rounded. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "model/params.h"
#include "parallel/mesh.h"
#include "parallel/outer.h"
#include "test_common.h"

static float uniform(void) {
    return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* x rounded to the nearest bf16 (8 significant bits), ties to even (nearbyint in the
 * default rounding mode); loom flushes subnormals to signed zero. */
static float bf16_reference(float x) {
    if (fabsf(x) < FLT_MIN) return copysignf(0.0f, x);
    int k;
    (void)frexp((double)x, &k); /* |x| = m 2^k, m in [0.5, 1) */
    return (float)ldexp(nearbyint(ldexp((double)x, 8 - k)), k - 8);
}

/* bf16 at the rounding boundaries: random normal bf16 values h with the 16 dropped bits
 * 0x8000 (a tie: to the even neighbour), 0x7FFF and 0x8001 (either side of it), 0xFFFF
 * (carries into the exponent at a full significand), both signs, and subnormals. */
static void test_bf16_boundaries(void **state) {
    (void)state;
    enum { N = 4096 };
    static const uint32_t low[] = {0x8000u, 0x7FFFu, 0x8001u, 0xFFFFu, 0x0001u};
    float x[N], y[N];
    uint8_t w[2 * N];
    for (int i = 0; i < N; i++) {
        uint32_t hi = (uint32_t)(rnd() % 0xFE) + 1; /* biased exponent 1..254 */
        if (i % 7 == 0) hi = 0;                     /* subnormal or zero */
        uint32_t u = (uint32_t)(rnd() & 0x8000u) << 16 | hi << 23 | (uint32_t)(rnd() & 0x7Fu) << 16;
        u |= i % 9 == 0 ? 0x007F0000u : 0; /* a full significand */
        u |= low[i % 5];
        memcpy(&x[i], &u, sizeof u);
    }
    loom_outer_quantize(LOOM_OUTER_BF16, x, N, 64, w);
    loom_outer_dequantize(LOOM_OUTER_BF16, w, N, 64, y);
    for (int i = 0; i < N; i++) {
        const float want = bf16_reference(x[i]);
        if (memcmp(&y[i], &want, sizeof want) != 0)
            print_error("bf16 wire: %a decoded as %a, expected %a\n", (double)x[i], (double)y[i],
                        (double)want);
        assert_memory_equal(&y[i], &want, sizeof want);
    }
}

static void test_wire_formats(void **state) {
    (void)state;
    for (int trial = 0; trial < 40; trial++) {
        const size_t n = 1 + rnd() % 300;
        const int block = 2 * (1 + (int)(rnd() % 40));
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        uint8_t *w = malloc(4 * n + 64);
        const float mag = powf(10.0f, (float)((int)(rnd() % 9) - 6));
        for (size_t i = 0; i < n; i++) x[i] = uniform() * mag;
        if (n > 2 * (size_t)block) /* one block of zeros */
            for (int i = 0; i < block; i++) x[block + i] = 0.0f;
        for (int d = LOOM_OUTER_FP32; d <= LOOM_OUTER_INT4; d++) {
            const loom_outer_dtype dt = (loom_outer_dtype)d;
            const size_t nb = (n + block - 1) / block;
            const size_t want = dt == LOOM_OUTER_FP32   ? 4 * n
                                : dt == LOOM_OUTER_BF16 ? 2 * n
                                : dt == LOOM_OUTER_INT8 ? 4 * nb + n
                                                        : 4 * nb + (n + 1) / 2;
            assert_int_equal(loom_outer_wire_bytes(dt, n, block), want);
            loom_outer_quantize(dt, x, n, block, w);
            loom_outer_dequantize(dt, w, n, block, y);
            for (size_t b = 0; b < nb; b++) {
                const size_t lo = b * block, hi = lo + block < n ? lo + block : n;
                double amax = 0;
                for (size_t i = lo; i < hi; i++) amax = fmax(amax, fabs(x[i]));
                for (size_t i = lo; i < hi; i++) {
                    const double e = fabs((double)y[i] - x[i]);
                    if (dt == LOOM_OUTER_FP32) assert_true(y[i] == x[i]);
                    if (dt == LOOM_OUTER_BF16) {
                        const float want = bf16_reference(x[i]);
                        if (memcmp(&y[i], &want, sizeof want) != 0)
                            print_error("bf16 wire: %a decoded as %a, expected %a\n", (double)x[i],
                                        (double)y[i], (double)want);
                        assert_memory_equal(&y[i], &want, sizeof want);
                        assert_true(e <= fabs(x[i]) / 256.0);
                    }
                    if (dt == LOOM_OUTER_INT8) assert_true(e <= amax / 127 * 0.5001 + 1e-30);
                    if (dt == LOOM_OUTER_INT4) assert_true(e <= amax / 7 * 0.5001 + 1e-30);
                    if (x[i] == 0.0f && amax == 0.0) assert_true(y[i] == 0.0f);
                }
            }
        }
        free(x), free(y), free(w);
    }
}

/* A one-process mesh and a small GPT-2's registry. */
typedef struct {
    loom_model_config cfg;
    loom_param_table table;
    loom_mesh mesh;
} rig;

static void rig_create(rig *r) {
    memset(r, 0, sizeof *r);
    assert_int_equal(loom_model_preset(&r->cfg, "gpt2-tiny", NULL), LOOM_OK);
    r->cfg.n_layer = 4, r->cfg.d_model = 8, r->cfg.n_head = 2, r->cfg.n_kv_head = 2;
    r->cfg.d_ff = 16, r->cfg.vocab_size = 16, r->cfg.seq_len = 8;
    assert_int_equal(loom_params_build(&r->table, &r->cfg, NULL, NULL), LOOM_OK);
    loom_world w = {0, 1, 0};
    assert_int_equal(loom_mesh_create(&r->mesh, &w, (loom_layout){1, 1, 1, 1, 1}, NULL), LOOM_OK);
}

static void rig_free(rig *r) {
    loom_mesh_free(&r->mesh);
    loom_params_free(&r->table);
}

/* The fragment of flat element i: its tensor's block's layer * F / L; before the first
 * block 0, in the head F - 1 (written independently of parallel/outer.c). */
static int fragment_of_element(const loom_param_table *t, size_t i, int F) {
    if (i >= t->head_begin) return F - 1;
    int layer = -1;
    for (int b = 0; b < t->n_layer; b++)
        if (t->blocks[b].begin <= i) layer = b;
    return layer < 0 ? 0 : layer * F / t->n_layer;
}

static double rel_diff(const float *a, const double *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
    return sqrt(d / (s > 0 ? s : 1));
}

/* The reference's outer step on fragment f: momentum, (Nesterov) update; a warm-up sync
 * (--outer-warmup) is the plain average: start += -g, the momentum untouched. */
static void outer_step(size_t P, const int *frag, int f, const double *g, double *mom, double *upd,
                       float lr, float mu, int nesterov, int warm) {
    for (size_t i = 0; i < P; i++)
        if (frag[i] == f && warm) {
            upd[i] = -g[i];
        } else if (frag[i] == f) {
            mom[i] = mu * mom[i] + g[i];
            upd[i] = -(double)lr * (nesterov ? g[i] + mu * mom[i] : mom[i]);
        }
}

/* The update lands: start += update; params = alpha params + (1 - alpha) start. */
static void land(size_t P, const int *frag, int f, const double *upd, double *start, double *rp,
                 double alpha) {
    for (size_t i = 0; i < P; i++)
        if (frag[i] == f) {
            start[i] += upd[i];
            rp[i] = alpha * rp[i] + (1 - alpha) * start[i];
        }
}

/* Whether the sync of fragment f sent after `sent` is one of its first R (warm-up). */
static int warm_at(int sent, int f, int F, int H, int R) {
    const int offset = F == 1 ? H : (f + 1) * H / F;
    return (sent >= offset ? (sent - offset) / H : 0) < R;
}

/* n_own > 0: the buffer is valid on n_own random ranges only (ZeRO-3's shard with --ep,
 * loom_outer_buffer.own): the rest is never synced (fragment -1 in the reference). */
static void run_case_own(int F, int H, int steps, int nesterov, float lr, float mu, float alpha,
                         int R, int n_own) {
    rig r;
    rig_create(&r);
    const size_t P = r.table.total;
    float *p = malloc(P * sizeof *p);
    double *rp = malloc(P * sizeof *rp), *start = malloc(P * sizeof *start);
    double *mom = calloc(P, sizeof *mom), *g = calloc(P, sizeof *g), *upd = calloc(P, sizeof *upd);
    int *frag = malloc(P * sizeof *frag);
    loom_flat_range own[8];
    size_t cut[16], owned = 0;
    for (int k = 0; k < 2 * n_own; k++) cut[k] = (size_t)(rnd() % (P + 1));
    for (int a = 0; a < 2 * n_own; a++) /* sorted cut points: ranges in flat order */
        for (int b = a + 1; b < 2 * n_own; b++)
            if (cut[b] < cut[a]) {
                const size_t t = cut[a];
                cut[a] = cut[b], cut[b] = t;
            }
    for (int k = 0; k < n_own; k++) own[k] = (loom_flat_range){cut[2 * k], cut[2 * k + 1]};
    for (size_t i = 0; i < P; i++) {
        p[i] = uniform();
        rp[i] = start[i] = p[i];
        int in = n_own == 0;
        for (int k = 0; k < n_own; k++) in |= own[k].lo <= i && i < own[k].hi;
        frag[i] = in ? fragment_of_element(&r.table, i, F) : -1;
        owned += in;
    }
    loom_outer_config c;
    loom_outer_config_defaults(&c);
    snprintf(c.kind, sizeof c.kind, "diloco");
    c.inner_steps = H, c.fragments = F, c.nesterov = nesterov, c.lr = lr, c.momentum = mu;
    c.merge = alpha;
    c.warmup = R;
    assert_int_equal(loom_outer_config_validate(&c, r.cfg.n_layer, NULL), LOOM_OK);
    loom_outer o;
    const loom_outer_buffer buf = {p, 0, r.table.total, n_own > 0, n_own ? own : NULL, n_own};
    assert_int_equal(loom_outer_create(&o, &c, &r.mesh, &r.table, r.cfg.n_layer, &buf, steps, NULL),
                     LOOM_OK);
    assert_true(o.n_start == (n_own ? owned : P)); /* round-start values of its ranges only */
    int sent[LOOM_OUTER_MAX_FRAGMENTS];
    for (int f = 0; f < F; f++) sent[f] = -100;
    for (int s = 1; s <= steps; s++) {
        for (size_t i = 0; i < P; i++) { /* an inner step */
            const float d = 0.01f * uniform();
            p[i] += d;
            rp[i] = p[i];
        }
        assert_int_equal(loom_outer_after_step(&o, s, NULL), LOOM_OK);
        for (int f = 0; f < F; f++) {
            const int offset = F == 1 ? H : (f + 1) * H / F;
            const int sends = s >= offset && (s - offset) % H == 0, last = s == steps;
            if (F > 1) {
                if (sent[f] == s - 1)
                    outer_step(P, frag, f, g, mom, upd, lr, mu, nesterov,
                               warm_at(s - 1, f, F, H, R));
                if (sent[f] == s - 2 || (last && sent[f] == s - 1)) {
                    land(P, frag, f, upd, start, rp, alpha);
                    sent[f] = -100;
                }
                if (sends) {
                    for (size_t i = 0; i < P; i++)
                        if (frag[i] == f) g[i] = start[i] - rp[i];
                    sent[f] = s;
                }
                if (!last) continue;
                if (sent[f] == s) {
                    outer_step(P, frag, f, g, mom, upd, lr, mu, nesterov, warm_at(s, f, F, H, R));
                    land(P, frag, f, upd, start, rp, alpha);
                }
            } else if (!sends && !last) {
                continue;
            }
            /* a blocking sync: plain DiLoCo's rounds, and every fragment at the last step */
            for (size_t i = 0; i < P; i++)
                if (frag[i] == f) g[i] = start[i] - rp[i];
            outer_step(P, frag, f, g, mom, upd, lr, mu, nesterov, warm_at(s, f, F, H, R));
            land(P, frag, f, upd, start, rp, 0.0);
            sent[f] = -100;
        }
        const double e = rel_diff(p, rp, P);
        if (e > 1e-5) print_error("F %d H %d step %d: params rel err %.3e\n", F, H, s, e);
        assert_true(e <= 1e-5);
        /* the metrics' reduction (one worker: the mean is the value) */
        double v[2] = {1.5, NAN};
        assert_int_equal(loom_outer_mean(&o, v, 2, NULL), LOOM_OK);
        assert_true(v[0] == 1.5 && isnan(v[1]));
    }
    loom_outer_free(&o);
    free(p), free(rp), free(start), free(mom), free(g), free(upd), free(frag);
    rig_free(&r);
}

static void run_case(int F, int H, int steps, int nesterov, float lr, float mu, float alpha,
                     int R) {
    run_case_own(F, H, steps, nesterov, lr, mu, alpha, R, 0);
}

static void test_plain_diloco(void **state) {
    (void)state;
    run_case(1, 3, 10, 1, 0.7f, 0.9f, 0.5f, 0); /* a last round of 1 step */
    run_case(1, 4, 12, 0, 0.5f, 0.6f, 0.5f, 0);
    run_case(1, 1, 5, 1, 1.0f, 0.0f, 0.5f, 0);
    run_case(1, 3, 14, 1, 0.7f, 0.9f, 0.5f, 2); /* --outer-warmup 2, then Nesterov */
}

static void test_streaming(void **state) {
    (void)state;
    run_case(2, 6, 20, 1, 0.7f, 0.9f, 0.5f, 0);
    run_case(4, 12, 30, 0, 0.6f, 0.8f, 0.25f, 0);
    run_case(2, 7, 13, 1, 0.7f, 0.9f, 0.0f, 0); /* the last step lands a send of the step before */
    run_case(2, 6, 26, 1, 0.7f, 0.9f, 0.5f, 1); /* --outer-warmup 1 */
}

/* A shard spread over ranges (ZeRO-3 with --ep): only they are synced, the rest is left
 * as the inner steps moved it; plain and streaming, 1 to 8 random ranges (empty ones too). */
static void test_own_ranges(void **state) {
    (void)state;
    for (int k = 1; k <= 8; k++) {
        run_case_own(1, 3, 10, 1, 0.7f, 0.9f, 0.5f, 0, k);
        run_case_own(2, 6, 20, 1, 0.7f, 0.9f, 0.5f, 1, k);
    }
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL);
    if (getenv("LOOM_TEST_SEED")) seed = strtoull(getenv("LOOM_TEST_SEED"), NULL, 10);
    g_rng = seed;
    printf("test_outer seed %llu (LOOM_TEST_SEED to repeat)\n", (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_formats), cmocka_unit_test(test_bf16_boundaries),
        cmocka_unit_test(test_plain_diloco), cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_own_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
