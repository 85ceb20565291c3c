/* Checkpoint planning with tensor-parallel placements built by hand and described for
 * ckpt/ by train/ckpt_tensors.h: every piece a rank
 * plans must hold exactly the global elements its box names, the TP ranks' pieces must
 * tile each global tensor exactly once, and any flat sub-range (partial rows) must plan
 * exactly its own elements. Also the manifest's dump/parse round trip and refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "ckpt/ckpt_plan.h"
#include "ckpt/manifest.h"
#include "test_common.h"
#include "train/ckpt_tensors.h"

/* One 2-D parameter of global shape [R, C] placed on `tp` ranks along dim with parts. */
static void make_table(loom_param_table *t, loom_param *p, int64_t R, int64_t C, int dim, int parts,
                       int rank, int tp) {
    memset(t, 0, sizeof *t);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "w");
    p->ndim = 2;
    p->global_shape[0] = R;
    p->global_shape[1] = C;
    p->shape[0] = dim == 0 ? R / tp : R;
    p->shape[1] = dim == 1 ? C / tp : C;
    p->tp_dim = dim;
    p->tp_parts = parts;
    p->tp_rank = rank;
    p->tp_size = tp;
    p->numel = (size_t)(p->shape[0] * p->shape[1]);
    t->params = p;
    t->n_params = 1;
    t->total = p->numel;
}

static void check_placement(int dim, int parts, int tp) {
    const int64_t R = (int64_t)(dim == 0 ? parts * tp * (1 + rnd() % 4) : 1 + rnd() % 7);
    const int64_t C = (int64_t)(dim == 1 ? parts * tp * (1 + rnd() % 4) : 1 + rnd() % 7);
    int *hits = calloc((size_t)(R * C), sizeof *hits);
    for (int rank = 0; rank < tp; rank++) {
        loom_param_table t;
        loom_param p;
        make_table(&t, &p, R, C, dim, parts, rank, tp);
        float *local = malloc(p.numel * sizeof(float));
        for (size_t i = 0; i < p.numel; i++)
            local[i] = (float)loom_param_global_index(&p, (int64_t)i);
        loom_ckpt_descs d;
        assert_int_equal(loom_ckpt_tensors_describe(&d, &t, NULL), LOOM_OK);
        loom_ckpt_plan plan = {0};
        size_t max_floats = 1 + rnd() % 9; /* force row splits too */
        assert_int_equal(
            loom_ckpt_plan_range(&plan, &d, LOOM_CKPT_ADAM_M, 0, t.total, 1, max_floats, NULL),
            LOOM_OK);
        for (int i = 0; i < plan.n; i++) {
            const loom_ckpt_piece *q = &plan.items[i];
            assert_int_equal(q->kind, LOOM_CKPT_ADAM_M);
            for (int64_t r = 0; r < q->box.len[0]; r++)
                for (int64_t c = 0; c < q->box.len[1]; c++) {
                    int64_t g = (q->box.off[0] + r) * C + q->box.off[1] + c;
                    assert_true(g >= 0 && g < R * C);
                    assert_float_equal(local[q->local + (size_t)(r * q->stride + c)], (float)g, 0);
                    hits[g]++;
                }
        }
        /* a random sub-range: exactly its own elements */
        size_t lo = rnd() % t.total, hi = lo + rnd() % (t.total - lo + 1);
        loom_ckpt_plan sub = {0};
        assert_int_equal(loom_ckpt_plan_range(&sub, &d, LOOM_CKPT_PARAMS, lo, hi, 0, 0, NULL),
                         LOOM_OK);
        int64_t vol = 0;
        for (int i = 0; i < sub.n; i++) {
            const loom_ckpt_piece *q = &sub.items[i];
            vol += loom_ckpt_box_volume(&q->box);
            for (int64_t r = 0; r < q->box.len[0]; r++) {
                size_t first = q->local + (size_t)(r * q->stride);
                assert_true(first >= lo && first + (size_t)q->box.len[1] <= hi);
                assert_float_equal(local[first], (float)((q->box.off[0] + r) * C + q->box.off[1]),
                                   0);
            }
        }
        assert_int_equal(vol, (int64_t)(hi - lo));
        loom_ckpt_plan_free(&sub);
        loom_ckpt_plan_free(&plan);
        loom_ckpt_descs_free(&d);
        free(local);
    }
    for (int64_t g = 0; g < R * C; g++) assert_int_equal(hits[g], 1);
    free(hits);
}

static void test_placements(void **state) {
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        check_placement(0, 1, 1); /* not placed */
        check_placement(0, 1, 2); /* rows split */
        check_placement(0, 3, 2); /* fused [q; k; v] rows */
        check_placement(0, 3, 3);
        check_placement(1, 1, 2); /* columns split */
        check_placement(1, 2, 4);
    }
}

static void test_replicated_written_once(void **state) {
    (void)state;
    loom_param_table t;
    loom_param p;
    for (int rank = 0; rank < 3; rank++) {
        make_table(&t, &p, 4, 5, -1, 1, rank, 3);
        p.shape[0] = 4, p.shape[1] = 5, p.numel = 20, t.total = 20;
        loom_ckpt_descs d;
        assert_int_equal(loom_ckpt_tensors_describe(&d, &t, NULL), LOOM_OK);
        assert_int_equal(d.items[0].written, rank == 0);
        loom_ckpt_plan plan = {0};
        assert_int_equal(loom_ckpt_plan_range(&plan, &d, LOOM_CKPT_PARAMS, 0, 20, 1, 0, NULL),
                         LOOM_OK);
        assert_int_equal(plan.n, rank == 0 ? 1 : 0);
        loom_ckpt_plan_free(&plan);
        /* but every rank loads it */
        assert_int_equal(loom_ckpt_plan_range(&plan, &d, LOOM_CKPT_PARAMS, 0, 20, 0, 0, NULL),
                         LOOM_OK);
        assert_int_equal(plan.n, 1);
        loom_ckpt_plan_free(&plan);
        loom_ckpt_descs_free(&d);
    }
}

static loom_status parse(const char *text) {
    loom_ckpt_manifest m;
    loom_error err = {0};
    loom_status st = loom_ckpt_manifest_parse(&m, text, strlen(text), 1, "idx", &err);
    if (!st) loom_ckpt_manifest_free(&m);
    return st;
}

static void test_manifest_round_trip(void **state) {
    (void)state;
    loom_ckpt_manifest m;
    memset(&m, 0, sizeof m);
    const int64_t rows = 2 + (int64_t)(rnd() % 30), cols = 1 + (int64_t)(rnd() % 5);
    const int64_t shape[2] = {rows, cols};
    int64_t r = 0;
    while (r < rows) { /* random row blocks over two files */
        int64_t n = 1 + (int64_t)(rnd() % 4);
        if (r + n > rows) n = rows - r;
        int file = loom_ckpt_manifest_add_file(&m, rnd() % 2 ? "a.safetensors" : "b.safetensors");
        loom_ckpt_chunk c = {file, {r, 0}, {n, cols}, rnd() % 1000, (uint64_t)(n * cols * 4),
                             rnd()};
        assert_int_equal(loom_ckpt_manifest_add_chunk(&m, "t", 2, shape, &c, NULL), LOOM_OK);
        r += n;
    }
    char *text = loom_ckpt_manifest_dump(&m, 1);
    loom_ckpt_manifest back;
    assert_int_equal(loom_ckpt_manifest_parse(&back, text, strlen(text), 1, "x", NULL), LOOM_OK);
    assert_int_equal(loom_ckpt_manifest_check_cover(&back, "x", NULL), LOOM_OK);
    const loom_ckpt_tensor *a = loom_ckpt_manifest_find(&m, "t"),
                           *b = loom_ckpt_manifest_find(&back, "t");
    assert_int_equal(a->n_chunks, b->n_chunks);
    for (int i = 0; i < a->n_chunks; i++) {
        assert_int_equal(a->chunks[i].checksum, b->chunks[i].checksum);
        assert_int_equal(a->chunks[i].byte_offset, b->chunks[i].byte_offset);
        assert_string_equal(m.files[a->chunks[i].file], back.files[b->chunks[i].file]);
    }
    free(text);
    loom_ckpt_manifest_free(&back);
    loom_ckpt_manifest_free(&m);
}

static void test_manifest_refusals(void **state) {
    (void)state;
#define HDR "{\"format\":\"loom-checkpoint-index-1\",\"checksum\":\"xxh3-64\","
#define CHUNK(file, off, len, bytes)                                                               \
    "{\"file\":" file ",\"offset\":[" off "],\"length\":[" len                                     \
    "],\"byte_offset\":0,\"bytes\":" bytes ",\"xxh3\":\"0123456789abcdef\"}"
    assert_int_equal(parse(HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\","
                               "\"shape\":[4],\"chunks\":[" CHUNK("0", "0", "4", "16") "]}]}"),
                     LOOM_OK);
    const char *bad[] = {
        HDR "\"files\":[\"../a\"],\"tensors\":[]}",
        HDR "\"files\":[\"/abs\"],\"tensors\":[]}",
        HDR "\"files\":[\"..\"],\"tensors\":[]}",
        HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\",\"shape\":[4],"
            "\"chunks\":[" CHUNK("1", "0", "4", "16") "]}]}", /* file index out of range */
        HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\",\"shape\":[4],"
            "\"chunks\":[" CHUNK("0", "2", "4", "16") "]}]}", /* outside the shape */
        HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\",\"shape\":[4],"
            "\"chunks\":[" CHUNK("0", "0", "4", "12") "]}]}", /* bytes disagree */
        HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"BF16\",\"shape\":[4],"
            "\"chunks\":[]}]}",
        HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\",\"shape\":[-4],"
            "\"chunks\":[]}]}",
        "[1,2]",
        "{\"format\":",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(parse(bad[i]), LOOM_ERR_INPUT);
    /* exact cover: overlap and hole */
    loom_ckpt_manifest m;
    const char *overlap = HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\","
                              "\"shape\":[4],\"chunks\":[" CHUNK("0", "0", "3", "12") "," CHUNK(
                                  "0", "2", "2", "8") "]}]}";
    assert_int_equal(loom_ckpt_manifest_parse(&m, overlap, strlen(overlap), 1, "x", NULL), LOOM_OK);
    assert_int_equal(loom_ckpt_manifest_check_cover(&m, "x", NULL), LOOM_ERR_INPUT);
    loom_ckpt_manifest_free(&m);
    const char *hole = HDR "\"files\":[\"a\"],\"tensors\":[{\"name\":\"t\",\"dtype\":\"F32\","
                           "\"shape\":[4],\"chunks\":[" CHUNK("0", "0", "3", "12") "]}]}";
    assert_int_equal(loom_ckpt_manifest_parse(&m, hole, strlen(hole), 1, "x", NULL), LOOM_OK);
    assert_int_equal(loom_ckpt_manifest_check_cover(&m, "x", NULL), LOOM_ERR_INPUT);
    loom_ckpt_manifest_free(&m);
}

int main(void) {
    const char *s = getenv("LOOM_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("LOOM_TEST_SEED=%llu\n", (unsigned long long)seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_replicated_written_once),
        cmocka_unit_test(test_manifest_round_trip),
        cmocka_unit_test(test_manifest_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
