/* Ulysses attention (cp.h, mode ulysses). An all-to-all turns the sequence-sharded qkv
 * [B*Tl, (H + 2*KV)*hd] into head-sharded full sequences [B, T, (Hn + 2*KVr)*hd] (rank p
 * gets query heads [p*Hn, (p+1)*Hn) and the key/value heads they use; with fewer key/value
 * heads than ranks each is replicated to the N/KV ranks that share it), the backend's
 * attention runs on whole sequences, and an all-to-all brings the output back. The lse
 * stays head-sharded ([B, Hn, T] is B*H*Tl floats too), so backward needs no lse
 * exchange: it re-gathers qkv, out and dout, runs the backend backward, and returns dqkv,
 * adding the replicated heads' gradients in rank order (a fixed order: runs repeat
 * bitwise).
 *
 * A message to or from rank s is its B samples' Tl tokens, [B][Tl][width]; in the full
 * sequence they sit at tokens [s*Tl, (s+1)*Tl) of each sample, so one 2-D copy per rank
 * (B rows of Tl*width floats) moves them between the two layouts.
 *
 * With o.bf16_qkv (a language model under --precision bf16, cp.h) the exchanges of values
 * that are, or are only read as, bf16 values travel as bf16 bits (rounded to nearest even
 * before sending, widened on arrival): qkv both ways (bf16 values: exact), forward's
 * output (the model rounds it to bf16 right after attention, and rounding a rounded value
 * changes nothing) and backward's re-gathered output (the rounded one). With o.bf16_grads
 * (a language model: its blocks round d(out) before and dqkv after, in every layout)
 * d(out) travels as bf16 too, and dqkv when no key/value head is replicated: a replicated
 * head's dK/dV are partial sums, added here in rank order and rounded by the model after,
 * so they stay fp32 (as the ring's dK/dV). */
#include "cp/cp_impl.h"

/* First key/value head rank p holds. */
static int kv_first(const loom_cp *cp, int p) {
    return cp->o.KV >= cp->size ? p * cp->KVr : p / (cp->size / cp->o.KV);
}

typedef struct {
    size_t Nl, R, Rr, OC, OCn, hd; /* local rows; qkv, exchanged qkv, out, exchanged out widths */
} dims;

static dims dims_of(const loom_cp *cp) {
    dims d;
    d.hd = (size_t)cp->o.hd;
    d.Nl = (size_t)cp->o.B * cp->Tl;
    d.R = (size_t)(cp->o.H + 2 * cp->o.KV) * d.hd;
    d.Rr = (size_t)(cp->Hn + 2 * cp->KVr) * d.hd;
    d.OC = (size_t)cp->o.H * d.hd;
    d.OCn = (size_t)cp->Hn * d.hd;
    return d;
}

/* Messages [B][Tl][w] (one per rank, in rank order) <-> full sequences [B][T][w]. */
static void messages_to_full(loom_cp *cp, float *full, const float *msg, size_t w) {
    const size_t Tl = (size_t)cp->Tl, T = (size_t)cp->o.T, B = (size_t)cp->o.B;
    for (int s = 0; s < cp->size; s++)
        loom_backend_copy_2d(cp->be, full + s * Tl * w, T * w, msg + s * B * Tl * w, Tl * w, B,
                             Tl * w);
}
static void full_to_messages(loom_cp *cp, float *msg, const float *full, size_t w) {
    const size_t Tl = (size_t)cp->Tl, T = (size_t)cp->o.T, B = (size_t)cp->o.B;
    for (int s = 0; s < cp->size; s++)
        loom_backend_copy_2d(cp->be, msg + s * B * Tl * w, Tl * w, full + s * Tl * w, T * w, B,
                             Tl * w);
}

/* send -> recv, qkv-wide or out-wide messages; bf16 (with o.bf16_qkv, for values that are
 * bf16 values or only read rounded to them) through send16/recv16. */
static loom_status exchange(loom_cp *cp, int out_wide, int bf16) {
    const int N = cp->size, *c = cp->counts + (out_wide ? N : 0);
    const int *d = cp->displs + (out_wide ? N : 0);
    const size_t n = (size_t)d[N - 1] + (size_t)c[N - 1], others = n - (size_t)c[cp->rank];
    bf16 = bf16 && cp->o.bf16_qkv;
    cp->comm->label = loom_cp_label(cp, 0, out_wide); /* heartbeats, hang diagnoses */
    loom_status st;
    if (bf16) {
        double t0 = loom_comm_now_ms();
        loom_bf16_from_f32_n(cp->send16, cp->send, n);
        cp->compute_ms += loom_comm_now_ms() - t0;
        loom_comm_handle h = {0};
        st = loom_comm_ialltoallv_bf16(cp->comm, cp->send16, c, d, cp->recv16, c, d, &h, cp->err);
        if (!st) st = loom_comm_wait(&h, cp->err);
        t0 = loom_comm_now_ms();
        if (!st) loom_bf16_to_f32_n(cp->recv, cp->recv16, n);
        cp->compute_ms += loom_comm_now_ms() - t0;
        cp->bytes_bf16 += (double)others * sizeof(loom_bf16);
    } else {
        st = loom_comm_alltoallv(cp->comm, cp->send, c, d, cp->recv, c, d, cp->err);
        cp->bytes_f32 += (double)others * sizeof(float);
    }
    cp->comm->label = NULL;
    return st;
}

/* Local qkv -> qkv_full (this rank's heads, whole sequences). */
static loom_status gather_qkv(loom_cp *cp, const float *qkv) {
    const dims d = dims_of(cp);
    const size_t H = (size_t)cp->o.H, KV = (size_t)cp->o.KV, kvc = (size_t)cp->KVr * d.hd;
    double t0 = loom_comm_now_ms();
    for (int p = 0; p < cp->size; p++) {
        float *m = cp->send + (size_t)p * d.Nl * d.Rr;
        size_t g = (size_t)kv_first(cp, p);
        loom_backend_copy_2d(cp->be, m, d.Rr, qkv + p * d.OCn, d.R, d.Nl, d.OCn);
        loom_backend_copy_2d(cp->be, m + d.OCn, d.Rr, qkv + (H + g) * d.hd, d.R, d.Nl, kvc);
        loom_backend_copy_2d(cp->be, m + d.OCn + kvc, d.Rr, qkv + (H + KV + g) * d.hd, d.R, d.Nl,
                             kvc);
    }
    cp->compute_ms += loom_comm_now_ms() - t0;
    loom_status st = exchange(cp, 0, 1);
    if (st) return st;
    t0 = loom_comm_now_ms();
    messages_to_full(cp, cp->qkv_full, cp->recv, d.Rr);
    cp->compute_ms += loom_comm_now_ms() - t0;
    return LOOM_OK;
}

/* Local out-shaped rows [Nl, H*hd] -> full [B, T, Hn*hd] of this rank's heads (bf16: values
 * the wire may carry as bf16). */
static loom_status gather_out(loom_cp *cp, float *full, const float *local, int bf16) {
    const dims d = dims_of(cp);
    double t0 = loom_comm_now_ms();
    for (int p = 0; p < cp->size; p++)
        loom_backend_copy_2d(cp->be, cp->send + (size_t)p * d.Nl * d.OCn, d.OCn, local + p * d.OCn,
                             d.OC, d.Nl, d.OCn);
    cp->compute_ms += loom_comm_now_ms() - t0;
    loom_status st = exchange(cp, 1, bf16);
    if (st) return st;
    t0 = loom_comm_now_ms();
    messages_to_full(cp, full, cp->recv, d.OCn);
    cp->compute_ms += loom_comm_now_ms() - t0;
    return LOOM_OK;
}

loom_status loom_cp_ulysses_forward(loom_cp *cp, float *out, float *lse, const float *qkv) {
    const dims d = dims_of(cp);
    loom_status st = gather_qkv(cp, qkv);
    if (st) return st;
    const int B = cp->o.B, T = cp->o.T, hd = cp->o.hd;
    double t0 = loom_comm_now_ms();
    if (cp->o.causal)
        loom_backend_attention_forward(cp->be, cp->out_full, lse, cp->qkv_full, cp->scratch, B, T,
                                       cp->Hn, cp->KVr, hd);
    else
        loom_backend_attention_bidir_forward(cp->be, cp->out_full, lse, cp->qkv_full, cp->scratch,
                                             B, T, cp->Hn, cp->KVr, hd);
    full_to_messages(cp, cp->send, cp->out_full, d.OCn);
    cp->compute_ms += loom_comm_now_ms() - t0;
    if ((st = exchange(cp, 1, 1))) return st; /* the model rounds it to bf16 next */
    t0 = loom_comm_now_ms();
    for (int p = 0; p < cp->size; p++)
        loom_backend_copy_2d(cp->be, out + p * d.OCn, d.OC, cp->recv + (size_t)p * d.Nl * d.OCn,
                             d.OCn, d.Nl, d.OCn);
    cp->compute_ms += loom_comm_now_ms() - t0;
    return LOOM_OK;
}

loom_status loom_cp_ulysses_backward(loom_cp *cp, float *dqkv, const float *dout, const float *qkv,
                                     const float *out, const float *lse) {
    const dims d = dims_of(cp);
    loom_status st;
    if ((st = gather_qkv(cp, qkv)) || (st = gather_out(cp, cp->out_full, out, 1)) ||
        (st = gather_out(cp, cp->dout_full, dout, cp->o.bf16_grads)))
        return st;
    const int B = cp->o.B, T = cp->o.T, hd = cp->o.hd;
    double t0 = loom_comm_now_ms();
    loom_backend_memset(cp->be, cp->dqkv_full, 0, (size_t)B * T * d.Rr * sizeof(float));
    if (cp->o.causal)
        loom_backend_attention_backward(cp->be, cp->dqkv_full, cp->scratch, cp->dout_full,
                                        cp->qkv_full, cp->out_full, lse, B, T, cp->Hn, cp->KVr, hd);
    else
        loom_backend_attention_bidir_backward(cp->be, cp->dqkv_full, cp->scratch, cp->dout_full,
                                              cp->qkv_full, cp->out_full, lse, B, T, cp->Hn,
                                              cp->KVr, hd);
    full_to_messages(cp, cp->send, cp->dqkv_full, d.Rr);
    cp->compute_ms += loom_comm_now_ms() - t0;
    if ((st = exchange(cp, 0, cp->o.bf16_grads && cp->o.KV >= cp->size))) return st;
    t0 = loom_comm_now_ms();
    const size_t H = (size_t)cp->o.H, KV = (size_t)cp->o.KV, kvc = (size_t)cp->KVr * d.hd;
    for (int p = 0; p < cp->size; p++) { /* rank order: replicated heads sum the same way */
        const float *m = cp->recv + (size_t)p * d.Nl * d.Rr;
        size_t g = (size_t)kv_first(cp, p);
        loom_backend_add_2d(cp->be, dqkv + p * d.OCn, d.R, m, d.Rr, d.Nl, d.OCn);
        loom_backend_add_2d(cp->be, dqkv + (H + g) * d.hd, d.R, m + d.OCn, d.Rr, d.Nl, kvc);
        loom_backend_add_2d(cp->be, dqkv + (H + KV + g) * d.hd, d.R, m + d.OCn + kvc, d.Rr, d.Nl,
                            kvc);
    }
    cp->compute_ms += loom_comm_now_ms() - t0;
    return LOOM_OK;
}
