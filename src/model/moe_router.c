/* MoE router: gate logits, softmax top-k with renormalised weights, the capacity
 * decision and the dispatch rows; the load-balancing and z losses; the router's
 * backward; and the routing decisions the layout tests compare (loom_moe_routes). */

#include "model/moe_impl.h"

void loom_moe_route(loom_moe *m, moe_layer *L, const loom_block_params *k, const float *p,
                    const float *x) {
    const int N = m->N, C = m->C, E = m->E, K = m->K;
    loom_backend_linear_forward(m->be, m->logits, x, p + k->gate_w, NULL, N, C, E);
    loom_backend_moe_router_forward(m->be, L->probs, L->idx, L->w, L->lse, m->logits, N, E, K);
    L->dropped =
        loom_backend_moe_capacity(m->be, L->pos, L->load, L->kept, L->idx, N, K, E, m->cap);
    loom_moe_set_rows(m, L);
}

/* Tokens of the whole micro-batch: N here, times the context-parallel ranks. */
static double batch_tokens(const loom_moe *m) {
    return (double)m->N * (m->cp ? m->cp->size : 1);
}

loom_status loom_moe_router_losses(loom_moe *m, moe_layer *L) {
    const int N = m->N, E = m->E, K = m->K;
    /* Auxiliary losses of this micro-batch (double: order-independent enough, and they
     * are sums over a fixed order anyway). With context parallelism the per-expert loads
     * and probability sums are the whole micro-batch's (summed over cp). */
    double aux = 0.0, z = 0.0, local[2 * 1024];
    double *s = L->gload ? L->gload : local;
    for (int e = 0; e < E; e++) {
        double P = 0.0;
        for (int t = 0; t < N; t++) P += L->probs[(size_t)t * E + e];
        s[e] = L->load[e];
        s[E + e] = P;
    }
    if (m->cp) {
        loom_status st = loom_comm_allreduce_sum_f64(m->cp, s, 2 * E, m->err);
        if (st) return st;
    }
    const double Nb = batch_tokens(m);
    for (int e = 0; e < E; e++) aux += s[e] / (Nb * K) * (s[E + e] / Nb);
    for (int t = 0; t < N; t++) z += (double)L->lse[t] * L->lse[t];
    L->aux = aux * E;
    L->zsum = z;
    L->fresh = 1;
    /* this rank's share of the micro-batch's aux term: its N tokens' weight */
    m->loss_term += (double)m->cfg.aux_loss_coef * L->aux * N + (double)m->cfg.z_loss_coef * z;
    return LOOM_OK;
}

void loom_moe_router_backward_into(loom_moe *m, moe_layer *L, const loom_block_params *k,
                                   const float *p, float *g, const float *x, float *dx) {
    const int N = m->N, C = m->C, E = m->E, K = m->K;
    /* Router: d(aux term)/d probs[t,e] = aux_coef * dloss * N * E * f_e / N (N, f_e: the
     * whole micro-batch's tokens and loads, with context parallelism over cp). */
    float dprob[1024];
    const double a = (double)m->cfg.aux_loss_coef * m->dloss * E / (batch_tokens(m) * K);
    for (int e = 0; e < E; e++) dprob[e] = (float)(a * (L->gload ? L->gload[e] : L->load[e]));
    loom_backend_moe_router_backward(m->be, m->logits, L->probs, L->idx, L->w, m->dw, L->lse, dprob,
                                     m->cfg.z_loss_coef * m->dloss, N, E, K);
    if (m->split) loom_backend_copy(m->be, L->w_dlogits, m->logits, (size_t)N * E * sizeof(float));
    loom_linear_backward(m->be, dx, LOOM_DX_ADD, m->logits, p + k->gate_w,
                         m->split ? NULL : g + k->gate_w, NULL, x, N, C, E);
}

int loom_moe_routes(const loom_moe *m, int32_t *idx, float *gap) {
    const int N = m->N, E = m->E, K = m->K;
    int count = 0;
    for (int l = 0; l < m->table->n_layer; l++) {
        if (!m->table->blocks[l].moe) continue;
        const moe_layer *L = &m->layers[l];
        int n = 0; /* the layer's place among the whole model's MoE layers */
        for (int j = 0; j < m->table->layer_ids[l]; j++) n += loom_model_layer_is_moe(&m->cfg, j);
        if (idx) /* to the caller's host buffer */
            loom_backend_copy_to_host(m->be, idx + (size_t)n * N * K, L->idx,
                                      (size_t)N * K * sizeof(int32_t));
        for (int t = 0; gap && t < N; t++) {
            const float *p = L->probs + (size_t)t * E;
            const int32_t *ix = L->idx + (size_t)t * K;
            float next = -1.0f; /* the best expert not chosen */
            for (int e = 0; e < E; e++) {
                int chosen = 0;
                for (int j = 0; j < K; j++) chosen |= ix[j] == e;
                if (!chosen && p[e] > next) next = p[e];
            }
            double g = 1.0;
            for (int j = 0; j < K; j++) {
                const double a = p[ix[j]], b = j + 1 < K ? p[ix[j + 1]] : next;
                if (b >= 0 && a > 0 && (a - b) / a < g) g = (a - b) / a;
            }
            gap[(size_t)n * N + t] = (float)g;
        }
        count++;
    }
    return count;
}
