#include "parallel/zero.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"

loom_status loom_zero_bf16_enable(loom_zero *z, loom_error *err) {
    if (z->experts)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--grad-reduce-dtype bf16: not with --ep (the experts' segments "
                              "reduce in fp32; docs/precision.md)");
    if (z->dp->size == 1) return LOOM_OK; /* nothing to reduce */
    const size_t R = (size_t)z->dp->size, own = z->shards.hi - z->shards.lo;
    z->send16 = malloc((z->total ? z->total : 1) * sizeof *z->send16);
    z->recv_cap = R * own;
    z->recv16 = malloc((z->recv_cap ? z->recv_cap : 1) * sizeof *z->recv16);
    if (!z->send16 || !z->recv16) {
        loom_zero_bf16_free(z);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "--grad-reduce-dtype bf16: out of memory for the bf16 buffers");
    }
    z->reduce_bf16 = 1;
    return LOOM_OK;
}

void loom_zero_bf16_free(loom_zero *z) {
    free(z->send16);
    free(z->recv16);
    z->send16 = z->recv16 = NULL;
    z->reduce_bf16 = 0;
}

double loom_zero_wire_bytes(int bf16_collectives, size_t n, size_t c) {
    if (!bf16_collectives) return 2.0 * (double)(n - c) * 4.0;
    return (double)bf16_collectives * (double)(n - c) * 2.0;
}

double loom_zero_bf16_wire_bytes(const loom_zero *z, size_t n, size_t c) {
    return loom_zero_wire_bytes(!z->reduce_bf16 ? 0 : z->stage >= 2 ? 1 : 2, n, c);
}

loom_status loom_zero_bf16_post(loom_zero *z, const float *grads, loom_zero_bucket *b,
                                loom_error *err) {
    const int R = z->dp->size, me = z->dp->rank, c = b->counts[me];
    if (z->recv_used + (size_t)R * (size_t)c > z->recv_cap)
        return loom_error_set(err, LOOM_ERR_STATE, "--grad-reduce-dtype bf16: receive overflow");
    for (int k = 0; k < R; k++) {
        b->rcounts[k] = c;
        b->rdispls[k] = k * c;
    }
    b->recv_at = z->recv_used;
    z->recv_used += (size_t)R * (size_t)c;
    loom_bf16_from_f32_n(z->send16 + b->begin, grads + b->begin, b->end - b->begin);
    loom_comm_op *op = &b->op;
    op->kind = LOOM_OP_ALLTOALLV_BF16;
    op->send16 = z->send16 + b->begin;
    op->recv16 = z->recv16 + b->recv_at;
    op->counts = b->counts;
    op->displs = b->displs;
    op->rcounts = b->rcounts;
    op->rdispls = b->rdispls;
    b->bf16_phase = LOOM_ZERO_BF16_SCATTER;
    return loom_comm_engine_post(&z->engine, op, err);
}

loom_status loom_zero_bf16_received(loom_zero *z, float *grads, loom_zero_bucket *b,
                                    loom_error *err) {
    if (b->bf16_phase != LOOM_ZERO_BF16_SCATTER) return LOOM_OK;
    const int R = z->dp->size, me = z->dp->rank;
    const size_t c = (size_t)b->counts[me], at = b->begin + (size_t)b->displs[me];
    const loom_bf16 *in = z->recv16 + b->recv_at;
    float *g = grads + at;
    loom_bf16_sum_pieces(g, in, c, R); /* rank order: the same sum on every run */
    b->bf16_phase = LOOM_ZERO_BF16_SUMMED;
    if (z->stage >= 2) return LOOM_OK;
    /* stages 0, 1: every replica needs the sums; the owner's rounded ones go out */
    loom_bf16_from_f32_n(z->send16 + at, g, c);
    loom_comm_op *op = &b->op;
    op->kind = LOOM_OP_ALLGATHERV_BF16;
    op->buf16 = z->send16 + b->begin;
    op->counts = b->counts;
    op->displs = b->displs;
    b->bf16_phase = LOOM_ZERO_BF16_GATHER;
    return loom_comm_engine_post(&z->engine, op, err);
}

void loom_zero_bf16_gathered(loom_zero *z, float *grads, loom_zero_bucket *b) {
    if (b->bf16_phase != LOOM_ZERO_BF16_GATHER) return;
    loom_bf16_to_f32_n(grads + b->begin, z->send16 + b->begin, b->end - b->begin);
    b->bf16_phase = LOOM_ZERO_BF16_DONE;
}
