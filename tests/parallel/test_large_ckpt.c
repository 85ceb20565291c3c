/* Checkpoint files past 2^31: element indices, byte offsets and element counts that an
 * int (or a 32-bit offset) would get wrong, through the real writers and readers.
 *
 *   test_large_ckpt [--seed S]     (uses $TMPDIR, about 6.5 GiB of disk, then removed)
 *
 * 1. A checkpoint (ckpt/ckpt_writer.h, the rank's chunk index parsed by ckpt/manifest.h,
 *    ckpt/ckpt_loader.h, ckpt_verify): one fp32 tensor of 2^29 + 7 elements (2 GiB + 28
 *    bytes: its later chunks sit past byte 2^31 of the data file) whose first element is
 *    at flat index 2^31 + 5 of the rank's buffers (every flat index the plan, the writer
 *    and the loader compute is past 2^31). Written from a buffer filled from the seed,
 *    loaded back into the same buffer after zeroing it, every element compared with the
 *    reference value; the index's last chunk's byte offset checked past 2^31.
 * 2. safetensors (ckpt/safetensors.h): a BF16 tensor of 2^31 + 7 elements (4 GiB + 14
 *    bytes) and after it a BF16 tensor of 7 elements (its data_offsets past 2^32; not
 *    F32: the format packs tensors back to back, and loom's reader refuses an F32 tensor
 *    at an offset that is not a multiple of 4), written
 *    by loom_safetensors_write, read back by loom_safetensors_open / _get_float: every
 *    element's bits equal to the reference.
 * Labelled `large` (not in the quick suite): about 4 GiB resident at most, minutes. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_loader.h"
#include "ckpt/ckpt_writer.h"
#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"

static int failures;
static uint64_t seed;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    fflush(stdout);
    if (!ok) {
        failures++;
        printf("  (seed %" PRIu64 ")\n", seed);
    }
}

/* Element i's reference value: a multiple of 2^-10 in [-1, 1), from the seed. */
static float value(size_t i) {
    return (float)((int)((i * 2654435761u + seed) % 2048u) - 1024) / 1024.0f;
}

/* Element i's reference bf16 bits (any pattern: only bits are compared). */
static uint16_t bits(size_t i) {
    return (uint16_t)((i * 40503u + seed) ^ (i >> 16));
}

static void test_checkpoint(const char *dir) {
    const size_t n = ((size_t)1 << 29) + 7, off = ((size_t)1 << 31) + 5;
    float *x = malloc(n * sizeof(float));
    if (!x) {
        check(0, "checkpoint: 2 GiB for 2^29 + 7 floats");
        return;
    }
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = value(off + i);
    loom_ckpt_desc desc = {.ndim = 1,
                           .global_shape = {(int64_t)n, 1},
                           .local_shape = {(int64_t)n, 1},
                           .dim = 0,
                           .parts = 1,
                           .offset = off,
                           .written = 1};
    snprintf(desc.name, sizeof desc.name, "big");
    loom_ckpt_descs descs = {&desc, 1};
    loom_ckpt_buffer buf[LOOM_CKPT_KINDS] = {{x, off, off, off + n}};
    loom_ckpt_writer w;
    loom_error err = {0};
    char step[4096], index[4200];
    snprintf(step, sizeof step, "%s/step_1", dir);
    loom_status st = loom_ckpt_writer_create(&w, &descs, buf, 0, &err);
    if (!st) st = loom_ckpt_writer_start(&w, step, &err);
    if (!st) st = loom_ckpt_writer_wait(&w, &err);
    check(st == LOOM_OK, "checkpoint: 2 GiB + 28 bytes written from flat index 2^31 + 5");
    if (st) printf("  %s\n", err.msg);
    loom_ckpt_writer_destroy(&w);
    loom_ckpt_manifest m;
    snprintf(index, sizeof index, "%s/rank_00000.index.json", step);
    st = st ? st : loom_ckpt_manifest_load(&m, index, 1, &err);
    check(st == LOOM_OK, "checkpoint: the rank's chunk index parses");
    if (st) {
        printf("  %s\n", err.msg);
        free(x);
        return;
    }
    uint64_t last = 0, covered = 0;
    const int n_chunks = m.n_tensors == 1 ? m.tensors[0].n_chunks : 0;
    for (int c = 0; c < n_chunks; c++) {
        const loom_ckpt_chunk *k = &m.tensors[0].chunks[c];
        if (k->byte_offset > last) last = k->byte_offset;
        covered += k->bytes;
    }
    check(m.n_tensors == 1 && last > ((uint64_t)1 << 31) && covered == n * sizeof(float),
          "checkpoint: chunks cover 2^31 + 28 bytes, the last at a byte offset past 2^31");
    uint64_t verified = 0;
    st = loom_ckpt_verify(step, &m, &verified, &err);
    check(st == LOOM_OK && verified >= n * sizeof(float), "checkpoint: every chunk's checksum");
    memset(x, 0, n * sizeof(float));
    loom_ckpt_load_stats stats = {0};
    st = loom_ckpt_load(step, &m, &descs, buf, &stats, &err);
    check(st == LOOM_OK, "checkpoint: loaded back into flat indices [2^31 + 5, 2^31 + 2^29 + 12)");
    if (st) printf("  %s\n", err.msg);
    size_t bad = 0, first_bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (size_t i = 0; i < n; i++)
        if (x[i] != value(off + i)) bad++;
    for (size_t i = 0; i < n && bad; i++)
        if (x[i] != value(off + i)) {
            first_bad = i;
            break;
        }
    char what[160];
    snprintf(what, sizeof what, "checkpoint: every element equal to the reference (%zu differ%s)",
             bad, bad ? ", see below" : "");
    check(bad == 0, what);
    if (bad)
        printf("  first at local %zu: %g, expected %g\n", first_bad, x[first_bad],
               value(off + first_bad));
    loom_ckpt_manifest_free(&m);
    free(x);
}

static void test_safetensors(const char *dir) {
    const size_t n = ((size_t)1 << 31) + 7;
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) {
        check(0, "safetensors: 4 GiB for 2^31 + 7 bf16 elements");
        return;
    }
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) h[i] = bits(i);
    uint16_t tail[7];
    for (int i = 0; i < 7; i++) tail[i] = bits(n + (size_t)i);
    loom_tensor_view t[2] = {{"big", LOOM_DTYPE_BF16, 1, {(int64_t)n}, h},
                             {"tail", LOOM_DTYPE_BF16, 1, {7}, tail}};
    char path[4096];
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    loom_error err = {0};
    loom_status st = loom_safetensors_write(path, t, 2, &err);
    free(h);
    check(st == LOOM_OK, "safetensors: 2^31 + 7 BF16 elements and 7 more after them written");
    if (st) {
        printf("  %s\n", err.msg);
        return;
    }
    loom_safetensors f;
    st = loom_safetensors_open(&f, path, &err);
    check(st == LOOM_OK, "safetensors: the file opens (every entry validated)");
    if (st) {
        printf("  %s\n", err.msg);
        unlink(path);
        return;
    }
    loom_dtype dt;
    const void *p = NULL;
    st = loom_safetensors_get_float(&f, "big", n, &dt, &p, &err);
    check(st == LOOM_OK && dt == LOOM_DTYPE_BF16, "safetensors: 'big' is BF16 of 2^31 + 7");
    size_t bad = 0;
    if (!st) {
        const uint16_t *g = p;
#pragma omp parallel for reduction(+ : bad)
        for (size_t i = 0; i < n; i++)
            if (g[i] != bits(i)) bad++;
    }
    check(!st && bad == 0, "safetensors: every element's bits equal to the reference");
    st = loom_safetensors_get_float(&f, "tail", 7, &dt, &p, &err);
    const uint16_t *q = p;
    int same = !st && (const uint8_t *)p - f.data == (ptrdiff_t)(n * 2);
    for (int i = 0; !st && i < 7; i++) same = same && q[i] == bits(n + (size_t)i);
    if (st) printf("  %s\n", err.msg);
    check(same, "safetensors: 'tail' at data offset 2^32 + 14, its 7 values equal");
    loom_safetensors_close(&f);
    unlink(path);
}

int main(int argc, char **argv) {
    seed = (uint64_t)time(NULL);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--seed") == 0) seed = strtoull(argv[i + 1], NULL, 10);
    printf("seed %" PRIu64 "\n", seed);
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/loom_large_ckpt_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        printf("FAIL cannot make a folder under %s\n", tmp && *tmp ? tmp : "/tmp");
        return 1;
    }
    test_checkpoint(dir);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/step_1'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s/step_1\n", dir);
    test_safetensors(dir);
    rmdir(dir);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
