/* Private to the MoE block (model/moe*.c): its state and the pieces the router,
 * dispatch and experts files share. model/moe.h is the public API.
 *
 * Memory: every tensor the ops read or write (routing outputs, dispatched rows, expert
 * activations, gradients, the zero offsets) is backend memory (loom_moe_grab); the
 * per-chunk row counts, all-to-all-v counts and displacements, handles and statistics
 * are host metadata (plain calloc, loom_moe_grab_host). The routing bookkeeping
 * (loom_moe_set_rows, the aux loss, loom_moe_routes) reads the routing outputs in
 * place: host-visible memory, as on the CPU backend (the CUDA backend refuses the
 * routing ops, kernels/cuda/backend_cuda.h). */
#ifndef LOOM_MODEL_MOE_IMPL_H
#define LOOM_MODEL_MOE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"
#include "model/linear_backward.h"
#include "model/moe.h"

/* What one MoE layer keeps from forward for backward. */
typedef struct {
    int32_t *idx, *pos;    /* [N*K] chosen experts, row among the expert's kept rows or -1 */
    float *w;              /* [N*K] renormalised combine weights */
    float *probs, *lse;    /* [N*E], [N] */
    int32_t *row;          /* [N*K] dispatch row of each assignment, -1: dropped */
    int32_t *load;         /* [E] assignments before dropping */
    int32_t *kept;         /* [E] */
    int32_t *ccnt;         /* [chunks][E] kept rows per chunk and expert (sent) */
    float *ret;            /* [N*K, C] expert outputs, dispatch order */
    int32_t *rows;         /* [chunks][ep][EL] rows received from source s for local expert j */
    float *xin, *h, *act;  /* expert side, expert-major: [R, C], [R, FC], [R, F] */
    float *sh_fc, *sh_act; /* shared expert: [N, FC], [N, F] */
    /* act and sh_act kept in bf16 instead (then those two are NULL) when the backend keeps
     * the activations only bf16 GEMMs read in bf16 (loom_backend_bf16_activations): the proj
     * GEMM and its weight gradient are their only readers (docs/precision.md) */
    loom_bf16 *act16, *sh_act16;
    /* xin kept in bf16 instead (then xin is NULL) under the same condition: the fc GEMM and
     * its weight gradient are its only readers, so the rows are rounded once before the
     * dispatch and travel as bf16 (half the forward all-to-all's bytes, the same function) */
    loom_bf16 *xin16;
    double aux, zsum;
    double *gload; /* context parallelism: [2E] loads and probability sums over the cp group */
    int dropped;
    int fresh; /* forward ran since the last loom_moe_loss_sum */
    /* split backward (loom_moe_set_split): what B keeps for W */
    float *w_dy, *w_dh;       /* expert side [R, C] output and [R, FC] hidden gradients */
    float *w_dlogits;         /* [N, E] */
    float *w_sh_dy, *w_sh_dh; /* shared expert [N, C], [N, FC] */
} moe_layer;

struct loom_moe {
    loom_model_config cfg;
    const loom_backend *be; /* where the ops run and the tensors live */
    const loom_param_table *table;
    int N, C, F, FC, E, K, EL, ep, cap, gpt2, R;
    int chunks;                /* token chunks whose all-to-all overlaps another's experts */
    int split;                 /* backward leaves the weight gradients to W */
    int32_t *chunk_of;         /* [N] chunk of each token */
    int32_t *zoffs;            /* [E] zeros: the kernels address rows as offs[e] + row */
    int *sb, *rb;              /* [chunks + 1] first row of each chunk: sent, received */
    loom_comm_handle *hd, *hc; /* [chunks] dispatch and combine in flight */
    loom_comm *comm;
    loom_comm *cp; /* NULL, or the context-parallel group the statistics are summed over */
    loom_error *err;
    moe_layer *layers; /* n_layer; only MoE layers have buffers */
    size_t bytes, chunk_bytes;
    /* scratch shared by all layers */
    float *logits, *dw, *send, *recv, *ex, *exd, *dact, *dh;
    loom_bf16 *send16, *recv16; /* the forward dispatch's rows in bf16 (xin16), or NULL; the
                                 * forward combine's on the way back (recv16 to send16) */
    /* --precision bf16: the experts' outputs are rounded to bf16 values (every layout), so
     * the forward combine can carry them as bf16 (docs/precision.md) */
    int round_out;
    /* all-to-all bytes this rank sent to the other ep ranks, by exchange and wire type */
    double sent_dispatch16, sent_dispatch32, sent_combine16, sent_combine32;
    float *cnt_send, *cnt_recv; /* [ep][chunks][EL] row counts as floats, sent and received */
    int *sc, *sd, *rc, *rd;     /* all-to-all-v counts and displacements, [chunks][ep] each */
    float dloss;
    double loss_term; /* this forward's aux and z terms times their token weights */
    /* step statistics (this rank) */
    double *step_load; /* [E + 4]: loads, dropped, aux, z, tokens */
};

/* ---- moe.c: memory ---- */
void *loom_moe_grab(loom_moe *m, size_t bytes);      /* zeroed backend memory */
void *loom_moe_grab_host(loom_moe *m, size_t bytes); /* zeroed host memory */

/* ---- moe_router.c: routing and its losses ---- */
/* Router logits, top-k, capacity and the dispatch rows of layer L from x. */
void loom_moe_route(loom_moe *m, moe_layer *L, const loom_block_params *k, const float *p,
                    const float *x);
/* The aux and z terms of L's forward, added to the loss of this forward. */
loom_status loom_moe_router_losses(loom_moe *m, moe_layer *L);
/* Router backward from m->dw: dx += d(gate input); the gate's weight gradient (or, split,
 * kept in L for W). */
void loom_moe_router_backward_into(loom_moe *m, moe_layer *L, const loom_block_params *k,
                                   const float *p, float *g, const float *x, float *dx);

/* ---- moe_dispatch.c: dispatch rows, counts, all-to-all-v in chunks, combine ---- */
void loom_moe_set_rows(loom_moe *m, moe_layer *L);
void loom_moe_set_counts(loom_moe *m, const moe_layer *L);
loom_status loom_moe_exchange_counts(loom_moe *m, moe_layer *L);
loom_status loom_moe_dispatch_start(loom_moe *m, int c, const float *send);
loom_status loom_moe_dispatch_finish(loom_moe *m, const moe_layer *L, int c, float *dst);
/* The same for the forward's rows in bf16: m->send16 (dispatch order) to m->recv16, then
 * expert-major into dst. */
loom_status loom_moe_dispatch_start16(loom_moe *m, int c);
loom_status loom_moe_dispatch_finish16(loom_moe *m, const moe_layer *L, int c, loom_bf16 *dst);
/* Backward's dispatch with bf16 on the wire (the experts' output gradients, which only
 * bf16 GEMMs read when the experts have no bias): send's rows rounded into m->send16 and
 * sent; the finish widens them and places them expert-major into dst, as the fp32 pair. */
loom_status loom_moe_dispatch_start_rounded(loom_moe *m, int c, const float *send);
loom_status loom_moe_dispatch_finish_widened(loom_moe *m, const moe_layer *L, int c, float *dst);
loom_status loom_moe_combine_start(loom_moe *m, const moe_layer *L, int c, const float *src,
                                   float *out);
/* The forward's combine of chunk c with bf16 on the wire (the forward dispatch in bf16 and
 * the experts' outputs src rounded to bf16 values): src's rows back as bf16 into m->send16
 * (dispatch order); loom_moe_combines_finish16 widens them into out. */
loom_status loom_moe_combine_start16(loom_moe *m, const moe_layer *L, int c, const float *src);
loom_status loom_moe_combines_finish16(loom_moe *m, float *out);
loom_status loom_moe_poke(loom_moe *m, int c);
loom_status loom_moe_combines_finish(loom_moe *m);
int loom_moe_expert_rows(const loom_moe *m, const moe_layer *L, int c, int j, int *r0);

/* ---- moe_experts.c: the feed-forward experts ---- */
loom_expert_params loom_moe_local_expert(const loom_block_params *k, int j);
/* act: the activation kept in fp32, or (act NULL) in bf16 in act16, computed through the
 * backward scratch m->dact (free in forward) and rounded once. */
/* x: the rows, fp32 or bf16 (loom_act). */
void loom_moe_ffn_forward(const loom_moe *m, const loom_expert_params *e, const float *p,
                          loom_act x, float *h, float *act, loom_bf16 *act16, float *y, int n);
void loom_moe_ffn_weight(const loom_moe *m, const loom_expert_params *e, float *g, loom_act x,
                         loom_act act, const float *dy, const float *dh, int n);
void loom_moe_ffn_backward(loom_moe *m, const loom_expert_params *e, const float *p, float *g,
                           loom_act x, const float *h, loom_act act, const float *dy, float *dx,
                           int n, float *keep_dy, float *keep_dh);

#endif
