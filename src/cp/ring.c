/* Ring attention (cp.h, mode ring). At step i of N rank r holds the key/value block of
 * src = (r - i) mod N; the transfer of the next block (send to r+1, receive from r-1) is
 * posted before the current block is computed and waited for after it. Forward merges
 * the partial results by log-sum-exp in step order; backward sends the blocks round
 * again, each block's dK/dV travelling one step behind it: rank r computes its share
 * into a zeroed buffer while the share so far is on its way from r-1, adds the two, and
 * passes the sum on; after N steps it reaches the block's owner (N-1 block transfers,
 * N dK/dV transfers). The order of every sum is fixed, so a run repeats bitwise.
 * With o.bf16_qkv the blocks travel as bf16 bits (rounded once when packed, widened into
 * kv[] on arrival): qkv's values are bf16 values then, so both are exact and the kernels
 * read the same floats; dK/dV (fp32 sums) stay fp32. */
#include <string.h>

#include "cp/cp_impl.h"

enum { TAG_KV = 71, TAG_DKV = 72 };

/* The kernel geometry for the block of rank src. */
static void block_of(const loom_cp *cp, loom_attention_blocks *g, int src) {
    *g = cp->blocks;
    for (int j = 0; j < cp->n_chunks; j++) g->kpos[j] = loom_cp_chunk_pos(cp, src, j);
}

/* Causally every key of the block lies after every query of the rank (only with the
 * contiguous split): the step computes nothing. */
static int all_masked(const loom_attention_blocks *g) {
    if (!g->causal) return 0;
    for (int a = 0; a < g->nq; a++)
        for (int c = 0; c < g->nk; c++)
            if (g->kpos[c] <= g->qpos[a] + g->chunk - 1) return 0;
    return 1;
}

static size_t local_rows(const loom_cp *cp) {
    return (size_t)cp->o.B * cp->Tl;
}
static size_t kv_width(const loom_cp *cp) {
    return (size_t)2 * cp->o.KV * cp->o.hd;
}
static size_t row_width(const loom_cp *cp) {
    return (size_t)(cp->o.H + 2 * cp->o.KV) * cp->o.hd;
}

/* Packs this rank's key and value heads (the contiguous tail of each qkv row) into kv[0]
 * (and, bf16 on the wire, its bf16 bits into kv16[0]). */
static void pack_kv(loom_cp *cp, const float *qkv) {
    loom_backend_copy_2d(cp->be, cp->kv[0], kv_width(cp), qkv + (size_t)cp->o.H * cp->o.hd,
                         row_width(cp), local_rows(cp), kv_width(cp));
    if (cp->o.bf16_qkv) loom_bf16_from_f32_n(cp->kv16[0], cp->kv[0], local_rows(cp) * kv_width(cp));
}

/* Posts step i's transfer of the next block: receive into kv[(i+1)%2], send kv[i%2] (bf16
 * on the wire: their kv16 twins). */
static loom_status post_block(loom_cp *cp, int i, loom_comm_handle *hr, loom_comm_handle *hs) {
    const size_t n = local_rows(cp) * kv_width(cp);
    const int next = (cp->rank + 1) % cp->size, prev = (cp->rank + cp->size - 1) % cp->size;
    loom_status st;
    if (cp->o.bf16_qkv) {
        st = loom_comm_irecv_bf16(cp->comm, cp->kv16[(i + 1) % 2], n, prev, TAG_KV, hr, cp->err);
        if (!st) st = loom_comm_isend_bf16(cp->comm, cp->kv16[i % 2], n, next, TAG_KV, hs, cp->err);
        cp->bytes_bf16 += (double)n * sizeof(loom_bf16);
        return st;
    }
    st = loom_comm_irecv(cp->comm, cp->kv[(i + 1) % 2], n, prev, TAG_KV, hr, cp->err);
    if (!st) st = loom_comm_isend(cp->comm, cp->kv[i % 2], n, next, TAG_KV, hs, cp->err);
    cp->bytes_f32 += (double)n * sizeof(float);
    return st;
}

/* Step i's block transfer done: a bf16 block is widened into kv[(i+1)%2] (exact). */
static void block_arrived(loom_cp *cp, int i) {
    if (!cp->o.bf16_qkv) return;
    double t0 = loom_comm_now_ms();
    loom_bf16_to_f32_n(cp->kv[(i + 1) % 2], cp->kv16[(i + 1) % 2], local_rows(cp) * kv_width(cp));
    cp->compute_ms += loom_comm_now_ms() - t0;
}

static loom_status wait2(loom_cp *cp, loom_comm_handle *a, loom_comm_handle *b) {
    loom_status st = loom_comm_wait(a, cp->err);
    return st ? st : loom_comm_wait(b, cp->err);
}

loom_status loom_cp_ring_forward(loom_cp *cp, float *out, float *lse, const float *qkv) {
    const int N = cp->size, r = cp->rank;
    double t0 = loom_comm_now_ms();
    pack_kv(cp, qkv);
    cp->compute_ms += loom_comm_now_ms() - t0;
    loom_comm_handle hr = {0}, hs = {0};
    for (int i = 0; i < N; i++) {
        cp->comm->label = loom_cp_label(cp, 0, i);
        loom_status st = i + 1 < N ? post_block(cp, i, &hr, &hs) : LOOM_OK;
        cp->comm->label = NULL;
        if (st) return st;
        loom_attention_blocks g;
        block_of(cp, &g, (r - i + N) % N);
        const float *kv = cp->kv[i % 2];
        t0 = loom_comm_now_ms();
        if (i == 0) { /* the own block: every query sees at least itself */
            loom_backend_attention_block_forward(cp->be, out, lse, qkv, kv, cp->scratch, &g);
        } else if (!all_masked(&g)) {
            loom_backend_attention_block_forward(cp->be, cp->part_out, cp->part_lse, qkv, kv,
                                                 cp->scratch, &g);
            loom_backend_attention_block_merge(cp->be, out, lse, cp->part_out, cp->part_lse, &g);
        }
        cp->compute_ms += loom_comm_now_ms() - t0;
        if (i + 1 < N && (st = wait2(cp, &hr, &hs))) return st;
        if (i + 1 < N) block_arrived(cp, i);
    }
    return LOOM_OK;
}

loom_status loom_cp_ring_backward(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse) {
    const int N = cp->size, r = cp->rank;
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    const size_t n = local_rows(cp) * kv_width(cp);
    double t0 = loom_comm_now_ms();
    loom_backend_attention_block_delta(cp->be, cp->delta, dout, out, &cp->blocks);
    pack_kv(cp, qkv);
    cp->compute_ms += loom_comm_now_ms() - t0;
    loom_comm_handle hr = {0}, hs = {0}, dr = {0}, ds[2] = {{0}, {0}};
    loom_status st = LOOM_OK;
    /* the transfers started in backward step i carry its name */
    for (int i = 0; i < N; i++) {
        cp->comm->label = loom_cp_label(cp, 1, i);
        st = i + 1 < N ? post_block(cp, i, &hr, &hs) : LOOM_OK;
        cp->comm->label = NULL;
        if (st) return st;
        float *dkv = cp->dkv_send[i % 2];
        if ((st = loom_comm_wait(&ds[i % 2], cp->err))) return st; /* sent at step i-2 */
        loom_attention_blocks g;
        block_of(cp, &g, (r - i + N) % N);
        t0 = loom_comm_now_ms();
        loom_backend_memset(cp->be, dkv, 0, n * sizeof(float));
        if (!all_masked(&g))
            loom_backend_attention_block_backward(cp->be, dqkv, dkv, cp->scratch, dout, qkv,
                                                  cp->kv[i % 2], lse, cp->delta, &g);
        cp->compute_ms += loom_comm_now_ms() - t0;
        if (i > 0) { /* the block's dK/dV from the ranks before: ours goes on top */
            if ((st = loom_comm_wait(&dr, cp->err))) return st;
            t0 = loom_comm_now_ms();
            loom_backend_add(cp->be, dkv, dkv, cp->dkv_recv, n);
            cp->compute_ms += loom_comm_now_ms() - t0;
        }
        if (N > 1) { /* pass it on; receive the next block's (at the end: our own block's) */
            cp->comm->label = loom_cp_label(cp, 1, i);
            st = loom_comm_isend(cp->comm, dkv, n, next, TAG_DKV, &ds[i % 2], cp->err);
            cp->bytes_f32 += (double)n * sizeof(float);
            if (!st) st = loom_comm_irecv(cp->comm, cp->dkv_recv, n, prev, TAG_DKV, &dr, cp->err);
            cp->comm->label = NULL;
            if (st) return st;
        }
        if (i + 1 < N && (st = wait2(cp, &hr, &hs))) return st;
        if (i + 1 < N) block_arrived(cp, i);
    }
    const float *own = cp->dkv_send[0]; /* N = 1: nothing travelled */
    if (N > 1) {
        if ((st = loom_comm_wait(&dr, cp->err)) || (st = wait2(cp, &ds[0], &ds[1]))) return st;
        own = cp->dkv_recv;
    }
    t0 = loom_comm_now_ms();
    loom_backend_add_2d(cp->be, dqkv + (size_t)cp->o.H * cp->o.hd, row_width(cp), own, kv_width(cp),
                        local_rows(cp), kv_width(cp));
    cp->compute_ms += loom_comm_now_ms() - t0;
    return LOOM_OK;
}
