#include "rl/grpo.h"

#include <math.h>

void loom_grpo_advantages(const float *rewards, int n_groups, int G, float eps, float *adv) {
    for (int g = 0; g < n_groups; g++) {
        const float *r = rewards + (size_t)g * G;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < G; i++) mean += r[i];
        mean /= G;
        for (int i = 0; i < G; i++) var += (r[i] - mean) * (r[i] - mean);
        double sd = G > 1 ? sqrt(var / (G - 1)) : 0.0;
        for (int i = 0; i < G; i++) adv[(size_t)g * G + i] = (float)((r[i] - mean) / (sd + eps));
    }
}

/* Row max and log-sum-exp in double. */
static double row_lse(const float *x, int V) {
    double m = x[0];
    for (int j = 1; j < V; j++)
        if (x[j] > m) m = x[j];
    double s = 0.0;
    for (int j = 0; j < V; j++) s += exp(x[j] - m);
    return m + log(s);
}

void loom_grpo_logprobs(const float *logits, const int32_t *targets, int N, int V, float *logp) {
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        logp[i] = (float)(x[targets[i]] - row_lse(x, V));
    }
}

double loom_grpo_loss(const loom_grpo_config *c, const float *logits, const int32_t *targets,
                      const float *weight, const float *adv, const float *old_logp,
                      const float *ref_logp, int N, int V, float *dlogits, loom_grpo_stats *stats) {
    const double lo = 1.0 - c->clip_eps, hi = 1.0 + c->clip_eps;
    const int kl = c->kl_coef != 0.0f && ref_logp;
    double loss = 0.0, tokens = 0.0, kl_sum = 0.0, clipped = 0.0, ent = 0.0, off = 0.0;
    /* Rows in order (the sums are the same whatever the thread count). */
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *dx = dlogits ? dlogits + (size_t)i * V : NULL;
        const double w = weight[i];
        if (w == 0.0) {
            if (dx)
                for (int j = 0; j < V; j++) dx[j] = 0.0f;
            continue;
        }
        const double lse = row_lse(x, V);
        const double logp = (float)(x[targets[i]] - lse); /* loom_grpo_logprobs' bits */
        const double A = adv[i], ratio = exp(logp - old_logp[i]);
        const double cr = ratio < lo ? lo : ratio > hi ? hi : ratio;
        const double u = ratio * A, v = cr * A;
        /* d(-min(u, v))/d logp: u's branch gives -ratio*A; v's gives it only inside the
         * clip range; a tie gives half of each (torch.minimum). */
        const int inside = ratio >= lo && ratio <= hi;
        double g = u < v ? -u : u > v ? (inside ? -u : 0.0) : -0.5 * u * (1.0 + inside);
        double l = -(u < v ? u : v);
        if (u > v) clipped += 1.0;
        if (kl) {
            const double d = ref_logp[i] - logp, e = exp(d);
            l += c->kl_coef * (e - d - 1.0);
            g += c->kl_coef * (1.0 - e);
            kl_sum += e - d - 1.0;
        }
        loss += w * l;
        tokens += 1.0;
        off += ratio != 1.0;
        /* entropy and the gradient share the softmax */
        double h = 0.0;
        const double gw = g * w;
        for (int j = 0; j < V; j++) {
            const double lp = x[j] - lse, p = exp(lp);
            h -= p * lp;
            if (dx) dx[j] = (float)(gw * ((j == targets[i]) - p));
        }
        ent += h;
    }
    if (stats) {
        stats->tokens += tokens;
        stats->kl += kl_sum;
        stats->clipped += clipped;
        stats->entropy += ent;
        stats->off += off;
    }
    return loss;
}
