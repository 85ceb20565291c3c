/* Mixture-of-experts feed-forward block (in place of the dense MLP of a layer), with
 * expert parallelism over the mesh's ep group.
 *
 * Router: logits = x @ gate^T [N, E]; softmax; top-k; the k probabilities renormalised
 * to sum 1 (Mixtral). Capacity (--capacity-factor cf > 0): per micro-batch of N local
 * tokens, every expert keeps at most ceil(cf * N * K / E) assignments, visited
 * slot-major (first choices of all tokens in token order, then second choices, ...);
 * a dropped assignment contributes nothing (the token keeps its residual). The
 * decision is made on the rank that owns the tokens, before dispatch, over exactly the
 * micro-batch one process would see: every layout with the same --micro-batch drops the
 * same assignments. cf 0: dropless (all-to-all-v with any counts).
 *
 * Dispatch: kept rows are laid out expert by expert (expert e's rows from offs[e]);
 * the rows of the experts a rank owns go to it with one all-to-all-v (row counts
 * exchanged first); the receiver places them expert-major ([local expert][source
 * rank][rows]: a fixed order, whatever the arrival order), runs one GEMM per expert
 * and per projection, and the outputs return by the inverse all-to-all-v.
 *
 * Losses added to the training loss (documented in docs/moe.md):
 *   aux = E * sum_e f_e * P_e per MoE layer and micro-batch, f_e = assignments to e
 *   (before dropping) / (N * K), P_e = mean router probability of e; the training loss
 *   adds aux_loss_coef * (sum over MoE layers of aux) averaged over micro-batches;
 *   z-loss: z_loss_coef * mean over tokens of sum over MoE layers of logsumexp^2. */
#ifndef LOOM_MODEL_MOE_H
#define LOOM_MODEL_MOE_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"

typedef struct loom_moe loom_moe;

/* Router statistics of one step over all ranks, MoE layers and micro-batches. */
typedef struct {
    double load_min, load_max, load_mean; /* per expert: assignments / tokens (mean = K/E) */
    double dropped;                       /* assignments dropped by the capacity */
    double aux_loss, z_loss;              /* unweighted, as they enter the loss */
} loom_moe_stats;

/* For micro-batches of N tokens; ep: the expert-parallel group (NULL: one rank); be:
 * where its ops run and its tensors live (NULL: loom_backend_cpu()). The table must have
 * been built for this rank's place in ep (loom_params_build's ep_rank, ep_size). */
loom_status loom_moe_create(loom_moe **out, const loom_model_config *cfg,
                            const loom_param_table *table, int N, loom_comm *ep,
                            const loom_backend *be, loom_error *err);
void loom_moe_destroy(loom_moe *moe);
/* Splits the local tokens of a micro-batch into `chunks` token ranges (default 1): chunk
 * c + 1's dispatch and chunk c - 1's combine are in flight (non-blocking all-to-all-v)
 * while chunk c's experts compute. The same function for any count (only the order of
 * the expert weight-gradient sums changes). moe NULL (a dense model): chunks must be 1. */
loom_status loom_moe_set_chunks(loom_moe *moe, int chunks, loom_error *err);
/* Bytes of activations and scratch held (for the start-up report). */
size_t loom_moe_bytes(const loom_moe *moe);
/* Where failures of the ep collectives inside forward/backward are reported. */
void loom_moe_set_error(loom_moe *moe, loom_error *err);

/* Context parallelism: the micro-batch's tokens are split over cp (its ranks hold other
 * tokens of the same sequences), so the load-balancing loss's per-expert statistics are
 * summed over cp before the loss is formed, and it is the whole micro-batch's, as on one
 * process. Needs a dropless router (capacity counts a whole micro-batch's tokens: the
 * caller checks --capacity-factor 0). moe NULL: nothing to do. */
loom_status loom_moe_set_cp(loom_moe *moe, loom_comm *cp, loom_error *err);

/* Split backward (zero-bubble schedules): loom_moe_backward then computes the input
 * gradient only and keeps the expert-side output and hidden gradients, the router's
 * logit gradient and the shared expert's; loom_moe_backward_weight adds the weight
 * gradients from them (in B's order: the same sums bitwise). */
loom_status loom_moe_set_split(loom_moe *moe, loom_error *err);
void loom_moe_backward_weight(loom_moe *moe, int layer, float *grads, const float *x);

/* out[N, C] = the MoE block of `layer` applied to x[N, C] (saves what backward needs). */
loom_status loom_moe_forward(loom_moe *moe, int layer, const float *params, const float *x,
                             float *out);
/* dx[N, C] = d/dx (overwritten); parameter gradients accumulate into grads. dloss: the
 * weight of one token's loss (as in loom_model_loss_sum). */
loom_status loom_moe_backward(loom_moe *moe, int layer, const float *params, float *grads,
                              const float *x, const float *dy, float *dx);
/* The auxiliary losses of the MoE layers whose forward ran since the last call (all of
 * them for a whole model; a pipeline stage calls it after each chunk), as a sum over the
 * tokens (aux_coef * aux * N + z_coef * sum of lse^2, over those layers), consumed: a
 * second call returns 0. With `training` also records their router statistics and
 * dloss for backward. */
double loom_moe_loss_sum(loom_moe *moe, float dloss, int training);
/* Adds src's step statistics to dst's and clears src's (pipeline slots: one model per
 * micro-batch in flight). */
void loom_moe_stats_add(loom_moe *dst, loom_moe *src);
/* Drops the step statistics gathered so far (a tp replica's: counted once, by tp rank 0). */
void loom_moe_stats_clear(loom_moe *moe);
/* The routing decisions of the last forward (for the layout tests, which compare them
 * across layouts): idx[n_moe][N][K] the chosen experts in choice order, gap[n_moe][N]
 * each token's margin, the smallest relative gap (p_j - p_{j+1}) / p_j between
 * consecutive router probabilities of its top K+1 (how close a choice, or the order of
 * two, is to flipping under rounding), n_moe the whole model's MoE layers: a pipeline
 * stage writes its own layers' entries at their places (the others untouched). Returns
 * the number of layers written. */
int loom_moe_routes(const loom_moe *moe, int32_t *idx, float *gap);
/* The expert-parallel all-to-alls' bytes this rank has sent to the other ep ranks so far:
 * sent[0] dispatches in bf16 (the forward's rows under --precision bf16), sent[1]
 * dispatches in fp32 (backward's output gradients; the forward's in fp32 runs), sent[2]
 * combines in bf16 (the forward's outputs under --precision bf16), sent[3] combines in
 * fp32 (backward's input gradients; the forward's in fp32 runs). */
void loom_moe_sent_bytes(const loom_moe *moe, double sent[4]);
/* The step's statistics summed over `dp` (collective; with pipelining the world, so every
 * stage's layers count), then reset. */
loom_status loom_moe_step_stats(loom_moe *moe, loom_comm *dp, loom_moe_stats *out, loom_error *err);

#endif
