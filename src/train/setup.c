/* A training run's setup: every choice that depends on the layout is made here, once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_dir.h"
#include "comm/world.h"
#include "core/fs.h"
#include "core/progress.h"
#include "core/timeline.h"
#include "model/gemm_shapes.h"
#include "model/moe_config.h"
#include "model/vlm.h"
#include "parallel/ep_zero.h"
#include "parallel/tp_shards.h"
#include "train/dp_balance.h"
#include "train/dump.h"
#include "train/run.h"

void loom_run_free(loom_run *r) {
    if (r->outer_on) loom_outer_free(&r->outer);
    r->outer_on = 0;
    loom_checkpointing_close(&r->ckpt); /* first: its writer thread reads the buffers below */
    loom_param_gather_free(&r->pg);     /* and no gather into them stays in flight */
    if (r->pipelined) loom_pipeline_free(r->pipelined);
    loom_dp_balance_free(r);
    loom_batch_source_close(&r->data);
    loom_batch_source_close(&r->val);
    loom_model_destroy(&r->model);
    if (r->sharded)
        loom_fsdp_free(r->sharded);
    else if (loom_run_on_device(r))
        loom_backend_free(r->be, r->params);
    else
        free(r->params);
    loom_grad_sync_free(&r->sync);
    loom_zero_grads_free(&r->zero, r->grads);
    loom_ep_zero_detach(&r->zero);
    loom_zero_free(&r->zero);
    free(r->batch);
    free(r->dump_batches);
    loom_route_dump_free(&r->routes);
    loom_metrics_close(&r->metrics);
    loom_trace_close(r->trace);
    loom_tb_close(r->tb);
    loom_tp_free(&r->tp);
    if (r->cped) loom_cp_free(r->cped);
    loom_params_free(&r->global_table);
    free(r->global_flat);
    free(r->host_flat);
    if (r->be && loom_backend_precision(r->be) == LOOM_PRECISION_BF16 && r->mesh &&
        r->mesh->rank == 0 && !r->size_only) {
        char line[256];
        loom_backend_cpu_bf16_describe(r->be, line, sizeof line);
        fprintf(stderr, "loom: precision bf16 at the end: %s\n", line);
    }
    loom_backend_close(r->be); /* last: everything above may free its memory */
}

int loom_run_on_device(const loom_run *r) {
    return r->be && r->be->device != LOOM_DEVICE_CPU;
}

/* A dit's image shards must hold samples of the model's shape and classes. */
static loom_status check_images(const loom_batch_source *s, const char *flag, const char *glob,
                                const loom_model_config *mc, loom_error *err) {
    const loom_image_dataset *d = &s->images;
    if (d->frames == mc->frames && d->channels == mc->channels && d->height == mc->height &&
        d->width == mc->width && (d->n_classes == mc->n_classes || mc->n_classes == 0))
        return LOOM_OK; /* an unconditional model (--n-classes 0) ignores the labels */
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "%s '%s': samples are %d x %d x %d x %d (frames x channels x height x "
                          "width) with %d classes, the model expects %d x %d x %d x %d with %d "
                          "(set --frames %d --channels %d --height %d --width %d --n-classes %d)",
                          flag, glob, d->frames, d->channels, d->height, d->width, d->n_classes,
                          mc->frames, mc->channels, mc->height, mc->width, mc->n_classes, d->frames,
                          d->channels, d->height, d->width, d->n_classes);
}

/* Training and validation batches: token windows for a language model, flow-matching
 * records of image/clip shards for a dit. */
static loom_status open_data(loom_run *r, loom_error *err) {
    const loom_model_config *mc = r->mc;
    const loom_train_config *tc = r->tc;
    const char *globs[2] = {tc->data, tc->val_data}, *flags[2] = {"--data", "--val-data"};
    loom_batch_source *dst[2] = {&r->data, &r->val};
    loom_flow_options flow = tc->flow;
    flow.n_classes = mc->n_classes;
    loom_status st = LOOM_OK;
    for (int i = 0; i < 2 && !st; i++) {
        if (!globs[i][0]) continue;
        if (mc->family == LOOM_FAMILY_VLM) {
            const loom_vlm_record_shape shape = {mc->seq_len,    loom_vlm_image_tokens(mc),
                                                 mc->max_images, mc->channels,
                                                 mc->height,     mc->width};
            if ((st = loom_batch_source_open_vlm(dst[i], globs[i], &shape, mc->vocab_size, err)))
                st = loom_error_prefix(err, "%s", flags[i]);
        } else if (mc->family != LOOM_FAMILY_DIT) {
            st = loom_batch_source_open_tokens(dst[i], globs[i], mc->vocab_size, mc->seq_len, err);
        } else if (!(st = loom_batch_source_open_flow(dst[i], globs[i], &flow, err))) {
            st = check_images(dst[i], flags[i], globs[i], mc, err);
        } else {
            st = loom_error_prefix(err, "%s", flags[i]);
        }
    }
    return st;
}

/* Context parallelism (--cp > 1): the attention over the cp group, for the heads this
 * tensor-parallel rank holds. */
static loom_status build_cp(loom_run *r, loom_error *err) {
    const loom_model_config *mc = r->mc;
    const loom_train_config *tc = r->tc;
    const int tp = r->mesh->layout.tp;
    loom_cp_mode mode;
    loom_status st;
    if (r->mesh->layout.cp == 1) return LOOM_OK;
    if ((st = loom_train_config_validate_cp(tc, mc, err)) ||
        (st = loom_cp_mode_parse(tc->cp_mode, &mode, err)))
        return st;
    /* every family rounds qkv (after RoPE) under bf16: the condition of
     * loom_model_bf16_pre_activations; the language models' blocks also round attention's
     * gradients (model/transformer.c), the DiT's do not */
    const int bf16 = r->be && loom_backend_precision(r->be) == LOOM_PRECISION_BF16 &&
                     r->be->ops->round_bf16_values != NULL;
    const loom_cp_options o = {.mode = mode,
                               .causal = mc->family != LOOM_FAMILY_DIT,
                               .B = tc->micro_batch,
                               .T = mc->seq_len,
                               .H = mc->n_head / tp,
                               .KV = mc->n_kv_head / tp,
                               .hd = mc->d_model / mc->n_head,
                               .bf16_qkv = bf16,
                               .bf16_grads = bf16 && mc->family != LOOM_FAMILY_DIT};
    loom_status (*make)(loom_cp *, loom_comm *, const loom_cp_options *, const loom_backend *,
                        loom_error *) = r->size_only ? loom_cp_size : loom_cp_create;
    if ((st = make(&r->cp, &r->mesh->cp, &o, loom_backend_cpu(), err))) return st;
    r->cp.err = err;
    r->cped = &r->cp;
    return LOOM_OK;
}

/* Whether this run reduces every micro-batch into the shard (--grad-accum sharded, stages
 * 2, 3): asked for, or the default (auto) at ZeRO-3, FSDP's behaviour (train_config.h:
 * loom_train_config_sharded_accum, which loom plan prices too; else local, as at ZeRO-2:
 * Megatron-LM's; docs/memory.md says why). Every family, also in a pipeline
 * (pipeline/executor.c: each action completing a micro-batch reduces its stage's ranges):
 * a vlm's encoder and projector go with the first stage's embedding range (--vision-
 * schedule bubbles adds the replicas' gradients into the last micro-batch's); a dit's
 * embedders too, its final layer is the last stage's head range, and its conditioning's
 * gradient travels back with the stream (dcond), so each stage's ranges are final when
 * the action ends. */
static int sharded_accum_wanted(const loom_run *r) {
    return loom_train_config_sharded_accum(r->tc, r->zero.stage);
}

/* loom_zero_accum_enable's flags for this stage: GPT-2's tied embedding on its first and
 * last stage (reduced once a step, after the stages' swap), split backward (zb); with --ep
 * each range is reduced before backward goes on (parallel/ep_zero.h), also in a stage. */
static int sharded_accum_flags(const loom_run *r) {
    const int blocking = r->mesh->ep.size > 1 ? LOOM_ZERO_ACCUM_BLOCKING : 0;
    if (!r->pipelined) return blocking;
    const loom_pipeline *pl = r->pipelined;
    const int tied = r->mc->family == LOOM_FAMILY_GPT2 && (pl->layers.first || pl->layers.last);
    return blocking | (tied ? LOOM_ZERO_ACCUM_KEEP_EMBED : 0) |
           (pl->train.split ? LOOM_ZERO_ACCUM_SPLIT : 0);
}

/* Data, the tensor-parallel group, the model (or the pipeline stage's slots) and ZeRO. */
static loom_status build_model(loom_run *r, loom_error *err) {
    const loom_model_config *mc = r->mc;
    const loom_train_config *tc = r->tc;
    loom_mesh *mesh = r->mesh;
    const int T = mc->seq_len, cp = mesh->layout.cp;
    const int rows = tc->micro_batch * T / cp; /* tokens of a micro-batch on this rank */
    loom_status st;
    loom_precision precision;
    /* sizing a bf16 run (loom plan): its arena keeps the run's activations in bf16 */
    if (r->size_only && !loom_precision_parse(tc->precision, "--precision", &precision, NULL) &&
        precision == LOOM_PRECISION_BF16)
        r->be = loom_backend_cpu_bf16_sizing();
    if ((!r->size_only && (st = open_data(r, err))) ||
        (st = loom_tp_validate(mc, mesh->layout.tp, tc->sequence_parallel, rows, err)) ||
        (st = loom_tp_create(&r->tp, &mesh->tp, tc->sequence_parallel, rows, mc->d_model, err)) ||
        (st = loom_moe_validate_layout(mc, mesh->layout.ep, loom_layout_replicas(mesh->layout),
                                       tc->zero, mesh->layout.tp, mesh->layout.pp, err)) ||
        (st = build_cp(r, err)))
        return st;
    r->tp.err = err;
    /* --precision bf16: the linears' tensor-parallel sums and gathers travel as bf16 */
    if (!r->size_only && loom_backend_precision(r->be) == LOOM_PRECISION_BF16 &&
        (st = loom_tp_wire_bf16(&r->tp, err)))
        return st;
    /* --freeze llm: the decoder's backward runs its input-gradient half only (B of split
     * backward, never followed by W), so it computes no weight gradients (the pipeline's
     * stages the same: pipeline/stage.c) */
    const int frozen_llm = (mc->freeze & LOOM_VLM_PART_LLM)
                               ? LOOM_MODEL_SPLIT_BACKWARD | LOOM_MODEL_NO_WEIGHT_GRADS
                               : 0;
    if (mesh->layout.pp > 1) {
        loom_pp_config pc;
        loom_train_config_pipeline(tc, &pc);
        pc.size_only = r->size_only;
        pc.backend = r->be;
        r->pipelined = &r->pipe; /* before: loom_run_free frees a partly built pipeline */
        if ((st = loom_pipeline_create(&r->pipe, mc, &pc, mesh, &r->tp, r->cped, &r->model, err)))
            return st;
    } else if ((st = loom_model_create(
                    &r->model,
                    &(loom_model_options){.cfg = mc,
                                          .B = tc->micro_batch,
                                          .T = T,
                                          .tp = &r->tp,
                                          .cp = r->cped,
                                          .ep = &mesh->ep,
                                          .backend = r->be,
                                          .flags = (r->size_only ? LOOM_MODEL_SIZE_ONLY : 0) |
                                                   frozen_llm},
                    err))) {
        return st;
    }
    r->tp.be = r->model.be; /* the vocabulary-parallel loss runs where the logits are */
    /* sizing (loom plan): ZeRO's shape only, no optimizer state, no engine */
    loom_status (*zero)(loom_zero *, loom_comm *, int, const loom_param_table *, double,
                        loom_error *) = r->size_only ? loom_zero_size : loom_zero_create;
    loom_status (*ep_zero)(loom_zero *, loom_comm *, loom_error *) =
        r->size_only ? loom_ep_zero_size : loom_ep_zero_attach;
    if ((st = loom_model_set_recompute(&r->model, tc->recompute, err)) ||
        (st = loom_moe_set_chunks(r->model.moe, tc->moe_chunks, err)) ||
        (st = zero(&r->zero, &mesh->dp, tc->zero, &r->model.table, tc->bucket_mb, err)) ||
        (mesh->ep.size > 1 && r->zero.stage > 0 && (st = ep_zero(&r->zero, &mesh->edp, err))) ||
        (sharded_accum_wanted(r) &&
         (st = loom_zero_accum_enable(
              &r->zero, !r->pipelined && loom_model_head_can_split(&r->model),
              sharded_accum_flags(r), tc->micro_batch * T, r->size_only, err))))
        return st;
    r->model.head_pieces = r->zero.head_pieces; /* --grad-accum sharded: 0 otherwise */
    if (r->size_only) return LOOM_OK;
    /* --grad-reduce-dtype bf16 (validated with --precision bf16): before the embedding plan */
    if (strcmp(tc->grad_reduce_dtype, "bf16") == 0 && (st = loom_zero_bf16_enable(&r->zero, err)))
        return st;
    /* --device cuda: the optimizer state and the gradients on the device too */
    if (loom_run_on_device(r) && (st = loom_zero_place_on(&r->zero, r->be, err))) return st;
    /* The embedding split needs the whole model's backward in one place (not pipelined)
     * and ZeRO's reduction (expert parallelism reduces after backward: parallel/ep.h), and
     * whole sequences (its positions are 0..T-1: not with context parallelism). */
    if (!r->pipelined && mesh->ep.size == 1 && cp == 1 && mc->family != LOOM_FAMILY_VLM &&
        (st = loom_zero_plan_embedding(&r->zero, tc->micro_batch * T, T, err)))
        return st;
    r->model.defer_embedding_grad = r->zero.embed.enabled;
    return LOOM_OK;
}

/* Parameters (whole, or ZeRO-3's shards behind a gathered view), gradients, the step's
 * batch, and the unsharded registry exports gather into. */
static loom_status build_buffers(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    loom_mesh *mesh = r->mesh;
    const size_t P = r->model.table.total;
    const int per_rank = tc->global_batch / mesh->layout.dp;
    const int lead = mesh->rank == 0;
    loom_status st;
    if (r->zero.stage == 3) {
        if ((st = loom_fsdp_create(&r->fsdp, &r->zero, tc->seed, err))) return st;
        r->sharded = &r->fsdp;
        r->params = r->fsdp.view;
        r->fsdp.err = err;
        r->fsdp.keep_blocks = r->pipelined != NULL; /* once per step, not per micro-batch */
        r->fsdp.release_ends = loom_run_fsdp_release_ends(r);
        r->model.hooks =
            (loom_block_hooks){loom_fsdp_before_block, loom_fsdp_after_block, &r->fsdp};
    } else {
        r->params = loom_run_on_device(r) ? loom_backend_alloc(r->be, P * sizeof(float))
                                          : calloc(P, sizeof(float));
        if (r->params && tc->overlap_param_gather) {
            if ((st = loom_param_gather_create(&r->pg, &r->zero, r->params, err))) return st;
            r->pg.err = err;
            r->model.hooks = (loom_block_hooks){loom_param_gather_before_block,
                                                loom_param_gather_after_block, &r->pg};
        }
    }
    r->grads = loom_zero_grads_alloc(&r->zero);
    /* the unsharded registry of this stage (the whole model without pipelining) */
    const int tp = r->tp.size > 1, ep = mesh->ep.size > 1;
    r->export_kind = ep && tp ? LOOM_EXPORT_EP_TP
                     : ep     ? LOOM_EXPORT_EP
                     : tp     ? LOOM_EXPORT_TP
                              : LOOM_EXPORT_LOCAL;
    const int tp_lead = mesh->tp_rank == 0 && mesh->dp_rank == 0 && (r->pipelined || lead);
    if (r->export_kind != LOOM_EXPORT_LOCAL) {
        if ((st = loom_params_build(
                 &r->global_table, r->mc,
                 &(loom_params_options){.layers = r->pipelined ? &r->pipe.layers : NULL}, err)))
            return st;
        if (tp_lead && !(r->global_flat = malloc(r->global_table.total * sizeof(float))))
            return loom_error_set(err, LOOM_ERR_NOMEM, "cannot allocate the weights' gather");
    }
    const size_t words = (size_t)loom_model_record_words(r->mc);
    r->batch = malloc((size_t)per_rank * words * sizeof(int32_t));
    if (tc->dump_dir[0] && lead)
        r->dump_batches = malloc((size_t)tc->steps * tc->global_batch * words * sizeof(int32_t));
    if (!r->params || !r->grads || !r->batch || (tc->dump_dir[0] && lead && !r->dump_batches))
        return loom_error_set(err, LOOM_ERR_NOMEM, "cannot allocate %zu parameters", P);
    return LOOM_OK;
}

/* The gradient-sync strategy and the step's runner for this layout. */
static loom_status build_step(loom_run *r, loom_error *err) {
    loom_model *mod = &r->model;
    const loom_train_config *tc = r->tc;
    const int embed = r->zero.embed.enabled;
    loom_grad_sync_options so = {&mod->table,
                                 r->mesh,
                                 &r->zero,
                                 r->sharded,
                                 &r->pg,
                                 &r->tp,
                                 r->params,
                                 r->grads,
                                 embed ? mod->dres : NULL,
                                 embed ? mod->inputs : NULL,
                                 err};
    loom_status st = loom_grad_sync_create(&r->sync, &so, err);
    if (st ||
        (tc->ema_decay > 0.0f && (st = loom_grad_sync_ema_enable(&r->sync, tc->ema_decay, err))))
        return st;
    const int lead = r->mesh->rank == 0;
    /* logits of the first micro-batch: one process's whole-vocabulary logits only */
    const int dump_logits = tc->dump_dir[0] && lead && r->tp.size == 1 && !r->pipelined && !r->cped;
    loom_step_runner_options ro = {mod,
                                   r->pipelined,
                                   &r->sync,
                                   r->mesh,
                                   r->params,
                                   r->grads,
                                   tc->micro_batch,
                                   r->mc->seq_len,
                                   tc->global_batch / r->mesh->layout.dp,
                                   &r->routes,
                                   dump_logits ? tc->dump_dir : NULL};
    loom_step_runner_init(&r->runner, &ro);
    r->dp_times = r->pipelined ? NULL : &r->zero.times;
    return LOOM_OK;
}

/* The first dumps of a reference run (--dump-dir): initial weights, routing file. */
static loom_status open_dumps(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    const int lead = r->mesh->rank == 0, per_rank = tc->global_batch / r->mesh->layout.dp;
    loom_status st;
    if (!tc->dump_dir[0]) return LOOM_OK;
    /* Every rank takes part in gathering sharded parameters; rank 0 writes. */
    if (r->sharded && (st = loom_fsdp_gather_all(r->sharded, err))) return st;
    if (lead && loom_mkdir_p(tc->dump_dir) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--dump-dir '%s': cannot create: %s",
                              tc->dump_dir, strerror(errno));
    const loom_param_table *it;
    const float *ip;
    if ((st = loom_run_export_flat(r, r->params, &it, &ip, err))) return st;
    /* Routes are recorded for whole sequences (not with --cp: a rank holds parts of them);
     * a pipeline stage records its own layers (train/step.c). */
    if (!r->cped && (st = loom_route_dump_open(&r->routes, r->mc, tc->micro_batch * r->mc->seq_len,
                                               tc->steps, per_rank / tc->micro_batch, err)))
        return st;
    if (lead && (st = loom_dump_flat(tc->dump_dir, "params_init.safetensors", it, ip, err)))
        return st;
    return LOOM_OK;
}

static loom_status open_outputs(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    loom_mesh *mesh = r->mesh;
    const int lead = mesh->rank == 0;
    loom_status st;
    if (tc->trace[0]) {
        /* Ranks open their traces together so their clocks start within a barrier. */
        const int accum = tc->global_batch / mesh->layout.dp / tc->micro_batch;
        size_t events = (size_t)tc->steps * (accum * (4 * r->mc->n_layer + 16) + 64) + 1024;
        if ((st = loom_comm_barrier(&mesh->world, err)) ||
            (st = loom_trace_open(&r->trace, mesh->rank, events, err)))
            return st;
        r->model.trace = mesh->dp.trace = mesh->tp.trace = mesh->world.trace = r->trace;
        mesh->cp.trace = r->trace; /* the ring's sends and receives on the cp lane */
    }
    if (lead && tc->tensorboard[0]) {
        if ((st = loom_tb_open(&r->tb, tc->tensorboard, err))) return st;
        fprintf(stderr, "loom: TensorBoard events in %s\n", loom_tb_path(r->tb));
    }
    return loom_metrics_open(&r->metrics, lead ? tc->metrics : "", err);
}

/* The initial weights: drawn on the host (the same numbers on every device), then copied
 * to the device when the model runs there. */
static loom_status init_params(loom_run *r, loom_error *err) {
    const loom_param_table *t = &r->model.table;
    if (!loom_run_on_device(r)) {
        loom_params_init(t, r->params, r->tc->seed);
        return LOOM_OK;
    }
    float *host = malloc((t->total ? t->total : 1) * sizeof(float));
    if (!host) return loom_error_set(err, LOOM_ERR_NOMEM, "initial weights: out of host memory");
    loom_params_init(t, host, r->tc->seed);
    loom_backend_copy_to_device(r->be, r->params, host, t->total * sizeof(float));
    loom_backend_synchronize(r->be);
    free(host);
    return loom_backend_status(r->be, err);
}

/* --precision bf16: the CPU table with oneDNN's bf16 GEMMs, chosen once here (the step
 * never asks which precision it runs). A CPU without AVX512-BF16/AMX-BF16: exit 2. */
static loom_status open_precision(loom_run *r, loom_error *err) {
    loom_precision p;
    loom_status st = loom_precision_parse(r->tc->precision, "--precision", &p, err);
    if (st || p == LOOM_PRECISION_FP32) return st;
    const loom_backend *be = NULL;
    if ((st = loom_backend_cpu_bf16_open(&be, err))) return st;
    r->be = be;
    return LOOM_OK;
}

/* The GEMM shapes of the step, made before it (a bf16 backend's oneDNN primitives): the
 * registry's linear layers over the micro-batch's tokens here and over its sequences (a
 * DiT's conditioning). MoE experts run unprepared: counted, printed at the end. */
static loom_status prepare_gemms(loom_run *r, loom_error *err) {
    if (loom_backend_precision(r->be) == LOOM_PRECISION_FP32) return LOOM_OK;
    const int cp = r->mesh->layout.cp > 0 ? r->mesh->layout.cp : 1;
    const int rows[2] = {r->tc->micro_batch * r->mc->seq_len / cp, r->tc->micro_batch};
    loom_status st =
        loom_model_prepare_gemms(r->be, &r->model.table, rows, 2, loom_run_bf16_logits(r), err);
    if (st) return st;
    if (r->mesh->rank == 0) {
        char line[256];
        loom_backend_cpu_bf16_describe(r->be, line, sizeof line);
        fprintf(stderr, "loom: precision bf16: %s\n", line);
    }
    return LOOM_OK;
}

/* The folder --resume searched: --ckpt-dir (auto), the parent of a step folder, or DIR. */
static void resume_tier(const loom_train_config *tc, char *tier, size_t n) {
    const char *slash = strrchr(tc->resume, '/');
    if (strcmp(tc->resume, "auto") == 0)
        snprintf(tier, n, "%s", tc->ckpt_dir);
    else if (strncmp(slash ? slash + 1 : tc->resume, "step_", 5) == 0)
        snprintf(tier, n, "%.*s", slash ? (int)(slash - tc->resume) : 1, slash ? tc->resume : ".");
    else
        snprintf(tier, n, "%s", tc->resume);
}

/* --resume auto with --ckpt-fast-dir: the step came from either tier (or, with --ckpt-peer,
 * from the hosts' memory), and its outer state lies beside the step folder its save wrote
 * (trainer.c saves it to loom_checkpointing_tier). The tiers are tried in the order the
 * search takes a step's folders: complete ones (a manifest) first, --ckpt-dir before
 * --ckpt-fast-dir, then the others (a step restored from memory may have no complete folder
 * on disk yet: its outer state was renamed into place before its save began). A tier is
 * taken when every rank of the worker holds its file there and every rank loads it. */
static loom_status load_outer_tiers(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    const int step = r->start_step, rank = r->mesh->rank;
    const char *dirs[2] = {tc->ckpt_dir, tc->ckpt_fast_dir};
    double order[2] = {0, 1}; /* rank 0's view of the folders, so every rank agrees */
    if (rank == 0) {
        int complete[2] = {0, 0};
        for (int t = 0; t < 2; t++) {
            char m[LOOM_CKPT_PATH_MAX + 16];
            loom_ckpt_step_dir(m, LOOM_CKPT_PATH_MAX, dirs[t], step);
            strcat(m, "/manifest.json");
            complete[t] = dirs[t][0] && access(m, F_OK) == 0;
        }
        if (complete[1] && !complete[0]) order[0] = 1, order[1] = 0;
    }
    loom_status st = loom_comm_bcast(&r->mesh->world, order, sizeof order, 0, err);
    int tried = 0;
    for (int i = 0; i < 2 && !st; i++) {
        const char *dir = dirs[(int)order[i]];
        double v = !dir[0] || !loom_outer_saved(&r->outer, dir, step, rank);
        if ((st = loom_comm_allreduce_sum_f64(&r->mesh->world, &v, 1, err)) || v > 0) continue;
        loom_error e = {0};
        const loom_status ls = loom_outer_load(&r->outer, dir, step, rank, &e);
        double bad = ls != LOOM_OK;
        if ((st = loom_comm_allreduce_sum_f64(&r->mesh->world, &bad, 1, err))) break;
        if (bad == 0) {
            if (rank == 0)
                fprintf(stderr, "loom: worker %d: the outer state of step %d from %s/outer\n",
                        r->mesh->worker, step, dir);
            return LOOM_OK;
        }
        if (ls) fprintf(stderr, "loom: rank %d of worker %d: %s\n", rank, r->mesh->worker, e.msg);
        tried = 1;
    }
    if (st) return st;
    return loom_error_set(err, LOOM_ERR_INPUT,
                          tried ? "--resume: worker %d: the outer optimizer's state of step %d "
                                  "failed to load from %s and %s (each rank's line says why)"
                                : "--resume: worker %d: the outer optimizer's state of step %d is "
                                  "in neither %s/outer nor %s/outer (--outer diloco saves it "
                                  "beside each checkpoint; every rank's file is needed)",
                          r->mesh->worker, step, dirs[0][0] ? dirs[0] : "(no --ckpt-dir)", dirs[1]);
}

/* --outer diloco: every worker resumed the same step, and the outer state of that step
 * (saved beside the checkpoint: parallel/outer.h) is loaded. */
static loom_status resume_outer(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    double v = r->start_step;
    loom_status st = loom_comm_allreduce_sum_f64(&r->mesh->outer, &v, 1, err);
    if (st) return st;
    if (v != (double)r->start_step * r->mesh->outer.size) /* elastic: this worker alone */
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: the workers' newest checkpoints are of different steps "
                              "(worker %d: step %d); resume every worker from one step "
                              "(--resume DIR/step_N)",
                              r->mesh->worker, r->start_step);
    if (!r->ckpt.loaded || r->start_step == 0) return LOOM_OK;
    if (strcmp(tc->resume, "auto") == 0 && tc->ckpt_fast_dir[0]) return load_outer_tiers(r, err);
    char tier[LOOM_PATH_MAX];
    resume_tier(tc, tier, sizeof tier);
    return loom_outer_load(&r->outer, tier, r->start_step, r->mesh->rank, err);
}

/* loom_outer_reload_fn (parallel/outer.h): an elastic joiner's own checkpoint of the group's
 * step, and the outer state beside it, from the folder it resumed from; with --resume auto
 * and --ckpt-fast-dir from either tier (--ckpt-dir first, as the resume searches). */
static loom_status reload_at(void *ctx, int step, int back, int *loaded, loom_error *err) {
    loom_run *r = ctx;
    const loom_train_config *tc = r->tc;
    char tiers[2][LOOM_PATH_MAX];
    int n = 1;
    resume_tier(tc, tiers[0], sizeof tiers[0]);
    if (strcmp(tc->resume, "auto") == 0 && tc->ckpt_fast_dir[0])
        snprintf(tiers[n++], sizeof tiers[1], "%s", tc->ckpt_fast_dir);
    loom_status st = LOOM_OK;
    *loaded = 0;
    for (int i = 0; i < n && !*loaded && !st; i++) {
        st = loom_checkpointing_load_step(&r->ckpt, tiers[i], step, back, loaded, err);
        if (st || !*loaded) continue;
        if (!r->ckpt.ema_loaded && (st = loom_grad_sync_ema_reset(&r->sync, err))) return st;
        /* without it (or unreadable) the outer state does not match the group's: the joiner
         * then takes the group's parameters and keeps this step's AdamW moments */
        loom_error e = {0};
        if (loom_outer_load(&r->outer, tiers[i], step, r->mesh->rank, &e))
            fprintf(stderr, "loom: %s\n", e.msg);
    }
    return st;
}

/* --device: the backend every buffer of the run lives on (the CPU's unless asked). */
static loom_status open_device(loom_run *r, loom_error *err) {
    loom_device_kind kind;
    loom_status st = loom_train_config_validate_device(r->tc, r->mc, r->mesh->size, &kind, err);
    if (!st && kind == LOOM_DEVICE_CPU) return open_precision(r, err);
    if (st) return st;
    if ((st = loom_backend_open(kind, 0, &r->be, err))) {
        r->be = loom_backend_cpu();
        /* a build without the device already names the flag; a missing GPU does not */
        return st == LOOM_ERR_INPUT ? st
                                    : loom_error_prefix(err, "--device %s", loom_device_name(kind));
    }
    if (r->mesh->rank == 0) fprintf(stderr, "loom: device %s\n", r->be->name);
    return LOOM_OK;
}

/* --precision bf16: the weights' bf16 copy, where they stay put between updates. */
static loom_status open_compute_weights(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    loom_bf16_rounding rounding;
    loom_status st = loom_bf16_rounding_parse(tc->bf16_rounding, "--bf16-rounding", &rounding, err);
    if (st) return st;
    /* the flat buffer the model reads: ZeRO-3's view (its pages exist while gathered) */
    const float *params = r->sharded ? r->sharded->view : r->params;
    /* (--outer moves the parameters after some updates: trainer.c rounds the copy again) */
    if ((st = loom_compute_weights_open(&r->cw, r->be, &r->model.table, params, rounding, tc->seed,
                                        loom_run_on_device(r) ? "--device" : NULL, err)))
        return st;
    if (r->pg.zero) { /* --overlap-param-gather: each range rounds when its gather lands */
        loom_compute_weights_by_range(&r->cw, LOOM_CW_UPDATES, 0);
        r->pg.landed = loom_compute_weights_land;
        r->pg.landed_ctx = &r->cw;
    }
    if (r->sharded) { /* ZeRO-3: the copy follows the view, gather by gather */
        loom_fsdp *f = r->sharded;
        const size_t shard = f->zero->span_on ? f->hi - f->lo : f->zero->shard_floats;
        loom_compute_weights_by_range(&r->cw, LOOM_CW_GATHERED,
                                      loom_fsdp_resident_bytes(f) / sizeof(float) - shard);
        f->landed = loom_compute_weights_land;
        f->released = loom_compute_weights_release;
        f->cb_ctx = &r->cw;
    }
    return LOOM_OK;
}

static loom_status setup(loom_run *r, loom_error *err) {
    const loom_train_config *tc = r->tc;
    loom_status st;
    loom_timeline_mark("train_setup");
    if ((st = open_device(r, err)) || (st = build_model(r, err)) || (st = prepare_gemms(r, err)))
        return st;
    loom_timeline_mark("data_model_zero_create");
    if ((st = build_buffers(r, err)) || (st = build_step(r, err)) ||
        (st = loom_dp_balance_setup(r, err)))
        return st;
    loom_timeline_mark("params_grads_alloc");
    if ((st = open_compute_weights(r, err))) return st;
    /* Resuming, a checkpoint overwrites every parameter: initialise them only if none is
     * loaded (seconds for a 124M model, on the path from a failure to the first step). */
    const int init_later = !r->sharded && tc->resume[0] && !tc->dump_dir[0] && !tc->init_from[0];
    if (!r->sharded && !init_later && (st = init_params(r, err))) return st;
    loom_timeline_mark("params_init");
    if (r->mesh->rank == 0) loom_run_report_startup(r);
    if ((st = open_dumps(r, err))) return st;
    loom_timeline_mark("report_and_dumps");
    loom_progress_phase(LOOM_PHASE_CKPT); /* resume: loading */
    if ((st = loom_checkpointing_open(&r->ckpt, r->mc, tc, r->mesh, &r->zero,
                                      r->sharded ? NULL : r->params,
                                      r->sharded ? r->sharded->shard : NULL, &r->start_step, err)))
        return st;
    if (init_later && !r->ckpt.loaded && !r->ckpt.reset)
        loom_params_init(&r->model.table, r->params, tc->seed);
    /* The moving average starts at the weights the run starts from, unless it was loaded. */
    if (!r->ckpt.ema_loaded && (st = loom_grad_sync_ema_reset(&r->sync, err))) return st;
    if (r->sharded) loom_fsdp_invalidate(r->sharded);
    /* --outer diloco: the round starts from the parameters the run starts from (ZeRO-3:
     * this rank's parameter shard, the only place they are; with --ep its own ranges) */
    if (loom_outer_enabled(&tc->outer)) {
        const loom_ep_zero *e = r->zero.experts;
        const loom_outer_buffer ob =
            r->sharded ? (loom_outer_buffer){r->sharded->shard, r->sharded->lo,  r->sharded->hi, 1,
                                             e ? e->own : NULL, e ? e->n_own : 0}
                       : (loom_outer_buffer){r->params, 0, r->model.table.total, 0, NULL, 0};
        if ((st = loom_outer_create(&r->outer, &tc->outer, r->mesh, &r->model.table, r->mc->n_layer,
                                    &ob, tc->steps, err)))
            return st;
        loom_timeline_mark("outer_create");
        r->outer_on = 1;
        /* --outer-start-step: the gradients the warm start averages over the workers */
        loom_flat_piece *pieces;
        int n_pieces;
        if ((st = loom_grad_sync_reduced_pieces(&r->sync, &pieces, &n_pieces, err)) ||
            (st = loom_outer_set_grads(&r->outer, pieces, n_pieces, err)))
            return st;
        if ((st = resume_outer(r, err))) return st;
        /* --elastic-worker: the group is founded or joined (a joiner: the coordinator's step) */
        if ((st = loom_outer_begin(&r->outer, &r->start_step, tc->resume[0] ? reload_at : NULL, r,
                                   err)))
            return st;
    }
    loom_timeline_mark("ckpt_open");
    if ((st = open_outputs(r, err))) return st;
    loom_timeline_mark("trace_tb_metrics");
    return LOOM_OK;
}

/* Builds r with `build` (the whole set-up, or only what sizes memory); on failure
 * everything built so far is freed. */
static loom_status build_run(loom_run *r, const loom_model_config *mc, const loom_train_config *tc,
                             loom_mesh *mesh, int size_only,
                             loom_status (*build)(loom_run *, loom_error *), loom_error *err) {
    memset(r, 0, sizeof *r);
    r->mc = mc;
    r->tc = tc;
    r->mesh = mesh;
    r->size_only = size_only;
    r->be = loom_backend_cpu(); /* setup's open_device may choose another */
    loom_status st = build(r, err);
    if (st) loom_run_free(r);
    return st;
}

loom_status loom_run_size(loom_run *r, const loom_model_config *mc, const loom_train_config *tc,
                          loom_mesh *mesh, loom_error *err) {
    return build_run(r, mc, tc, mesh, 1, build_model, err);
}

/* loom plan's memory of any rank of any layout (run_memory.c collects it; here beside
 * loom_run_size so that run_memory.c does not call back into this file). */
loom_status loom_run_memory_of(const loom_model_config *mc, const loom_train_config *tc, int world,
                               int rank, loom_run_memory *m, loom_error *err) {
    loom_mesh mesh;
    loom_run r;
    loom_status st = loom_mesh_shape(&mesh, tc->layout, world, rank, err);
    if (st || (st = loom_run_size(&r, mc, tc, &mesh, err))) return st;
    loom_run_memory_collect(&r, m);
    loom_run_free(&r);
    return LOOM_OK;
}

loom_status loom_run_setup(loom_run *r, const loom_model_config *mc, const loom_train_config *tc,
                           loom_mesh *mesh, loom_error *err) {
    return build_run(r, mc, tc, mesh, 0, setup, err);
}
