/* What one rank holds: the start-up report's memory figures, read from the run's own
 * objects (the same for any rank of any layout without running it, loom plan's
 * loom_run_memory_of, is in setup.c beside loom_run_size: this file calls nothing there). */
#include <stdio.h>
#include <string.h>

#include "comm/engine.h"
#include "kernels/backend_bf16.h"
#include "parallel/embed_grad.h"
#include "parallel/ep_zero.h"
#include "train/run.h"

int loom_run_fsdp_release_ends(const loom_run *r) {
    return r->zero.stage == 3 && r->zero.accum_resident > 0 && !r->pipelined && /* sharded */
           r->mesh->ep.size == 1 && loom_model_head_can_split(&r->model);
}

/* Where the embedding split's dense wte range ends (0: no split): the run's own, or in
 * sizing (no plan made) the conditions setup.c and loom_zero_plan_embedding apply. */
static size_t embed_split_end(const loom_run *r) {
    if (!r->size_only) return r->zero.embed.enabled ? r->zero.embed.wte_end : 0;
    const loom_zero *z = &r->zero;
    if (r->pipelined || r->mesh->ep.size > 1 || r->mesh->layout.cp > 1 ||
        r->mc->family == LOOM_FAMILY_VLM || z->bucket_floats >= z->total || z->accum_resident ||
        z->span_on || strcmp(r->tc->grad_reduce_dtype, "bf16") == 0)
        return 0;
    return loom_embed_grad_wte_end(z->table, z->dp->size);
}

int loom_run_bf16_logits(const loom_run *r) {
    const loom_model_config *mc = r->mc;
    return loom_backend_bf16_logits(r->be) && r->tp.size <= 1 && !mc->fp32_logits &&
           mc->family != LOOM_FAMILY_VLM && mc->family != LOOM_FAMILY_DIT;
}

void loom_run_memory_collect(const loom_run *r, loom_run_memory *m) {
    memset(m, 0, sizeof *m);
    loom_zero_memory zm;
    loom_zero_memory_of(&r->zero, &zm);
    m->params = zm.params;
    /* ZeRO-3 holds gathered blocks beyond its shard (once per step in a pipeline) */
    if (r->zero.stage == 3) {
        size_t lo, hi; /* the parameter shard (with --freeze not the optimizer's) */
        loom_zero_own_param_shard(&r->zero, &lo, &hi);
        const size_t n = r->zero.span_on ? hi - lo : r->zero.shard_floats;
        m->gathered = loom_fsdp_resident_bytes_of(&r->model.table, n, r->pipelined != NULL,
                                                  loom_run_fsdp_release_ends(r)) -
                      n * sizeof(float);
    }
    m->grads_local = zm.grads_local;
    /* ZeRO-2/3 with one micro-batch a step: buckets hand their pages back during backward,
     * so the whole local gradient is never resident at once (parallel/zero_resident.c).
     * With more micro-batches the earlier ones fill all of it before the last backward. */
    const loom_layout *l = &r->mesh->layout;
    const size_t peak =
        !r->pipelined && r->zero.table && r->tc->global_batch == l->dp * r->tc->micro_batch
            ? loom_zero_grads_peak_local(&r->zero, embed_split_end(r))
            : 0;
    if (peak) m->grads_local = peak;
    m->grads_shard = zm.grads_shard;
    m->grads_sharded = r->zero.accum_resident != 0;
    m->optimizer = zm.optimizer;
    /* parallel/zero.h: the average is held like AdamW's m (also --ep's expert segments) */
    if (r->tc->ema_decay > 0.0f) m->ema = zm.optimizer / 2;
    m->activations = loom_model_activation_bytes(&r->model);
    if (r->tp.size > 1) {
        m->act_sp = loom_model_plan_bytes(&r->model, 1);
        m->act_nosp = loom_model_plan_bytes(&r->model, 0);
    }
    if (r->cped) {
        m->act_whole = loom_model_plan_bytes_whole(&r->model, r->tp.sequence_parallel);
        m->cp_buffers = loom_cp_buffer_bytes(r->cp.size, &r->cp.o);
    }
    m->moe_buffers = loom_moe_bytes(r->model.moe);
    const size_t per_model = m->activations + m->moe_buffers;
    if (r->pipelined) {
        const loom_pipeline *pl = r->pipelined;
        m->pp_slots = pl->n_slots;
        m->pp_messages = loom_pipeline_message_bytes(pl);
        m->vision = loom_pp_vision_bytes(pl);
    }
    /* OpenMPI's MPI_Iallreduce (coll/libnbc, nbc_iallreduce.c) mallocs a temporary of its
     * whole buffer until it completes, and the heap keeps freed memory (core/malloc_policy.h).
     * The engine keeps at most LOOM_COMM_ENGINE_INFLIGHT_BYTES in flight, one larger
     * partition alone (comm/engine.c): the temporaries live at once take the largest
     * partition's bytes, or up to that budget of smaller ones (no more than all the
     * partitions together). (--grad-reduce-dtype bf16 moves its buckets with all-to-alls
     * instead: not counted.) */
    const int bf16_wire = strcmp(r->tc->grad_reduce_dtype, "bf16") == 0;
    if (r->zero.dp && !bf16_wire && r->zero.table) {
        const size_t largest =
            loom_zero_largest_partition(&r->zero, embed_split_end(r)) * sizeof(float);
        const size_t all =
            (r->zero.span_on ? r->zero.span_hi - r->zero.span_lo : r->zero.total) * sizeof(float);
        const size_t small =
            all < LOOM_COMM_ENGINE_INFLIGHT_BYTES ? all : LOOM_COMM_ENGINE_INFLIGHT_BYTES;
        m->mpi_temp = largest == 0 ? 0 : largest > small ? largest : small;
    }
    /* --precision bf16: the tp linears' messages (setup's loom_tp_wire_bf16; a sized run's
     * backend is the bf16 sizing one, so loom plan counts them as the run holds them) */
    if (loom_backend_precision(r->be) == LOOM_PRECISION_BF16)
        m->tp_messages = loom_tp_wire_bf16_bytes(&r->tp);
    /* dp > 1: the embedding split's buffer of every rank's token ids and d(embedding) rows
     * (parallel/embed_grad.c), --ep ZeRO's pack and receive buffers (parallel/ep_zero.c) */
    if (r->zero.dp && r->zero.table) {
        if (embed_split_end(r))
            m->dp_buffers = loom_embed_grad_buffer_bytes(r->zero.table, r->zero.dp->size,
                                                         r->tc->micro_batch * r->mc->seq_len);
        m->dp_buffers += loom_ep_zero_buffer_bytes(&r->zero);
    }
    m->total = m->params + m->gathered + m->grads_local + m->optimizer + m->ema + m->cp_buffers +
               per_model * (size_t)(m->pp_slots > 0 ? m->pp_slots : 1) + m->pp_messages +
               m->vision + m->mpi_temp + m->tp_messages + m->dp_buffers;
}

void loom_run_memory_line(const loom_run_memory *m, int micro_batch, int seq_len, char *buf,
                          size_t n) {
    const double MiB = 1 << 20;
    char held[64] = "", ema[64] = "";
    if (m->gathered) snprintf(held, sizeof held, " + %.3f MiB gathered at most", m->gathered / MiB);
    if (m->ema) snprintf(ema, sizeof ema, ", EMA of the weights %.3f MiB", m->ema / MiB);
    snprintf(buf, n,
             "memory per rank: params %.3f MiB%s, grads %.3f MiB (%s accumulation) of which "
             "%.3f MiB stay (reduced shard), optimizer %.3f MiB (AdamW m, v)%s, activations %.3f "
             "MiB (micro-batch %d x %d)",
             m->params / MiB, held, m->grads_local / MiB, m->grads_sharded ? "sharded" : "local",
             m->grads_shard / MiB, m->optimizer / MiB, ema, m->activations / MiB, micro_batch,
             seq_len);
}
