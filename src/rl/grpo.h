/* The GRPO objective over plain buffers (DeepSeekMath; DAPO's and Dr. GRPO's per-token
 * normalisation as an option): group-normalised advantages, the per-token importance
 * ratio exp(logp - logp_old), the clipped surrogate, and the k3 estimator of the KL
 * divergence to a reference policy. Forward and backward to the logits, for one rank
 * holding whole vocabulary rows (no tensor parallelism). */
#ifndef LOOM_RL_GRPO_H
#define LOOM_RL_GRPO_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    LOOM_GRPO_NORM_SEQUENCE, /* GRPO: each sequence's token mean, averaged over sequences */
    LOOM_GRPO_NORM_TOKEN     /* DAPO / Dr. GRPO: every completion token of the batch alike */
} loom_grpo_norm;

typedef struct {
    float clip_eps; /* the ratio is clipped to [1 - eps, 1 + eps] */
    float kl_coef;  /* weight of the k3 KL to the reference (0: none, ref_logp unused) */
} loom_grpo_config;

/* Sums over the tokens given (weight != 0), for the metrics. */
typedef struct {
    double tokens;  /* tokens counted */
    double kl;      /* sum of k3 KL estimates (0 without a reference) */
    double clipped; /* tokens whose clipped term is the smaller one (no gradient) */
    double entropy; /* sum of the policy's entropies (nats) */
    double off;     /* tokens whose ratio is not exactly 1 */
} loom_grpo_stats;

/* Group-normalised advantages: rewards are n_groups groups of G (G >= 2) in a row;
 * adv = (r - mean of its group) / (sample std of its group + eps). */
void loom_grpo_advantages(const float *rewards, int n_groups, int G, float eps, float *adv);

/* logp[i] = log softmax(logits[i])[targets[i]] for i < N (V logits a row), computed in
 * double and rounded once: the same function gives the same bits for the same row. */
void loom_grpo_logprobs(const float *logits, const int32_t *targets, int N, int V, float *logp);

/* The loss sum_i weight[i] * l_i with, for token i (logp its log-probability),
 *   ratio = exp(logp - old_logp[i]),
 *   l_i = -min(ratio * adv[i], clip(ratio, 1 - eps, 1 + eps) * adv[i])
 *         + kl_coef * (exp(ref_logp[i] - logp) - (ref_logp[i] - logp) - 1).
 * weight[i] = 0 leaves token i out (prompt, padding); the caller's weights carry the
 * normalisation (1 / (sequences x the sequence's tokens) or 1 / tokens of the batch).
 * ref_logp may be NULL when kl_coef is 0. When dlogits is not NULL it receives
 * d loss / d logits (it may be logits itself: each row is read before it is written).
 * Ties in the min split the gradient as PyTorch's minimum does. stats (may be NULL)
 * accumulates. Returns the loss. */
double loom_grpo_loss(const loom_grpo_config *c, const float *logits, const int32_t *targets,
                      const float *weight, const float *adv, const float *old_logp,
                      const float *ref_logp, int N, int V, float *dlogits, loom_grpo_stats *stats);

#endif
