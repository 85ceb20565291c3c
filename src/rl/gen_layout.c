/* loom rl's generation layout: the generator's own copy of the weights where the training
 * layout does not hold them whole (docs/rl.md, "Two layouts in one job"), filled after
 * every update by parallel/reshard.h's plan or ZeRO-3's all-gather. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/trace.h"
#include "parallel/fsdp.h"
#include "rl/gen_layout.h"
#include "train/ckpt_tensors.h"

/* Training layout -> generation layout (the generator's copy), timed. */
loom_status loom_rl_reshard(rl_state *s, loom_error *err) {
    if (!s->gen_params) return LOOM_OK;
    loom_run *r = s->run;
    double t0 = loom_now_ms();
    loom_trace_begin(r->trace, "reshard", "rl");
    loom_status st;
    if (r->sharded) { /* ZeRO-3: the shards gathered whole on every rank, then copied */
        if (!(st = loom_fsdp_gather_all(r->sharded, err))) {
            if (s->to_gen.comm) /* a generation tp shard, or from pipeline stages */
                st = loom_reshard_run(&s->to_gen, r->params, s->gen_params, err);
            else
                memcpy(s->gen_params, r->params, s->gen_table.total * sizeof(float));
        }
        loom_fsdp_invalidate(r->sharded);
    } else
        st = loom_reshard_run(&s->to_gen, r->params, s->gen_params, err);
    loom_trace_end(r->trace);
    s->reshard_ms = loom_now_ms() - t0;
    return st;
}

/* With --tp > 1, --pp > 1 or ZeRO-3 in training, or --tp in generation, the generator
 * gets its own copy (whole, or its generation tp shard), and the move that fills it: tp
 * shards and pipeline stages through parallel/reshard.h's plan (a stage's tensors
 * described in the whole model's order); ZeRO-3's flat shards through the trainer's own
 * all-gather (parallel/fsdp.h), then copied (a tp shard: the plan's local copies). */
loom_status loom_rl_gen_layout_open(rl_state *s, loom_error *err) {
    loom_run *r = s->run;
    loom_mesh *mesh = r->mesh;
    const int ep = mesh->layout.ep > 1 ? mesh->layout.ep : 1;
    if (mesh->layout.tp == 1 && !r->sharded && !r->pipelined && !s->gmesh_on && ep == 1)
        return LOOM_OK;
    const int gtp = s->gmesh_on ? s->gmesh.tp.size : 1;
    loom_status st = loom_params_build(
        &s->gen_table, r->mc,
        &(loom_params_options){.tp_rank = s->gmesh_on ? s->gmesh.tp_rank : 0, .tp_size = gtp}, err);
    if (st) return st;
    if (!(s->gen_params = malloc(s->gen_table.total * sizeof(float))))
        return loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory for the weights");
    size_t train_floats = r->model.table.total;
    if (r->sharded) {
        train_floats = r->zero.shard_floats;
        s->reshard_bytes = (double)(r->model.table.total - train_floats) * 4.0 * mesh->size;
    }
    /* ZeRO-3 (tp 1, no stages) to whole replicas: the gathered whole copied; else a plan
     * (ZeRO-3: from the gathered stage or tp shard, the data-parallel ranks its replicas) */
    if (!r->sharded || s->gmesh_on || r->pipelined || mesh->layout.tp > 1 || ep > 1) {
        /* a stage's or an ep rank's tensors in the whole model's order (the others: none) */
        if ((st = loom_ckpt_tensors_describe(&s->gen_descs, &s->gen_table, err)) ||
            (st = r->pipelined || ep > 1
                      ? loom_ckpt_tensors_describe_as(&s->train_descs, &r->model.table,
                                                      &s->gen_descs, err)
                      : loom_ckpt_tensors_describe(&s->train_descs, &r->model.table, err)))
            return st;
        /* the replicas of a training piece: dp x cp ranks (cp ranks hold the same weights);
         * with --ep an ep group (consecutive replicas) is one replica, its experts split */
        loom_reshard_side train = {&s->train_descs, r->model.table.total, mesh->dp_rank / ep,
                                   loom_layout_replicas(mesh->layout) / ep};
        loom_reshard_side gen = {&s->gen_descs, s->gen_table.total, mesh->rank, mesh->size};
        if ((st = loom_reshard_plan(&s->to_gen, &mesh->world, &train, &gen, err))) return st;
        s->reshard_bytes += s->to_gen.bytes_moved;
    }
    if (mesh->layout.tp > 1) {
        const size_t N = (size_t)s->rc->ppo_micro_batch * s->T * s->V;
        s->full = malloc(N * sizeof(float));
        s->parts = malloc(N * sizeof(float));
        if (!s->full || !s->parts)
            return loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory for the logits");
    }
    char pp[32] = "", gen[64] = "", cp[48] = "";
    if (r->pipelined) snprintf(pp, sizeof pp, "pp %d x ", mesh->layout.pp);
    if (mesh->layout.cp > 1) snprintf(cp, sizeof cp, " x cp %d", mesh->layout.cp);
    if (ep > 1) snprintf(cp + strlen(cp), sizeof cp - strlen(cp), " (ep %d)", ep);
    if (gtp > 1) snprintf(gen, sizeof gen, "tp %d x ", gtp);
    if (mesh->rank == 0)
        fprintf(stderr,
                "loom rl: generation layout %sdp %d (%s on every rank, %.3f MiB); "
                "training layout %stp %d x dp %d%s%s (%.3f MiB of weights on rank 0); reshard "
                "moves %.3f MiB between ranks\n",
                gen, s->gdp, gtp > 1 ? "a tp shard" : "whole weights",
                s->gen_table.total * 4.0 / 1048576.0, pp, mesh->layout.tp, mesh->layout.dp, cp,
                r->sharded ? " ZeRO-3" : "", train_floats * 4.0 / 1048576.0,
                s->reshard_bytes / 1048576.0);
    return loom_rl_reshard(s, err);
}
