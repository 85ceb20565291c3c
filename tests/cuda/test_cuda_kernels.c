/* Every CUDA kernel (src/kernels/cuda) against float64 naive references on random inputs
 * of odd sizes, in fp32 and in bf16 (inputs rounded to bf16 first, so the reference sees
 * exactly what the GPU sees). Outputs that a kernel overwrites are poisoned with NaN bytes
 * before each call; outputs that it accumulates into (+=) start from the same random
 * values on both sides, so the += contract is checked too. AdamW is also compared with
 * the CPU kernel (same operation order; built with LOOM_TEST_CPU_KERNELS). The backend
 * table (kernels/backend.h): the CUDA backend's memory functions, streams and events, a
 * few ops against the CPU backend's, and the sticky error of an op it does not implement.
 * The bf16 table (loom_backend_cuda_bf16_create, --precision bf16's ops): its rounding
 * bitwise against the CPU's (kernels/bf16.h) on ties, subnormals, inf, NaN and random bit
 * patterns; its GEMMs within a bound derived per element (see gemm_bound's comment);
 * GELU/SwiGLU from bf16 bit for bit the fp32 kernels on the widened input.
 *
 * Error measure: max |gpu - ref| / max |ref| over the tensor (NaN fails). Tolerances:
 * fp32 2e-5 (1e-4 for attention), bf16 2e-2.
 *
 * Exit 77 (ctest: skipped) when there is no CUDA driver or device. LOOM_TEST_SEED fixes
 * the seed (printed at the start and on failure). The last line is "N passed, F failed". */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/backend_bf16.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/kernels_cuda.h"
#ifdef LOOM_TEST_CPU_KERNELS
#include "kernels/kernels.h"
#endif

#define TOL32 2e-5
#define TOL32_ATTN 1e-4
#define TOL16 2e-2

static uint64_t g_rng, g_seed;
static long g_passed, g_failed;
static loom_cuda_ctx g_ctx;
static loom_cuda_arena g_arena;
static cudaStream_t g_s;

/* ------------------------------------------------------------------ helpers */

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float unif(float lo, float hi) {
    return lo + (hi - lo) * (float)((rnd() >> 11) * (1.0 / 9007199254740992.0));
}
static int randint(int n) {
    return (int)(rnd() % (uint64_t)n);
}

static uint16_t f2bf(float x) { /* round to nearest even, as __float2bfloat16_rn */
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static float *hrand(size_t n, float lo, float hi, int bf) {
    float *x = malloc(n * sizeof *x + 4);
    for (size_t i = 0; i < n; i++) x[i] = bf ? bf2f(f2bf(unif(lo, hi))) : unif(lo, hi);
    return x;
}
static float *hcopy(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y + 4);
    memcpy(y, x, n * sizeof *y);
    return y;
}
static double *dzeros(size_t n) {
    return calloc(n + 1, sizeof(double));
}

/* Cross-entropy in float64: loss[r] and dl = (softmax - onehot) x dloss over rows of V. */
static void ref_crossentropy(const float *x, const int32_t *tgt, int N, int V, float dloss,
                             double *loss, double *dl) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * V;
        double m = xr[0], sum = 0.0;
        for (int j = 1; j < V; j++) m = xr[j] > m ? xr[j] : m;
        for (int j = 0; j < V; j++) sum += exp(xr[j] - m);
        loss[r] = m + log(sum) - xr[tgt[r]];
        for (int j = 0; j < V; j++)
            dl[(size_t)r * V + j] = (exp(xr[j] - m) / sum - (j == tgt[r])) * dloss;
    }
}

static void fatal(const char *what, loom_error *err) {
    fprintf(stderr, "FATAL (seed %llu): %s: %s\n", (unsigned long long)g_seed, what,
            err ? err->msg : "");
    exit(1);
}

static void *dalloc(size_t bytes) {
    loom_error err = {0};
    void *p = loom_cuda_arena_alloc(&g_arena, bytes ? bytes : 4, "test buffer", &err);
    if (!p) fatal("arena", &err);
    return p;
}
static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "FATAL (seed %llu): %s: %s\n", (unsigned long long)g_seed, what,
                cudaGetErrorString(e));
        exit(1);
    }
}
/* Device copy of x as fp32 or bf16. */
static void *up(const float *x, size_t n, int bf) {
    void *d = dalloc(n * (bf ? 2 : 4));
    if (bf) {
        uint16_t *t = malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) t[i] = f2bf(x[i]);
        cuda_ok(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice), "upload");
        free(t);
    } else {
        cuda_ok(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice), "upload");
    }
    return d;
}
static void *up_i32(const int32_t *x, size_t n) {
    void *d = dalloc(n * 4);
    cuda_ok(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice), "upload");
    return d;
}
/* A poisoned output: every byte 0xFF is a NaN in fp32 and in bf16. */
static void *poisoned(size_t n, int bf) {
    void *d = dalloc(n * (bf ? 2 : 4));
    cuda_ok(cudaMemset(d, 0xFF, n * (bf ? 2 : 4)), "poison");
    return d;
}
static float *down(const void *d, size_t n, int bf) {
    loom_error err = {0};
    if (loom_cuda_check("kernel", 1, &err) != LOOM_OK) fatal("kernel launch", &err);
    float *x = malloc(n * 4 + 4);
    if (bf) {
        uint16_t *t = malloc(n * 2 + 2);
        cuda_ok(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost), "download");
        for (size_t i = 0; i < n; i++) x[i] = bf2f(t[i]);
        free(t);
    } else {
        cuda_ok(cudaMemcpy(x, d, n * 4, cudaMemcpyDeviceToHost), "download");
    }
    return x;
}

static void check(const char *name, const float *got, const double *ref, size_t n, double tol) {
    double maxref = 0.0, maxerr = 0.0;
    size_t worst = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs(ref[i]), e = fabs((double)got[i] - ref[i]);
        if (r > maxref) maxref = r;
        if (!(e <= maxerr)) { /* catches NaN */
            if (isnan(e)) nan = 1;
            maxerr = isnan(e) ? INFINITY : e;
            worst = i;
        }
    }
    double rel = maxerr / (maxref > 0 ? maxref : 1.0);
    if (!nan && rel <= tol) {
        g_passed++;
        return;
    }
    g_failed++;
    fprintf(stderr, "FAIL %s: rel err %.3g > %.3g (element %zu: got %.9g, want %.9g) seed %llu\n",
            name, rel, tol, worst, (double)got[worst], ref[worst], (unsigned long long)g_seed);
}

static void check_true(const char *name, int ok) {
    if (ok) {
        g_passed++;
    } else {
        g_failed++;
        fprintf(stderr, "FAIL %s (seed %llu)\n", name, (unsigned long long)g_seed);
    }
}

#define TOL(bf) ((bf) ? TOL16 : TOL32)
#define NAME(buf, base, bf) snprintf(buf, sizeof buf, "%s%s", base, (bf) ? " bf16" : "")

/* Runs body with a scratch scope of the arena (everything carved inside is released). */
#define SCOPE                                                                                      \
    for (size_t mark_ = loom_cuda_arena_mark(&g_arena), once_ = 1; once_;                          \
         once_ = 0, loom_cuda_arena_release(&g_arena, mark_))

/* ------------------------------------------------------------------ linear */

static void test_linear(int N, int IC, int OC, int with_bias, int bf) {
    char nm[64];
    loom_error err = {0};
    float *x = hrand((size_t)N * IC, -1, 1, bf), *w = hrand((size_t)OC * IC, -1, 1, bf);
    float *b = hrand(OC, -1, 1, bf), *dy = hrand((size_t)N * OC, -1, 1, bf);
    float *dx0 = hrand((size_t)N * IC, -1, 1, bf), *dw0 = hrand((size_t)OC * IC, -1, 1, 0);
    float *db0 = hrand(OC, -1, 1, 0);
    double *out = dzeros((size_t)N * OC), *dx = dzeros((size_t)N * IC);
    double *dw = dzeros((size_t)OC * IC), *db = dzeros(OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = with_bias ? b[o] : 0.0;
            for (int i = 0; i < IC; i++) acc += (double)x[n * IC + i] * w[o * IC + i];
            out[n * OC + o] = acc;
        }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double acc = dx0[n * IC + i];
            for (int o = 0; o < OC; o++) acc += (double)dy[n * OC + o] * w[o * IC + i];
            dx[n * IC + i] = acc;
        }
    for (int o = 0; o < OC; o++) {
        double accb = db0[o];
        for (int n = 0; n < N; n++) accb += dy[n * OC + o];
        db[o] = accb;
        for (int i = 0; i < IC; i++) {
            double acc = dw0[o * IC + i];
            for (int n = 0; n < N; n++) acc += (double)dy[n * OC + o] * x[n * IC + i];
            dw[o * IC + i] = acc;
        }
    }
    SCOPE {
        void *dX = up(x, (size_t)N * IC, bf), *dW = up(w, (size_t)OC * IC, bf);
        void *dB = with_bias ? up(b, OC, bf) : NULL, *dDY = up(dy, (size_t)N * OC, bf);
        void *dOut = poisoned((size_t)N * OC, bf), *dDX = up(dx0, (size_t)N * IC, bf);
        float *dDW = up(dw0, (size_t)OC * IC, 0), *dDB = up(db0, OC, 0);
        if (bf) {
            loom_cuda_linear_forward_bf16(&g_ctx, dOut, dX, dW, dB, N, IC, OC);
            loom_cuda_linear_backward_input_bf16(&g_ctx, dDX, dDY, dW, N, IC, OC);
            loom_cuda_linear_backward_weight_bf16(&g_ctx, dDW, with_bias ? dDB : NULL, dDY, dX, N,
                                                  IC, OC);
        } else {
            loom_cuda_linear_forward(&g_ctx, dOut, dX, dW, dB, N, IC, OC);
            loom_cuda_linear_backward_input(&g_ctx, dDX, dDY, dW, N, IC, OC);
            loom_cuda_linear_backward_weight(&g_ctx, dDW, with_bias ? dDB : NULL, dDY, dX, N, IC,
                                             OC);
        }
        /* the GEMMs' first failure is the context's sticky error */
        if (loom_cuda_ctx_status(&g_ctx, 1, &err) != LOOM_OK) fatal("linear", &err);
        float *g;
        NAME(nm, "linear forward", bf);
        check(nm, g = down(dOut, (size_t)N * OC, bf), out, (size_t)N * OC, TOL(bf));
        free(g);
        NAME(nm, "linear backward input", bf);
        check(nm, g = down(dDX, (size_t)N * IC, bf), dx, (size_t)N * IC, TOL(bf));
        free(g);
        NAME(nm, "linear backward weight", bf);
        check(nm, g = down(dDW, (size_t)OC * IC, 0), dw, (size_t)OC * IC, TOL(bf));
        free(g);
        if (with_bias) {
            NAME(nm, "linear backward bias", bf);
            check(nm, g = down(dDB, OC, 0), db, OC, TOL(bf));
            free(g);
        }
    }
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0);
    free(out), free(dx), free(dw), free(db);
}

/* ------------------------------------------------------------------ embedding */

static void test_embedding(int B, int T, int C, int vocab, int v0, int V, int with_wpe, int bf) {
    char nm[64];
    int N = B * T;
    int32_t *tok = malloc(N * 4);
    for (int i = 0; i < N; i++) tok[i] = randint(vocab); /* N > vocab: tokens repeat */
    float *wte = hrand((size_t)V * C, -1, 1, 0), *wpe = hrand((size_t)T * C, -1, 1, 0);
    float *dy = hrand((size_t)N * C, -1, 1, bf);
    float *dwte0 = hrand((size_t)V * C, -1, 1, 0), *dwpe0 = hrand((size_t)T * C, -1, 1, 0);
    double *out = dzeros((size_t)N * C), *dwte = dzeros((size_t)V * C), *dwpe = dzeros(T * C);
    for (size_t i = 0; i < (size_t)V * C; i++) dwte[i] = dwte0[i];
    for (size_t i = 0; i < (size_t)T * C; i++) dwpe[i] = dwpe0[i];
    for (int bt = 0; bt < N; bt++) {
        int t = bt % T, k = tok[bt] - v0, own = k >= 0 && k < V;
        for (int c = 0; c < C; c++) {
            out[bt * C + c] = (own ? wte[k * C + c] : 0.0) + (with_wpe ? wpe[t * C + c] : 0.0);
            if (own) dwte[k * C + c] += dy[bt * C + c];
            dwpe[t * C + c] += dy[bt * C + c];
        }
    }
    SCOPE {
        void *dTok = up_i32(tok, N), *dWte = up(wte, (size_t)V * C, 0);
        void *dWpe = with_wpe ? up(wpe, (size_t)T * C, 0) : NULL, *dDy = up(dy, (size_t)N * C, bf);
        void *dOut = poisoned((size_t)N * C, bf);
        float *dDwte = up(dwte0, (size_t)V * C, 0), *dDwpe = with_wpe ? up(dwpe0, T * C, 0) : NULL;
        if (bf) {
            loom_cuda_embedding_forward_bf16(dOut, dTok, dWte, dWpe, v0, V, B, T, C, g_s);
            loom_cuda_embedding_backward_bf16(dDwte, dDwpe, dDy, dTok, v0, V, B, T, C, g_s);
        } else {
            loom_cuda_embedding_forward(dOut, dTok, dWte, dWpe, v0, V, B, T, C, g_s);
            loom_cuda_embedding_backward(dDwte, dDwpe, dDy, dTok, v0, V, B, T, C, g_s);
        }
        float *g;
        NAME(nm, "embedding forward", bf);
        check(nm, g = down(dOut, (size_t)N * C, bf), out, (size_t)N * C, TOL(bf));
        free(g);
        NAME(nm, "embedding backward wte", bf);
        check(nm, g = down(dDwte, (size_t)V * C, 0), dwte, (size_t)V * C, TOL(bf));
        free(g);
        if (with_wpe) {
            NAME(nm, "embedding backward wpe", bf);
            check(nm, g = down(dDwpe, (size_t)T * C, 0), dwpe, (size_t)T * C, TOL(bf));
            free(g);
        }
    }
    free(tok), free(wte), free(wpe), free(dy), free(dwte0), free(dwpe0);
    free(out), free(dwte), free(dwpe);
}

/* ------------------------------------------------------------------ norms */

static void test_norm(int rms, int N, int C, int bf) {
    char nm[64];
    const float eps = 1e-5f;
    size_t n = (size_t)N * C;
    float *x = hrand(n, -2, 3, bf), *w = hrand(C, 0.5f, 1.5f, 0), *b = hrand(C, -1, 1, 0);
    float *dy = hrand(n, -1, 1, bf), *dx0 = hrand(n, -1, 1, bf);
    float *dw0 = hrand(C, -1, 1, 0), *db0 = hrand(C, -1, 1, 0);
    double *out = dzeros(n), *mean = dzeros(N), *rstd = dzeros(N), *dx = dzeros(n);
    double *dw = dzeros(C), *db = dzeros(C);
    for (int c = 0; c < C; c++) dw[c] = dw0[c], db[c] = db0[c];
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C;
        double mu = 0.0, var = 0.0;
        if (!rms) {
            for (int c = 0; c < C; c++) mu += xr[c];
            mu /= C;
        }
        for (int c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu);
        double rs = 1.0 / sqrt(var / C + eps);
        mean[r] = mu, rstd[r] = rs;
        double sg = 0.0, sgx = 0.0;
        for (int c = 0; c < C; c++) {
            double xh = (xr[c] - mu) * rs, g = (double)dy[r * C + c] * w[c];
            out[r * C + c] = xh * w[c] + (rms ? 0.0 : b[c]);
            sg += g, sgx += g * xh;
            dw[c] += dy[r * C + c] * xh;
            db[c] += dy[r * C + c];
        }
        for (int c = 0; c < C; c++) {
            double xh = (xr[c] - mu) * rs, g = (double)dy[r * C + c] * w[c];
            dx[r * C + c] = dx0[r * C + c] + rs * (g - (rms ? 0.0 : sg / C) - xh * sgx / C);
        }
    }
    SCOPE {
        void *dX = up(x, n, bf), *dDy = up(dy, n, bf), *dOut = poisoned(n, bf);
        void *dDx = up(dx0, n, bf);
        float *dW = up(w, C, 0), *dB = up(b, C, 0), *dDw = up(dw0, C, 0), *dDb = up(db0, C, 0);
        float *dMean = poisoned(N, 0), *dRstd = poisoned(N, 0);
        if (rms && bf) {
            loom_cuda_rmsnorm_forward_bf16(dOut, dRstd, dX, dW, N, C, eps, g_s);
            loom_cuda_rmsnorm_backward_bf16(dDx, dDw, dDy, dX, dW, dRstd, N, C, g_s);
        } else if (rms) {
            loom_cuda_rmsnorm_forward(dOut, dRstd, dX, dW, N, C, eps, g_s);
            loom_cuda_rmsnorm_backward(dDx, dDw, dDy, dX, dW, dRstd, N, C, g_s);
        } else if (bf) {
            loom_cuda_layernorm_forward_bf16(dOut, dMean, dRstd, dX, dW, dB, N, C, eps, g_s);
            loom_cuda_layernorm_backward_bf16(dDx, dDw, dDb, dDy, dX, dW, dMean, dRstd, N, C, g_s);
        } else {
            loom_cuda_layernorm_forward(dOut, dMean, dRstd, dX, dW, dB, N, C, eps, g_s);
            loom_cuda_layernorm_backward(dDx, dDw, dDb, dDy, dX, dW, dMean, dRstd, N, C, g_s);
        }
        const char *base = rms ? "rmsnorm" : "layernorm";
        char tmp[48];
        float *g;
        snprintf(tmp, sizeof tmp, "%s forward", base);
        NAME(nm, tmp, bf);
        check(nm, g = down(dOut, n, bf), out, n, TOL(bf));
        free(g);
        snprintf(tmp, sizeof tmp, "%s rstd", base);
        NAME(nm, tmp, bf);
        check(nm, g = down(dRstd, N, 0), rstd, N, TOL32);
        free(g);
        if (!rms) {
            NAME(nm, "layernorm mean", bf);
            check(nm, g = down(dMean, N, 0), mean, N, TOL32);
            free(g);
            NAME(nm, "layernorm dbias", bf);
            check(nm, g = down(dDb, C, 0), db, C, TOL(bf));
            free(g);
        }
        snprintf(tmp, sizeof tmp, "%s dinp", base);
        NAME(nm, tmp, bf);
        check(nm, g = down(dDx, n, bf), dx, n, TOL(bf));
        free(g);
        snprintf(tmp, sizeof tmp, "%s dweight", base);
        NAME(nm, tmp, bf);
        check(nm, g = down(dDw, C, 0), dw, C, TOL(bf));
        free(g);
    }
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0);
    free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
}

/* ------------------------------------------------------------------ activations */

static void test_gelu_add(size_t n, int bf) {
    char nm[64];
    const double S = 0.7978845608028654, K = 0.044715;
    float *x = hrand(n, -5, 5, bf), *y = hrand(n, -3, 3, bf), *dy = hrand(n, -1, 1, bf);
    float *dx0 = hrand(n, -1, 1, bf);
    double *out = dzeros(n), *dx = dzeros(n), *sum = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        double v = x[i], u = S * (v + K * v * v * v), t = tanh(u);
        out[i] = 0.5 * v * (1.0 + t);
        double d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * S * (1.0 + 3.0 * K * v * v);
        dx[i] = dx0[i] + d * dy[i];
        sum[i] = (double)x[i] + y[i];
    }
    SCOPE {
        void *dX = up(x, n, bf), *dY = up(y, n, bf), *dDy = up(dy, n, bf), *dDx = up(dx0, n, bf);
        void *dOut = poisoned(n, bf), *dSum = poisoned(n, bf);
        if (bf) {
            loom_cuda_gelu_forward_bf16(dOut, dX, n, g_s);
            loom_cuda_gelu_backward_bf16(dDx, dX, dDy, n, g_s);
            loom_cuda_add_bf16(dSum, dX, dY, n, g_s);
        } else {
            loom_cuda_gelu_forward(dOut, dX, n, g_s);
            loom_cuda_gelu_backward(dDx, dX, dDy, n, g_s);
            loom_cuda_add(dSum, dX, dY, n, g_s);
        }
        float *g;
        NAME(nm, "gelu forward", bf);
        check(nm, g = down(dOut, n, bf), out, n, TOL(bf));
        free(g);
        NAME(nm, "gelu backward", bf);
        check(nm, g = down(dDx, n, bf), dx, n, TOL(bf));
        free(g);
        NAME(nm, "add", bf);
        check(nm, g = down(dSum, n, bf), sum, n, TOL(bf));
        free(g);
        if (!bf) { /* out aliasing a: out = a + b in place */
            loom_cuda_add(dX, dX, dY, n, g_s);
            check("add in place", g = down(dX, n, 0), sum, n, TOL32);
            free(g);
        }
    }
    free(x), free(y), free(dy), free(dx0), free(out), free(dx), free(sum);
}

static void test_swiglu(int N, int F, int bf) {
    char nm[64];
    size_t n = (size_t)N * F;
    float *x = hrand(2 * n, -4, 4, bf), *dy = hrand(n, -1, 1, bf), *dx0 = hrand(2 * n, -1, 1, bf);
    double *out = dzeros(n), *dx = dzeros(2 * n);
    for (size_t i = 0; i < 2 * n; i++) dx[i] = dx0[i];
    for (int r = 0; r < N; r++)
        for (int f = 0; f < F; f++) {
            double g = x[(size_t)r * 2 * F + f], u = x[(size_t)r * 2 * F + F + f];
            double sig = 1.0 / (1.0 + exp(-g)), d = dy[(size_t)r * F + f];
            out[(size_t)r * F + f] = g * sig * u;
            dx[(size_t)r * 2 * F + f] += d * u * sig * (1.0 + g * (1.0 - sig));
            dx[(size_t)r * 2 * F + F + f] += d * g * sig;
        }
    SCOPE {
        void *dX = up(x, 2 * n, bf), *dDy = up(dy, n, bf), *dDx = up(dx0, 2 * n, bf);
        void *dOut = poisoned(n, bf);
        if (bf) {
            loom_cuda_swiglu_forward_bf16(dOut, dX, N, F, g_s);
            loom_cuda_swiglu_backward_bf16(dDx, dDy, dX, N, F, g_s);
        } else {
            loom_cuda_swiglu_forward(dOut, dX, N, F, g_s);
            loom_cuda_swiglu_backward(dDx, dDy, dX, N, F, g_s);
        }
        float *g;
        NAME(nm, "swiglu forward", bf);
        check(nm, g = down(dOut, n, bf), out, n, TOL(bf));
        free(g);
        NAME(nm, "swiglu backward", bf);
        check(nm, g = down(dDx, 2 * n, bf), dx, 2 * n, TOL(bf));
        free(g);
    }
    free(x), free(dy), free(dx0), free(out), free(dx);
}

/* ------------------------------------------------------------------ rope */

static void rope_ref(double *y, const float *x, int B, int T, int H, int KV, int hd, double theta,
                     int pos0, double sign) {
    int R = (H + 2 * KV) * hd, half = hd / 2;
    for (size_t i = 0; i < (size_t)B * T * R; i++) y[i] = x[i];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H + KV; h++)
                for (int k = 0; k < half; k++) {
                    double ang = (pos0 + t) * pow(theta, -2.0 * k / hd);
                    double cs = cos(ang), sn = sign * sin(ang);
                    size_t lo = ((size_t)b * T + t) * R + (size_t)h * hd + k, hi = lo + half;
                    double a = x[lo], c = x[hi];
                    y[lo] = a * cs - c * sn;
                    y[hi] = c * cs + a * sn;
                }
}

static void test_rope(int B, int T, int H, int KV, int hd, int pos0, int bf) {
    char nm[64];
    const float theta = 10000.0f;
    size_t n = (size_t)B * T * (H + 2 * KV) * hd;
    float *x = hrand(n, -2, 2, bf);
    double *fw = dzeros(n), *bw = dzeros(n);
    rope_ref(fw, x, B, T, H, KV, hd, theta, pos0, 1.0);
    rope_ref(bw, x, B, T, H, KV, hd, theta, 0, -1.0);
    SCOPE {
        void *dF = up(x, n, bf), *dB = up(x, n, bf);
        if (bf) {
            loom_cuda_rope_forward_bf16(dF, B, T, H, KV, hd, theta, pos0, g_s);
            loom_cuda_rope_backward_bf16(dB, B, T, H, KV, hd, theta, g_s);
        } else {
            loom_cuda_rope_forward(dF, B, T, H, KV, hd, theta, pos0, g_s);
            loom_cuda_rope_backward(dB, B, T, H, KV, hd, theta, g_s);
        }
        float *g;
        NAME(nm, "rope forward", bf);
        check(nm, g = down(dF, n, bf), fw, n, TOL(bf));
        free(g);
        NAME(nm, "rope backward", bf);
        check(nm, g = down(dB, n, bf), bw, n, TOL(bf));
        free(g);
    }
    free(x), free(fw), free(bw);
}

/* ------------------------------------------------------------------ attention */

/* Naive GQA attention in double, causal (key j <= query i) or not: out, lse; and dqkv
 * (+= onto dqkv) given dout. */
static void attention_ref(double *out, double *lse, double *dqkv, const float *qkv,
                          const float *dout, const float *out_used, const float *lse_used, int B,
                          int T, int H, int KV, int hd, int causal) {
    int R = (H + 2 * KV) * hd, OC = H * hd;
    double scale = 1.0 / sqrt((double)hd);
    double *p = malloc(sizeof(double) * T), *dp = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / KV);
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * R + (size_t)h * hd;
                const int jn = causal ? i + 1 : T; /* keys visible to query i */
                double m = -INFINITY;
                for (int j = 0; j < jn; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * R + (size_t)(H + g) * hd;
                    double s = 0.0;
                    for (int d = 0; d < hd; d++) s += (double)q[d] * k[d];
                    p[j] = s * scale;
                    if (p[j] > m) m = p[j];
                }
                double sum = 0.0;
                for (int j = 0; j < jn; j++) sum += exp(p[j] - m);
                size_t lrow = ((size_t)b * H + h) * T + i;
                lse[lrow] = m + log(sum);
                size_t orow = ((size_t)b * T + i) * OC + (size_t)h * hd;
                for (int d = 0; d < hd; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < jn; j++)
                        acc += exp(p[j] - lse[lrow]) *
                               qkv[((size_t)b * T + j) * R + (size_t)(H + KV + g) * hd + d];
                    out[orow + d] = acc;
                }
                if (!dqkv) continue;
                /* Backward with the out and lse the GPU is given (as the kernel uses them). */
                double D = 0.0;
                for (int d = 0; d < hd; d++) D += (double)dout[orow + d] * out_used[orow + d];
                for (int j = 0; j < jn; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * R + (size_t)(H + KV + g) * hd;
                    double pj = exp(p[j] - lse_used[lrow]), acc = 0.0;
                    for (int d = 0; d < hd; d++) acc += (double)dout[orow + d] * v[d];
                    dp[j] = scale * pj * (acc - D); /* dS */
                    p[j] = pj;
                }
                for (int j = 0; j < jn; j++) {
                    size_t krow = ((size_t)b * T + j) * R;
                    for (int d = 0; d < hd; d++) {
                        dqkv[((size_t)b * T + i) * R + (size_t)h * hd + d] +=
                            dp[j] * qkv[krow + (size_t)(H + g) * hd + d];
                        dqkv[krow + (size_t)(H + g) * hd + d] += dp[j] * q[d];
                        dqkv[krow + (size_t)(H + KV + g) * hd + d] += p[j] * dout[orow + d];
                    }
                }
            }
        }
    free(p), free(dp);
}

static void test_attention(int B, int T, int H, int KV, int hd, int bf) {
    char nm[64];
    size_t nq = (size_t)B * T * (H + 2 * KV) * hd, no = (size_t)B * T * H * hd;
    size_t nl = (size_t)B * H * T;
    float *qkv = hrand(nq, -2, 2, bf), *dout = hrand(no, -1, 1, bf), *dq0 = hrand(nq, -1, 1, bf);
    double *out = dzeros(no), *lse = dzeros(nl), *dqkv = dzeros(nq);
    attention_ref(out, lse, NULL, qkv, NULL, NULL, NULL, B, T, H, KV, hd, 1);
    /* The backward is given the reference out (rounded like the GPU's) and lse. */
    float *out_used = malloc(no * 4 + 4), *lse_used = malloc(nl * 4 + 4);
    for (size_t i = 0; i < no; i++) out_used[i] = bf ? bf2f(f2bf((float)out[i])) : (float)out[i];
    for (size_t i = 0; i < nl; i++) lse_used[i] = (float)lse[i];
    for (size_t i = 0; i < nq; i++) dqkv[i] = dq0[i];
    double *o2 = dzeros(no), *l2 = dzeros(nl);
    attention_ref(o2, l2, dqkv, qkv, dout, out_used, lse_used, B, T, H, KV, hd, 1);
    SCOPE {
        void *dQkv = up(qkv, nq, bf), *dOut = poisoned(no, bf), *dDout = up(dout, no, bf);
        void *dOutUsed = up(out_used, no, bf), *dDq = up(dq0, nq, bf);
        float *dLse = poisoned(nl, 0), *dLseUsed = up(lse_used, nl, 0);
        float *scratch = poisoned(loom_cuda_attention_scratch_floats(B, T, H), 0);
        if (bf) {
            loom_cuda_attention_forward_bf16(dOut, dLse, dQkv, B, T, H, KV, hd, g_s);
            loom_cuda_attention_backward_bf16(dDq, scratch, dDout, dQkv, dOutUsed, dLseUsed, B, T,
                                              H, KV, hd, g_s);
        } else {
            loom_cuda_attention_forward(dOut, dLse, dQkv, B, T, H, KV, hd, g_s);
            loom_cuda_attention_backward(dDq, scratch, dDout, dQkv, dOutUsed, dLseUsed, B, T, H, KV,
                                         hd, g_s);
        }
        char tmp[96];
        float *g;
        snprintf(tmp, sizeof tmp, "attention forward B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
        NAME(nm, tmp, bf);
        check(nm, g = down(dOut, no, bf), out, no, bf ? TOL16 : TOL32_ATTN);
        free(g);
        snprintf(tmp, sizeof tmp, "attention lse hd%d", hd);
        NAME(nm, tmp, bf);
        check(nm, g = down(dLse, nl, 0), lse, nl, bf ? TOL16 : TOL32_ATTN);
        free(g);
        snprintf(tmp, sizeof tmp, "attention backward B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
        NAME(nm, tmp, bf);
        check(nm, g = down(dDq, nq, bf), dqkv, nq, bf ? TOL16 : TOL32_ATTN);
        free(g);
    }
    free(qkv), free(dout), free(dq0), free(out), free(lse), free(dqkv);
    free(out_used), free(lse_used), free(o2), free(l2);
}

/* The cuBLAS path (attention_gemm.cu), fp32, causal and bidirectional: the same checks. */
static void test_attention_gemm(int B, int T, int H, int KV, int hd, int causal) {
    size_t nq = (size_t)B * T * (H + 2 * KV) * hd, no = (size_t)B * T * H * hd;
    size_t nl = (size_t)B * H * T;
    float *qkv = hrand(nq, -2, 2, 0), *dout = hrand(no, -1, 1, 0), *dq0 = hrand(nq, -1, 1, 0);
    double *out = dzeros(no), *lse = dzeros(nl), *dqkv = dzeros(nq);
    attention_ref(out, lse, NULL, qkv, NULL, NULL, NULL, B, T, H, KV, hd, causal);
    float *out_used = malloc(no * 4 + 4), *lse_used = malloc(nl * 4 + 4);
    for (size_t i = 0; i < no; i++) out_used[i] = (float)out[i];
    for (size_t i = 0; i < nl; i++) lse_used[i] = (float)lse[i];
    for (size_t i = 0; i < nq; i++) dqkv[i] = dq0[i];
    double *o2 = dzeros(no), *l2 = dzeros(nl);
    attention_ref(o2, l2, dqkv, qkv, dout, out_used, lse_used, B, T, H, KV, hd, causal);
    SCOPE {
        void *dQkv = up(qkv, nq, 0), *dOut = poisoned(no, 0), *dDout = up(dout, no, 0);
        void *dOutUsed = up(out_used, no, 0), *dDq = up(dq0, nq, 0);
        float *dLse = poisoned(nl, 0), *dLseUsed = up(lse_used, nl, 0);
        float *scratch = poisoned(loom_cuda_attention_gemm_scratch_floats(B, T, H, KV), 0);
        loom_cuda_attention_gemm_forward(&g_ctx, dOut, dLse, dQkv, scratch, B, T, H, KV, hd,
                                         causal);
        loom_cuda_attention_gemm_backward(&g_ctx, dDq, scratch, dDout, dQkv, dOutUsed, dLseUsed, B,
                                          T, H, KV, hd, causal);
        loom_error e;
        check_true("attention gemm: no cuBLAS error",
                   loom_cuda_ctx_status(&g_ctx, 1, &e) == LOOM_OK);
        char nm[128];
        const char *kind = causal ? "causal" : "bidir";
        float *g;
        snprintf(nm, sizeof nm, "attention gemm %s forward B%d T%d H%d KV%d hd%d", kind, B, T, H,
                 KV, hd);
        check(nm, g = down(dOut, no, 0), out, no, TOL32_ATTN);
        free(g);
        snprintf(nm, sizeof nm, "attention gemm %s lse hd%d", kind, hd);
        check(nm, g = down(dLse, nl, 0), lse, nl, TOL32_ATTN);
        free(g);
        snprintf(nm, sizeof nm, "attention gemm %s backward B%d T%d H%d KV%d hd%d", kind, B, T, H,
                 KV, hd);
        check(nm, g = down(dDq, nq, 0), dqkv, nq, TOL32_ATTN);
        free(g);
    }
    free(qkv), free(dout), free(dq0), free(out), free(lse), free(dqkv);
    free(out_used), free(lse_used), free(o2), free(l2);
}

/* ------------------------------------------------------------------ cross-entropy */

static void test_crossentropy(int N, int V, int bf) {
    char nm[64];
    size_t n = (size_t)N * V;
    float *x = hrand(n, -8, 8, bf);
    for (int r = 0; r < N; r++) /* a large offset per row: the max must be subtracted */
        for (int j = 0; j < V; j++) x[(size_t)r * V + j] += bf ? 0.0f : 30.0f * (r % 3);
    int32_t *tgt = malloc(N * 4);
    for (int r = 0; r < N; r++) tgt[r] = randint(V);
    const float dloss = 1.0f / (float)N;
    double *loss = dzeros(N), *dl = dzeros(n);
    ref_crossentropy(x, tgt, N, V, dloss, loss, dl);
    SCOPE {
        void *dX = up(x, n, bf), *dX2 = up(x, n, bf), *dT = up_i32(tgt, N);
        float *dL = poisoned(N, 0), *dL2 = poisoned(N, 0);
        if (bf) {
            loom_cuda_crossentropy_forward_bf16(dL, dX, dT, N, V, g_s);
            loom_cuda_crossentropy_forward_backward_bf16(dL2, dX2, dT, N, V, dloss, g_s);
        } else {
            loom_cuda_crossentropy_forward(dL, dX, dT, N, V, g_s);
            loom_cuda_crossentropy_forward_backward(dL2, dX2, dT, N, V, dloss, g_s);
        }
        float *g;
        /* Losses are fp32 from (possibly bf16) logits the reference also used: tight. */
        NAME(nm, "crossentropy forward", bf);
        check(nm, g = down(dL, N, 0), loss, N, TOL32);
        free(g);
        NAME(nm, "crossentropy forward_backward loss", bf);
        check(nm, g = down(dL2, N, 0), loss, N, TOL32);
        free(g);
        NAME(nm, "crossentropy dlogits", bf);
        check(nm, g = down(dX2, n, bf), dl, n, TOL(bf));
        free(g);
    }
    free(x), free(tgt), free(loss), free(dl);
}

/* ------------------------------------------------------------------ optimizer, clipping */

static void test_adamw(size_t n) {
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = hrand(n, -1, 1, 0), *m = hrand(n, -0.1f, 0.1f, 0), *v = hrand(n, 0, 0.01f, 0);
    double *pd = dzeros(n), *md = dzeros(n), *vd = dzeros(n);
    for (size_t i = 0; i < n; i++) pd[i] = p[i], md[i] = m[i], vd[i] = v[i];
#ifdef LOOM_TEST_CPU_KERNELS
    float *pc = hcopy(p, n), *mc = hcopy(m, n), *vc = hcopy(v, n);
#endif
    SCOPE {
        float *dP = up(p, n, 0), *dM = up(m, n, 0), *dV = up(v, n, 0);
        for (int t = 1; t <= 3; t++) {
            float *gr = hrand(n, -1, 1, 0);
            float *dG = up(gr, n, 0);
            loom_cuda_adamw_update(dP, dG, dM, dV, n, lr, b1, b2, eps, wd, t, g_s);
            double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
            for (size_t i = 0; i < n; i++) {
                pd[i] *= 1.0 - (double)lr * wd;
                md[i] = b1 * md[i] + (1.0 - b1) * gr[i];
                vd[i] = b2 * vd[i] + (1.0 - b2) * gr[i] * gr[i];
                pd[i] -= lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + eps);
            }
#ifdef LOOM_TEST_CPU_KERNELS
            loom_adamw_update(pc, gr, mc, vc, n, lr, b1, b2, eps, wd, t);
#endif
            free(gr);
        }
        float *g = down(dP, n, 0), *gm = down(dM, n, 0), *gv = down(dV, n, 0);
        check("adamw param vs float64", g, pd, n, 1e-5);
        check("adamw m vs float64", gm, md, n, 1e-5);
        check("adamw v vs float64", gv, vd, n, 1e-5);
#ifdef LOOM_TEST_CPU_KERNELS
        /* Same operation order as the CPU kernel: expected bitwise equal; reported, and
         * checked to 1e-6 so a last-ulp difference of libm/device math is not a failure. */
        size_t differ = 0;
        double *pcd = dzeros(n);
        for (size_t i = 0; i < n; i++) {
            pcd[i] = pc[i];
            differ += memcmp(&g[i], &pc[i], 4) != 0;
        }
        printf("adamw: %zu of %zu parameters differ bitwise from the CPU kernel\n", differ, n);
        check("adamw param vs CPU kernel", g, pcd, n, 1e-6);
        free(pcd), free(pc), free(mc), free(vc);
#endif
        free(g), free(gm), free(gv);
    }
    free(p), free(m), free(v), free(pd), free(md), free(vd);
}

static void test_clip_and_convert(size_t n) {
    float *x = hrand(n, -3, 3, 0);
    double ss = 0.0, *scaled = dzeros(n), *rounded = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        scaled[i] = (double)x[i] * 0.37f;
        rounded[i] = bf2f(f2bf(x[i]));
    }
    SCOPE {
        float *dX = up(x, n, 0);
        double *dOut = poisoned(2, 0), *scratch = poisoned(2 * LOOM_CUDA_SUMSQ_BLOCKS, 0);
        loom_cuda_sum_squares(dOut, scratch, dX, n, g_s);
        double got = NAN;
        loom_error err = {0};
        if (loom_cuda_check("sum_squares", 1, &err) != LOOM_OK) fatal("sum_squares", &err);
        cuda_ok(cudaMemcpy(&got, dOut, 8, cudaMemcpyDeviceToHost), "download");
        check_true("sum_squares (double, relative 1e-12)", fabs(got - ss) <= 1e-12 * ss);
        loom_bf16 *dB = poisoned(n, 1);
        float *dBack = poisoned(n, 0);
        loom_cuda_f32_to_bf16(dB, dX, n, g_s);
        loom_cuda_bf16_to_f32(dBack, dB, n, g_s);
        float *g = down(dBack, n, 0);
        check("f32 -> bf16 -> f32 (round to nearest even)", g, rounded, n, 0.0);
        free(g);
        loom_cuda_scale(dX, 0.37f, n, g_s);
        check("scale", g = down(dX, n, 0), scaled, n, 1e-7);
        free(g);
    }
    free(x), free(scaled), free(rounded);
}

static void test_arena(void) {
    loom_error err = {0};
    size_t mark = loom_cuda_arena_mark(&g_arena), peak = g_arena.peak;
    void *a = loom_cuda_arena_alloc(&g_arena, 3, "a", &err);
    void *b = loom_cuda_arena_alloc(&g_arena, 5, "b", &err);
    check_true("arena: 256-byte aligned carving",
               a && b && ((uintptr_t)a % 256 == 0) && ((uintptr_t)b % 256 == 0) && b > a);
    void *huge = loom_cuda_arena_alloc(&g_arena, g_arena.size, "too big", &err);
    check_true("arena: over-allocation fails with a message naming it",
               huge == NULL && err.code == LOOM_ERR_NOMEM && strstr(err.msg, "too big"));
    loom_cuda_arena_release(&g_arena, mark);
    check_true("arena: release to the mark keeps the peak",
               g_arena.used == mark && g_arena.peak >= peak);
    char line[256];
    loom_cuda_arena_report(&g_arena, line, sizeof line);
    printf("%s\n", line);
    check_true("arena: report", strstr(line, "peak") != NULL);
}

#ifdef LOOM_TEST_CPU_KERNELS
/* The CUDA backend table against the CPU one: arena, copies, memset, a stream waiting
 * on an event, linear / RMSNorm / sum of squares through both tables, then an op the
 * CUDA backend does not implement leaves its sticky error. */
static void test_backend_table(void) {
    loom_error err = {0};
    loom_backend *cu = NULL;
    if (loom_backend_cuda_create(&cu, 0, &err) != LOOM_OK) fatal("cuda backend", &err);
    const loom_backend *cpu = loom_backend_cpu();
    check_true("backend: kind and name", cu->device == LOOM_DEVICE_CUDA &&
                                             strcmp(cu->name, "cuda:0") == 0 && cu->align == 256);
    const int N = 37, IC = 53, OC = 29;
    const size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    loom_backend_arena a;
    if (loom_backend_arena_create(&a, cu, (size_t)1 << 20, "backend test", &err) != LOOM_OK)
        fatal("backend arena", &err);
    float *x = hrand(nx, -1, 1, 0), *w = hrand(nw, -1, 1, 0), *b = hrand(OC, -1, 1, 0);
    float *dx = loom_backend_arena_alloc(&a, nx * 4, "x", &err);
    float *dw = loom_backend_arena_alloc(&a, nw * 4, "w", &err);
    float *db = loom_backend_arena_alloc(&a, OC * 4, "b", &err);
    float *dout = loom_backend_arena_alloc(&a, no * 4, "out", &err);
    float *dcopy = loom_backend_arena_alloc(&a, no * 4, "copy", &err);
    check_true("backend: arena pieces 256-byte aligned", dx && dw && db && dout && dcopy &&
                                                             (uintptr_t)dw % 256 == 0 &&
                                                             (uintptr_t)dcopy % 256 == 0);
    loom_backend_copy_to_device(cu, dx, x, nx * 4);
    loom_backend_copy_to_device(cu, dw, w, nw * 4);
    loom_backend_copy_to_device(cu, db, b, OC * 4);
    loom_backend_memset(cu, dout, 0xFF, no * 4); /* poisoned: the op overwrites */
    loom_backend_linear_forward(cu, dout, dx, dw, db, N, IC, OC);
    /* the copy on a second stream, after an event recorded behind the GEMM */
    loom_backend_stream *s2 = NULL;
    loom_backend_event *ev = NULL;
    if (loom_backend_stream_create(cu, &s2, &err) || loom_backend_event_create(cu, &ev, &err))
        fatal("stream/event", &err);
    loom_backend_event_record(cu, ev, NULL);
    loom_backend_stream_wait_event(cu, s2, ev);
    loom_backend_copy(cu, dcopy, dout, no * 4);
    loom_backend_synchronize(cu);
    float *got = malloc(no * 4), *want = malloc(no * 4);
    loom_backend_copy_to_host(cu, got, dcopy, no * 4);
    loom_backend_linear_forward(cpu, want, x, w, b, N, IC, OC);
    double *ref = dzeros(no);
    for (size_t i = 0; i < no; i++) ref[i] = want[i];
    check("backend: linear_forward cuda vs cpu table", got, ref, no, TOL32);
    /* RMSNorm and the sum of squares (returned to the host) */
    float *g = hrand(IC, 0.5f, 1.5f, 0), *rs = malloc((size_t)N * 4);
    float *gotn = malloc(nx * 4), *norm = malloc(nx * 4);
    float *dg = loom_backend_arena_alloc(&a, IC * 4, "g", &err);
    float *drs = loom_backend_arena_alloc(&a, (size_t)N * 4, "rstd", &err);
    float *dn = loom_backend_arena_alloc(&a, nx * 4, "norm", &err);
    check_true("backend: arena holds the norm buffers", dg && drs && dn);
    loom_backend_copy_to_device(cu, dg, g, IC * 4);
    loom_backend_rmsnorm_forward(cu, dn, drs, dx, dg, N, IC, 1e-5f);
    loom_backend_copy_to_host(cu, gotn, dn, nx * 4);
    loom_backend_rmsnorm_forward(cpu, norm, rs, x, g, N, IC, 1e-5f);
    double *rn = dzeros(nx);
    for (size_t i = 0; i < nx; i++) rn[i] = norm[i];
    check("backend: rmsnorm_forward cuda vs cpu table", gotn, rn, nx, TOL32);
    const double q = loom_backend_sum_squares(cu, dx, nx),
                 qc = loom_backend_sum_squares(cpu, x, nx);
    check_true("backend: sum_squares", fabs(q - qc) <= 1e-9 * qc);
    check_true("backend: no error so far", loom_backend_status(cu, &err) == LOOM_OK);
    /* an op without a CUDA kernel: a sticky error naming it, the first one kept */
    loom_backend_crossentropy_shard_max(cu, dout, dx, N, IC);
    loom_backend_moe_permute(cu, dout, dx, NULL, NULL, NULL, N, 1, IC);
    loom_error e2 = {0};
    check_true("backend: refused op is a sticky error naming it",
               loom_backend_status(cu, &e2) == LOOM_ERR_STATE &&
                   strstr(e2.msg, "not implemented on cuda: crossentropy_shard_max") != NULL);
    loom_backend_event_destroy(cu, ev);
    loom_backend_stream_destroy(cu, s2);
    loom_backend_arena_destroy(&a);
    loom_backend_cuda_destroy(cu);
    free(x), free(w), free(b), free(got), free(want), free(ref), free(g), free(rs), free(norm);
    free(rn), free(gotn);
}
#endif

/* ------------------------------------------------------------------ the bf16 table */
/* --precision bf16's ops on CUDA (loom_backend_cuda_bf16_create; kernels/backend_bf16.h),
 * against the CPU's rounding (kernels/bf16.h, bitwise) and float64 references computed
 * here from the same bf16-rounded operands.
 *
 * GEMM tolerance, per element: the operands are bf16 (8 significant bits), so every
 * product a_i b_i is exact in fp32 (16 bits); the only error is the fp32 accumulation of
 * K products plus the accumulated-into value (or bias) and the final add: K + 2 terms.
 * In any summation order, with round-to-nearest, |C - C64| <= gamma_{K+2} S with
 * S = |C0| + sum_i |a_i b_i| and gamma_k = k 2^-24 / (1 - k 2^-24) (Higham, Accuracy and
 * Stability, 3.1). Tensor cores align and truncate instead of rounding (Fasi, Higham,
 * Mikaitis, Pranesh 2021): at most 2^-23 per addition, twice that; and a factor 2 margin:
 * bound = 4 (K + 2) 2^-24 S. A wrong transpose or operand gives O(1) errors, far above.
 * Where the output is bf16 (the logits), the rounding adds 2^-8 |C64| (half an ulp); 2^-7
 * is allowed (a tie moved by the accumulation error). */
static double gemm_bound(int K, double S, double ref, double round_rel) {
    return round_rel * fabs(ref) + (1.0 + round_rel) * 4.0 * (K + 2) * ldexp(1.0, -24) * S;
}

static void check_bound(const char *name, const float *got, const double *ref, const double *S,
                        size_t n, int K, double round_rel) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e <= gemm_bound(K, S[i], ref[i], round_rel))) { /* catches NaN */
            if (!bad) first = i;
            bad++;
        }
    }
    if (!bad) {
        g_passed++;
        return;
    }
    g_failed++;
    fprintf(stderr,
            "FAIL %s: %zu of %zu elements beyond the bound (element %zu: got %.9g, want %.9g, "
            "bound %.3g) seed %llu\n",
            name, bad, n, first, (double)got[first], ref[first],
            gemm_bound(K, S[first], ref[first], round_rel), (unsigned long long)g_seed);
}

/* The uploads and poisonings (cudaMemcpy, cudaMemset: the legacy stream) done before a
 * table op runs on the backend's own non-blocking stream. */
static void settle(void) {
    cuda_ok(cudaDeviceSynchronize(), "uploads");
}

/* Raw device buffers of 16- and 32-bit patterns (no conversion: NaN payloads kept). */
static void *up_raw(const void *x, size_t bytes) {
    void *d = dalloc(bytes);
    cuda_ok(cudaMemcpy(d, x, bytes, cudaMemcpyHostToDevice), "upload");
    return d;
}
static void down_raw(void *x, const void *d, size_t bytes) {
    loom_error err = {0};
    if (loom_cuda_check("kernel", 1, &err) != LOOM_OK) fatal("kernel launch", &err);
    cuda_ok(cudaMemcpy(x, d, bytes, cudaMemcpyDeviceToHost), "download");
}
static float f32_of_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static uint32_t bits_of_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
/* x rounded by loom's rule (kernels/bf16.h), as a float */
static float loom_round(float x) {
    return loom_bf16_to_f32(loom_bf16_from_f32(x));
}

/* The rounding corner cases, then random bit patterns of every exponent. */
static size_t rounding_inputs(uint32_t *u, size_t n) {
    static const uint32_t fixed[] = {
        0x00000000u, 0x80000000u,                            /* signed zeros */
        0x00000001u, 0x807FFFFFu, 0x00400000u, 0x80008000u,  /* subnormals: signed zero */
        0x00800000u, 0x80800000u,                            /* smallest normals */
        0x7F800000u, 0xFF800000u,                            /* +-inf */
        0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu,  /* NaNs: quiet, signalling */
        0x7FFF0000u, 0xFF810000u,                            /* NaN payload in the top bits */
        0x7F7FFFFFu, 0xFF7FFFFFu,                            /* largest finite: to inf */
        0x7F7F7FFFu, 0x7F7F8000u, 0x7F7E8000u,               /* below, at the tie to inf */
        0x3F808000u, 0x3F818000u, 0xBF808000u, 0xBF818000u,  /* ties: to even, both ways */
        0x3F807FFFu, 0x3F808001u, 0x3F80FFFFu, 0x3FFF8000u,  /* around ties; carry out */
        0x3F800000u, 0x3FC00000u, 0x00808000u, 0x00818000u}; /* exact; ties at tiny normals */
    size_t k = 0;
    for (; k < sizeof fixed / sizeof fixed[0] && k < n; k++) u[k] = fixed[k];
    for (; k < n; k++) {
        uint32_t r = (uint32_t)rnd();
        switch (k % 4) {
        case 0:
            u[k] = r;
            break; /* any pattern */
        case 1:
            u[k] = (r & 0xFFFF0000u) | 0x8000u;
            break; /* an exact tie */
        case 2:
            u[k] = r & 0x807FFFFFu;
            break; /* zero or subnormal */
        default:
            u[k] = (r & 0xFFFF0000u) | (r & 1u ? 0x7FFFu : 0x8001u); /* next to a tie */
        }
    }
    return k;
}

static void test_bf16_rounding(const loom_backend *be, size_t n) {
    uint32_t *u = malloc(n * 4), *back = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *g16 = malloc(n * 2);
    rounding_inputs(u, n);
    SCOPE {
        float *dX = up_raw(u, n * 4), *dV = up_raw(u, n * 4), *dW = poisoned(n, 0);
        loom_bf16 *dH = poisoned(n, 1);
        settle();
        loom_backend_round_bf16(be, dH, dX, n);
        loom_backend_round_bf16_values(be, dV, n);
        loom_backend_synchronize(be);
        down_raw(g16, dH, n * 2);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            h[i] = loom_bf16_from_f32(f32_of_bits(u[i]));
            if (g16[i] != h[i] && !bad++) first = i;
        }
        if (bad)
            fprintf(stderr, "round_bf16: %zu of %zu differ; first %08x -> %04x, cpu %04x\n", bad, n,
                    u[first], g16[first], h[first]);
        check_true("bf16 table: round_bf16 bitwise the CPU's loom_bf16_from_f32", bad == 0);
        down_raw(back, dV, n * 4);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (back[i] != (uint32_t)h[i] << 16 && !bad++) first = i;
        if (bad)
            fprintf(stderr, "round_bf16_values: %zu of %zu differ; first %08x -> %08x\n", bad, n,
                    u[first], back[first]);
        check_true("bf16 table: round_bf16_values bitwise widen(round(x))", bad == 0);
        /* widen: every one of the 65536 patterns (NaNs included) */
        for (size_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
        loom_bf16 *dAll = up_raw(h, 65536 * 2);
        settle();
        loom_backend_widen_bf16(be, dW, dAll, 65536);
        loom_backend_synchronize(be);
        down_raw(back, dW, 65536 * 4);
        bad = 0;
        for (size_t i = 0; i < 65536; i++) bad += back[i] != (uint32_t)i << 16;
        check_true("bf16 table: widen_bf16 exact on all 65536 patterns", bad == 0);
    }
    free(u), free(back), free(h), free(g16);
}

/* fp32 values and their bf16 roundings (loom's rule), uniform in [lo, hi). */
static float *hrand_pair(size_t n, float lo, float hi, float **rounded_out) {
    float *x = hrand(n, lo, hi, 0), *r = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) r[i] = loom_round(x[i]);
    *rounded_out = r;
    return x;
}

/* Every bf16 GEMM op of the table, and the fp32-signature ops that round inside. */
static void test_bf16_linear(const loom_backend *be, int N, int IC, int OC, int with_bias) {
    char nm[160];
    const size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, ny = (size_t)N * OC;
    float *x16, *w16, *dy16;
    float *x = hrand_pair(nx, -1, 1, &x16), *w = hrand_pair(nw, -1, 1, &w16);
    float *dy = hrand_pair(ny, -1, 1, &dy16), *b = hrand(OC, -1, 1, 0);
    float *dx0 = hrand(nx, -1, 1, 0), *dw0 = hrand(nw, -1, 1, 0), *db0 = hrand(OC, -1, 1, 0);
    double *out = dzeros(ny), *Sout = dzeros(ny), *logit = dzeros(ny), *Slogit = dzeros(ny);
    double *dx = dzeros(nx), *Sdx = dzeros(nx), *dw = dzeros(nw), *Sdw = dzeros(nw);
    double *dwnb = dzeros(nw), *db = dzeros(OC), *Sdb = dzeros(OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = 0.0, s = 0.0;
            for (int i = 0; i < IC; i++) {
                const double p = (double)x16[(size_t)n * IC + i] * w16[(size_t)o * IC + i];
                acc += p, s += fabs(p);
            }
            logit[(size_t)n * OC + o] = acc, Slogit[(size_t)n * OC + o] = s;
            out[(size_t)n * OC + o] = acc + (with_bias ? b[o] : 0.0);
            Sout[(size_t)n * OC + o] = s + (with_bias ? fabs(b[o]) : 0.0);
        }
    for (int n = 0; n < N; n++) /* dinp += round(dout) @ w */
        for (int i = 0; i < IC; i++) {
            double acc = dx0[(size_t)n * IC + i], s = fabs(acc);
            for (int o = 0; o < OC; o++) {
                const double p = (double)dy16[(size_t)n * OC + o] * w16[(size_t)o * IC + i];
                acc += p, s += fabs(p);
            }
            dx[(size_t)n * IC + i] = acc, Sdx[(size_t)n * IC + i] = s;
        }
    for (int o = 0; o < OC; o++) /* dweight += round(dout)^T @ inp; dbias += sum of fp32 dout */
        for (int i = 0; i < IC; i++) {
            double acc = dw0[(size_t)o * IC + i], s = fabs(acc);
            for (int n = 0; n < N; n++) {
                const double p = (double)dy16[(size_t)n * OC + o] * x16[(size_t)n * IC + i];
                acc += p, s += fabs(p);
            }
            dw[(size_t)o * IC + i] = acc, Sdw[(size_t)o * IC + i] = s;
        }
    for (int o = 0; o < OC; o++) {
        double acc = db0[o], s = fabs(acc);
        for (int n = 0; n < N; n++)
            acc += dy[(size_t)n * OC + o], s += fabs(dy[(size_t)n * OC + o]);
        db[o] = acc, Sdb[o] = s;
    }
    float *g;
    SCOPE {
        float *dX = up(x, nx, 0), *dW = up(w, nw, 0), *dDy = up(dy, ny, 0), *dB = up(b, OC, 0);
        void *dX16 = up(x16, nx, 1), *dW16 = up(w16, nw, 1), *dDy16 = up(dy16, ny, 1);
        const float *bias = with_bias ? dB : NULL;
        /* the _bf16 ops: operands already bf16 (dout fp32, rounded inside) */
        float *dOut = poisoned(ny, 0), *dDx = up(dx0, nx, 0), *dDw = up(dw0, nw, 0);
        float *dDb = up(db0, OC, 0);
        settle();
        loom_backend_linear_forward_bf16(be, dOut, dX16, dW16, bias, N, IC, OC);
        loom_backend_linear_backward_input_bf16(be, dDx, dDy, dW16, N, IC, OC);
        loom_backend_linear_backward_weight_bf16(be, dDw, dDb, dDy, dX16, N, IC, OC);
        loom_backend_synchronize(be);
        snprintf(nm, sizeof nm, "bf16 table: linear_forward_bf16 N%d IC%d OC%d%s", N, IC, OC,
                 with_bias ? " bias" : "");
        check_bound(nm, g = down(dOut, ny, 0), out, Sout, ny, IC, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_input_bf16 N%d IC%d OC%d", N, IC, OC);
        check_bound(nm, g = down(dDx, nx, 0), dx, Sdx, nx, OC, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_weight_bf16 N%d IC%d OC%d", N, IC, OC);
        check_bound(nm, g = down(dDw, nw, 0), dw, Sdw, nw, N, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_weight_bf16 dbias N%d OC%d", N, OC);
        check_bound(nm, g = down(dDb, OC, 0), db, Sdb, OC, N, 0.0);
        free(g);

        /* the fp32 signatures: every operand rounded inside; the same references */
        float *dOut2 = poisoned(ny, 0), *dDx2 = up(dx0, nx, 0), *dDw2 = up(dw0, nw, 0);
        float *dDb2 = up(db0, OC, 0), *dOut3 = poisoned(ny, 0);
        settle();
        loom_backend_linear_forward(be, dOut2, dX, dW, bias, N, IC, OC);
        loom_backend_linear_backward_input(be, dDx2, dDy, dW, N, IC, OC);
        loom_backend_linear_backward_weight(be, dDw2, dDb2, dDy, dX, N, IC, OC);
        loom_backend_linear_forward_in_bf16(be, dOut3, dX16, dW, bias, N, IC, OC);
        loom_backend_synchronize(be);
        snprintf(nm, sizeof nm, "bf16 table: linear_forward (rounds) N%d IC%d OC%d", N, IC, OC);
        check_bound(nm, g = down(dOut2, ny, 0), out, Sout, ny, IC, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_input (rounds) N%d IC%d OC%d", N, IC,
                 OC);
        check_bound(nm, g = down(dDx2, nx, 0), dx, Sdx, nx, OC, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_weight (rounds) N%d IC%d OC%d", N, IC,
                 OC);
        check_bound(nm, g = down(dDw2, nw, 0), dw, Sdw, nw, N, 0.0);
        free(g);
        check_bound("bf16 table: linear_backward_weight (rounds) dbias", g = down(dDb2, OC, 0), db,
                    Sdb, OC, N, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_forward_in_bf16 N%d IC%d OC%d", N, IC, OC);
        check_bound(nm, g = down(dOut3, ny, 0), out, Sout, ny, IC, 0.0);
        free(g);

        /* the logits' ops: bf16 output; bf16 output gradient; no bias */
        void *dL1 = poisoned(ny, 1), *dL2 = poisoned(ny, 1);
        float *dDx3 = up(dx0, nx, 0), *dDw3 = up(dw0, nw, 0), *dDw4 = up(dw0, nw, 0);
        settle();
        loom_backend_linear_forward_out_bf16(be, dL1, dX, NULL, dW, N, IC, OC);
        loom_backend_linear_forward_out_bf16(be, dL2, NULL, dX16, dW, N, IC, OC);
        loom_backend_linear_backward_input_dbf16(be, dDx3, dDy16, dW, N, IC, OC);
        loom_backend_linear_backward_weight_dbf16(be, dDw3, dDy16, dX, NULL, N, IC, OC);
        loom_backend_linear_backward_weight_dbf16(be, dDw4, dDy16, NULL, dX16, N, IC, OC);
        loom_backend_synchronize(be);
        snprintf(nm, sizeof nm, "bf16 table: linear_forward_out_bf16 (fp32 inp) N%d IC%d OC%d", N,
                 IC, OC);
        check_bound(nm, g = down(dL1, ny, 1), logit, Slogit, ny, IC, ldexp(1.0, -7));
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_forward_out_bf16 (bf16 inp) N%d IC%d OC%d", N,
                 IC, OC);
        check_bound(nm, g = down(dL2, ny, 1), logit, Slogit, ny, IC, ldexp(1.0, -7));
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_input_dbf16 N%d IC%d OC%d", N, IC, OC);
        check_bound(nm, g = down(dDx3, nx, 0), dx, Sdx, nx, OC, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_weight_dbf16 (fp32 inp) N%d IC%d OC%d",
                 N, IC, OC);
        check_bound(nm, g = down(dDw3, nw, 0), dw, Sdw, nw, N, 0.0);
        free(g);
        snprintf(nm, sizeof nm, "bf16 table: linear_backward_weight_dbf16 (bf16 inp) N%d IC%d OC%d",
                 N, IC, OC);
        check_bound(nm, g = down(dDw4, nw, 0), dw, Sdw, nw, N, 0.0);
        free(g);
    }
    (void)dwnb;
    free(x), free(w), free(dy), free(b), free(x16), free(w16), free(dy16);
    free(dx0), free(dw0), free(db0), free(out), free(Sout), free(logit), free(Slogit);
    free(dx), free(Sdx), free(dw), free(Sdw), free(dwnb), free(db), free(Sdb);
}

/* No product (IC == 0): out is the bias, or zeros, exactly. */
static void test_bf16_linear_empty(const loom_backend *be, int N, int OC) {
    float *b = hrand(OC, -1, 1, 0);
    double *ref = dzeros((size_t)N * OC), *zero = dzeros((size_t)N * OC);
    for (size_t i = 0; i < (size_t)N * OC; i++) ref[i] = b[i % OC];
    SCOPE {
        float *dB = up(b, OC, 0), *dO = poisoned((size_t)N * OC, 0);
        float *dO2 = poisoned((size_t)N * OC, 0), *dX = poisoned(1, 0), *dW = poisoned(1, 0);
        settle();
        loom_backend_linear_forward(be, dO, dX, dW, dB, N, 0, OC);
        loom_backend_linear_forward_bf16(be, dO2, NULL, NULL, NULL, N, 0, OC);
        loom_backend_synchronize(be);
        float *g;
        check("bf16 table: linear_forward IC=0 is the bias", g = down(dO, (size_t)N * OC, 0), ref,
              (size_t)N * OC, 0.0);
        free(g);
        check("bf16 table: linear_forward_bf16 IC=0 without bias is 0",
              g = down(dO2, (size_t)N * OC, 0), zero, (size_t)N * OC, 0.0);
        free(g);
    }
    free(b), free(ref), free(zero);
}

/* Cross-entropy over bf16 logits. Losses: fp32 from the same bf16 values (TOL32). dlogits
 * rounded to bf16: half an ulp, 2^-8 |ref|, plus the fp32 error of p = exp(x - m) s (a few
 * ulps of p <= dloss) and of p - dloss at the target: bound 2^-7 |ref| + 2^-20 dloss. */
static void test_bf16_crossentropy(const loom_backend *be, int N, int V) {
    const size_t n = (size_t)N * V;
    float *x = hrand(n, -8, 8, 0);
    for (size_t i = 0; i < n; i++) x[i] = loom_round(x[i]);
    int32_t *tgt = malloc((size_t)N * 4);
    for (int r = 0; r < N; r++) tgt[r] = randint(V);
    const float dloss = 1.0f / (float)N;
    double *loss = dzeros(N), *dl = dzeros(n);
    ref_crossentropy(x, tgt, N, V, dloss, loss, dl);
    SCOPE {
        void *dX = up(x, n, 1), *dX2 = up(x, n, 1), *dT = up_i32(tgt, N);
        float *dL = poisoned(N, 0), *dL2 = poisoned(N, 0);
        settle();
        loom_backend_crossentropy_forward_bf16(be, dL, dX, dT, N, V);
        loom_backend_crossentropy_forward_backward_bf16(be, dL2, dX2, dT, N, V, dloss);
        loom_backend_synchronize(be);
        float *g;
        check("bf16 table: crossentropy_forward_bf16", g = down(dL, N, 0), loss, N, TOL32);
        free(g);
        check("bf16 table: crossentropy_forward_backward_bf16 loss", g = down(dL2, N, 0), loss, N,
              TOL32);
        free(g);
        g = down(dX2, n, 1);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            const double bound = ldexp(fabs(dl[i]), -7) + ldexp((double)dloss, -20);
            if (!(fabs((double)g[i] - dl[i]) <= bound) && !bad++) first = i;
        }
        if (bad)
            fprintf(stderr,
                    "dlogits: %zu of %zu beyond the bound; element %zu got %.9g want %.9g\n", bad,
                    n, first, (double)g[first], dl[first]);
        check_true("bf16 table: crossentropy dlogits in bf16 within half an ulp", bad == 0);
        free(g);
    }
    free(x), free(tgt), free(loss), free(dl);
}

static double gelu64(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double gelu64_grad(double x) {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
static double silu64(double g) {
    return g / (1.0 + exp(-g));
}
static size_t bit_diffs(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += bits_of_f32(a[i]) != bits_of_f32(b[i]);
    return d;
}

/* GELU and SwiGLU from a bf16 input: float64 within TOL32, and bit for bit the fp32
 * kernels on the widened input (the contract of kernels.h's _bf16 variants). */
static void test_bf16_activations(const loom_backend *be, size_t n, int N, int F) {
    float *x = hrand(n, -4, 4, 0), *dy = hrand(n, -1, 1, 0), *dx0 = hrand(n, -1, 1, 0);
    for (size_t i = 0; i < n; i++) x[i] = loom_round(x[i]);
    double *fw = dzeros(n), *bw = dzeros(n), *bw0 = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        fw[i] = gelu64(x[i]);
        bw[i] = dx0[i] + gelu64_grad(x[i]) * dy[i];
        bw0[i] = gelu64_grad(x[i]) * dy[i];
    }
    const size_t ns = (size_t)N * F;
    float *s = hrand(2 * ns, -4, 4, 0), *sdy = hrand(ns, -1, 1, 0), *sdx0 = hrand(2 * ns, -1, 1, 0);
    for (size_t i = 0; i < 2 * ns; i++) s[i] = loom_round(s[i]);
    double *sfw = dzeros(ns), *sbw = dzeros(2 * ns);
    for (int r = 0; r < N; r++)
        for (int f = 0; f < F; f++) {
            const size_t gi = (size_t)r * 2 * F + f, ui = gi + F, o = (size_t)r * F + f;
            const double g = s[gi], u = s[ui], sig = 1.0 / (1.0 + exp(-g));
            sfw[o] = silu64(g) * u;
            sbw[gi] = sdx0[gi] + sdy[o] * u * sig * (1.0 + g * (1.0 - sig));
            sbw[ui] = sdx0[ui] + sdy[o] * silu64(g);
        }
    SCOPE {
        void *dX16 = up(x, n, 1);
        float *dX = up(x, n, 0), *dDy = up(dy, n, 0), *dOut = poisoned(n, 0),
              *dRef = poisoned(n, 0);
        float *dDx = up(dx0, n, 0), *dDxRef = up(dx0, n, 0), *dIn = up(dy, n, 0);
        float *dZero = poisoned(n, 0);
        settle();
        loom_backend_gelu_forward_in_bf16(be, dOut, dX16, n);
        loom_backend_gelu_backward_in_bf16(be, dDx, dX16, dDy, n);
        loom_backend_memset(be, dZero, 0, n * 4);
        loom_backend_gelu_backward_in_bf16(be, dZero, dX16, dDy, n);
        loom_backend_gelu_backward_in_bf16_inplace(be, dIn, dX16, n);
        loom_backend_synchronize(be);
        loom_cuda_gelu_forward(dRef, dX, n, g_s); /* the fp32 kernels on the widened input */
        loom_cuda_gelu_backward(dDxRef, dX, dDy, n, g_s);
        float *g = down(dOut, n, 0), *gr = down(dRef, n, 0);
        check("bf16 table: gelu_forward_in_bf16", g, fw, n, TOL32);
        check_true("bf16 table: gelu_forward_in_bf16 bitwise the fp32 kernel",
                   !bit_diffs(g, gr, n));
        free(g), free(gr);
        g = down(dDx, n, 0), gr = down(dDxRef, n, 0);
        check("bf16 table: gelu_backward_in_bf16 (+=)", g, bw, n, TOL32);
        check_true("bf16 table: gelu_backward_in_bf16 bitwise the fp32 kernel",
                   !bit_diffs(g, gr, n));
        free(g), free(gr);
        g = down(dIn, n, 0), gr = down(dZero, n, 0);
        check("bf16 table: gelu_backward_in_bf16_inplace", g, bw0, n, TOL32);
        check_true("bf16 table: gelu_backward_in_bf16_inplace bitwise into zeros",
                   !bit_diffs(g, gr, n));
        free(g), free(gr);

        void *dS16 = up(s, 2 * ns, 1);
        float *dS = up(s, 2 * ns, 0), *dSdy = up(sdy, ns, 0), *dSo = poisoned(ns, 0);
        float *dSoRef = poisoned(ns, 0), *dSdx = up(sdx0, 2 * ns, 0),
              *dSdxRef = up(sdx0, 2 * ns, 0);
        settle();
        loom_backend_swiglu_forward_in_bf16(be, dSo, dS16, N, F);
        loom_backend_swiglu_backward_in_bf16(be, dSdx, dSdy, dS16, N, F);
        loom_backend_synchronize(be);
        loom_cuda_swiglu_forward(dSoRef, dS, N, F, g_s);
        loom_cuda_swiglu_backward(dSdxRef, dSdy, dS, N, F, g_s);
        g = down(dSo, ns, 0), gr = down(dSoRef, ns, 0);
        check("bf16 table: swiglu_forward_in_bf16", g, sfw, ns, TOL32);
        check_true("bf16 table: swiglu_forward_in_bf16 bitwise the fp32 kernel",
                   !bit_diffs(g, gr, ns));
        free(g), free(gr);
        g = down(dSdx, 2 * ns, 0), gr = down(dSdxRef, 2 * ns, 0);
        check("bf16 table: swiglu_backward_in_bf16 (+=)", g, sbw, 2 * ns, TOL32);
        check_true("bf16 table: swiglu_backward_in_bf16 bitwise the fp32 kernel",
                   !bit_diffs(g, gr, 2 * ns));
        free(g), free(gr);
    }
    free(x), free(dy), free(dx0), free(fw), free(bw), free(bw0);
    free(s), free(sdy), free(sdx0), free(sfw), free(sbw);
}

static void test_bf16_table(void) {
    loom_backend *cu = NULL, *cu16 = NULL;
    loom_error err = {0};
    if (loom_backend_cuda_create(&cu, 0, &err) != LOOM_OK) fatal("cuda backend", &err);
    if (loom_backend_cuda_bf16_create(&cu16, 0, &err) != LOOM_OK) fatal("cuda bf16 backend", &err);
    check_true("bf16 table: the fp32 table keeps every tensor fp32",
               loom_backend_precision(cu) == LOOM_PRECISION_FP32 &&
                   !loom_backend_bf16_activations(cu) && !loom_backend_bf16_logits(cu) &&
                   !loom_backend_bf16_pre_activations(cu));
    check_true("bf16 table: precision bf16, activations, logits, pre-activations in bf16; "
               "attention's shared scratch not (fp32 fallback)",
               loom_backend_precision(cu16) == LOOM_PRECISION_BF16 &&
                   loom_backend_bf16_activations(cu16) && loom_backend_bf16_logits(cu16) &&
                   loom_backend_bf16_pre_activations(cu16) &&
                   !loom_backend_bf16_shared_scratch(cu16));
    /* the scratch sized before the calls: no growth in them */
    const int shapes[][3] = {{37, 53, 29}, {130, 257, 67}, {5, 768, 2304}, {64, 96, 1000}};
    for (int i = 0; i < 4; i++) {
        const int N = shapes[i][0], IC = shapes[i][1], OC = shapes[i][2];
        if (loom_backend_linear_prepare(cu16, N, IC, OC, &err) ||
            loom_backend_linear_prepare_out_bf16(cu16, N, IC, OC, &err))
            fatal("linear_prepare", &err);
    }
    test_bf16_rounding(cu16, 1 << 20);
    test_bf16_linear(cu16, 37, 53, 29, 1);
    test_bf16_linear(cu16, 130, 257, 67, 0);
    test_bf16_linear(cu16, 5, 768, 2304, 1); /* GPT-2 qkv shape, few rows */
    test_bf16_linear(cu16, 64, 96, 1000, 0); /* a head: wide output */
    test_bf16_linear_empty(cu16, 3, 7);
    char line[256];
    loom_backend_cuda_bf16_describe(cu16, line, sizeof line);
    printf("bf16 table: %s\n", line);
    check_true("bf16 table: prepared scratch never grown in a call", strstr(line, "grown 0 ") != 0);
    test_bf16_linear(cu16, 1500, 1200, 300, 1); /* unprepared, larger: grows in the call */
    loom_backend_cuda_bf16_describe(cu16, line, sizeof line);
    printf("bf16 table: %s\n", line);
    check_true("bf16 table: an unprepared larger shape grew the scratch",
               strstr(line, "grown 0 ") == NULL);
    test_bf16_crossentropy(cu16, 13, 997);
    test_bf16_crossentropy(cu16, 3, 50257);
    test_bf16_activations(cu16, 100003, 13, 171);
    loom_error e2 = {0};
    const loom_status st = loom_backend_status(cu16, &e2);
    if (st) fprintf(stderr, "bf16 table status: %s\n", e2.msg);
    check_true("bf16 table: no sticky error", st == LOOM_OK);
    loom_backend_cuda_destroy(cu16);
    loom_backend_cuda_destroy(cu);
}

/* ------------------------------------------------------------------ main */

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    g_rng = g_seed;
    printf("test_cuda_kernels: seed %llu (LOOM_TEST_SEED)\n", (unsigned long long)g_seed);
    loom_cuda_device dev[16];
    int ndev = 0;
    loom_error err = {0};
    if (loom_cuda_devices(dev, 16, &ndev, &err) != LOOM_OK) {
        printf("SKIP: %s\n", err.msg);
        return 77;
    }
    printf("device 0: %s (compute capability %d.%d)\n", dev[0].name, dev[0].cc_major,
           dev[0].cc_minor);
    if (loom_cuda_ctx_create(&g_ctx, 0, &err) != LOOM_OK) fatal("context", &err);
    g_s = g_ctx.stream;
    if (loom_cuda_arena_create(&g_arena, (size_t)512 << 20, &err) != LOOM_OK) fatal("arena", &err);

    for (int bf = 0; bf <= 1; bf++) {
        test_linear(37, 53, 29, 1, bf);
        test_linear(130, 257, 67, 0, bf);
        test_linear(5, 768, 2304, 1, bf); /* GPT-2 qkv shape, few rows */
        test_embedding(3, 7, 37, 11, 0, 11, 1, bf);
        test_embedding(2, 9, 70, 13, 4, 5, 0, bf); /* vocabulary shard [4, 9) of 13 */
        test_norm(0, 29, 77, bf);
        test_norm(0, 8, 1031, bf);
        test_norm(1, 29, 77, bf);
        test_norm(1, 11, 2049, bf);
        test_gelu_add(100003, bf);
        test_swiglu(13, 171, bf);
        test_rope(2, 19, 4, 2, 24, 0, bf);
        test_rope(1, 7, 2, 1, 64, 100, bf);
        test_attention(2, 37, 4, 2, 24, bf);  /* GQA, odd T, hd not a multiple of 32 */
        test_attention(1, 70, 3, 3, 64, bf);  /* MHA, several key tiles */
        test_attention(1, 45, 2, 1, 256, bf); /* largest head size: shared-memory opt-in */
        test_attention(2, 33, 2, 1, 7, bf);   /* tiny odd head size */
        if (!bf)
            for (int causal = 0; causal < 2; causal++) {
                test_attention_gemm(2, 37, 4, 2, 24, causal); /* GQA, odd T */
                test_attention_gemm(1, 70, 3, 3, 64, causal); /* MHA */
                test_attention_gemm(2, 29, 8, 2, 16, causal); /* rep 4: sums over a group */
                test_attention_gemm(1, 45, 2, 1, 256, causal);
                test_attention_gemm(2, 33, 2, 1, 7, causal);
                test_attention_gemm(1, 131, 4, 1, 32, causal); /* 4 uneven query blocks */
            }
        test_crossentropy(13, 997, bf);
        test_crossentropy(3, 50257, bf); /* GPT-2 vocabulary */
    }
    test_adamw(100003);
    test_clip_and_convert(1000003);
    test_arena();
#ifdef LOOM_TEST_CPU_KERNELS
    test_backend_table();
#endif
    test_bf16_table();

    char line[256];
    loom_cuda_arena_report(&g_arena, line, sizeof line);
    printf("%s\n", line);
    loom_cuda_arena_destroy(&g_arena);
    loom_cuda_ctx_destroy(&g_ctx);
    printf("%ld passed, %ld failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
