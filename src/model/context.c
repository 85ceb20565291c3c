/* The model's side of context parallelism (cp/cp.h): which parts of every sequence this
 * rank holds, the position-dependent pieces at those global positions (RoPE, learned
 * positions, a batch's tokens), and attention through the context-parallel group.
 *
 * A rank holds n chunks of every sample (zigzag: two, else one), its rows ordered
 * [chunk][sample][token], so the rows of one chunk are B contiguous runs of `chunk`
 * tokens that all start at the same global position: each position-dependent kernel
 * runs once per chunk, unchanged, with its positions offset. Every other piece of the
 * model is row by row and does not care where a row sits in its sequence. Without
 * context parallelism there is one chunk at position 0 and the calls are the usual ones. */
#include "model/model_impl.h"

#include <string.h>

int loom_model_cp_on(const loom_model *m) {
    return m->cp && m->cp->size > 1;
}

int loom_model_chunks(const loom_model *m, int pos[2]) {
    if (!loom_model_cp_on(m)) {
        pos[0] = pos[1] = 0;
        return 1;
    }
    pos[0] = m->cp->chunk_pos[0];
    pos[1] = m->cp->chunk_pos[1];
    return m->cp->n_chunks;
}

void loom_model_load_tokens(loom_model *m, const int32_t *batch, int first) {
    int pos[2];
    const int n = loom_model_chunks(m, pos), L = m->T / n;
    const size_t bytes = (size_t)L * sizeof(int32_t);
    for (int j = 0; j < n; j++)
        for (int b = 0; b < m->B; b++) {
            /* a record is a window of T_seq + 1 tokens: inputs, and targets one later */
            const int32_t *seq = batch + (size_t)(first + b) * (m->T_seq + 1) + pos[j];
            const size_t row = ((size_t)j * m->B + b) * L;
            loom_backend_copy_to_device(m->be, m->inputs + row, seq, bytes);
            loom_backend_copy_to_device(m->be, m->targets + row, seq + 1, bytes);
        }
}

void loom_model_rope(const loom_model *m, float *qkv, int H, int KV, int hd, int backward) {
    int pos[2];
    const int n = loom_model_chunks(m, pos), L = m->T / n;
    const size_t rows = (size_t)m->B * L * (H + 2 * KV) * hd; /* floats of one chunk */
    const float theta = m->cfg.rope_theta;
    for (int j = 0; j < n; j++) {
        float *x = qkv + j * rows;
        if (backward)
            loom_backend_rope_backward_at(m->be, x, m->B, L, H, KV, hd, theta, pos[j]);
        else
            loom_backend_rope_forward_at(m->be, x, m->B, L, H, KV, hd, theta, pos[j]);
    }
}

loom_status loom_model_attention_forward(loom_model *m, float *out, float *lse, const float *qkv,
                                         int H, int KV, int hd, int causal) {
    if (loom_model_cp_on(m)) return loom_cp_attention_forward(m->cp, out, lse, qkv);
    if (causal)
        loom_backend_attention_forward(m->be, out, lse, qkv, m->att_scratch, m->B, m->T, H, KV, hd);
    else
        loom_backend_attention_bidir_forward(m->be, out, lse, qkv, m->att_scratch, m->B, m->T, H,
                                             KV, hd);
    return LOOM_OK;
}

loom_status loom_model_attention_backward(loom_model *m, float *dqkv, const float *dout,
                                          const float *qkv, const float *out, const float *lse,
                                          int H, int KV, int hd, int causal) {
    if (loom_model_cp_on(m)) return loom_cp_attention_backward(m->cp, dqkv, dout, qkv, out, lse);
    if (causal)
        loom_backend_attention_backward(m->be, dqkv, m->att_scratch, dout, qkv, out, lse, m->B,
                                        m->T, H, KV, hd);
    else
        loom_backend_attention_bidir_backward(m->be, dqkv, m->att_scratch, dout, qkv, out, lse,
                                              m->B, m->T, H, KV, hd);
    return LOOM_OK;
}

size_t loom_model_attention_scratch_floats(const loom_model *m, int H) {
    return loom_model_cp_on(m) ? 0 : loom_backend_attention_scratch_floats(m->be, m->B, m->T, H);
}
