/* DiT's per-sample pieces: adaLN modulation (x * (1 + scale) + shift), the gated
 * residual (res + gate * y) and the fixed position table. Local row i is global row
 * row0 + i of sample (row0 + i) / T; per-sample vectors are rows of stride ld.
 * Forwards split the rows across threads (static, equal split). Backwards run one task
 * per (local sample, column block): each task owns its rows' dx/dy entries and its
 * sample's gradient columns, summing over the sample's rows in row order in double, so
 * there are no races and the result does not depend on the thread count. */
#include "kernels/kernels.h"

#include "vecmath.h"

#define LOOM_MOD_COLS 64

/* ---- forwards ---- */
LOOM_SIMD static void modulate_rows(float *out, const float *x, const float *shift,
                                    const float *scale, int ld, int C, int T, int row0, size_t lo,
                                    size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        size_t b = ((size_t)row0 + i) / (size_t)T;
        const float *restrict s = shift + b * ld, *restrict k = scale + b * ld;
        const float *restrict xv = x + i * C;
        float *restrict o = out + i * C;
        for (int c = 0; c < C; c++) o[c] = xv[c] * (1.0f + k[c]) + s[c];
    }
}

void loom_modulate_forward(float *out, const float *x, const float *shift, const float *scale,
                           int ld, int N, int C, int T, int row0) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        modulate_rows(out, x, shift, scale, ld, C, T, row0, lo, hi);
    }
}

/* No restrict on out and res: out may alias res (elementwise, so that is safe). */
LOOM_SIMD static void gate_add_rows(float *out, const float *res, const float *y, const float *gate,
                                    int ld, int C, int T, int row0, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        size_t b = ((size_t)row0 + i) / (size_t)T;
        const float *g = gate + b * ld, *yv = y + i * C, *r = res + i * C;
        float *o = out + i * C;
        for (int c = 0; c < C; c++) o[c] = r[c] + g[c] * yv[c];
    }
}

void loom_gate_add_forward(float *out, const float *res, const float *y, const float *gate, int ld,
                           int N, int C, int T, int row0) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        gate_add_rows(out, res, y, gate, ld, C, T, row0, lo, hi);
    }
}

LOOM_SIMD static void add_position_rows(float *x, const float *pos, int C, int T, int row0,
                                        size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        const float *restrict p = pos + (((size_t)row0 + i) % (size_t)T) * C;
        float *restrict xv = x + i * C;
        for (int c = 0; c < C; c++) xv[c] += p[c];
    }
}

void loom_add_position(float *x, const float *pos, int N, int C, int T, int row0) {
#pragma omp parallel
    {
        size_t lo, hi;
        loom_thread_range((size_t)N, &lo, &hi);
        add_position_rows(x, pos, C, T, row0, lo, hi);
    }
}

/* ---- backwards: tasks over (local sample, column block) ---- */
typedef struct {
    int b;      /* global sample */
    int lo, hi; /* its local rows [lo, hi) */
    int c0, nc; /* columns [c0, c0 + nc) */
} sample_block;

/* Local samples and column blocks of N rows from row0; returns the task count. */
static int sample_tasks(int N, int C, int T, int row0, int *b0, int *ncb) {
    if (N <= 0 || C <= 0) return 0;
    *b0 = row0 / T;
    *ncb = (C + LOOM_MOD_COLS - 1) / LOOM_MOD_COLS;
    int nb = (row0 + N - 1) / T - *b0 + 1;
    return nb * *ncb;
}

static sample_block task_block(int task, int b0, int ncb, int N, int C, int T, int row0) {
    sample_block s;
    s.b = b0 + task / ncb;
    int first = s.b * T - row0, last = first + T;
    s.lo = first > 0 ? first : 0;
    s.hi = last < N ? last : N;
    s.c0 = (task % ncb) * LOOM_MOD_COLS;
    s.nc = C - s.c0 < LOOM_MOD_COLS ? C - s.c0 : LOOM_MOD_COLS;
    return s;
}

LOOM_SIMD static void modulate_backward_block(float *dx, float *dshift, float *dscale,
                                              const float *dout, const float *x, const float *scale,
                                              int ld, int C, sample_block s) {
    double as[LOOM_MOD_COLS] = {0}, ak[LOOM_MOD_COLS] = {0};
    const float *restrict k = scale + (size_t)s.b * ld + s.c0;
    for (int i = s.lo; i < s.hi; i++) {
        size_t off = (size_t)i * C + s.c0;
        const float *restrict dy = dout + off, *restrict xv = x + off;
        float *restrict g = dx + off;
        for (int j = 0; j < s.nc; j++) {
            g[j] += dy[j] * (1.0f + k[j]);
            as[j] += dy[j];
            ak[j] += (double)dy[j] * xv[j];
        }
    }
    float *restrict ds = dshift + (size_t)s.b * ld + s.c0, *restrict dk =
                                                               dscale + (size_t)s.b * ld + s.c0;
    for (int j = 0; j < s.nc; j++) {
        ds[j] += (float)as[j];
        dk[j] += (float)ak[j];
    }
}

void loom_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout,
                            const float *x, const float *scale, int ld, int N, int C, int T,
                            int row0) {
    int b0 = 0, ncb = 1, ntasks = sample_tasks(N, C, T, row0, &b0, &ncb);
#pragma omp parallel for schedule(static)
    for (int task = 0; task < ntasks; task++)
        modulate_backward_block(dx, dshift, dscale, dout, x, scale, ld, C,
                                task_block(task, b0, ncb, N, C, T, row0));
}

LOOM_SIMD static void gate_add_backward_block(float *dy, float *dgate, const float *dout,
                                              const float *y, const float *gate, int ld, int C,
                                              sample_block s) {
    double ag[LOOM_MOD_COLS] = {0};
    const float *restrict g = gate + (size_t)s.b * ld + s.c0;
    for (int i = s.lo; i < s.hi; i++) {
        size_t off = (size_t)i * C + s.c0;
        const float *restrict d = dout + off, *restrict yv = y + off;
        float *restrict dyv = dy + off;
        for (int j = 0; j < s.nc; j++) {
            dyv[j] += d[j] * g[j];
            ag[j] += (double)d[j] * yv[j];
        }
    }
    float *restrict dg = dgate + (size_t)s.b * ld + s.c0;
    for (int j = 0; j < s.nc; j++) dg[j] += (float)ag[j];
}

void loom_gate_add_backward(float *dy, float *dgate, const float *dout, const float *y,
                            const float *gate, int ld, int N, int C, int T, int row0) {
    int b0 = 0, ncb = 1, ntasks = sample_tasks(N, C, T, row0, &b0, &ncb);
#pragma omp parallel for schedule(static)
    for (int task = 0; task < ntasks; task++)
        gate_add_backward_block(dy, dgate, dout, y, gate, ld, C,
                                task_block(task, b0, ncb, N, C, T, row0));
}
