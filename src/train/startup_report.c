/* What rank 0 says about a run at its start and its end. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "comm/world.h"
#include "kernels/backend_bf16.h"
#include "model/vlm.h"
#include "train/run.h"

void loom_run_report_startup(const loom_run *r) {
    const loom_model_config *mc = r->mc;
    const loom_train_config *tc = r->tc;
    const loom_mesh *mesh = r->mesh;
    const double MiB = 1 << 20;
    const size_t P = r->model.table.total;
    const int gathered = r->export_kind != LOOM_EXPORT_LOCAL;
    size_t whole = gathered ? r->global_table.total : P;
    loom_param_table t;
    loom_error e;
    if ((r->size_only || !gathered) &&
        loom_params_build(&t, mc, &(loom_params_options){.tp_size = 1, .ep_size = 1}, &e) ==
            LOOM_OK) { /* sized only, or each rank saves its own (a pipeline stage's): no
                          global table, the whole model's count from its shapes */
        whole = t.total;
        loom_params_free(&t);
    }
    loom_run_memory rm;
    loom_run_memory_collect(r, &rm);
    char cp_text[64] = "";
    if (r->cped)
        snprintf(cp_text, sizeof cp_text, " x cp %d (%s%s)", r->cp.size,
                 loom_cp_mode_name(r->cp.o.mode), r->cp.n_chunks == 2 ? ", zigzag" : "");
    fprintf(stderr,
            "loom: %s model, %zu parameters (%zu on this rank); layout dp %d (ZeRO-%d) x tp %d x "
            "pp %d%s\n",
            loom_family_name(mc->family), whole, P, mesh->layout.dp, r->zero.stage, mesh->layout.tp,
            mesh->layout.pp, r->cped ? cp_text : "");
    if (r->pipelined) loom_pipeline_report(r->pipelined, stderr);
    if (mc->n_experts > 0)
        fprintf(stderr,
                "loom: mixture of experts: %d experts, top-%d, every %d layer(s)%s, capacity "
                "factor %g%s, expert parallel %d (%d experts per rank), buffers %.1f MiB\n",
                mc->n_experts, mc->top_k, mc->moe_every, mc->shared_expert ? " + shared" : "",
                (double)mc->capacity_factor, mc->capacity_factor > 0 ? "" : " (dropless)",
                mesh->layout.ep, mc->n_experts / mesh->layout.ep, rm.moe_buffers / MiB);
    if (mesh->layout.dp > 1 && !r->size_only && !r->zero.engine.threaded) /* comm/engine.h */
        fprintf(stderr,
                "loom: communication engine: no thread (MPI provides %s): collectives "
                "progress from the training thread\n",
                loom_world_thread_level_name(loom_world_thread_level()));
    if (tc->zero > 0 && mesh->layout.dp == 1)
        fprintf(stderr, "loom: --zero %d with one data-parallel rank shards nothing (no-op)%s\n",
                tc->zero, tc->overlap_param_gather ? ", --overlap-param-gather too" : "");
    char line[512];
    loom_run_memory_line(&rm, tc->micro_batch, mc->seq_len, line, sizeof line);
    fprintf(stderr, "loom: %s\n", line);
    if (rm.mpi_temp)
        fprintf(stderr,
                "loom: MPI all-reduce temporary: %.3f MiB (OpenMPI's buffers of the all-reduces "
                "in flight, %zu floats: the largest gradient partition, or up to 4 MiB of "
                "smaller ones)\n",
                rm.mpi_temp / MiB, rm.mpi_temp / sizeof(float));
    if (rm.dp_buffers)
        fprintf(stderr,
                "loom: data-parallel buffers: %.3f MiB (the embedding gradient's rows gathered "
                "from every rank; --ep ZeRO's pack and receive buffers)\n",
                rm.dp_buffers / MiB);
    fprintf(stderr, "loom: memory per rank in all: %.3f MiB%s\n", rm.total / MiB,
            rm.pp_slots ? " (every micro-batch in flight and the stage's message buffers)" : "");
    if (loom_backend_precision(r->be) == LOOM_PRECISION_BF16) {
        const int acts =
            loom_backend_bf16_activations(r->be) && !(r->tp.size > 1 && r->tp.sequence_parallel);
        const int logits = loom_run_bf16_logits(r);
        const int pre = loom_backend_bf16_pre_activations(r->be);
        fprintf(stderr,
                "loom: precision bf16: %.3f MiB more for the GEMMs' bf16 operands (the largest "
                "layer's input or output gradient and weight, rounded per call, and the weights' "
                "bf16 copy where one is kept); master weights, gradients and optimizer state stay "
                "fp32 as above; activations as above, %s%s%s%s\n",
                (double)loom_backend_cpu_bf16_bytes(r->be) / MiB,
                acts ? "those only bf16 GEMMs read (the norms' outputs, the MLP's activation) in "
                       "bf16, "
                     : "",
                pre ? "the language models' attention qkv and MLP pre-activation in bf16 "
                      "(rounded where autocast rounds those linears' outputs), "
                    : "",
                logits ? "the logits and their gradient in bf16 (softmax and loss in fp32 from "
                         "them), "
                       : "",
                acts || logits || pre ? "the rest fp32" : "fp32");
    }
    if (r->zero.reduce_bf16) { /* --grad-reduce-dtype bf16 (parallel/zero_bf16.c) */
        const loom_zero *z = &r->zero;
        const size_t own = z->shards.hi - z->shards.lo;
        const double bf = loom_zero_bf16_wire_bytes(z, z->total, own);
        fprintf(stderr,
                "loom: gradient reduction in bf16 (round to nearest even, summed in fp32 on "
                "receipt): %.3f MiB a reduction per rank on the wire, fp32 would move %.3f MiB "
                "(%.2fx); %.3f MiB more for the bf16 send and receive buffers\n",
                bf / MiB, 2.0 * (double)(z->total - own) * 4.0 / MiB,
                bf / (2.0 * (double)(z->total - own) * 4.0),
                (double)(z->total + z->recv_cap) * 2.0 / MiB);
    }
    if (mc->freeze) { /* --freeze (vlm): what is not trained, and what it no longer holds */
        const loom_zero *z = &r->zero;
        size_t frozen = 0;
        for (int i = 0; i < r->model.table.n_params; i++)
            if (r->model.table.params[i].frozen) frozen += r->model.table.params[i].numel;
        const size_t outside = P - (z->span_hi - z->span_lo); /* no gradient, state, reduction */
        fprintf(stderr,
                "loom: frozen (--freeze):%s%s%s %zu of %zu parameters on this rank: no gradients "
                "and no AdamW update; %zu of them outside the trainable span [%zu, %zu) hold no "
                "gradient (%.3f MiB less), no AdamW state (%.3f MiB less over the replicas) and "
                "are never reduced%s\n",
                mc->freeze & LOOM_VLM_PART_VISION ? " vision" : "",
                mc->freeze & LOOM_VLM_PART_PROJECTOR ? " projector" : "",
                mc->freeze & LOOM_VLM_PART_LLM ? " llm" : "", frozen, P, outside, z->span_lo,
                z->span_hi, (double)outside * sizeof(float) / MiB,
                2.0 * (double)outside * sizeof(float) / MiB,
                z->stage == 3 ? " (ZeRO-3: their weights stay in the parameter shards; AdamW "
                                "fetches its span shard's weights from them and sends them back "
                                "each step)"
                              : "");
    }
    if (r->tp.size > 1)
        fprintf(stderr,
                "loom: tensor parallel %d ranks%s: activations per rank %.1f MiB with sequence "
                "parallelism, %.1f MiB without%s\n",
                r->tp.size, r->tp.sequence_parallel ? " (sequence parallel)" : "", rm.act_sp / MiB,
                rm.act_nosp / MiB,
                r->tp.wire_bf16 ? "; the linears' sums and gathers sent as bf16" : "");
    if (rm.tp_messages) /* tp/tp.h's two bf16 message buffers (in the total above) */
        fprintf(stderr, "loom: tensor-parallel bf16 message buffers: %.3f MiB\n",
                rm.tp_messages / MiB);
    if (r->cped) {
        const int sp = r->tp.sequence_parallel;
        fprintf(stderr,
                "loom: context parallel %d ranks: activations per rank %.3f MiB (%d of %d tokens "
                "per sample), %.3f MiB holding whole sequences; attention buffers %.3f MiB\n",
                r->cp.size, loom_model_plan_bytes(&r->model, sp) / MiB, r->model.T, r->model.T_seq,
                rm.act_whole / MiB, rm.cp_buffers / MiB);
    }
    if (r->size_only) /* --dry-run past this host's memory: no data opened */
        fprintf(stderr, "loom: data %s: not opened (sized only)\n", tc->data);
    else if (r->data.kind == LOOM_BATCH_FLOW)
        fprintf(stderr,
                "loom: data %s: %d file(s), %lld samples of %d x %d x %d x %d, %d classes "
                "(flow matching: t %s, class dropout %g%s)\n",
                tc->data, r->data.images.n_shards, (long long)r->data.images.n,
                r->data.images.frames, r->data.images.channels, r->data.images.height,
                r->data.images.width, r->data.images.n_classes,
                loom_t_sampling_name(tc->flow.t_sampling), (double)tc->flow.class_dropout,
                tc->ema_decay > 0 ? ", EMA of the weights" : "");
    else if (r->data.kind == LOOM_BATCH_VLM)
        fprintf(stderr,
                "loom: data %s: %d file(s), %lld image-text samples, images %d x %d x %d "
                "(%d tokens each)\n",
                tc->data, r->data.vlm.n_shards, (long long)r->data.vlm.n, r->data.vlm.channels,
                r->data.vlm.height, r->data.vlm.width, r->data.vlm.rec.image_tokens);
    else
        fprintf(stderr, "loom: data %s: %d file(s), %lld tokens\n", tc->data,
                r->data.tokens.n_shards, (long long)r->data.tokens.total_tokens);
}

void loom_run_report_end(const loom_run *r, int steps_run) {
    const loom_mesh *mesh = r->mesh;
    const loom_train_config *tc = r->tc;
    if (mesh->rank != 0 || steps_run <= 0) return;
    if (r->tp.size > 1)
        fprintf(stderr,
                "loom: tensor-parallel communication: %.2f MiB (%.0f bytes) per step per rank\n",
                (double)mesh->tp.bytes / tc->steps / (1 << 20), (double)mesh->tp.bytes / tc->steps);
    if (r->tp.size > 1) /* what rank 0 sent to the others (tp/tp.h's count) */
        fprintf(stderr,
                "loom: tensor-parallel messages: %.0f bytes sent per step by rank 0 (%.0f in bf16, "
                "%.0f in fp32)\n",
                (r->tp.bytes_bf16 + r->tp.bytes_f32) / steps_run, r->tp.bytes_bf16 / steps_run,
                r->tp.bytes_f32 / steps_run);
    if (r->cped && r->cp.size > 1) /* what rank 0 sent to its ring or all-to-all peers */
        fprintf(stderr,
                "loom: context-parallel messages: %.0f bytes sent per step by rank 0 (%.0f in "
                "bf16, %.0f in fp32)\n",
                (r->cp.bytes_bf16 + r->cp.bytes_f32) / steps_run, r->cp.bytes_bf16 / steps_run,
                r->cp.bytes_f32 / steps_run);
    if (r->pipelined) /* the stage boundary's activations and gradients this rank sent */
        fprintf(stderr,
                "loom: pipeline messages: %.3f MiB (%.0f bytes) sent per step by rank 0 (%s)\n",
                (double)r->pipelined->sent_bytes / steps_run / (1 << 20),
                (double)r->pipelined->sent_bytes / steps_run,
                r->pipelined->wire_send ? "bf16" : "fp32");
    double ep[4]; /* what rank 0 sent to the other ranks of its ep group */
    loom_moe_sent_bytes(r->model.moe, ep);
    if (mesh->ep.size > 1 && r->model.moe)
        fprintf(stderr,
                "loom: expert-parallel messages: %.0f bytes sent per step by rank 0 (%.0f in "
                "bf16, %.0f in fp32): dispatch %.0f bf16 + %.0f fp32, combine %.0f bf16 + %.0f "
                "fp32\n",
                (ep[0] + ep[1] + ep[2] + ep[3]) / steps_run, (ep[0] + ep[2]) / steps_run,
                (ep[1] + ep[3]) / steps_run, ep[0] / steps_run, ep[1] / steps_run,
                ep[2] / steps_run, ep[3] / steps_run);
    if (mesh->ep.size > 1) /* the all-to-all time not hidden behind expert compute */
        fprintf(stderr,
                "loom: expert-parallel all-to-all: %.3f ms blocked per step (%.3f ms in flight), "
                "%d chunk(s)\n",
                mesh->ep.blocked_ms / steps_run, mesh->ep.inflight_ms / steps_run, tc->moe_chunks);
    if (mesh->cp.size > 1) /* the ring's transfers (or Ulysses' all-to-alls) not hidden */
        fprintf(stderr,
                "loom: context-parallel communication: %.3f ms blocked per step (%.3f ms in "
                "flight), %.2f MiB per step; attention compute %.3f ms per step\n",
                mesh->cp.blocked_ms / steps_run, mesh->cp.inflight_ms / steps_run,
                (double)mesh->cp.bytes / steps_run / (1 << 20), r->cp.compute_ms / steps_run);
}

loom_status loom_run_report_peak_memory(const loom_run *r, loom_error *err) {
    loom_mesh *mesh = r->mesh;
    const int n = mesh->world.size;
    double *mib = calloc((size_t)n, sizeof *mib);
    if (!mib) return loom_error_set(err, LOOM_ERR_NOMEM, "peak memory report: out of memory");
    struct rusage u; /* Linux: ru_maxrss is the peak resident set (VmHWM), KiB */
    if (getrusage(RUSAGE_SELF, &u) == 0) mib[mesh->rank] = (double)u.ru_maxrss / 1024.0;
    loom_status st = loom_comm_allreduce_sum_f64(&mesh->world, mib, n, err);
    if (!st && mesh->rank == 0) {
        int hi = 0, lo = 0;
        for (int i = 1; i < n; i++) {
            if (mib[i] > mib[hi]) hi = i;
            if (mib[i] < mib[lo]) lo = i;
        }
        fprintf(stderr,
                "loom: peak resident memory per rank (measured, VmHWM): %.1f MiB most (rank %d), "
                "%.1f MiB least (rank %d)\n",
                mib[hi], hi, mib[lo], lo);
    }
    free(mib);
    return st;
}
