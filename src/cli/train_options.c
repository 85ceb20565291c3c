#include "cli/train_options.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/flags.h"
#include "core/suggest.h"
#include "model/vlm.h"

typedef enum {
    OPT_INT,
    OPT_FLOAT,
    OPT_U64,
    OPT_STRING,
    OPT_FAMILY,
    OPT_BOOL,
    OPT_LIST,
    OPT_T_SAMPLING,
    OPT_FREEZE,   /* vlm parts: model/vlm.h's bit flags */
    OPT_RECOMPUTE /* none | selective | full; a bare flag or 0/1 as the boolean it was */
} opt_type;

typedef struct {
    const char *key;
    opt_type type;
    size_t offset; /* into loom_train_options */
    size_t size;   /* for strings */
    const char *help;
} opt_def;

#define M(field) offsetof(loom_train_options, model.field)
#define TR(field) offsetof(loom_train_options, train.field)
#define S(field) offsetof(loom_train_options, field)

static const opt_def OPTS[] = {
    {"model", OPT_STRING, S(preset), 64,
     "preset: gpt2-tiny, gpt2-small, llama-tiny, llama-100m, dit-tiny, dit-small, vlm-tiny, "
     "vlm-small"},
    {"family", OPT_FAMILY, M(family), 0, "gpt2 | llama | dit | vlm"},
    {"n-layer", OPT_INT, M(n_layer), 0, "transformer blocks"},
    {"n-head", OPT_INT, M(n_head), 0, "attention (query) heads"},
    {"n-kv-head", OPT_INT, M(n_kv_head), 0, "key/value heads (llama: divides n-head)"},
    {"d-model", OPT_INT, M(d_model), 0, "model width"},
    {"d-ff", OPT_INT, M(d_ff), 0, "MLP hidden width"},
    {"vocab-size", OPT_INT, M(vocab_size), 0, "vocabulary size"},
    {"seq-len", OPT_INT, M(seq_len), 0, "sequence length T"},
    {"norm-eps", OPT_FLOAT, M(norm_eps), 0, "LayerNorm/RMSNorm epsilon"},
    {"rope-theta", OPT_FLOAT, M(rope_theta), 0, "RoPE base (llama)"},
    {"n-experts", OPT_INT, M(n_experts), 0, "experts per MoE layer (0 = dense MLP)"},
    {"top-k", OPT_INT, M(top_k), 0, "experts per token (MoE)"},
    {"moe-every", OPT_INT, M(moe_every), 0, "MoE in every k-th layer (layers k-1, 2k-1, ...)"},
    {"shared-expert", OPT_BOOL, M(shared_expert), 0, "MoE: add a shared expert every token uses"},
    {"capacity-factor", OPT_FLOAT, M(capacity_factor), 0,
     "MoE expert capacity ceil(cf*N*K/E) per micro-batch (0 = dropless)"},
    {"aux-loss-coef", OPT_FLOAT, M(aux_loss_coef), 0, "MoE load-balancing loss weight"},
    {"z-loss-coef", OPT_FLOAT, M(z_loss_coef), 0, "MoE router z-loss weight"},
    {"channels", OPT_INT, M(channels), 0, "dit: image channels (1 gray, 3 RGB)"},
    {"frames", OPT_INT, M(frames), 0, "dit: frames per sample (1 = images)"},
    {"height", OPT_INT, M(height), 0, "dit: image height (pixels)"},
    {"width", OPT_INT, M(width), 0, "dit: image width (pixels)"},
    {"patch", OPT_INT, M(patch), 0, "dit: patch size p (p x p pixels per token)"},
    {"patch-t", OPT_INT, M(patch_t), 0, "dit: frames per patch (video)"},
    {"n-classes", OPT_INT, M(n_classes), 0, "dit: classes (plus the null class for guidance)"},
    {"vit-layers", OPT_INT, M(vit_layers), 0, "vlm: vision encoder blocks"},
    {"vit-d-model", OPT_INT, M(vit_d_model), 0, "vlm: vision encoder width"},
    {"vit-n-head", OPT_INT, M(vit_n_head), 0, "vlm: vision encoder heads"},
    {"vit-d-ff", OPT_INT, M(vit_d_ff), 0, "vlm: vision encoder MLP width"},
    {"vit-patch", OPT_INT, M(patch), 0, "vlm: patch size p of the vision encoder (= --patch)"},
    {"max-images", OPT_INT, M(max_images), 0, "vlm: image slots per sample"},
    {"balance-dp", OPT_BOOL, TR(balance_dp), 0,
     "vlm: spread each step's samples over the dp ranks by predicted compute (images)"},
    {"vision-schedule", OPT_STRING, TR(vision_schedule), 16,
     "vlm with --pp: first (encoder on stage 0) | bubbles (its pieces in the idle slots)"},
    {"freeze", OPT_FREEZE, M(freeze), 0,
     "vlm: parts that are not trained, a subset of vision,projector,llm (not all three)"},
    {"t-sampling", OPT_T_SAMPLING, TR(flow.t_sampling), 0,
     "dit: flow-matching times, logit-normal (SD3) | uniform"},
    {"class-dropout", OPT_FLOAT, TR(flow.class_dropout), 0,
     "dit: probability of the null class (classifier-free guidance)"},
    {"ema-decay", OPT_FLOAT, TR(ema_decay), 0,
     "moving average of the weights after each step (0 = off; DiT: 0.9999)"},
    {"save-ema", OPT_STRING, TR(save_ema), LOOM_PATH_MAX,
     "write the moving average's weights (safetensors) at the end"},
    {"moe-chunks", OPT_INT, TR(moe_chunks), 0,
     "MoE: token chunks per micro-batch whose all-to-all overlaps expert compute (1 = none)"},
    {"data", OPT_STRING, TR(data), LOOM_PATH_MAX, "token shard file or glob (llm.c format)"},
    {"micro-batch", OPT_INT, TR(micro_batch), 0, "sequences per forward/backward"},
    {"global-batch", OPT_INT, TR(global_batch), 0, "sequences per optimizer step"},
    {"steps", OPT_INT, TR(steps), 0, "optimizer steps"},
    {"lr", OPT_FLOAT, TR(lr), 0, "peak learning rate"},
    {"min-lr", OPT_FLOAT, TR(min_lr), 0, "final learning rate of the cosine decay"},
    {"warmup-steps", OPT_INT, TR(warmup_steps), 0, "linear warmup steps"},
    {"weight-decay", OPT_FLOAT, TR(adamw.weight_decay), 0, "AdamW decay (matrices only)"},
    {"grad-clip", OPT_FLOAT, TR(adamw.grad_clip), 0, "global gradient norm clip (0 = off)"},
    {"beta1", OPT_FLOAT, TR(adamw.beta1), 0, "AdamW beta1"},
    {"beta2", OPT_FLOAT, TR(adamw.beta2), 0, "AdamW beta2"},
    {"adam-eps", OPT_FLOAT, TR(adamw.eps), 0, "AdamW epsilon"},
    {"seed", OPT_U64, TR(seed), 0, "seed of initialisation and data order"},
    {"threads", OPT_INT, TR(threads), 0, "threads (0 = cores / ranks per node)"},
    {"log-every", OPT_INT, TR(log_every), 0, "progress line every N steps"},
    {"metrics", OPT_STRING, TR(metrics), LOOM_PATH_MAX, "JSON-lines metrics file"},
    {"dump-dir", OPT_STRING, TR(dump_dir), LOOM_PATH_MAX, "dump tensors (reference tests)"},
    {"dp", OPT_INT, TR(layout.dp), 0, "data-parallel ranks"},
    {"tp", OPT_INT, TR(layout.tp), 0, "tensor-parallel ranks (Megatron: heads, MLP, vocabulary)"},
    {"sequence-parallel", OPT_BOOL, TR(sequence_parallel), 0,
     "with --tp: split norms/residuals along the sequence (flag, or 0/1 in a config)"},
    {"pp", OPT_INT, TR(layout.pp), 0, "pipeline stages (layers split over them)"},
    {"pp-schedule", OPT_STRING, TR(pp_schedule), 16,
     "pipeline schedule: gpipe, 1f1b, interleaved, zb"},
    {"virtual-stages", OPT_INT, TR(virtual_stages), 0,
     "model chunks per pipeline rank (interleaved)"},
    {"pp-layers", OPT_STRING, TR(pp_layers), 256,
     "layers per pipeline stage, e.g. 3,5 (pp x virtual-stages counts; default even)"},
    {"device", OPT_STRING, TR(device), 16,
     "where the model runs: cpu, or cuda (one GPU, one process; a CUDA build)"},
    {"precision", OPT_STRING, TR(precision), 8,
     "fp32, or bf16: the linear layers' GEMMs in bf16 (oneDNN; fp32 master weights, optimizer, "
     "gradients; docs/precision.md)"},
    {"grad-reduce-dtype", OPT_STRING, TR(grad_reduce_dtype), 8,
     "fp32, or bf16 (needs --precision bf16): the data-parallel gradient reduction sends bf16, "
     "sums in fp32 (half the bytes)"},
    {"bf16-rounding", OPT_STRING, TR(bf16_rounding), 16,
     "nearest, or stochastic: how the bf16 copy of the weights is rounded from the fp32 master "
     "once per step (seeded by --seed, step and tensor)"},
    {"dry-run", OPT_BOOL, TR(dry_run), 0,
     "set up the layout, print the start-up (memory) report and stop before the first step"},
    {"recompute", OPT_RECOMPUTE, TR(recompute), 0,
     "activation recomputation: none, selective (recompute attention and activations) or "
     "full (keep each layer's input only); the bare flag is full"},
    {"pp-stats", OPT_STRING, TR(pp_stats), LOOM_PATH_MAX,
     "per-rank pipeline timers, JSON lines in FILE.rankN (benchmarks)"},
    {"ep", OPT_INT, TR(layout.ep), 0, "expert-parallel ranks (MoE): divides dp x cp and n-experts"},
    {"cp", OPT_INT, TR(layout.cp), 0,
     "context-parallel ranks: every sequence split over them (long sequences)"},
    {"cp-mode", OPT_STRING, TR(cp_mode), 16,
     "context parallelism: ring (key/value blocks passed round, zigzag when causal) or "
     "ulysses (all-to-all to heads)"},
    {"zero", OPT_INT, TR(zero), 0,
     "ZeRO stage over dp: 0, 1 (optimizer state), 2 (+grads), 3 (+params)"},
    {"bucket-mb", OPT_FLOAT, TR(bucket_mb), 0, "gradient bucket size (MiB) for overlap"},
    {"overlap-param-gather", OPT_BOOL, TR(overlap_param_gather), 0,
     "ZeRO 1, 2: all-gather updated params per block during the next forward"},
    {"startup-timeout", OPT_FLOAT, TR(startup_timeout), 0,
     "seconds every rank has to start before the job stops (names missing ranks)"},
    {"save-weights", OPT_STRING, TR(save_weights), LOOM_PATH_MAX,
     "write the final weights (safetensors + config) for loom generate"},
    {"val-data", OPT_STRING, TR(val_data), LOOM_PATH_MAX, "validation shards (file or glob)"},
    {"eval-every", OPT_INT, TR(eval_every), 0, "validation loss every N steps (0 = off)"},
    {"eval-batches", OPT_INT, TR(eval_batches), 0, "global batches per evaluation"},
    {"tensorboard", OPT_STRING, TR(tensorboard), LOOM_PATH_MAX, "TensorBoard event file folder"},
    {"trace", OPT_STRING, TR(trace), LOOM_PATH_MAX, "Chrome/Perfetto trace file (all ranks)"},
    {"ckpt-dir", OPT_STRING, TR(ckpt_dir), LOOM_PATH_MAX, "checkpoint folder (durable tier)"},
    {"ckpt-every", OPT_INT, TR(ckpt_every), 0, "checkpoint every N steps (and at the end)"},
    {"ckpt-keep", OPT_INT, TR(ckpt_keep), 0, "complete checkpoints kept per folder (0 = all)"},
    {"ckpt-fast-dir", OPT_STRING, TR(ckpt_fast_dir), LOOM_PATH_MAX,
     "fast checkpoint tier, e.g. /dev/shm/NAME"},
    {"ckpt-fast-every", OPT_INT, TR(ckpt_fast_every), 0, "fast-tier checkpoint every M steps"},
    {"ckpt-peer", OPT_BOOL, TR(ckpt_peer), 0,
     "keep each save in this host's memory and a copy on another host's (recovery)"},
    {"ckpt-peer-dir", OPT_STRING, TR(ckpt_peer_dir), LOOM_PATH_MAX,
     "the memory --ckpt-peer uses (default /dev/shm/loom-peer; per host a HOSTNAME folder)"},
    {"resume", OPT_STRING, TR(resume), LOOM_PATH_MAX,
     "auto (newest valid checkpoint, else start fresh) or a checkpoint/folder path"},
    {"init-from", OPT_STRING, TR(init_from), LOOM_PATH_MAX,
     "start from weights in a safetensors file (loom ckpt export, --save-weights)"},
    {"skip-steps", OPT_STRING, TR(skip_steps), LOOM_PATH_MAX,
     "batches never trained on, e.g. 5,9 (step s uses the s-th batch not listed)"},
    {"inject", OPT_LIST, TR(inject), LOOM_PATH_MAX,
     "fault injection KIND@STEP[:RANK[:ARG]][+], repeatable (docs/fault-tolerance.md)"},
    {"resume-ignore-seed", OPT_BOOL, TR(resume_ignore_seed), 0,
     "resume even if the checkpoint was saved with another --seed (the data order changes)"},
    {"outer", OPT_STRING, TR(outer.kind), 16,
     "outer optimizer: none, or diloco (worker groups sync every --inner-steps)"},
    {"workers", OPT_INT, TR(outer.workers), 0,
     "DiLoCo worker groups (the world's outermost dimension; layouts apply inside each)"},
    {"inner-steps", OPT_INT, TR(outer.inner_steps), 0, "DiLoCo: inner steps H between outer syncs"},
    {"outer-lr", OPT_FLOAT, TR(outer.lr), 0, "DiLoCo: outer SGD learning rate"},
    {"outer-momentum", OPT_FLOAT, TR(outer.momentum), 0, "DiLoCo: outer SGD momentum"},
    {"outer-nesterov", OPT_BOOL, TR(outer.nesterov), 0, "DiLoCo: Nesterov outer momentum"},
    {"outer-fragments", OPT_INT, TR(outer.fragments), 0,
     "streaming DiLoCo: fragments of consecutive blocks synced in turn, overlapped (1 = off)"},
    {"outer-dtype", OPT_STRING, TR(outer.dtype), 8,
     "DiLoCo: outer gradient on the wire: fp32, bf16, int8, int4 (no error feedback)"},
    {"outer-block", OPT_INT, TR(outer.block), 0,
     "DiLoCo: values per scale for --outer-dtype int8/int4 (int4: even)"},
    {"outer-merge", OPT_FLOAT, TR(outer.merge), 0,
     "streaming DiLoCo: local weight alpha when a fragment's global params land"},
    {"outer-warmup", OPT_INT, TR(outer.warmup), 0,
     "DiLoCo: a fragment's first R outer syncs only average (outer lr 1, momentum untouched)"},
    {"outer-start-step", OPT_INT, TR(outer.start_step), 0,
     "DiLoCo: synchronous dp over all workers (gradients all-reduced) for the first S steps"},
    {"inner-lr-scale", OPT_FLOAT, TR(outer.inner_lr_scale), 0,
     "DiLoCo: the inner AdamW's lr schedule times F in the rounds (after --outer-start-step)"},
    {"elastic-worker", OPT_INT, TR(outer.elastic_worker), 0,
     "elastic DiLoCo: this mpirun job is worker I of --workers (-1: off)"},
    {"elastic-join", OPT_BOOL, TR(outer.elastic_join), 0,
     "elastic DiLoCo: join a running group (a restarted worker; worker 0 otherwise founds it)"},
    {"elastic-timeout", OPT_FLOAT, TR(outer.elastic_timeout), 0,
     "elastic DiLoCo: seconds an outer exchange may take before a worker is dropped"},
    {"memory-per-rank", OPT_FLOAT, TR(memory_per_rank), 0,
     "GiB a rank may hold: a layout needing more is refused, naming the smallest that fits"},
    {"grad-accum", OPT_STRING, TR(grad_accum), 16,
     "local (sum micro-batches, reduce once) | sharded (ZeRO 2, 3: reduce each micro-batch "
     "into the shard; no whole gradient kept) | auto (default: sharded at --zero 3, else local)"},
};
#define N_OPTS (int)(sizeof OPTS / sizeof OPTS[0])

/* A key = value pair with where it came from, for error messages. */
typedef struct {
    const opt_def *def;
    char value[LOOM_PATH_MAX];
    char origin[LOOM_PATH_MAX + 32];
} setting;

typedef struct {
    setting *items;
    int n, cap;
} setting_list;

/* loom train --help lists the keys by purpose, each group naming its docs page; a key in no
 * group (a new row above) is listed under "Other keys" until it is given one. */
typedef struct {
    const char *title;
    const char *page;
    const char *keys; /* space-separated */
} opt_group;

static const opt_group GROUPS[] = {
    {"Model", "docs/training.md",
     "model family n-layer n-head n-kv-head d-model d-ff vocab-size seq-len norm-eps rope-theta"},
    {"Data and optimisation", "docs/training.md",
     "data micro-batch global-batch steps lr min-lr warmup-steps weight-decay grad-clip beta1 "
     "beta2 adam-eps seed threads"},
    {"Watching a run, evaluation, weights", "docs/training.md",
     "log-every metrics tensorboard trace val-data eval-every eval-batches save-weights dry-run "
     "dump-dir"},
    {"Parallel layouts", "docs/parallelism.md",
     "dp zero bucket-mb overlap-param-gather tp sequence-parallel pp pp-schedule virtual-stages "
     "pp-layers pp-stats cp cp-mode ep recompute startup-timeout"},
    {"Mixture of experts", "docs/parallelism.md",
     "n-experts top-k moe-every shared-expert capacity-factor aux-loss-coef z-loss-coef "
     "moe-chunks"},
    {"Diffusion transformers (images, clips)", "docs/dit.md",
     "channels frames height width patch patch-t n-classes t-sampling class-dropout ema-decay "
     "save-ema"},
    {"Checkpoints", "docs/checkpoints.md",
     "ckpt-dir ckpt-every ckpt-keep ckpt-fast-dir ckpt-fast-every ckpt-peer ckpt-peer-dir resume "
     "resume-ignore-seed init-from"},
    {"Faults and recovery", "docs/fault-tolerance.md", "skip-steps inject"},
    {"Multimodal LLM (vlm)", "docs/vlm.md",
     "vit-layers vit-d-model vit-n-head vit-d-ff vit-patch max-images freeze balance-dp "
     "vision-schedule"},
    {"Precision", "docs/precision.md", "precision grad-reduce-dtype bf16-rounding"},
    {"Large models: memory", "docs/memory.md", "memory-per-rank grad-accum"},
    {"DiLoCo: worker groups and an outer optimizer", "docs/diloco.md",
     "outer workers inner-steps outer-lr outer-momentum outer-nesterov outer-fragments "
     "outer-dtype outer-block outer-merge outer-warmup outer-start-step inner-lr-scale"},
    {"Device", "docs/gpu.md", "device"},
};
#define N_GROUPS (int)(sizeof GROUPS / sizeof GROUPS[0])

static int group_has(const opt_group *g, const char *key) {
    size_t n = strlen(key);
    for (const char *p = g->keys; (p = strstr(p, key)) != NULL; p += n)
        if ((p == g->keys || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

/* ": did you mean --KEY?" for a mistyped flag or config key, else "". */
static void suggest_key(char *out, size_t cap, const char *word) {
    const char *keys[N_OPTS + 2];
    for (int i = 0; i < N_OPTS; i++) keys[i] = OPTS[i].key;
    keys[N_OPTS] = "config";
    keys[N_OPTS + 1] = "help";
    char w[128];
    snprintf(w, sizeof w, "%s", word);
    for (char *c = w; *c; c++)
        if (*c == '_') *c = '-'; /* config files may spell keys with '_' */
    loom_suggest_flag(out, cap, w, keys, N_OPTS + 2);
}

static const opt_def *find_opt(const char *key) {
    for (int i = 0; i < N_OPTS; i++)
        if (strcmp(OPTS[i].key, key) == 0) return &OPTS[i];
    return NULL;
}

static int push(setting_list *l, const opt_def *def, const char *value, const char *origin) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        setting *items = realloc(l->items, (size_t)cap * sizeof *items);
        if (!items) return -1;
        l->items = items;
        l->cap = cap;
    }
    setting *s = &l->items[l->n++];
    s->def = def;
    snprintf(s->value, sizeof s->value, "%s", value);
    snprintf(s->origin, sizeof s->origin, "%s", origin);
    return 0;
}

static loom_status apply(loom_train_options *o, const setting *s, loom_error *err) {
    char *base = (char *)o + s->def->offset;
    const char *v = s->value;
    char *end = NULL;
    errno = 0;
    switch (s->def->type) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < -2147483647L || x > 2147483647L)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected an integer", s->origin,
                                  v);
        *(int *)base = (int)x;
        break;
    }
    case OPT_FLOAT: {
        float x = strtof(v, &end);
        if (!*v || *end || errno)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected a number", s->origin, v);
        *(float *)base = x;
        break;
    }
    case OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || v[0] == '-')
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected a non-negative integer",
                                  s->origin, v);
        *(uint64_t *)base = x;
        break;
    }
    case OPT_LIST: /* repeated flags accumulate, comma-separated */
        if (strlen(base) + strlen(v) + 2 > s->def->size)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s: values too long (max %zu)", s->origin,
                                  s->def->size - 1);
        if (base[0]) strcat(base, ",");
        strcat(base, v);
        break;
    case OPT_STRING:
        if (strlen(v) >= s->def->size)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s: value too long (max %zu)", s->origin,
                                  s->def->size - 1);
        snprintf(base, s->def->size, "%s", v);
        break;
    case OPT_BOOL:
        if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0)
            *(int *)base = 1;
        else if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
            *(int *)base = 0;
        else
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected 0, 1, true or false",
                                  s->origin, v);
        break;
    case OPT_FAMILY:
        if (strcmp(v, "gpt2") == 0)
            *(loom_family *)base = LOOM_FAMILY_GPT2;
        else if (strcmp(v, "llama") == 0)
            *(loom_family *)base = LOOM_FAMILY_LLAMA;
        else if (strcmp(v, "dit") == 0)
            *(loom_family *)base = LOOM_FAMILY_DIT;
        else if (strcmp(v, "vlm") == 0)
            *(loom_family *)base = LOOM_FAMILY_VLM;
        else
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected gpt2, llama, dit or vlm",
                                  s->origin, v);
        break;
    case OPT_RECOMPUTE:
        if (strcmp(v, "none") == 0 || strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
            *(int *)base = LOOM_RECOMPUTE_NONE;
        else if (strcmp(v, "full") == 0 || strcmp(v, "1") == 0 || strcmp(v, "true") == 0)
            *(int *)base = LOOM_RECOMPUTE_FULL;
        else if (strcmp(v, "selective") == 0)
            *(int *)base = LOOM_RECOMPUTE_SELECTIVE;
        else
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected none, selective or full",
                                  s->origin, v);
        break;
    case OPT_T_SAMPLING:
        if (loom_t_sampling_parse(v, (loom_t_sampling *)base, NULL) != LOOM_OK)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': expected logit-normal or uniform",
                                  s->origin, v);
        break;
    case OPT_FREEZE:
        if (loom_vlm_parse_freeze(v, (int *)base, err) != LOOM_OK) /* names --freeze */
            return LOOM_ERR_INPUT;
        break;
    }
    return LOOM_OK;
}

typedef struct {
    setting_list *list;
    const char *path;
    char bad_key[128]; /* set when the handler rejects a key; ini_parse returns its line */
} ini_ctx;

/* Debian's inih passes no line number to handlers: a rejected key stops the parse and
 * ini_parse returns its line; accepted values are named by file and key. */
static int on_ini(void *user, const char *section, const char *name, const char *value) {
    (void)section; /* sections only group keys; names are unique */
    ini_ctx *c = user;
    char key[128];
    snprintf(key, sizeof key, "%s", name);
    for (char *p = key; *p; p++)
        if (*p == '_') *p = '-';
    const opt_def *def = find_opt(key);
    if (!def) {
        snprintf(c->bad_key, sizeof c->bad_key, "%s", name);
        return 0;
    }
    char origin[LOOM_PATH_MAX + 32];
    snprintf(origin, sizeof origin, "%s: %s", c->path, name);
    return push(c->list, def, value, origin) == 0;
}

static loom_status read_config(setting_list *file, const char *path, loom_error *err) {
    ini_ctx ctx = {file, path, ""};
    int rc = ini_parse(path, on_ini, &ctx);
    if (rc == -1)
        return loom_error_set(err, LOOM_ERR_INPUT, "--config '%s': cannot open: %s", path,
                              strerror(errno));
    if (rc == -2) return loom_error_set(err, LOOM_ERR_NOMEM, "--config '%s': out of memory", path);
    if (rc != 0 && ctx.bad_key[0]) {
        char hint[96];
        suggest_key(hint, sizeof hint, ctx.bad_key);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--config '%s': line %d: unknown key '%s'%s (see loom train --help)",
                              path, rc, ctx.bad_key, hint);
    }
    if (rc != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--config '%s': line %d: expected 'key = value' or '[section]'", path,
                              rc);
    return LOOM_OK;
}

typedef struct {
    setting_list *list;
    const opt_def *def;
} flag_slot;

static loom_status push_flag(void *dst, const char *name, const char *value, loom_error *err) {
    const flag_slot *slot = dst;
    char origin[96];
    snprintf(origin, sizeof origin, "--%s", name);
    if (push(slot->list, slot->def, value, origin))
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    return LOOM_OK;
}

/* The flags, read by the one flag parser (core/flags.h): each pushes its setting. A boolean
 * is a bare flag (--sequence-parallel) or --key=0|1; --recompute takes its mode as the next
 * word too (--recompute selective). */
static loom_status parse_flags(setting_list *flags, char *config, int *help, int argc, char **argv,
                               const loom_flag_spec *outer, loom_error *err) {
    static const char *const modes[] = {"none", "selective", "full", NULL};
    flag_slot slots[N_OPTS];
    loom_flag table[N_OPTS + 1];
    const char *config_path = NULL;
    for (int i = 0; i < N_OPTS; i++) {
        slots[i] = (flag_slot){flags, &OPTS[i]};
        const int optional = OPTS[i].type == OPT_BOOL || OPTS[i].type == OPT_RECOMPUTE;
        table[i] = (loom_flag){.name = OPTS[i].key,
                               .kind = LOOM_FLAG_CALL,
                               .dst = &slots[i],
                               .set = push_flag,
                               .optional = optional,
                               .next_words = OPTS[i].type == OPT_RECOMPUTE ? modes : NULL};
    }
    table[N_OPTS] = (loom_flag)LOOM_FLAG_STR(0, "config", &config_path, "FILE", "");
    const loom_flag_spec spec = {
        .flags = table, .n_flags = N_OPTS + 1, .positional = 1, .also = outer};
    int first = argc;
    loom_status st = loom_flags_parse(&spec, argc, argv, help, &first, err);
    if (st) return st;
    if (config_path) snprintf(config, LOOM_PATH_MAX, "%s", config_path);
    if (!*help && first < argc)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "unexpected argument '%s' (options are --key value)", argv[first]);
    return LOOM_OK;
}

static loom_status apply_all(loom_train_options *o, const setting_list *file,
                             const setting_list *flags, loom_error *err) {
    /* The preset first (the flag's over the file's), then every other key in order. */
    const setting *preset = NULL;
    for (int i = 0; i < file->n; i++)
        if (strcmp(file->items[i].def->key, "model") == 0) preset = &file->items[i];
    for (int i = 0; i < flags->n; i++)
        if (strcmp(flags->items[i].def->key, "model") == 0) preset = &flags->items[i];
    /* --family dit without a --model starts from the dit-tiny preset (DiT's norm epsilon,
     * the sample shape), not from the default language model's */
    const setting_list *both[2] = {file, flags};
    for (int l = 0; l < 2 && !preset; l++)
        for (int i = 0; i < both[l]->n; i++)
            if (strcmp(both[l]->items[i].def->key, "family") == 0)
                snprintf(o->preset, sizeof o->preset, "%s",
                         strcmp(both[l]->items[i].value, "dit") == 0   ? "dit-tiny"
                         : strcmp(both[l]->items[i].value, "vlm") == 0 ? "vlm-tiny"
                                                                       : "gpt2-tiny");
    loom_status st;
    if (preset && (st = apply(o, preset, err))) return st;
    if (loom_model_preset(&o->model, o->preset, NULL) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': unknown preset (expected one of %s)",
                              preset ? preset->origin : "--model", o->preset,
                              loom_model_preset_names());
    const setting_list *lists[2] = {file, flags};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n; i++)
            if (strcmp(lists[l]->items[i].def->key, "model") != 0)
                if ((st = apply(o, &lists[l]->items[i], err))) return st;
    /* GPT-2 has no grouped-query attention: unless given, key/value heads follow --n-head. */
    int kv_given = 0;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n; i++)
            kv_given |= strcmp(lists[l]->items[i].def->key, "n-kv-head") == 0;
    if (!kv_given && o->model.family != LOOM_FAMILY_LLAMA && o->model.family != LOOM_FAMILY_VLM)
        o->model.n_kv_head = o->model.n_head;
    /* A dit's sequence is its patch tokens (checked against an explicit --seq-len). */
    int seq_given = 0;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n; i++)
            seq_given |= strcmp(lists[l]->items[i].def->key, "seq-len") == 0;
    if (o->model.family == LOOM_FAMILY_DIT && !seq_given)
        o->model.seq_len = loom_model_dit_tokens(&o->model);
    return LOOM_OK;
}

loom_status loom_train_options_parse(loom_train_options *o, int argc, char **argv,
                                     loom_error *err) {
    return loom_train_options_parse_within(o, argc, argv, NULL, err);
}

loom_status loom_train_options_parse_within(loom_train_options *o, int argc, char **argv,
                                            const loom_flag_spec *outer, loom_error *err) {
    memset(o, 0, sizeof *o);
    snprintf(o->preset, sizeof o->preset, "gpt2-tiny");
    loom_train_config_defaults(&o->train);
    setting_list file = {0}, flags = {0};
    char config[LOOM_PATH_MAX] = "";
    loom_status st = parse_flags(&flags, config, &o->help, argc, argv, outer, err);
    if (!st && !o->help && config[0]) st = read_config(&file, config, err);
    if (!st && !o->help) st = apply_all(o, &file, &flags, err);
    free(file.items);
    free(flags.items);
    return st;
}

void loom_train_options_print(const loom_train_options *o, FILE *f) {
    for (int i = 0; i < N_OPTS; i++) {
        const opt_def *d = &OPTS[i];
        const char *base = (const char *)o + d->offset;
        fprintf(f, "%s = ", d->key);
        switch (d->type) {
        case OPT_INT:
        case OPT_BOOL:
            fprintf(f, "%d\n", *(const int *)base);
            break;
        case OPT_FLOAT:
            fprintf(f, "%g\n", (double)*(const float *)base);
            break;
        case OPT_U64:
            fprintf(f, "%" PRIu64 "\n", *(const uint64_t *)base);
            break;
        case OPT_STRING:
        case OPT_LIST:
            fprintf(f, "%s\n", base);
            break;
        case OPT_FAMILY:
            fprintf(f, "%s\n", loom_family_name(*(const loom_family *)base));
            break;
        case OPT_T_SAMPLING:
            fprintf(f, "%s\n", loom_t_sampling_name(*(const loom_t_sampling *)base));
            break;
        case OPT_FREEZE: {
            const int parts = *(const int *)base;
            fprintf(f, "%s%s%s%s\n", parts & LOOM_VLM_PART_VISION ? "vision " : "",
                    parts & LOOM_VLM_PART_PROJECTOR ? "projector " : "",
                    parts & LOOM_VLM_PART_LLM ? "llm" : "", parts ? "" : "none");
            break;
        }
        case OPT_RECOMPUTE:
            fprintf(f, "%s\n", loom_recompute_name(*(const int *)base));
            break;
        }
    }
}

static void usage_line(FILE *f, const opt_def *d) {
    if (strlen(d->key) <= 20)
        fprintf(f, "  --%-20s %s\n", d->key, d->help);
    else
        fprintf(f, "  --%s\n  %-22s %s\n", d->key, "", d->help);
}

void loom_train_options_usage(FILE *f) {
    fprintf(f,
            "usage: loom train [--config FILE] [--KEY VALUE ...]\n\n"
            "Every key is also valid in a --config file as 'key = value' (flags win).\n"
            "  --%-20s %s\n  --%-20s %s\n",
            "config FILE", "INI file of keys ('_' or '-'; [sections] allowed)", "help",
            "this list");
    for (int g = 0; g < N_GROUPS; g++) {
        fprintf(f, "\n%s (%s):\n", GROUPS[g].title, GROUPS[g].page);
        for (int i = 0; i < N_OPTS; i++)
            if (group_has(&GROUPS[g], OPTS[i].key)) usage_line(f, &OPTS[i]);
    }
    int others = 0;
    for (int i = 0; i < N_OPTS; i++) {
        int placed = 0;
        for (int g = 0; g < N_GROUPS && !placed; g++) placed = group_has(&GROUPS[g], OPTS[i].key);
        if (placed) continue;
        if (!others++) fprintf(f, "\nOther keys (see docs/*.md):\n");
        usage_line(f, &OPTS[i]);
    }
}
