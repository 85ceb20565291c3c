/* The CPU backend table (kernels/backend.h): its memory functions (arena alignment,
 * mark/release, memset, the three copies, streams and events) and ops through the table
 * against direct calls of the kernels on random inputs: bitwise equal, since the table
 * points at the same functions. The seed is printed; LOOM_TEST_SEED reruns one. */
#include "test_kernels_util.h"

#include <string.h>

#include "kernels/backend.h"
#include "kernels/kernels.h"

/* Bitwise equality of two float buffers; names the seed on failure. */
static void same(const char *what, const float *a, const float *b, size_t n) {
    if (memcmp(a, b, n * sizeof(float)) == 0) return;
    size_t i = 0;
    while (i < n && memcmp(a + i, b + i, sizeof(float)) == 0) i++;
    fprintf(stderr, "%s: table and kernel differ at [%zu]: %.9g vs %.9g; LOOM_TEST_SEED=%llu\n",
            what, i, (double)a[i], (double)b[i], (unsigned long long)tk_seed);
    fail();
}

static void test_identity(void **state) {
    (void)state;
    const loom_backend *be = loom_backend_cpu();
    assert_ptr_equal(be, loom_backend_cpu());
    assert_int_equal(be->device, LOOM_DEVICE_CPU);
    assert_string_equal(be->name, "cpu");
    assert_int_equal(be->align, 64);
    assert_int_equal(loom_backend_status(be, NULL), LOOM_OK);
}

static void test_arena(void **state) {
    (void)state;
    const loom_backend *be = loom_backend_cpu();
    loom_backend_arena a;
    loom_error err = {0};
    assert_int_equal(loom_backend_piece_bytes(be, 1), 64);
    assert_int_equal(loom_backend_piece_bytes(be, 64), 64);
    assert_int_equal(loom_backend_piece_bytes(be, 65), 128);
    assert_int_equal(loom_backend_arena_create(&a, be, 1000, "test", &err), LOOM_OK);
    assert_int_equal((uintptr_t)a.base % 64, 0);
    char *p = loom_backend_arena_alloc(&a, 10, "p", &err);
    char *q = loom_backend_arena_alloc(&a, 100, "q", &err);
    assert_non_null(p);
    assert_non_null(q);
    assert_int_equal((uintptr_t)q % 64, 0);
    assert_ptr_equal(q, p + 64); /* 10 bytes take one 64-byte piece */
    const size_t mark = loom_backend_arena_mark(&a);
    assert_int_equal(mark, 64 + 100);
    char *r = loom_backend_arena_alloc(&a, 500, "r", &err);
    assert_ptr_equal(r, p + 192);
    loom_backend_arena_release(&a, mark);
    assert_int_equal(loom_backend_arena_mark(&a), mark);
    assert_ptr_equal(loom_backend_arena_alloc(&a, 500, "r again", &err), r); /* reused */
    assert_int_equal(a.peak, 192 + 500);
    /* 1000 - 692 rounded to 704: 300 more do not fit */
    assert_null(loom_backend_arena_alloc(&a, 300, "too big", &err));
    assert_int_equal(err.code, LOOM_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "too big"));
    loom_backend_arena_release(&a, 0);
    assert_ptr_equal(loom_backend_arena_alloc(&a, 1000, "all", &err), a.base);
    loom_backend_arena_destroy(&a);
    assert_null(a.base);
}

static void test_memory(void **state) {
    (void)state;
    tk_reseed(1);
    const loom_backend *be = loom_backend_cpu();
    const size_t n = 1000;
    float *host = tk_rand(n, 1), *back = tk_alloc(n);
    float *d = loom_backend_alloc(be, n * sizeof(float));
    float *e = loom_backend_alloc(be, n * sizeof(float));
    assert_non_null(d);
    assert_non_null(e);
    assert_int_equal((uintptr_t)d % 64, 0);
    loom_backend_memset(be, d, 0, n * sizeof(float));
    for (size_t i = 0; i < n; i++) assert_true(d[i] == 0.0f);
    loom_backend_copy_to_device(be, d, host, n * sizeof(float));
    loom_backend_copy(be, e, d, n * sizeof(float));
    loom_backend_memset(be, d, 0, n * sizeof(float));
    loom_backend_copy_to_host(be, back, e, n * sizeof(float));
    loom_backend_synchronize(be);
    same("copies", back, host, n);
    loom_backend_free(be, d);
    loom_backend_free(be, e);
    loom_backend_free(be, NULL);
    free(host), free(back);
}

static void test_stream_event(void **state) {
    (void)state;
    const loom_backend *be = loom_backend_cpu();
    loom_backend_stream *s = NULL;
    loom_backend_event *ev = NULL;
    loom_error err = {0};
    assert_int_equal(loom_backend_stream_create(be, &s, &err), LOOM_OK);
    assert_int_equal(loom_backend_event_create(be, &ev, &err), LOOM_OK);
    assert_non_null(s);
    assert_non_null(ev);
    /* compute on the default stream, record, the second stream waits, then the host */
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i, y[i] = 1.0f;
    loom_backend_add(be, y, y, x, 64);
    loom_backend_event_record(be, ev, NULL);
    loom_backend_stream_wait_event(be, s, ev);
    loom_backend_event_synchronize(be, ev);
    for (int i = 0; i < 64; i++) assert_true(y[i] == (float)i + 1.0f); /* done at once */
    loom_backend_event_record(be, ev, s);
    loom_backend_event_destroy(be, ev);
    loom_backend_stream_destroy(be, s);
    assert_int_equal(loom_backend_status(be, &err), LOOM_OK);
}

static void test_ops_equal_kernels(void **state) {
    (void)state;
    tk_reseed(2);
    const loom_backend *be = loom_backend_cpu();
    const int N = 7 + tk_randint(20), IC = 5 + tk_randint(40), OC = 3 + tk_randint(30);
    float *x = tk_rand((size_t)N * IC, 1), *w = tk_rand((size_t)OC * IC, 1), *b = tk_rand(OC, 1);
    float *dy = tk_rand((size_t)N * OC, 1);
    /* linear forward and both backward halves (accumulating into the same start) */
    float *o1 = tk_alloc((size_t)N * OC), *o2 = tk_alloc((size_t)N * OC);
    loom_backend_linear_forward(be, o1, x, w, b, N, IC, OC);
    loom_linear_forward(o2, x, w, b, N, IC, OC);
    same("linear_forward", o1, o2, (size_t)N * OC);
    float *dx1 = tk_rand((size_t)N * IC, 1), *dx2 = tk_copy(dx1, (size_t)N * IC);
    loom_backend_linear_backward_input(be, dx1, dy, w, N, IC, OC);
    loom_linear_backward_input(dx2, dy, w, N, IC, OC);
    same("linear_backward_input", dx1, dx2, (size_t)N * IC);
    float *dw1 = tk_rand((size_t)OC * IC, 1), *dw2 = tk_copy(dw1, (size_t)OC * IC);
    float *db1 = tk_rand(OC, 1), *db2 = tk_copy(db1, OC);
    loom_backend_linear_backward_weight(be, dw1, db1, dy, x, N, IC, OC);
    loom_linear_backward_weight(dw2, db2, dy, x, N, IC, OC);
    same("linear_backward_weight", dw1, dw2, (size_t)OC * IC);
    same("linear_backward_weight bias", db1, db2, OC);
    /* RMSNorm forward, GELU, the sum of squares and scaling */
    float *r1 = tk_alloc((size_t)N * IC), *r2 = tk_alloc((size_t)N * IC);
    float *s1 = tk_alloc(N), *s2 = tk_alloc(N), *g = tk_rand(IC, 1);
    loom_backend_rmsnorm_forward(be, r1, s1, x, g, N, IC, 1e-5f);
    loom_rmsnorm_forward(r2, s2, x, g, N, IC, 1e-5f);
    same("rmsnorm_forward", r1, r2, (size_t)N * IC);
    same("rmsnorm_forward rstd", s1, s2, N);
    loom_backend_gelu_forward(be, r1, x, (size_t)N * IC);
    loom_gelu_forward(r2, x, (size_t)N * IC);
    same("gelu_forward", r1, r2, (size_t)N * IC);
    const double q1 = loom_backend_sum_squares(be, x, (size_t)N * IC);
    const double q2 = loom_sum_squares(x, (size_t)N * IC);
    assert_memory_equal(&q1, &q2, sizeof q1);
    loom_backend_scale(be, r1, 0.37f, (size_t)N * IC);
    loom_scale(r2, 0.37f, (size_t)N * IC);
    same("scale", r1, r2, (size_t)N * IC);
    /* cross-entropy with its backward (in place on the logits) */
    int32_t *t = malloc(sizeof(int32_t) * N);
    assert_non_null(t);
    for (int i = 0; i < N; i++) t[i] = tk_randint(OC);
    float *l1 = tk_alloc(N), *l2 = tk_alloc(N);
    float *z1 = tk_copy(o1, (size_t)N * OC), *z2 = tk_copy(o2, (size_t)N * OC);
    loom_backend_crossentropy_forward_backward(be, l1, z1, t, N, OC, 0.25f);
    loom_crossentropy_forward_backward(l2, z2, t, N, OC, 0.25f);
    same("crossentropy losses", l1, l2, N);
    same("crossentropy dlogits", z1, z2, (size_t)N * OC);
    /* the MoE router through the table */
    const int E = 2 + tk_randint(7), K = 1 + tk_randint(E);
    float *rl = tk_rand((size_t)N * E, 3);
    float *p1 = tk_alloc((size_t)N * E), *p2 = tk_alloc((size_t)N * E);
    float *w1 = tk_alloc((size_t)N * K), *w2 = tk_alloc((size_t)N * K);
    float *e1 = tk_alloc(N), *e2 = tk_alloc(N);
    int32_t *i1 = malloc(sizeof(int32_t) * N * K), *i2 = malloc(sizeof(int32_t) * N * K);
    assert_non_null(i1);
    assert_non_null(i2);
    loom_backend_moe_router_forward(be, p1, i1, w1, e1, rl, N, E, K);
    loom_moe_router_forward(p2, i2, w2, e2, rl, N, E, K);
    same("moe_router_forward probs", p1, p2, (size_t)N * E);
    same("moe_router_forward weights", w1, w2, (size_t)N * K);
    assert_memory_equal(i1, i2, sizeof(int32_t) * N * K);
    free(x), free(w), free(b), free(dy), free(o1), free(o2), free(dx1), free(dx2), free(dw1);
    free(dw2), free(db1), free(db2), free(r1), free(r2), free(s1), free(s2), free(g), free(t);
    free(l1), free(l2), free(z1), free(z2), free(rl), free(p1), free(p2), free(w1), free(w2);
    free(e1), free(e2), free(i1), free(i2);
}

int main(void) {
    tk_init_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_stream_event),
        cmocka_unit_test(test_ops_equal_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
