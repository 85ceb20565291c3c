/* Context-parallel attention (src/cp/cp.h) under MPI: every rank builds the same random
 * global qkv and dout from one seed, takes its local rows with loom_cp_position /
 * loom_cp_local_row, runs loom_cp_attention_forward/backward (ring with the zigzag and
 * the contiguous split, Ulysses with and without key/value head replication, causal and
 * bidirectional, GQA) and compares with the whole-sequence loom_attention_forward /
 * backward on the global arrays: |got - ref| <= 1e-5 |ref| + 1e-6 max|ref| per element.
 * The same layout run twice must be bitwise equal, backward must add to dqkv, and
 * loom_cp_validate / loom_cp_create must refuse bad layouts naming the flags. With
 * bf16_qkv (qkv of bf16 values, --precision bf16) the bf16 messages give bitwise the fp32
 * wire's results in half their bytes (test_bf16_wire).
 *
 *   mpirun -n R test_cp_attention      (R = 2, 3, 4; also 1 without mpirun)
 *
 * The seed comes from LOOM_TEST_SEED, else from the clock; rank 0 broadcasts it. The last
 * line (rank 0) is "N passed, F failed"; the exit status is 0 only when every rank passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "cp/cp.h"
#include "kernels/bf16.h"
#include "kernels/kernels.h"
#include "comm_check.h"

typedef struct {
    loom_cp_mode mode;
    int causal, no_zigzag, B, T, H, KV, hd;
} cp_case;

static const char *case_name(const cp_case *c, char *buf, size_t n) {
    snprintf(buf, n, "%s %s%s B=%d T=%d H=%d KV=%d hd=%d", loom_cp_mode_name(c->mode),
             c->causal ? "causal" : "bidir", c->no_zigzag ? " contiguous" : "", c->B, c->T, c->H,
             c->KV, c->hd);
    return buf;
}

/* Elementwise |got - ref| <= 1e-5 |ref| + 1e-6 max|ref|; returns the number of misses and
 * the worst relative error (normwise: max |got - ref| / max |ref|). */
static size_t compare(const float *got, const float *ref, size_t n, double *worst) {
    double mx = 0, err = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)ref[i]));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= 1e-5 * fabs((double)ref[i]) + 1e-6 * mx)) bad++;
        err = fmax(err, d);
    }
    *worst = mx > 0 ? err / mx : err;
    return bad;
}

static void run_case(loom_comm *world, const cp_case *c, uint64_t tag) {
    char name[128];
    case_name(c, name, sizeof name);
    const int R = (c->H + 2 * c->KV) * c->hd, OC = c->H * c->hd, T = c->T, B = c->B;
    const size_t nqkv = (size_t)B * T * R, nout = (size_t)B * T * OC;
    float *qkv = xmalloc(nqkv * sizeof(float)), *dout = xmalloc(nout * sizeof(float));
    for (size_t i = 0; i < nqkv; i++) qkv[i] = 1.5f * rnd(0, tag, i);
    fill(dout, nout, 0, tag + 1);
    /* the whole-sequence reference */
    float *rout = xmalloc(nout * sizeof(float)), *rlse = xmalloc((size_t)B * c->H * T * 4);
    float *rdqkv = calloc(nqkv, sizeof(float));
    float *scr = xmalloc(loom_attention_scratch_floats(T) * sizeof(float));
    if (c->causal) {
        loom_attention_forward(rout, rlse, qkv, scr, B, T, c->H, c->KV, c->hd);
        loom_attention_backward(rdqkv, scr, dout, qkv, rout, rlse, B, T, c->H, c->KV, c->hd);
    } else {
        loom_attention_bidir_forward(rout, rlse, qkv, scr, B, T, c->H, c->KV, c->hd);
        loom_attention_bidir_backward(rdqkv, scr, dout, qkv, rout, rlse, B, T, c->H, c->KV, c->hd);
    }
    free(scr);

    loom_cp cp;
    loom_cp_options o = {c->mode, c->causal, c->no_zigzag, B, T, c->H, c->KV, c->hd, 0, 0};
    loom_error err = {0};
    OK(loom_cp_create(&cp, world, &o, loom_backend_cpu(), &err_));
    cp.err = &err;
    const int Tl = cp.Tl;
    const size_t Nl = (size_t)B * Tl, nlse = (size_t)B * c->H * Tl;
    CHECK(Tl == T / world->size && cp.n_chunks * cp.chunk == Tl, "%s: Tl %d n_chunks %d chunk %d",
          name, Tl, cp.n_chunks, cp.chunk);
    CHECK(cp.n_chunks == (c->mode == LOOM_CP_RING && c->causal && !c->no_zigzag ? 2 : 1),
          "%s: %d chunks", name, cp.n_chunks);
    /* positions: every global token exactly once over the ranks; local rows a bijection */
    int *pos = xmalloc(sizeof(int) * Tl), *allpos = xmalloc(sizeof(int) * T);
    for (int t = 0; t < Tl; t++) pos[t] = loom_cp_position(&cp, t);
    if (g_mpi)
        MPI_Allgather(pos, Tl, MPI_INT, allpos, Tl, MPI_INT, MPI_COMM_WORLD);
    else
        memcpy(allpos, pos, sizeof(int) * Tl);
    char *seen = calloc((size_t)T, 1), *rows = calloc(Nl, 1);
    int perm_ok = 1;
    for (int t = 0; t < T; t++) {
        if (allpos[t] < 0 || allpos[t] >= T || seen[allpos[t]])
            perm_ok = 0;
        else
            seen[allpos[t]] = 1;
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++) {
            int row = loom_cp_local_row(&cp, b, t);
            if (row < 0 || (size_t)row >= Nl || rows[row])
                perm_ok = 0;
            else
                rows[row] = 1;
        }
    CHECK(perm_ok, "%s: positions / local rows are not a permutation", name);
    free(seen), free(rows), free(allpos);

    float *lqkv = xmalloc(Nl * R * 4), *ldout = xmalloc(Nl * OC * 4);
    float *refo = xmalloc(Nl * OC * 4), *refd = xmalloc(Nl * R * 4);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++) {
            size_t row = (size_t)loom_cp_local_row(&cp, b, t), g = (size_t)b * T + pos[t];
            memcpy(lqkv + row * R, qkv + g * R, sizeof(float) * R);
            memcpy(ldout + row * OC, dout + g * OC, sizeof(float) * OC);
            memcpy(refo + row * OC, rout + g * OC, sizeof(float) * OC);
            memcpy(refd + row * R, rdqkv + g * R, sizeof(float) * R);
        }
    float *out = xmalloc(Nl * OC * 4), *lse = xmalloc(nlse * 4), *dqkv = calloc(Nl * R, 4);
    for (size_t i = 0; i < Nl * OC; i++) out[i] = NAN;
    for (size_t i = 0; i < nlse; i++) lse[i] = NAN;
    OK(loom_cp_attention_forward(&cp, out, lse, lqkv));
    OK(loom_cp_attention_backward(&cp, dqkv, ldout, lqkv, out, lse));
    double w_out, w_dq;
    size_t bad_out = compare(out, refo, Nl * OC, &w_out);
    size_t bad_dq = compare(dqkv, refd, Nl * R, &w_dq);
    CHECK(bad_out == 0,
          "%s: out %zu/%zu outside tolerance (max err / max |ref| %.3g); "
          "LOOM_TEST_SEED=%llu",
          name, bad_out, Nl * OC, w_out, (unsigned long long)g_seed);
    CHECK(bad_dq == 0,
          "%s: dqkv %zu/%zu outside tolerance (max err / max |ref| %.3g); "
          "LOOM_TEST_SEED=%llu",
          name, bad_dq, Nl * R, w_dq, (unsigned long long)g_seed);
    CHECK(cp.compute_ms > 0, "%s: compute_ms %g", name, cp.compute_ms);
    if (g_rank == 0)
        printf("  %-52s out %.2e dqkv %.2e (max err / max |ref|, rank 0)\n", name, w_out, w_dq);

    /* the same layout again: bitwise the same; backward adds (+=) to what dqkv holds */
    float *out2 = xmalloc(Nl * OC * 4), *lse2 = xmalloc(nlse * 4), *dq2 = xmalloc(Nl * R * 4);
    for (size_t i = 0; i < Nl * R; i++) dq2[i] = rnd(g_rank, tag + 2, i);
    float *base = xmalloc(Nl * R * 4);
    memcpy(base, dq2, Nl * R * 4);
    double c0 = cp.compute_ms;
    OK(loom_cp_attention_forward(&cp, out2, lse2, lqkv));
    CHECK(memcmp(out, out2, Nl * OC * 4) == 0 && memcmp(lse, lse2, nlse * 4) == 0,
          "%s: a second forward differs bitwise", name);
    float *dq3 = calloc(Nl * R, 4);
    OK(loom_cp_attention_backward(&cp, dq3, ldout, lqkv, out2, lse2));
    CHECK(memcmp(dqkv, dq3, Nl * R * 4) == 0, "%s: a second backward differs bitwise", name);
    OK(loom_cp_attention_backward(&cp, dq2, ldout, lqkv, out2, lse2));
    /* The tolerance's scale is the tensor's largest gradient, not this element's: a
     * key/value element sums many heads' and ring steps' partial products in fp32 (in
     * another order than base + dqkv), and those can be larger than their sum (seed
     * 33977016187: 4.1e-9 off at |base| + |dqkv| = 4.0e-3). Overwriting instead of adding
     * would be off by |base|, uniform in [-1, 1). */
    double dq_max = 0;
    for (size_t i = 0; i < Nl * R; i++) dq_max = fmax(dq_max, fabs(dqkv[i]));
    size_t bad_acc = 0;
    for (size_t i = 0; i < Nl * R; i++) {
        double want = (double)base[i] + dqkv[i];
        if (!(fabs(dq2[i] - want) <= 1e-6 * (fabs(base[i]) + dq_max) + 1e-12)) bad_acc++;
    }
    CHECK(bad_acc == 0, "%s: backward does not add to dqkv (%zu elements)", name, bad_acc);
    CHECK(cp.compute_ms > c0, "%s: compute_ms did not grow (%g -> %g)", name, c0, cp.compute_ms);
    free(out2), free(lse2), free(dq2), free(dq3), free(base);

    loom_cp_free(&cp);
    free(pos), free(qkv), free(dout), free(rout), free(rlse), free(rdqkv), free(lqkv);
    free(ldout), free(refo), free(refd), free(out), free(lse), free(dqkv);
}

/* bf16_qkv on qkv rounded to bf16 values (what the language models pass under --precision
 * bf16, then rounding the output to bf16 values as they do): bitwise the fp32 wire's out
 * (ring: before rounding too), lse and dqkv. What travels as bf16 is exactly half its fp32
 * bytes: the ring's key/value blocks (2 (N-1) of them; dK/dV's N stay fp32), Ulysses' qkv and
 * output exchanges (forward and backward). With bf16_grads too (d(out) of bf16 values, dqkv
 * rounded after, as the language models' blocks do) also Ulysses' d(out) and dqkv (no key/
 * value head replicated here): its rounded dqkv bitwise the fp32 wire's rounded, nothing
 * fp32 on its wire. */
static void test_bf16_wire(loom_comm *world, loom_cp_mode mode, uint64_t tag) {
    const int N = world->size, B = 2, T = 16 * N, H = 2 * N, KV = N, hd = 8;
    const int R = (H + 2 * KV) * hd, OC = H * hd;
    const char *name = loom_cp_mode_name(mode);
    loom_cp cp[3]; /* the fp32 wire, bf16_qkv, bf16_qkv + bf16_grads */
    float *res[3][3];
    loom_error err = {0};
    for (int w = 0; w < 3; w++) {
        loom_cp_options o = {mode, 1, 0, B, T, H, KV, hd, w > 0, w > 1};
        OK(loom_cp_create(&cp[w], world, &o, loom_backend_cpu(), &err_));
        cp[w].err = &err;
    }
    const size_t Nl = (size_t)B * cp[0].Tl, nlse = (size_t)B * H * cp[0].Tl;
    float *qkv = xmalloc(Nl * R * 4), *dout = xmalloc(Nl * OC * 4);
    for (size_t i = 0; i < Nl * R; i++) /* this rank's rows, rounded to bf16 values */
        qkv[i] = loom_bf16_to_f32(loom_bf16_from_f32(1.5f * rnd(g_rank, tag, i)));
    fill(dout, Nl * OC, g_rank, tag + 1);
    for (size_t i = 0; i < Nl * OC; i++) dout[i] = loom_bf16_to_f32(loom_bf16_from_f32(dout[i]));
    for (int w = 0; w < 3; w++) {
        res[w][0] = xmalloc(Nl * OC * 4), res[w][1] = xmalloc(nlse * 4);
        res[w][2] = calloc(Nl * R, 4);
        OK(loom_cp_attention_forward(&cp[w], res[w][0], res[w][1], qkv));
    }
    if (mode == LOOM_CP_RING)
        CHECK(memcmp(res[0][0], res[1][0], Nl * OC * 4) == 0,
              "ring bf16 wire: out differs bitwise before rounding; LOOM_TEST_SEED=%llu",
              (unsigned long long)g_seed);
    for (int w = 0; w < 3; w++) { /* the model rounds the output, then runs backward */
        for (size_t i = 0; i < Nl * OC; i++)
            res[w][0][i] = loom_bf16_to_f32(loom_bf16_from_f32(res[w][0][i]));
        OK(loom_cp_attention_backward(&cp[w], res[w][2], dout, qkv, res[w][0], res[w][1]));
    }
    CHECK(memcmp(res[0][0], res[1][0], Nl * OC * 4) == 0 &&
              memcmp(res[0][1], res[1][1], nlse * 4) == 0 &&
              memcmp(res[0][2], res[1][2], Nl * R * 4) == 0,
          "%s bf16 wire: out, lse or dqkv differ bitwise from the fp32 wire; LOOM_TEST_SEED=%llu",
          name, (unsigned long long)g_seed);
    CHECK(cp[0].bytes_bf16 == 0 && cp[1].bytes_bf16 * 2 + cp[1].bytes_f32 == cp[0].bytes_f32 &&
              (N == 1 || cp[1].bytes_bf16 > 0),
          "%s bf16 wire: %g bytes bf16 + %g fp32 against the fp32 wire's %g", name,
          cp[1].bytes_bf16, cp[1].bytes_f32, cp[0].bytes_f32);
    /* bf16_grads: the model rounds dqkv next; then the fp32 wire's and this one's agree */
    size_t bad = 0;
    for (size_t i = 0; i < Nl * R; i++)
        bad += loom_bf16_from_f32(res[0][2][i]) != loom_bf16_from_f32(res[2][2][i]);
    CHECK(memcmp(res[0][0], res[2][0], Nl * OC * 4) == 0 && bad == 0 &&
              cp[2].bytes_bf16 * 2 + cp[2].bytes_f32 == cp[0].bytes_f32 &&
              (mode == LOOM_CP_RING ? cp[2].bytes_f32 == cp[1].bytes_f32 : cp[2].bytes_f32 == 0),
          "%s bf16 gradients: out or rounded dqkv differ from the fp32 wire's (%zu elements), "
          "or %g bytes bf16 + %g fp32 against %g; LOOM_TEST_SEED=%llu",
          name, bad, cp[2].bytes_bf16, cp[2].bytes_f32, cp[0].bytes_f32,
          (unsigned long long)g_seed);
    const double block = (double)Nl * 2 * KV * hd; /* elements of one key/value block */
    if (mode == LOOM_CP_RING)
        CHECK(cp[1].bytes_bf16 == 2.0 * (N - 1) * block * 2 &&
                  cp[1].bytes_f32 == (N > 1 ? N : 0) * block * 4,
              "ring bf16 wire: %g bytes bf16 (want %g), %g fp32", cp[1].bytes_bf16,
              2.0 * (N - 1) * block * 2, cp[1].bytes_f32);
    loom_cp_options o = cp[0].o;
    const size_t b32 = loom_cp_buffer_bytes(N, &o);
    o.bf16_qkv = 1;
    const size_t extra = mode == LOOM_CP_RING ? (size_t)block * 4 /* two bf16 blocks */
                                              : (size_t)B * T * (H / N + 2 * (KV / N)) * hd * 4;
    CHECK(loom_cp_buffer_bytes(N, &o) == b32 + extra, "%s bf16 wire: buffer bytes %zu, fp32 %zu",
          name, loom_cp_buffer_bytes(N, &o), b32);
    if (g_rank == 0)
        printf("  %-7s bf16 wire: bitwise the fp32 wire; rank 0 sent %g bytes (%g bf16), fp32 "
               "wire %g\n",
               name, cp[1].bytes_bf16 + cp[1].bytes_f32, cp[1].bytes_bf16, cp[0].bytes_f32);
    for (int w = 0; w < 3; w++) {
        loom_cp_free(&cp[w]);
        for (int k = 0; k < 3; k++) free(res[w][k]);
    }
    free(qkv), free(dout);
}

static void expect_refusal(loom_status st, const loom_error *e, const char *what, const char *need1,
                           const char *need2) {
    CHECK(st == LOOM_ERR_INPUT, "%s: status %d, expected LOOM_ERR_INPUT", what, (int)st);
    CHECK(strstr(e->msg, need1) && (!need2 || strstr(e->msg, need2)),
          "%s: message '%s' should name %s%s%s", what, e->msg, need1, need2 ? " and " : "",
          need2 ? need2 : "");
}

static void test_refusals(loom_comm *world) {
    loom_error e = {0};
    expect_refusal(loom_cp_validate(2, LOOM_CP_RING, 1, 6, 4, 2, &e), &e, "ring zigzag T=6 cp=2",
                   "zigzag needs --seq-len divisible by 2 x --cp", NULL);
    expect_refusal(loom_cp_validate(3, LOOM_CP_RING, 0, 10, 4, 2, &e), &e, "T=10 cp=3", "--seq-len",
                   "--cp");
    expect_refusal(loom_cp_validate(4, LOOM_CP_ULYSSES, 1, 10, 4, 2, &e), &e, "ulysses T=10 cp=4",
                   "--seq-len 10", "--cp 4");
    expect_refusal(loom_cp_validate(2, LOOM_CP_ULYSSES, 1, 8, 3, 1, &e), &e, "ulysses H=3 cp=2",
                   "--n-head", "--tp");
    expect_refusal(loom_cp_validate(4, LOOM_CP_ULYSSES, 0, 8, 4, 3, &e), &e, "ulysses KV=3 cp=4",
                   "--n-kv-head", "--tp");
    expect_refusal(loom_cp_validate(4, LOOM_CP_ULYSSES, 0, 8, 8, 6, &e), &e, "ulysses KV=6 cp=4",
                   "--n-kv-head", "--cp");
    expect_refusal(loom_cp_validate(0, LOOM_CP_RING, 1, 8, 4, 2, &e), &e, "cp=0", "--cp", NULL);
    CHECK(loom_cp_validate(4, LOOM_CP_ULYSSES, 1, 8, 8, 2, &e) == LOOM_OK, "ulysses KV=2 cp=4: %s",
          e.msg);
    CHECK(loom_cp_validate(2, LOOM_CP_ULYSSES, 1, 6, 4, 4, &e) == LOOM_OK, "ulysses T=6 cp=2: %s",
          e.msg);
    CHECK(loom_cp_validate(2, LOOM_CP_RING, 0, 6, 4, 2, &e) == LOOM_OK, "bidir ring T=6 cp=2: %s",
          e.msg);
    loom_cp_mode m = LOOM_CP_ULYSSES;
    CHECK(loom_cp_mode_parse("ring", &m, &e) == LOOM_OK && m == LOOM_CP_RING, "parse ring");
    CHECK(loom_cp_mode_parse("ulysses", &m, &e) == LOOM_OK && m == LOOM_CP_ULYSSES,
          "parse ulysses");
    expect_refusal(loom_cp_mode_parse("zigzag", &m, &e), &e, "parse zigzag", "--cp-mode",
                   "ring or ulysses");
    CHECK(strcmp(loom_cp_mode_name(LOOM_CP_RING), "ring") == 0 &&
              strcmp(loom_cp_mode_name(LOOM_CP_ULYSSES), "ulysses") == 0,
          "mode names");
    /* a backend without the block kernels (the CUDA one today) is refused at create */
    loom_backend_ops ops = *loom_backend_cpu()->ops;
    ops.attention_block_forward = NULL;
    ops.copy_2d = NULL;
    loom_backend fake = {&ops, NULL, LOOM_DEVICE_CUDA, "cuda:0", 64};
    loom_cp cp;
    loom_cp_options o = {LOOM_CP_RING,    1,           0, 1, 8 * world->size,
                         2 * world->size, world->size, 8, 0, 0};
    loom_status st = loom_cp_create(&cp, world, &o, &fake, &e);
    CHECK(st == LOOM_ERR_INPUT &&
              strcmp(e.msg, "--cp with --device cuda: ring attention has no CUDA kernels yet") == 0,
          "create on a backend without block kernels: %d '%s'", (int)st, e.msg);
    o.mode = LOOM_CP_ULYSSES;
    st = loom_cp_create(&cp, world, &o, &fake, &e);
    CHECK(st == LOOM_ERR_INPUT && strstr(e.msg, "--device cuda"), "ulysses on fake cuda: '%s'",
          e.msg);
    /* the memory report's number is what create allocates (positive, grows with T) */
    o.mode = LOOM_CP_RING;
    size_t b1 = loom_cp_buffer_bytes(world->size, &o);
    o.T *= 2;
    CHECK(b1 > 0 && loom_cp_buffer_bytes(world->size, &o) > b1, "buffer bytes %zu", b1);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    loom_world w;
    {
        loom_error err = {0};
        if (loom_world_init(&w, &argc, &argv, &err) != LOOM_OK) {
            fprintf(stderr, "FAIL: loom_world_init: %s\n", err.msg);
            return 1;
        }
    }
    g_rank = w.rank, g_size = w.size, g_mpi = w.mpi;
    loom_comm world;
    if (w.mpi)
        OK(loom_comm_from_mpi(&world, MPI_COMM_WORLD, "cp", &err_));
    else
        loom_comm_self(&world, "cp");
    uint64_t seed = 0;
    if (w.rank == 0) {
        const char *env = getenv("LOOM_TEST_SEED");
        seed = env && *env ? strtoull(env, NULL, 0)
                           : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    }
    OK(loom_comm_bcast(&world, &seed, sizeof seed, 0, &err_));
    g_seed = seed;
    if (w.rank == 0)
        printf("test_cp_attention: seed %llu (LOOM_TEST_SEED=%llu to repeat), %d rank(s)\n",
               (unsigned long long)seed, (unsigned long long)seed, w.size);

    /* Ulysses needs H % N == 0 and KV a multiple or divisor of N: heads scale with N. */
    const int N = w.size, K2 = N / 2 > 0 ? N / 2 : 1;
    cp_case cases[16];
    int n = 0;
    cases[n++] = (cp_case){LOOM_CP_RING, 1, 0, 2, 16 * N, 4, 2, 8};
    cases[n++] = (cp_case){LOOM_CP_RING, 1, 1, 2, 16 * N, 4, 2, 8};
    cases[n++] = (cp_case){LOOM_CP_RING, 0, 0, 2, 12 * N, 4, 2, 8};
    cases[n++] = (cp_case){LOOM_CP_RING, 1, 0, 1, 2 * 37 * N, 4, 4, 16};
    cases[n++] = (cp_case){LOOM_CP_RING, 1, 0, 1, 2 * 70 * N, 4, 1, 8}; /* chunk > 64 rows */
    cases[n++] = (cp_case){LOOM_CP_RING, 0, 0, 1, 70 * N, 8, 2, 8};
    if (4 % N == 0) cases[n++] = (cp_case){LOOM_CP_ULYSSES, 1, 0, 2, 16 * N, 4, 2, 8};
    cases[n++] = (cp_case){LOOM_CP_ULYSSES, 1, 0, 2, 16 * N, 2 * N, N, 8};
    cases[n++] = (cp_case){LOOM_CP_ULYSSES, 0, 0, 2, 12 * N, 2 * N, K2, 8}; /* N > 2: shared */
    cases[n++] = (cp_case){LOOM_CP_ULYSSES, 1, 0, 2, 10 * N, 2 * N, 1, 8};  /* one kv head */
    cases[n++] = (cp_case){LOOM_CP_ULYSSES, 0, 0, 1, 24 * N, 4 * N, 2 * N, 16};
    cases[n++] = (cp_case){LOOM_CP_ULYSSES, 1, 0, 1, 33 * N, 2 * N, 2 * N, 8};
    for (int i = 0; i < n; i++) run_case(&world, &cases[i], 10 * (uint64_t)i);
    test_refusals(&world);
    test_bf16_wire(&world, LOOM_CP_RING, 1000);
    test_bf16_wire(&world, LOOM_CP_ULYSSES, 1010);

    long tot[2] = {g_passed, g_failed};
    if (w.mpi) MPI_Allreduce(MPI_IN_PLACE, tot, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (w.rank == 0) printf("%ld passed, %ld failed\n", tot[0], tot[1]);
    loom_comm_free(&world);
    loom_world_finalize(&w);
    return tot[1] == 0 ? 0 : 1;
}
