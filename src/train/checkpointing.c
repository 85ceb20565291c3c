#include "train/checkpointing.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_loader.h"
#include "ckpt/safetensors.h"
#include "core/clock.h"
#include "core/timeline.h"
#include "core/version.h"
#include "kernels/bf16.h"
#include "model/config_json.h"
#include "model/moe_config.h"
#include "model/vlm_parts.h"
#include "parallel/ep.h"
#include "parallel/ep_zero.h"
#include "train/ckpt_tensors.h"

static volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) {
    g_stop_signal = sig;
}

/* The buffers this rank holds, and in lo/hi the range it owns of each. */
static void held_buffers(const loom_checkpointing *c, loom_ckpt_buffer b[LOOM_CKPT_KINDS]) {
    loom_zero_held_buffers(c->zero, c->params, c->param_shard, b);
}

/* What this rank writes: its dp shard (row-snapped, computed even for ZeRO-0, so a
 * replicated buffer is written once with bytes balanced over the replicas). */
static void written_buffers(const loom_checkpointing *c, loom_ckpt_buffer b[LOOM_CKPT_KINDS]) {
    held_buffers(c, b);
    size_t lo, hi;
    loom_zero_shard_of(c->zero, c->mesh->dp_rank, &lo, &hi);
    for (int k = 0; k < LOOM_CKPT_KINDS; k++) b[k].lo = lo, b[k].hi = hi;
    /* --freeze: the state covers the trainable span, the weights everything */
    loom_zero_param_shard_of(c->zero, c->mesh->dp_rank, &b[0].lo, &b[0].hi);
}

/* The writer of written_buffers' ranges; with expert parallelism the expert tensors
 * (different on each ep rank) are shared out over edp instead (parallel/ep.h). */
static loom_status create_writer(loom_checkpointing *c, loom_error *err) {
    loom_ckpt_buffer b[LOOM_CKPT_KINDS];
    written_buffers(c, b);
    const loom_mesh *mesh = c->mesh;
    if (mesh->ep.size == 1)
        return loom_ckpt_writer_create(&c->writer, &c->tensors, b, mesh->rank, err);
    loom_ckpt_plan plan = {0};
    loom_status st = LOOM_OK;
    for (int k = 0; k < LOOM_CKPT_KINDS && !st; k++)
        st = !b[k].data ? LOOM_OK /* not kept (the average without --ema-decay) */
             : loom_zero_has_expert_segments(c->zero) /* ZeRO 1-2: each rank writes its shard */
                 ? loom_ep_zero_plan_written(c->zero, &c->tensors, &plan, (loom_ckpt_kind)k, err)
                 : loom_ep_plan_written(&plan, loom_zero_table(c->zero), &c->tensors,
                                        (loom_ckpt_kind)k, b[k].lo, b[k].hi, mesh->edp.rank,
                                        mesh->edp.size, err);
    if (st) {
        loom_ckpt_plan_free(&plan);
        return st;
    }
    return loom_ckpt_writer_create_planned(&c->writer, &c->tensors, b, &plan, mesh->rank, err);
}

/* Fresh state (after a failed load attempt): initial parameters, zero moments. */
static void reset_state(loom_checkpointing *c) {
    c->reset = 1;
    c->ema_loaded = 0;
    loom_ckpt_buffer b[LOOM_CKPT_KINDS];
    held_buffers(c, b);
    loom_params_init_range(loom_zero_table(c->zero), b[0].data + (b[0].lo - b[0].base), b[0].lo,
                           b[0].hi, c->tc->seed);
    if (loom_zero_has_expert_segments(c->zero))
        loom_ep_zero_clear_state(c->zero);
    else
        loom_zero_clear_state(c->zero);
}

static json_t *train_json(const loom_train_config *tc) {
    return json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:s}",
                     "micro_batch", tc->micro_batch, "global_batch", tc->global_batch, "steps",
                     tc->steps, "warmup_steps", tc->warmup_steps, "lr", (double)tc->lr, "min_lr",
                     (double)tc->min_lr, "beta1", (double)tc->adamw.beta1, "beta2",
                     (double)tc->adamw.beta2, "adam_eps", (double)tc->adamw.eps, "weight_decay",
                     (double)tc->adamw.weight_decay, "grad_clip", (double)tc->adamw.grad_clip,
                     "data", tc->data, "val_data", tc->val_data);
}

static int same_model(const loom_model_config *a, const loom_model_config *b) {
    return a->family == b->family && a->n_layer == b->n_layer && a->n_head == b->n_head &&
           a->n_kv_head == b->n_kv_head && a->d_model == b->d_model && a->d_ff == b->d_ff &&
           a->vocab_size == b->vocab_size && a->seq_len == b->seq_len &&
           a->channels == b->channels && a->frames == b->frames && a->height == b->height &&
           a->width == b->width && a->patch == b->patch && a->patch_t == b->patch_t &&
           a->n_classes == b->n_classes && a->vit_layers == b->vit_layers &&
           a->vit_d_model == b->vit_d_model && a->vit_n_head == b->vit_n_head &&
           a->vit_d_ff == b->vit_d_ff && a->max_images == b->max_images;
}

/* 1 when the checkpoint holds the weights' moving average (saved with --ema-decay). */
static int has_ema(const loom_checkpointing *c, const loom_ckpt_manifest *m) {
    char name[224]; /* any tensor's: a frozen one (--freeze) has no average of its own */
    for (int i = 0; i < c->tensors.n; i++) {
        loom_ckpt_tensor_name(name, sizeof name, LOOM_CKPT_EMA, c->tensors.items[i].name);
        if (loom_ckpt_manifest_find(m, name)) return 1;
    }
    return 0;
}

/* One attempt: model check, load from the files of dir that manifest m names (origin
 * names it in messages). *wrong_seed: the checkpoint is fine but was saved with another
 * --seed or other MoE settings (not loaded, and no older checkpoint is tried). */
static loom_status load_from(loom_checkpointing *c, const char *dir, const char *origin,
                             const loom_ckpt_manifest *m, int64_t *step, int *wrong_seed,
                             loom_ckpt_load_stats *stats, loom_error *err) {
    loom_model_config saved;
    loom_status st = loom_model_config_from_json(&saved, m->model, origin, err);
    if (st) return st;
    /* The seed decides initialisation and the data order (a pure function of (seed,
     * step)): another seed would silently continue on a different stream of batches, so
     * the run state of the checkpoint wins unless the user says otherwise. */
    *wrong_seed = m->seed != c->tc->seed && !c->tc->resume_ignore_seed;
    if (*wrong_seed) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "--seed %llu: %s was saved with --seed %llu (the seed decides the "
                            "data order); use --seed %llu, or --resume-ignore-seed to continue "
                            "with another data order",
                            (unsigned long long)c->tc->seed, origin, (unsigned long long)m->seed,
                            (unsigned long long)m->seed);
    } else if (!same_model(&saved, c->mc)) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: saved for a different model (%s, %d layers, d_model %d, vocab %d, "
                            "T %d)",
                            origin, loom_family_name(saved.family), saved.n_layer, saved.d_model,
                            saved.vocab_size, saved.seq_len);
    } else if (loom_moe_config_check_same(&saved, c->mc, origin, err)) {
        *wrong_seed = 1; /* a setting to change, not a damaged checkpoint */
        st = LOOM_ERR_INPUT;
    } else {
        loom_ckpt_buffer b[LOOM_CKPT_KINDS];
        held_buffers(c, b);
        /* saved without the average: it starts from the loaded weights (setup.c) */
        if (!has_ema(c, m)) b[LOOM_CKPT_EMA].data = NULL;
        double t0 = loom_now_ms();
        st = loom_zero_has_expert_segments(c->zero)
                 ? loom_ep_zero_load(c->zero, &c->tensors, dir, m, b[0].data,
                                     b[LOOM_CKPT_EMA].data != NULL, stats, err)
                 : loom_ckpt_load(dir, m, &c->tensors, b, stats, err);
        *step = m->step;
        c->ema_loaded = !st && b[LOOM_CKPT_EMA].data != NULL;
        if (!st && c->mesh->rank == 0)
            fprintf(stderr, "loom: rank 0 loaded %llu bytes (%d chunks) in %.1f ms\n",
                    (unsigned long long)stats->bytes_read, stats->chunks_read, loom_now_ms() - t0);
        if (!st && m->seed != c->tc->seed && c->mesh->rank == 0)
            fprintf(stderr,
                    "loom: warning: %s was saved with --seed %llu, this run uses %llu "
                    "(--resume-ignore-seed: the data order differs from the saved run's)\n",
                    dir, (unsigned long long)m->seed, (unsigned long long)c->tc->seed);
    }
    return st;
}

/* One attempt from a checkpoint folder: its manifest, then load_from. */
/* *unfinished: dir has no manifest.json, the commit's last file: its writer never completed
 * it (a crash or a kill during the save), so it is passed over, not damaged. */
static loom_status try_load(loom_checkpointing *c, const char *dir, int64_t *step, int *wrong_seed,
                            int *unfinished, loom_ckpt_load_stats *stats, loom_error *err) {
    char path[LOOM_CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    loom_ckpt_manifest m;
    *wrong_seed = 0;
    struct stat sb;
    *unfinished = stat(path, &sb) != 0 && errno == ENOENT;
    if (*unfinished)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: unfinished (no manifest.json: its writer never completed it)",
                              dir);
    loom_status st = loom_ckpt_manifest_load(&m, path, 0, err);
    if (st) return st;
    st = load_from(c, dir, path, &m, step, wrong_seed, stats, err);
    loom_ckpt_manifest_free(&m);
    return st;
}

/* One collective attempt at a checkpoint: this rank's load, and the verdict summed over
 * the ranks, so that every rank takes the same branch after it. */
typedef struct {
    loom_status ls; /* this rank's load; e says why it failed */
    loom_error e;
    int64_t step;
    int wrong_seed, unfinished;    /* this rank's, as try_load sets them */
    double failed;                 /* ranks whose load failed (the refusing ones too) */
    double refused;                /* ranks that refused its settings: no older one is tried */
    double bytes, chunks, seconds; /* read and spent loading, summed over the ranks */
} load_verdict;

/* Every rank calls it with the same dir. m: a manifest already in memory (peer memory),
 * named origin in messages; NULL: dir's own manifest.json (try_load). */
static loom_status load_all_ranks(loom_checkpointing *c, const char *dir, const char *origin,
                                  const loom_ckpt_manifest *m, load_verdict *v, loom_error *err) {
    memset(v, 0, sizeof *v);
    loom_ckpt_load_stats stats = {0};
    const double t0 = loom_now_ms();
    v->ls = m ? load_from(c, dir, origin, m, &v->step, &v->wrong_seed, &stats, &v->e)
              : try_load(c, dir, &v->step, &v->wrong_seed, &v->unfinished, &stats, &v->e);
    double sum[5] = {v->ls != LOOM_OK, v->wrong_seed, (double)stats.bytes_read, stats.chunks_read,
                     (loom_now_ms() - t0) / 1e3};
    loom_status st = loom_comm_allreduce_sum_f64(&c->mesh->world, sum, 5, err);
    v->failed = sum[0];
    v->refused = sum[1];
    v->bytes = sum[2];
    v->chunks = sum[3];
    v->seconds = sum[4];
    return st;
}

/* The error of a refused checkpoint: this rank's reason, or that another rank refused. */
static loom_status refused(const load_verdict *v, loom_error *err) {
    return v->wrong_seed ? loom_error_set(err, LOOM_ERR_INPUT, "%s", v->e.msg)
                         : loom_error_set(err, LOOM_ERR_INPUT,
                                          "--resume: another rank refused the checkpoint's "
                                          "settings");
}

/* Candidates newest first: a step folder itself, or the step folders of tier folders. */
static int candidates(const loom_train_config *tc, loom_ckpt_entry **list) {
    int n = 0;
    if (strcmp(tc->resume, "auto") != 0) {
        char m[LOOM_PATH_MAX + 16];
        snprintf(m, sizeof m, "%s/manifest.json", tc->resume);
        struct stat sb;
        if (stat(m, &sb) == 0) {
            *list = calloc(1, sizeof **list);
            if (!*list) return -1;
            snprintf((*list)[0].path, sizeof(*list)[0].path, "%s", tc->resume);
            return 1;
        }
        return loom_ckpt_list(tc->resume, list, 0);
    }
    if (tc->ckpt_dir[0]) n = loom_ckpt_list(tc->ckpt_dir, list, n);
    if (n >= 0 && tc->ckpt_fast_dir[0]) n = loom_ckpt_list(tc->ckpt_fast_dir, list, n);
    /* newest first across both tiers (stable insertion sort: few entries) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (*list)[j].step > (*list)[j - 1].step; j--) {
            loom_ckpt_entry t = (*list)[j];
            (*list)[j] = (*list)[j - 1];
            (*list)[j - 1] = t;
        }
    return n;
}

/* --ckpt-peer: the newest complete checkpoint in the hosts' memory, when it is at least
 * as new as disk_newest (rank 0's newest step on disk). *loaded 1: loaded; 0: not (why:
 * rank 0's reason; *tried when a load failed and left the buffers half-written). */
static loom_status resume_from_peers(loom_checkpointing *c, int64_t disk_newest, int *start_step,
                                     int *loaded, int *tried, char *why, loom_error *err) {
    loom_ckpt_manifest m;
    loom_ckpt_peer_found found;
    *loaded = 0;
    const double t0 = loom_now_ms();
    loom_status st = loom_ckpt_peer_restore(&c->peer, disk_newest, &m, &found, err);
    if (st) return st;
    const double t_restored = loom_now_ms();
    snprintf(why, 512, "%s", found.why);
    if (!found.use) return LOOM_OK;
    char origin[LOOM_PATH_MAX + 200];
    snprintf(origin, sizeof origin, "%s (peer memory)", found.dir);
    load_verdict v;
    st = load_all_ranks(c, found.dir, origin, &m, &v, err);
    loom_ckpt_manifest_free(&m);
    if (st) return st;
    if (v.refused > 0) return refused(&v, err);
    if (v.failed > 0) {
        if (v.ls)
            fprintf(stderr, "loom: rank %d: checkpoint %s not usable: %s\n", c->mesh->rank, origin,
                    v.e.msg);
        snprintf(why, 512, "step %lld in peer memory failed to load", (long long)found.step);
        *tried = 1;
        return LOOM_OK;
    }
    *start_step = (int)v.step;
    *loaded = 1;
    c->loaded = 1;
    if (c->mesh->rank == 0) {
        fprintf(stderr,
                "loom: resume source: peer memory, step %lld: %.0f bytes (%.0f chunks) read from "
                "memory on %d host(s) by %d rank(s), 0 bytes (0 chunks) from disk; %d shard "
                "cop%s (%llu bytes) sent between hosts over MPI to complete each host's set of "
                "%d; the copies took %.2f s, the load %.2f s (mean over the ranks)\n",
                (long long)v.step, v.bytes, v.chunks, c->peer.n_hosts, c->mesh->size,
                found.shards_copied, found.shards_copied == 1 ? "y" : "ies",
                (unsigned long long)found.bytes_copied, found.world, (t_restored - t0) / 1e3,
                v.seconds / c->mesh->size);
        fprintf(stderr, "loom: resumed from peer memory %s (step %lld)\n", found.dir,
                (long long)v.step);
    }
    return LOOM_OK;
}

static loom_status resume(loom_checkpointing *c, int *start_step, loom_error *err) {
    const int lead = c->mesh->rank == 0;
    loom_ckpt_entry *list = NULL;
    int n = lead ? candidates(c->tc, &list) : 0;
    double nd = n;
    loom_status st = loom_comm_bcast(&c->mesh->world, &nd, sizeof nd, 0, err);
    if (st) return st;
    n = (int)nd;
    if (n < 0) return loom_error_set(err, LOOM_ERR_NOMEM, "--resume: out of memory");
    const int explicit_path = strcmp(c->tc->resume, "auto") != 0;
    int tried = 0;
    char peer_why[512] = "";
    if (c->peer.enabled && !explicit_path) {
        int loaded = 0;
        int64_t disk_newest = -1; /* the newest complete one (a manifest) on disk */
        for (int i = 0; lead && i < n && disk_newest < 0; i++) {
            char mp[LOOM_CKPT_PATH_MAX + 16];
            struct stat sb;
            snprintf(mp, sizeof mp, "%s/manifest.json", list[i].path);
            if (stat(mp, &sb) == 0) disk_newest = list[i].step;
        }
        st = resume_from_peers(c, disk_newest, start_step, &loaded, &tried, peer_why, err);
        if (st || loaded) {
            free(list);
            return st;
        }
    }
    for (int i = 0; i < n; i++) {
        char dir[LOOM_CKPT_PATH_MAX] = "";
        if (lead) snprintf(dir, sizeof dir, "%s", list[i].path);
        if ((st = loom_comm_bcast(&c->mesh->world, dir, sizeof dir, 0, err))) break;
        load_verdict v;
        if ((st = load_all_ranks(c, dir, NULL, NULL, &v, err))) break;
        if (v.refused > 0) { /* not a damaged checkpoint: no older one is tried */
            free(list);
            return refused(&v, err);
        }
        if (v.failed == 0) {
            *start_step = (int)v.step;
            c->loaded = 1;
            snprintf(c->loaded_dir, sizeof c->loaded_dir, "%s", dir);
            if (lead && c->peer.enabled)
                fprintf(stderr,
                        "loom: resume source: disk, step %lld: %.0f bytes (%.0f chunks) read from "
                        "%s by %d rank(s), 0 bytes from peer memory%s%s%s; the load took %.2f s "
                        "(mean over the ranks)\n",
                        (long long)v.step, v.bytes, v.chunks, dir, c->mesh->size,
                        peer_why[0] ? " (" : "", peer_why, peer_why[0] ? ")" : "",
                        v.seconds / c->mesh->size);
            if (lead)
                fprintf(stderr, "loom: resumed from %s (step %lld)\n", dir, (long long)v.step);
            free(list);
            return LOOM_OK;
        }
        if (v.unfinished) /* ft/supervisor.c's scan_rejected reads both lines */
            fprintf(stderr,
                    "loom: rank %d: checkpoint %s unfinished, ignored (no manifest.json: its "
                    "writer never completed it)\n",
                    c->mesh->rank, dir);
        else if (v.ls)
            fprintf(stderr, "loom: rank %d: checkpoint %s not usable: %s\n", c->mesh->rank, dir,
                    v.e.msg);
        /* A failed load may have written part of the buffers; the next one that loads
         * overwrites all of them, so the fresh state is made only if none does (below). */
        tried = 1;
        if (explicit_path && n == 1) {
            reset_state(c);
            free(list);
            return loom_error_set(err, v.ls ? v.ls : LOOM_ERR_INPUT, "--resume %s: %s",
                                  c->tc->resume, v.ls ? v.e.msg : "another rank could not load it");
        }
    }
    free(list);
    if (tried) reset_state(c);
    if (st) return st;
    if (explicit_path)
        return loom_error_set(err, LOOM_ERR_INPUT, "--resume %s: no valid checkpoint there",
                              c->tc->resume);
    if (lead)
        fprintf(stderr, "loom: --resume auto: no valid checkpoint in %s%s%s: starting fresh\n",
                c->tc->ckpt_dir, c->tc->ckpt_dir[0] && c->tc->ckpt_fast_dir[0] ? " or " : "",
                c->tc->ckpt_fast_dir);
    return LOOM_OK;
}

/* --init-from: every parameter this rank holds from a safetensors file of global tensors
 * under Hugging Face names (F32, or BF16 widened exactly); optimizer state starts at zero. */
static loom_status import_weights(loom_checkpointing *c, loom_error *err) {
    loom_safetensors f;
    loom_status st = loom_safetensors_open(&f, c->tc->init_from, err);
    if (st) return st;
    loom_ckpt_buffer b[LOOM_CKPT_KINDS];
    held_buffers(c, b);
    loom_ckpt_plan plan = {0};
    /* a vlm loads the parts the file holds (a trained LLM, an encoder, a whole vlm); the
     * others keep their initialisation */
    const int absent = c->mc->family == LOOM_FAMILY_VLM ? loom_vlm_parts_absent(&f) : 0;
    if (absent == LOOM_VLM_PARTS_ALL) {
        loom_safetensors_close(&f);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--init-from %s: holds no part of a vlm (expected vision.*, "
                              "projector.* or model.* tensors)",
                              c->tc->init_from);
    }
    st = loom_ckpt_plan_range(&plan, &c->tensors, LOOM_CKPT_PARAMS, b[0].lo, b[0].hi, 0, 0, err);
    for (int i = 0; i < plan.n && !st; i++) {
        const loom_ckpt_piece *q = &plan.items[i];
        const loom_ckpt_desc *p = &c->tensors.items[q->tensor];
        if (absent & (int)loom_vlm_param_part(p->name)) continue;
        const void *src;
        loom_dtype dtype;
        const int64_t *g = p->global_shape;
        if ((st =
                 loom_safetensors_get_float(&f, p->name, (size_t)(g[0] * g[1]), &dtype, &src, err)))
            break;
        for (int64_t r = 0; r < q->box.len[0]; r++) {
            float *dst = b[0].data + (q->local + (size_t)(r * q->stride) - b[0].base);
            const size_t at = (size_t)((q->box.off[0] + r) * g[1] + q->box.off[1]);
            if (dtype == LOOM_DTYPE_BF16) /* widened exactly */
                loom_bf16_to_f32_n(dst, (const loom_bf16 *)src + at, (size_t)q->box.len[1]);
            else
                memcpy(dst, (const float *)src + at, (size_t)q->box.len[1] * sizeof(float));
        }
    }
    loom_ckpt_plan_free(&plan);
    loom_safetensors_close(&f);
    if (!st && c->mesh->rank == 0)
        fprintf(stderr, "loom: parameters from %s (optimizer state fresh)%s%s%s%s\n",
                c->tc->init_from, absent ? "; not in the file, kept from initialisation:" : "",
                absent & LOOM_VLM_PART_VISION ? " vision" : "",
                absent & LOOM_VLM_PART_PROJECTOR ? " projector" : "",
                absent & LOOM_VLM_PART_LLM ? " llm" : "");
    return st ? loom_error_prefix(err, "--init-from") : LOOM_OK;
}

loom_status loom_checkpointing_open(loom_checkpointing *c, const loom_model_config *mc,
                                    const loom_train_config *tc, loom_mesh *mesh, loom_zero *zero,
                                    float *params, float *param_shard, int *start_step,
                                    loom_error *err) {
    memset(c, 0, sizeof *c);
    c->mc = mc;
    c->tc = tc;
    c->mesh = mesh;
    c->zero = zero;
    c->params = params;
    c->param_shard = param_shard;
    c->last_saved = -1;
    *start_step = 0;
    loom_status st = loom_ckpt_tensors_describe(&c->tensors, loom_zero_table(zero), err);
    const loom_ckpt_peer_options po = {tc->ckpt_peer,
                                       tc->ckpt_peer_dir,
                                       tc->ckpt_dir[0] ? tc->ckpt_dir : tc->ckpt_fast_dir,
                                       mesh->rank,
                                       mesh->size,
                                       mesh->world.mpi,
                                       loom_world_thread_level(),
                                       loom_world_thread_level_name(loom_world_thread_level())};
    if (!st) st = loom_ckpt_peer_open(&c->peer, &po, err);
    if (!st && tc->init_from[0]) st = import_weights(c, err);
    if (!st && tc->resume[0]) st = resume(c, start_step, err);
    /* --init-from with --resume (loom rl under loom run): a failed load's fresh state is the
     * imported weights again */
    if (!st && c->reset && tc->init_from[0]) st = import_weights(c, err);
    /* The per-step collective result decides, so a failure on one rank fails all. */
    double bad = st != LOOM_OK;
    loom_status cs = loom_comm_allreduce_sum_f64(&mesh->world, &bad, 1, err);
    if (st || cs) return st ? st : cs;
    if (bad > 0) return loom_error_set(err, LOOM_ERR_INPUT, "another rank failed to load");
    /* Every rank has loaded: what memory holds of other steps (a lost future, an older
     * save) would only confuse a later restart. */
    loom_ckpt_peer_keep_only(&c->peer, *start_step > 0 ? *start_step : -1);
    loom_timeline_mark("ckpt_load");
    c->last_saved = *start_step > 0 ? *start_step : -1;
    c->enabled = tc->ckpt_dir[0] || tc->ckpt_fast_dir[0];
    if (!c->enabled) return LOOM_OK;
    if ((st = create_writer(c, err))) return st;
    c->writer_ready = 1;
    g_stop_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return LOOM_OK;
}

/* One collective attempt at the step folder dir: 1 loaded, 0 not complete there (the
 * buffers untouched), -1 the load failed (the buffers may be partly overwritten). */
static loom_status load_dir(loom_checkpointing *c, const char *dir, int *loaded, loom_error *err) {
    char path[LOOM_CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct stat sb;
    double there = c->mesh->rank == 0 && stat(path, &sb) == 0;
    loom_status st = loom_comm_bcast(&c->mesh->world, &there, sizeof there, 0, err);
    *loaded = 0;
    if (st || !there) return st;
    load_verdict v;
    if ((st = load_all_ranks(c, dir, NULL, NULL, &v, err))) return st;
    /* a refused one counts as failed here: load_step goes back to the state before it */
    if (v.ls)
        fprintf(stderr, "loom: rank %d: checkpoint %s not usable: %s\n", c->mesh->rank, dir,
                v.e.msg);
    *loaded = v.failed > 0 ? -1 : 1;
    return LOOM_OK;
}

loom_status loom_checkpointing_load_step(loom_checkpointing *c, const char *tier, int step,
                                         int back, int *loaded, loom_error *err) {
    char dir[LOOM_CKPT_PATH_MAX];
    loom_ckpt_step_dir(dir, sizeof dir, tier, step);
    loom_status st = load_dir(c, dir, loaded, err);
    if (st || *loaded >= 0) {
        if (!st && *loaded == 1) {
            c->last_saved = step;
            snprintf(c->loaded_dir, sizeof c->loaded_dir, "%s", dir);
            if (c->mesh->rank == 0)
                fprintf(stderr, "loom: resumed from %s (step %d) instead\n", dir, step);
        }
        return st;
    }
    /* the buffers were partly overwritten: the state before again (back 0: the fresh one) */
    *loaded = 0;
    if (back <= 0) {
        reset_state(c);
        return LOOM_OK;
    }
    int again = 0;
    if (c->loaded_dir[0]) /* the folder the state came from (either tier) */
        snprintf(dir, sizeof dir, "%s", c->loaded_dir);
    else
        loom_ckpt_step_dir(dir, sizeof dir, tier, back);
    if ((st = load_dir(c, dir, &again, err))) return st;
    if (again == 1) return LOOM_OK;
    reset_state(c);
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "--resume: the checkpoints of steps %d and %d failed to load (each "
                          "rank's line says why)",
                          step, back);
}

/* The run state of a save at `step` (a manifest without files or tensors). */
static void run_state(const loom_checkpointing *c, int64_t step, loom_ckpt_manifest *run) {
    memset(run, 0, sizeof *run);
    const loom_train_config *tc = c->tc;
    const loom_layout *l = &c->mesh->layout;
    run->step = step;
    run->tokens_seen = step * (int64_t)tc->global_batch * c->mc->seq_len;
    run->seed = tc->seed;
    run->layout = (loom_ckpt_layout){l->dp,         l->tp, l->pp, l->ep, loom_zero_stage(c->zero),
                                     c->mesh->size, l->cp};
    run->model = loom_model_config_to_json(c->mc);
    snprintf(run->version, sizeof run->version, "%s", LOOM_VERSION);
    run->train = train_json(tc);
}

/* --ckpt-peer: every rank's memory copies of the save are done (peer_failed: some failed). */
static void peer_finished(loom_checkpointing *c, int peer_failed) {
    if (!c->peer.enabled) return;
    loom_error e = {0};
    if (loom_ckpt_peer_wait(&c->peer, &e))
        fprintf(stderr, "loom: rank %d: checkpoint copy to memory failed: %s\n", c->mesh->rank,
                e.msg);
    if (peer_failed) {
        if (c->mesh->rank == 0)
            fprintf(stderr,
                    "loom: checkpoint step %lld not complete in peer memory (a rank's copy "
                    "failed); the previous one stays there\n",
                    (long long)c->flight_step);
        return;
    }
    loom_ckpt_peer_keep_only(&c->peer, c->flight_step);
    if (c->mesh->rank == 0)
        fprintf(stderr,
                "loom: checkpoint step %lld in peer memory (rank 0, background): %llu bytes on "
                "%s, %llu bytes received from the previous host, in %.1f ms\n",
                (long long)c->flight_step, (unsigned long long)c->peer.own_bytes, c->peer.host,
                (unsigned long long)c->peer.recv_bytes, c->peer.ms);
}

/* Every rank's write is done (sum of done flags known): rank 0 commits in the background. */
static loom_status write_finished(loom_checkpointing *c, int failed, int peer_failed,
                                  loom_error *err) {
    c->in_flight = 0;
    peer_finished(c, peer_failed);
    loom_error e = {0};
    loom_status own = loom_ckpt_writer_wait(&c->writer, &e);
    if (own) fprintf(stderr, "loom: rank %d: checkpoint write failed: %s\n", c->mesh->rank, e.msg);
    if (failed) {
        c->failures++;
        if (c->mesh->rank == 0)
            fprintf(stderr,
                    "loom: checkpoint %s not committed (a rank's write failed); the "
                    "previous checkpoint stays the newest\n",
                    c->flight_dir);
        return LOOM_OK;
    }
    if (c->mesh->rank != 0) return LOOM_OK;
    const loom_ckpt_writer *w = &c->writer;
    fprintf(stderr,
            "loom: checkpoint step %lld written (rank 0, background): staging copy + checksums "
            "%.1f ms (cpu %.1f); %llu bytes in %.1f ms (write %.1f, fsync %.1f; cpu %.1f)%s\n",
            (long long)c->flight_step, w->stage_ms, w->stage_cpu_ms,
            (unsigned long long)w->written_bytes, w->write_ms, w->data_write_ms, w->fsync_ms,
            w->write_cpu_ms, w->direct_io ? " direct I/O" : "");
    loom_ckpt_manifest run;
    run_state(c, c->flight_step, &run);
    const int keep = c->tc->ckpt_keep;
    return loom_ckpt_writer_start_commit(&c->writer, c->flight_dir, c->flight_tier, keep,
                                         c->mesh->size, &run, err);
}

/* Rank 0: the previous commit's outcome (reported, never fatal: the previous checkpoint
 * stays the newest valid one). */
static void report_commit(loom_checkpointing *c) {
    if (c->mesh->rank != 0) return;
    loom_error e = {0};
    if (loom_ckpt_writer_wait(&c->writer, &e)) {
        c->failures++;
        fprintf(stderr, "loom: checkpoint commit failed: %s\n", e.msg);
    }
}

/* Sums (stop, done, failed, memory copy failed) over the world. */
static loom_status exchange(loom_checkpointing *c, double v[4], loom_error *err) {
    v[0] = g_stop_signal != 0;
    v[1] = c->in_flight && loom_ckpt_writer_idle(&c->writer) &&
           (!c->peer.enabled || loom_ckpt_peer_idle(&c->peer));
    v[2] = v[1] && c->writer.worker.failed;
    v[3] = v[1] && c->peer.enabled && c->peer.worker.failed;
    return loom_comm_allreduce_sum_f64(&c->mesh->world, v, 4, err);
}

/* Waits for the save in flight (every rank) and starts its commit. */
static loom_status drain_write(loom_checkpointing *c, loom_error *err) {
    c->staging = 0;
    if (!c->in_flight) return LOOM_OK;
    loom_ckpt_writer_wait(&c->writer, NULL);
    if (c->peer.enabled) loom_ckpt_peer_wait(&c->peer, NULL);
    double v[4];
    loom_status st = exchange(c, v, err);
    if (st) return st;
    return write_finished(c, v[2] > 0, v[3] > 0, err);
}

static loom_status save(loom_checkpointing *c, int step, const char *tier, loom_error *err) {
    double t0 = loom_now_ms();
    if (!c->in_flight && !loom_ckpt_writer_idle(&c->writer)) c->commit_waits++; /* rank 0 */
    if (c->in_flight) {
        c->waits++;
        if (c->mesh->rank == 0)
            fprintf(stderr,
                    "loom: step %d: the previous checkpoint is still being written; "
                    "waiting for it\n",
                    step);
    }
    loom_status st = drain_write(c, err);
    if (st) return st;
    report_commit(c); /* rank 0: the commit must finish before the buffer is reused */
    double t1 = loom_now_ms();
    c->wait_ms_total += t1 - t0;
    loom_ckpt_step_dir(c->flight_dir, sizeof c->flight_dir, tier, step);
    snprintf(c->flight_tier, sizeof c->flight_tier, "%s", tier);
    if ((st = loom_ckpt_writer_start(&c->writer, c->flight_dir, err))) return st;
    if (c->peer.enabled) { /* the memory copy starts once the staging copy is done */
        loom_ckpt_manifest run;
        run_state(c, step, &run);
        char *text = loom_ckpt_manifest_dump(&run, 0);
        loom_ckpt_manifest_free(&run);
        if (!text) return loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
        if ((st = loom_ckpt_peer_start(&c->peer, &c->writer, step, text, err))) return st;
    }
    c->in_flight = 1;
    c->staging = 1;
    c->flight_step = step;
    c->last_saved = step;
    c->saves++;
    c->stall_ms_pending = loom_now_ms() - t0; /* the waits above count as stall too */
    return LOOM_OK;
}

void loom_checkpointing_before_update(loom_checkpointing *c) {
    if (!c->staging) return;
    c->staging = 0;
    const double stall = c->stall_ms_pending + loom_ckpt_writer_wait_staged(&c->writer);
    c->stall_ms_last = stall;
    c->stall_ms_total += stall;
    c->stalls++;
    if (stall > c->stall_ms_max) c->stall_ms_max = stall;
    if (c->mesh->rank == 0)
        fprintf(stderr, "loom: checkpoint step %lld: training stall %.1f ms\n",
                (long long)c->flight_step, stall);
}

/* Where the periodic save after step `step` goes (--ckpt-dir first), or NULL: none, or
 * the last step, whose save loom_checkpointing_finish makes. */
static const char *periodic_dir(const loom_checkpointing *c, int step) {
    const loom_train_config *tc = c->tc;
    if (step == tc->steps) return NULL;
    if (tc->ckpt_dir[0] && tc->ckpt_every > 0 && step % tc->ckpt_every == 0) return tc->ckpt_dir;
    if (tc->ckpt_fast_dir[0] && tc->ckpt_fast_every > 0 && step % tc->ckpt_fast_every == 0)
        return tc->ckpt_fast_dir;
    return NULL;
}

loom_status loom_checkpointing_step(loom_checkpointing *c, int step, int *stop, loom_error *err) {
    *stop = 0;
    if (!c->enabled) return LOOM_OK;
    double v[4];
    loom_status st = exchange(c, v, err);
    if (st) return st;
    if (c->in_flight && v[1] == c->mesh->size && (st = write_finished(c, v[2] > 0, v[3] > 0, err)))
        return st;
    if (v[0] > 0) {
        *stop = 1;
        if (c->mesh->rank == 0)
            fprintf(stderr, "loom: stop requested (signal) after step %d: saving, then exiting\n",
                    step);
        return LOOM_OK;
    }
    const char *dir = periodic_dir(c, step);
    return dir ? save(c, step, dir, err) : LOOM_OK;
}

int loom_checkpointing_saves_at(const loom_checkpointing *c, int step) {
    return c->enabled && periodic_dir(c, step) != NULL;
}

const char *loom_checkpointing_tier(const loom_checkpointing *c, int step, int final) {
    if (!c->enabled) return NULL;
    if (!final) return periodic_dir(c, step);
    return c->tc->ckpt_dir[0] ? c->tc->ckpt_dir : c->tc->ckpt_fast_dir;
}

loom_status loom_checkpointing_finish(loom_checkpointing *c, int step, loom_error *err) {
    if (!c->enabled) return LOOM_OK;
    loom_status st = LOOM_OK;
    const int failures = c->failures;
    if (c->last_saved != step) st = save(c, step, loom_checkpointing_tier(c, step, 1), err);
    if (!st) st = drain_write(c, err);
    if (st) return st;
    report_commit(c);
    if (c->mesh->rank == 0) {
        fprintf(stderr,
                "loom: checkpoints: %d saved, training stall per save %.1f ms (max %.1f, over "
                "%d saves before an update), waited for the previous save %d time(s) and for "
                "its commit %d time(s) (%.1f ms in all), %d failed\n",
                c->saves, c->stalls ? c->stall_ms_total / c->stalls : 0.0, c->stall_ms_max,
                c->stalls, c->waits, c->commit_waits, c->wait_ms_total, c->failures);
        if (c->failures == failures && c->saves > 0)
            fprintf(stderr, "loom: checkpoint written to %s\n", c->flight_dir);
    }
    double bad = c->failures > failures;
    if ((st = loom_comm_allreduce_sum_f64(&c->mesh->world, &bad, 1, err))) return st;
    if (bad > 0)
        return loom_error_set(err, LOOM_ERR_IO, "the final checkpoint %s was not committed",
                              c->flight_dir);
    return LOOM_OK;
}

void loom_checkpointing_close(loom_checkpointing *c) {
    loom_ckpt_peer_close(&c->peer); /* first: its thread reads the writer's image */
    if (c->writer_ready) loom_ckpt_writer_destroy(&c->writer);
    loom_ckpt_descs_free(&c->tensors);
    if (c->enabled) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
    }
    memset(c, 0, sizeof *c);
}
