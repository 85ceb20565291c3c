/* libFuzzer target: checkpoint manifests. The input is split at its first 0 byte into
 * manifest.json (before) and a data file rank_00000.safetensors (after), written to a
 * scratch step folder. The manifest is parsed as a manifest and as a rank index; a parse
 * that succeeds must dump and parse again to the same tensors and chunks, its model
 * object is read as a model configuration (model/config_json.h), and then
 * `verify` runs against the data file (every byte range checked against the file before
 * any read). Error statuses are fine (with a message); crashes, leaks, UB, reads out of
 * bounds and huge allocations are not. Built and run by tests/fuzz/run_fuzz.sh. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_loader.h"
#include "ckpt/manifest.h"
#include "fuzz_util.h"
#include "model/config_json.h"

static char dir[PATH_MAX], manifest_path[PATH_MAX + 32], data_path[PATH_MAX + 32];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_make_dir(dir, sizeof dir, "ckpt_manifest");
    snprintf(manifest_path, sizeof manifest_path, "%s/manifest.json", dir);
    snprintf(data_path, sizeof data_path, "%s/rank_00000.safetensors", dir);
    return 0;
}

static int same_chunk(const loom_ckpt_chunk *x, const loom_ckpt_chunk *y) {
    return x->file == y->file && x->off[0] == y->off[0] && x->off[1] == y->off[1] &&
           x->len[0] == y->len[0] && x->len[1] == y->len[1] && x->byte_offset == y->byte_offset &&
           x->bytes == y->bytes && x->checksum == y->checksum;
}

static void same_manifest(const loom_ckpt_manifest *a, const loom_ckpt_manifest *b) {
    if (a->n_files != b->n_files || a->n_tensors != b->n_tensors || a->step != b->step ||
        a->seed != b->seed)
        fuzz_die("dump/parse round trip changed the manifest", NULL);
    for (int i = 0; i < a->n_files; i++)
        if (strcmp(a->files[i], b->files[i]) != 0) fuzz_die("round trip: file names", NULL);
    for (int i = 0; i < a->n_tensors; i++) {
        const loom_ckpt_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) != 0 || x->ndim != y->ndim || x->shape[0] != y->shape[0] ||
            x->shape[1] != y->shape[1] || x->n_chunks != y->n_chunks)
            fuzz_die("round trip: tensors", NULL);
        for (int k = 0; k < x->n_chunks; k++)
            if (!same_chunk(&x->chunks[k], &y->chunks[k])) fuzz_die("round trip: chunks", NULL);
    }
}

static void check(const char *text, size_t n, int index) {
    loom_ckpt_manifest m, again;
    loom_error err = {0};
    if (loom_ckpt_manifest_parse(&m, text, n, index, manifest_path, &err) != LOOM_OK) {
        if (!err.msg[0]) fuzz_die("failed parse without a message", NULL);
        if (m.n_tensors || m.n_files || m.model || m.train)
            fuzz_die("failed parse left state", NULL);
        return;
    }
    char *dumped = loom_ckpt_manifest_dump(&m, index);
    if (!dumped) fuzz_die("dump", NULL);
    if (loom_ckpt_manifest_parse(&again, dumped, strlen(dumped), index, "dump", &err) != LOOM_OK)
        fuzz_die("a dumped manifest does not parse", &err);
    same_manifest(&m, &again);
    loom_ckpt_manifest_free(&again);
    free(dumped);
    if (!index) { /* the model configuration, as the trainer and `loom ckpt` read it */
        loom_model_config mc;
        loom_error merr = {0};
        if (loom_model_config_from_json(&mc, m.model, manifest_path, &merr) != LOOM_OK &&
            !merr.msg[0])
            fuzz_die("a bad model configuration without a message", NULL);
    }
    if (!index) { /* the reader on top of it: bounds before reads, checksums */
        uint64_t bytes = 0;
        loom_error verr = {0};
        if (loom_ckpt_verify(dir, &m, &bytes, &verr) != LOOM_OK && !verr.msg[0])
            fuzz_die("failed verify without a message", NULL);
    }
    loom_ckpt_manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *zero = memchr(data, 0, size);
    size_t text_n = zero ? (size_t)(zero - data) : size;
    const uint8_t *file = zero ? zero + 1 : data + size;
    fuzz_write(manifest_path, data, text_n);
    fuzz_write(data_path, file, size - (size_t)(file - data));
    check((const char *)data, text_n, 0);
    check((const char *)data, text_n, 1);
    return 0;
}
