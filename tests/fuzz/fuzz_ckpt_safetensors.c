/* libFuzzer target: the safetensors reader (loom_safetensors_open, _get_f32, _meta). The
 * input is written as a file and opened; when the open succeeds, every tensor entry is
 * fetched as F32 with the element count its shape declares, and a tensor that is handed
 * out must lie inside the mapped file, be 4-byte aligned and is read in full (so UBSan
 * and the explicit bounds check see every byte). Error statuses are fine (with a
 * message); crashes, leaks, UB and out-of-bounds pointers are not. Built and run by
 * tests/fuzz/run_fuzz.sh. */
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "fuzz_util.h"

static char path[PATH_MAX + 32];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[PATH_MAX];
    fuzz_make_dir(dir, sizeof dir, "ckpt_safetensors");
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(path, data, size);
    loom_safetensors f;
    loom_error err = {0};
    if (loom_safetensors_open(&f, path, &err) != LOOM_OK) {
        if (!err.msg[0]) fuzz_die("failed open without a message", NULL);
        if (f.map || f.header) fuzz_die("failed open left a mapping", NULL);
        return 0;
    }
    (void)loom_safetensors_meta(&f, "format");
    (void)loom_safetensors_get_f32(&f, "__metadata__", 1, &(const float *){0}, &err);
    const char *key;
    json_t *v;
    volatile float sink = 0;
    json_object_foreach((json_t *)f.header, key, v) {
        size_t numel = 1;
        json_t *shape = json_object_get(v, "shape");
        for (size_t d = 0; d < json_array_size(shape); d++)
            numel *= (size_t)json_integer_value(json_array_get(shape, d));
        /* F32 or BF16 (what --init-from and loom generate read): inside, aligned. */
        loom_dtype dt;
        const void *any = NULL;
        loom_error e = {0};
        if (loom_safetensors_get_float(&f, key, numel, &dt, &any, &e) == LOOM_OK) {
            const size_t size = dt == LOOM_DTYPE_BF16 ? 2 : 4;
            const uint8_t *lo = f.map, *hi = lo + f.map_bytes, *p = any;
            if (p < lo || p > hi || numel > (size_t)(hi - p) / size)
                fuzz_die("a float tensor outside the file", NULL);
            if ((uintptr_t)p % size != 0) fuzz_die("a misaligned float tensor", NULL);
            for (size_t i = 0; i < numel; i++) sink += p[i * size];
        } else if (!e.msg[0]) {
            fuzz_die("failed get_float without a message", NULL);
        }
        const float *x = NULL;
        e = (loom_error){0};
        if (loom_safetensors_get_f32(&f, key, numel, &x, &e) != LOOM_OK) {
            if (!e.msg[0]) fuzz_die("failed get without a message", NULL);
            continue;
        }
        const uint8_t *lo = f.map, *hi = lo + f.map_bytes, *p = (const uint8_t *)x;
        if (p < lo || p > hi || numel > (size_t)(hi - p) / sizeof(float))
            fuzz_die("a tensor outside the file", NULL);
        if ((uintptr_t)p % sizeof(float) != 0) fuzz_die("a misaligned F32 tensor", NULL);
        for (size_t i = 0; i < numel; i++) sink += x[i];
    }
    (void)sink;
    loom_safetensors_close(&f);
    return 0;
}
