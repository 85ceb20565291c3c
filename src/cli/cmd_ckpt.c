/* loom ckpt: inspect (run state, layout, tensors), verify (every checksum, exit 2 on the
 * first bad chunk, naming file and tensor), export (the parameters as one safetensors
 * file with Hugging Face names and the model config, like --save-weights; F32, or BF16
 * with --dtype bf16). DIR is a step
 * folder or a tier folder (then its newest complete checkpoint). */
#include "cli/cmd_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_loader.h"
#include "ckpt/manifest.h"
#include "core/flags.h"
#include "model/config_json.h"
#include "model/weights.h"
#include "train/ckpt_tensors.h"

static int fail(const char *msg) {
    fprintf(stderr, "loom ckpt: %s\n", msg);
    return 2;
}

/* A step folder with a manifest: DIR itself, else DIR's newest such step folder. */
static int resolve(const char *dir, char *out, size_t size) {
    char m[1500];
    struct stat sb;
    snprintf(m, sizeof m, "%s/manifest.json", dir);
    if (stat(m, &sb) == 0) {
        snprintf(out, size, "%s", dir);
        return 0;
    }
    loom_ckpt_entry *list = NULL;
    int n = loom_ckpt_list(dir, &list, 0), found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        snprintf(m, sizeof m, "%s/manifest.json", list[i].path);
        if (stat(m, &sb) == 0) found = i;
    }
    if (found >= 0) snprintf(out, size, "%s", list[found].path);
    free(list);
    return found >= 0 ? 0 : -1;
}

static void inspect(const char *dir, const loom_ckpt_manifest *m, const loom_model_config *c) {
    const loom_ckpt_layout *l = &m->layout;
    printf("checkpoint %s\n  loom %s, step %lld, tokens seen %lld, seed %llu\n", dir, m->version,
           (long long)m->step, (long long)m->tokens_seen, (unsigned long long)m->seed);
    printf("  layout at save: dp %d, tp %d, pp %d, ep %d, cp %d, ZeRO-%d, %d rank(s)\n", l->dp,
           l->tp, l->pp, l->ep, l->cp, l->zero, l->world_size);
    printf("  model: %s, %d layers, d_model %d, %d heads (%d kv), d_ff %d, vocab %d, T %d\n",
           loom_family_name(c->family), c->n_layer, c->d_model, c->n_head, c->n_kv_head, c->d_ff,
           c->vocab_size, c->seq_len);
    if (c->n_experts > 0)
        printf("  mixture of experts: %d experts, top-%d, every %d layer(s)%s, capacity factor "
               "%g, aux-loss-coef %g, z-loss-coef %g\n",
               c->n_experts, c->top_k, c->moe_every, c->shared_expert ? ", shared expert" : "",
               (double)c->capacity_factor, (double)c->aux_loss_coef, (double)c->z_loss_coef);
    uint64_t total = 0;
    int chunks = 0;
    printf("  %-48s %-16s %7s %12s\n", "tensor", "shape", "chunks", "bytes");
    for (int i = 0; i < m->n_tensors; i++) {
        const loom_ckpt_tensor *t = &m->tensors[i];
        uint64_t b = 0;
        for (int k = 0; k < t->n_chunks; k++) b += t->chunks[k].bytes;
        char shape[48];
        if (t->ndim == 2)
            snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)t->shape[0],
                     (long long)t->shape[1]);
        else
            snprintf(shape, sizeof shape, "[%lld]", (long long)t->shape[0]);
        printf("  %-48s %-16s %7d %12llu\n", t->name, shape, t->n_chunks, (unsigned long long)b);
        total += b;
        chunks += t->n_chunks;
    }
    printf("  %d tensors, %d chunks, %.1f MiB in %d file(s)\n", m->n_tensors, chunks,
           (double)total / (1 << 20), m->n_files);
}

/* The checkpoint's weights, or with ema its moving average of them (--ema-decay runs). */
static int export_weights(const char *dir, const loom_ckpt_manifest *m, const loom_model_config *mc,
                          const char *out, int ema, loom_dtype dtype) {
    loom_param_table t;
    loom_error err = {0};
    if (loom_params_build(&t, mc, NULL, &err)) return fail(err.msg);
    loom_ckpt_descs ct;
    if (loom_ckpt_tensors_describe(&ct, &t, &err)) {
        loom_params_free(&t);
        return fail(err.msg);
    }
    float *params = malloc(t.total * sizeof(float));
    if (!params) {
        loom_ckpt_descs_free(&ct);
        loom_params_free(&t);
        return fail("out of memory");
    }
    loom_ckpt_buffer b[LOOM_CKPT_KINDS] = {{0}};
    b[ema ? LOOM_CKPT_EMA : LOOM_CKPT_PARAMS] = (loom_ckpt_buffer){params, 0, 0, t.total};
    loom_status st = loom_ckpt_load(dir, m, &ct, b, NULL, &err);
    if (!st) st = loom_weights_save_as(out, mc, &t, params, dtype, &err);
    free(params);
    loom_ckpt_descs_free(&ct);
    loom_params_free(&t);
    if (st) return fail(err.msg);
    fprintf(stderr, "loom ckpt: step %lld%s exported to %s (%s)\n", (long long)m->step,
            ema ? " (moving average)" : "", out, dtype == LOOM_DTYPE_BF16 ? "bf16" : "f32");
    return 0;
}

static loom_status set_dtype(void *dst, const char *name, const char *v, loom_error *err) {
    if (strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%.64s': expected f32 or bf16", name, v);
    *(loom_dtype *)dst = strcmp(v, "bf16") == 0 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
    return LOOM_OK;
}

static const loom_flag_group GROUPS[] = {{"export", "docs/checkpoints.md"}};

int loom_cmd_ckpt(int argc, char **argv) {
    const char *usage = "usage: loom ckpt inspect DIR | verify DIR | export DIR --format "
                        "safetensors [--ema] [--dtype f32|bf16] -o FILE";
    int ema = 0, first = argc;
    loom_dtype dtype = LOOM_DTYPE_F32;
    const char *out = NULL, *format = "safetensors";
    const loom_flag flags[] = {
        LOOM_FLAG_STR(0, "format", &format, "safetensors", "the only format"),
        LOOM_FLAG_SW(0, "ema", &ema, "the moving average's weights (--ema-decay runs)"),
        LOOM_FLAG_FN(0, "dtype", &dtype, set_dtype, "f32|bf16",
                     "tensor dtype (default f32, the checkpoint's values\n"
                     "exactly; bf16 rounds to nearest even)"),
        LOOM_FLAG_STR_SHORT(0, "output", 'o', &out, "FILE", "the file to write"),
    };
    const loom_flag_spec spec = {
        .usage = usage,
        .about = "\n  inspect DIR       the newest checkpoint in DIR (or a step folder): step,\n"
                 "                    layout, model, tensors\n"
                 "  verify DIR        read every chunk and check its XXH3 checksum\n"
                 "  export DIR        whole tensors under Hugging Face names",
        LOOM_FLAGS_TABLE(flags, GROUPS),
        .positional = 1,
        .exact = 1};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom ckpt", argc, argv, &first);
    if (fo != LOOM_FLAGS_GO) return fo;
    if (argc - first < 2) return fail(usage);
    const char *cmd = argv[first], *arg = argv[first + 1];
    if (argc - first > 2) {
        char msg[256];
        snprintf(msg, sizeof msg, "unexpected argument '%s' (%s)", argv[first + 2], usage);
        return fail(msg);
    }
    char dir[1400];
    if (resolve(arg, dir, sizeof dir) != 0) {
        char msg[1500];
        snprintf(msg, sizeof msg, "%s: no checkpoint (no manifest.json, no complete step_* folder)",
                 arg);
        return fail(msg);
    }
    char path[1500];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    loom_ckpt_manifest m;
    loom_error err = {0};
    if (loom_ckpt_manifest_load(&m, path, 0, &err)) return fail(err.msg);
    loom_model_config mc;
    if (loom_model_config_from_json(&mc, m.model, path, &err)) {
        loom_ckpt_manifest_free(&m);
        return fail(err.msg);
    }
    int rc = 0;
    if (strcmp(cmd, "inspect") == 0) {
        inspect(dir, &m, &mc);
    } else if (strcmp(cmd, "verify") == 0) {
        uint64_t bytes = 0;
        if (loom_ckpt_verify(dir, &m, &bytes, &err))
            rc = fail(err.msg);
        else
            printf("%s: ok (%d files, %llu bytes, every checksum matches)\n", dir, m.n_files,
                   (unsigned long long)bytes);
    } else if (strcmp(cmd, "export") == 0) {
        if (strcmp(format, "safetensors") != 0)
            rc = fail("--format: only safetensors is supported");
        else if (!out)
            rc = fail("export: -o FILE is required");
        else
            rc = export_weights(dir, &m, &mc, out, ema, dtype);
    } else {
        rc = fail(usage);
    }
    loom_ckpt_manifest_free(&m);
    return rc;
}
