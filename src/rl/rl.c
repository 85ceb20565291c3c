#include "rl/rl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/fault.h"
#include "core/progress.h"
#include "core/trace.h"
#include "core/fs.h"
#include "core/philox.h"
#include "model/moe.h"
#include "model/weights.h"
#include "rl/prompts.h"
#include "rl/reference.h"
#include "rl/reward.h"
#include "rl/gen_layout.h"
#include "rl/rollout.h"
#include "train/run.h"
#include "train/schedule.h"

#define PROMPT_STREAM 0x70726f6du /* "prom": the prompts of an iteration */

void loom_rl_config_defaults(loom_rl_config *rc) {
    memset(rc, 0, sizeof *rc);
    rc->iterations = 20;
    rc->prompts_per_iter = 8;
    rc->group_size = 8;
    rc->sampling = (loom_sampling){1.0f, 0, 1.0f};
    rc->max_new = 16;
    rc->grpo = (loom_grpo_config){0.2f, 0.0f};
    rc->norm = LOOM_GRPO_NORM_SEQUENCE;
    rc->ppo_epochs = 1;
    rc->ppo_micro_batch = 8;
    rc->gen_tp = 1;
}

static void state_free(rl_state *s) {
    loom_batch_generator_free(&s->gen);
    loom_reshard_free(&s->to_gen);
    loom_ckpt_descs_free(&s->train_descs);
    loom_ckpt_descs_free(&s->gen_descs);
    loom_params_free(&s->gen_table);
    if (s->gmesh_on) loom_mesh_free(&s->gmesh);
    loom_prompts_free(&s->train);
    loom_prompts_free(&s->eval);
    for (int i = 0; s->ctext && i < s->gper; i++) free(s->ctext[i]);
    free(s->stop), free(s->pptr), free(s->plen), free(s->clen), free(s->pidx), free(s->comp);
    free(s->stream), free(s->reward), free(s->sums), free(s->adv), free(s->weight);
    free(s->old_logp), free(s->ref_logp), free(s->ref_params), free(s->ctext);
    free(s->ctext_len), free(s->ptext_len), free(s->gen_params), free(s->full), free(s->parts);
    loom_route_dump_free(&s->routes);
    loom_sample_dump_free(&s->samples);
}

static loom_status state_init(rl_state *s, loom_run *r, const loom_rl_config *rc, loom_error *err) {
    memset(s, 0, sizeof *s);
    s->rc = rc;
    s->run = r;
    const loom_model_config *mc = r->mc;
    loom_mesh *mesh = r->mesh;
    s->n_global = rc->prompts_per_iter * rc->group_size;
    s->per = s->n_global / mesh->layout.dp;
    s->q0 = mesh->data_rank * s->per;
    s->gdp = mesh->size, s->grank = mesh->rank, s->glead = 1;
    loom_status st;
    if (rc->gen_tp > 1) {
        const loom_world w = {mesh->rank, mesh->size, 1};
        const loom_layout gl = {mesh->size / rc->gen_tp, rc->gen_tp, 1, 1, 1};
        if ((st = loom_mesh_create(&s->gmesh, &w, gl, err))) return st;
        s->gmesh_on = 1;
        s->gdp = gl.dp, s->grank = s->gmesh.dp_rank, s->glead = s->gmesh.tp_rank == 0;
    }
    s->gper = s->n_global / s->gdp;
    s->g0 = s->grank * s->gper;
    s->T = mc->seq_len;
    s->Tm = r->model.T;
    s->W = mc->seq_len + 1;
    s->V = mc->vocab_size;
    s->Vl = mc->vocab_size / mesh->layout.tp;
    s->aux_dloss = 1.0f / (float)((size_t)s->n_global * s->T); /* as loom train's */
    if ((st = loom_prompts_load(&s->train, "--prompts", rc->prompts, s->T, err)) ||
        (rc->eval_prompts[0] &&
         (st = loom_prompts_load(&s->eval, "--eval-prompts", rc->eval_prompts, s->T, err))))
        return st;
    const size_t n = (size_t)s->n_global, g = (size_t)s->gper, PT = (size_t)s->per * s->T;
    s->stop = calloc((size_t)s->V, 1);
    s->pptr = calloc(n, sizeof *s->pptr);
    s->plen = calloc(n, sizeof *s->plen);
    s->clen = calloc(n, sizeof *s->clen);
    s->pidx = calloc(n, sizeof *s->pidx);
    s->comp = calloc(n * rc->max_new, sizeof *s->comp);
    s->stream = calloc(g, sizeof *s->stream);
    s->reward = calloc(n, sizeof *s->reward);
    s->sums = calloc(n * (2 + (size_t)rc->max_new), sizeof *s->sums);
    s->adv = calloc(PT, sizeof *s->adv);
    s->weight = calloc(PT, sizeof *s->weight);
    s->old_logp = calloc(PT, sizeof *s->old_logp);
    s->ref_logp = calloc(PT, sizeof *s->ref_logp);
    s->ctext = calloc(g, sizeof *s->ctext);
    s->ctext_len = calloc(g, sizeof *s->ctext_len);
    s->ptext_len = calloc(g, sizeof *s->ptext_len);
    for (size_t i = 0; s->ctext && i < g; i++) s->ctext[i] = malloc((size_t)rc->max_new + 1);
    int ok = s->stop && s->pptr && s->plen && s->clen && s->pidx && s->comp && s->stream &&
             s->reward && s->sums && s->adv && s->weight && s->old_logp && s->ref_logp &&
             s->ctext && s->ctext_len && s->ptext_len;
    for (size_t i = 0; ok && i < g; i++) ok = s->ctext[i] != NULL;
    if (ok && rc->grpo.kl_coef != 0.0f) {
        const size_t P = r->model.table.total;
        if ((ok = (s->ref_params = malloc(P * sizeof(float))) != NULL)) {
            /* ZeRO-3: the reference is kept whole (the shards gathered once) */
            if (r->sharded && (st = loom_fsdp_gather_all(r->sharded, err))) return st;
            memcpy(s->ref_params, r->params, P * sizeof(float));
            if (r->sharded) loom_fsdp_invalidate(r->sharded);
        }
    }
    if (!ok) return loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory");
    if (s->V > '\n') s->stop['\n'] = 1;
    /* --dump-dir (MoE): whole sequences only (not --cp); a stage records its layers */
    if (rc->dump_dir[0] && !r->cped &&
        (st = loom_route_dump_open(&s->routes, mc, rc->ppo_micro_batch * s->Tm,
                                   rc->iterations * rc->ppo_epochs, s->per / rc->ppo_micro_batch,
                                   err)))
        return st;
    if ((st = loom_rl_gen_layout_open(s, err))) return st;
    /* --dump-dir: the rollouts' draws (any model and layout; gper is known now) */
    if (rc->dump_dir[0] &&
        (st = loom_sample_dump_open(&s->samples, rc->iterations, s->gper, rc->max_new, err)))
        return st;
    const loom_param_table *t = s->gen_params ? &s->gen_table : &r->model.table;
    if ((st = loom_batch_generator_create(&s->gen, mc, t, s->gen_params ? s->gen_params : r->params,
                                          s->gper, err)))
        return st;
    return s->gmesh_on ? loom_batch_generator_shard(&s->gen, &s->gmesh.tp, err) : LOOM_OK;
}

/* Greedy exact-match accuracy on the held-out prompts (each rank its slice). */
static loom_status evaluate(rl_state *s, double *accuracy, loom_error *err) {
    loom_run *r = s->run;
    const loom_rl_config *rc = s->rc;
    const int W = s->gdp, n = s->eval.n; /* each generation replica its slice */
    const int lo = (int)((int64_t)n * s->grank / W);
    const int hi = (int)((int64_t)n * (s->grank + 1) / W);
    loom_rollout_options ro = {{0.0f, 0, 1.0f}, rc->max_new, s->stop, 0, NULL};
    double correct = 0.0;
    loom_status st;
    for (int first = lo; first < hi; first += s->gper) {
        const int m = hi - first < s->gper ? hi - first : s->gper;
        for (int i = 0; i < m; i++) s->stream[i] = (uint64_t)(first + i);
        if ((st = loom_rollout_run(&s->gen, &ro, m, (const int32_t *const *)s->eval.ids + first,
                                   s->eval.len + first, s->stream, s->comp, s->clen, err)))
            return st;
        for (int i = 0; i < m; i++) {
            char *c = s->ctext[i];
            for (int k = 0; k < s->clen[i]; k++) c[k] = (char)s->comp[(size_t)i * rc->max_new + k];
            if (s->glead) /* once per replica */
                correct += loom_reward_arith(s->eval.text[first + i],
                                             (size_t)s->eval.len[first + i], c, (size_t)s->clen[i]);
        }
    }
    if ((st = loom_comm_allreduce_sum_f64(&r->mesh->world, &correct, 1, err))) return st;
    *accuracy = correct / n;
    return LOOM_OK;
}

/* (1) G completions of each of the iteration's P prompts: the prompts of every sequence
 * (each rank draws them all), this rank's generation slice sampled. */
static loom_status rollout(rl_state *s, int it, uint64_t seed, loom_error *err) {
    const loom_rl_config *rc = s->rc;
    const int G = rc->group_size;
    for (int q = 0; q < s->n_global; q++) {
        const int idx =
            (int)(loom_philox_u64(seed, PROMPT_STREAM, (uint64_t)it, (uint32_t)(q / G)) %
                  (uint64_t)s->train.n);
        s->pidx[q] = idx;
        s->pptr[q] = s->train.ids[idx];
        s->plen[q] = s->train.len[idx];
    }
    for (int i = 0; i < s->gper; i++)
        s->stream[i] = (uint64_t)it * (uint64_t)s->n_global + (uint64_t)(s->g0 + i);
    loom_rollout_options ro = {rc->sampling, rc->max_new, s->stop, seed,
                               loom_sample_dump_margins(&s->samples, it)};
    int32_t *comp = s->comp + (size_t)s->g0 * rc->max_new;
    loom_status st = loom_rollout_run(&s->gen, &ro, s->gper, s->pptr + s->g0, s->plen + s->g0,
                                      s->stream, comp, s->clen + s->g0, err);
    if (!st) loom_sample_dump_record(&s->samples, it, s->n_global, s->g0, comp, s->clen + s->g0);
    return st;
}

/* (2) Rewards of this rank's generation slice, then every rank gets every sequence's
 * completion, length and reward (disjoint slices summed: x + 0 = x, exact). */
static loom_status rewards(rl_state *s, loom_error *err) {
    const loom_rl_config *rc = s->rc;
    const int n = s->n_global, K = rc->max_new;
    const char **ptext = malloc((size_t)s->gper * sizeof *ptext);
    float *mine = malloc((size_t)s->gper * sizeof *mine);
    loom_status st = LOOM_OK;
    if (!ptext || !mine) st = loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory");
    for (int i = 0; !st && i < s->gper; i++) {
        const int q = s->g0 + i, idx = s->pidx[q];
        ptext[i] = s->train.text[idx];
        s->ptext_len[i] = (size_t)s->train.len[idx];
        for (int k = 0; k < s->clen[q]; k++) s->ctext[i][k] = (char)s->comp[(size_t)q * K + k];
        s->ctext[i][s->clen[q]] = 0;
        s->ctext_len[i] = (size_t)s->clen[q];
    }
    /* a tp generation replica's ranks hold the same completions: its tp rank 0 scores */
    if (!st && s->glead && rc->reward_cmd[0])
        st = loom_reward_cmd(rc->reward_cmd, s->gper, ptext, s->ptext_len,
                             (const char *const *)s->ctext, s->ctext_len, mine, err);
    else if (s->glead)
        for (int i = 0; !st && i < s->gper; i++)
            mine[i] = loom_reward_arith(ptext[i], s->ptext_len[i], s->ctext[i], s->ctext_len[i]);
    if (!st) {
        double *len = s->sums + n, *tok = s->sums + 2 * (size_t)n;
        memset(s->sums, 0, (size_t)n * (2 + K) * sizeof *s->sums);
        for (int i = 0; i < s->gper && s->glead; i++) {
            const int q = s->g0 + i;
            s->sums[q] = mine[i];
            len[q] = s->clen[q];
            for (int k = 0; k < s->clen[q]; k++)
                tok[(size_t)q * K + k] = s->comp[(size_t)q * K + k];
        }
        st = loom_comm_allreduce_sum_f64(&s->run->mesh->world, s->sums, n * (2 + K), err);
        for (int q = 0; !st && q < n; q++) {
            s->reward[q] = (float)s->sums[q];
            s->clen[q] = (int)len[q];
            for (int k = 0; k < s->clen[q]; k++)
                s->comp[(size_t)q * K + k] = (int32_t)tok[(size_t)q * K + k];
        }
    }
    free(ptext);
    free(mine);
    return st;
}

/* The records (prompt, completion, zero padding) and per-token advantages and weights:
 * row t predicts token t + 1; the completion's tokens are rows plen-1 .. plen+clen-2. */
static loom_status build_batch(rl_state *s, loom_error *err) {
    const loom_rl_config *rc = s->rc;
    const int G = rc->group_size, P = rc->prompts_per_iter;
    float *adv = malloc((size_t)s->n_global * sizeof *adv);
    if (!adv) return loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory");
    loom_grpo_advantages(s->reward, P, G, 1e-4f, adv);
    double tokens = 0.0;
    for (int q = 0; q < s->n_global; q++) tokens += s->sums[s->n_global + q];
    int32_t *batch = s->run->batch;
    for (int i = 0; i < s->per; i++) {
        const int q = s->q0 + i;
        int32_t *rec = batch + (size_t)i * s->W;
        float *a = s->adv + (size_t)i * s->T, *w = s->weight + (size_t)i * s->T;
        memset(rec, 0, (size_t)s->W * sizeof *rec);
        memcpy(rec, s->pptr[q], (size_t)s->plen[q] * sizeof *rec);
        memcpy(rec + s->plen[q], s->comp + (size_t)q * rc->max_new,
               (size_t)s->clen[q] * sizeof *rec);
        const double wt = rc->norm == LOOM_GRPO_NORM_SEQUENCE
                              ? 1.0 / ((double)s->n_global * (s->clen[q] > 0 ? s->clen[q] : 1))
                              : 1.0 / (tokens > 0 ? tokens : 1.0);
        for (int t = 0; t < s->T; t++) {
            const int in = t >= s->plen[q] - 1 && t < s->plen[q] - 1 + s->clen[q];
            w[t] = in ? (float)wt : 0.0f;
            a[t] = adv[q];
        }
    }
    free(adv);
    return LOOM_OK;
}

/* Positions micro-batch k needs: up to its longest prompt + completion (row t predicts
 * token t + 1, so the last completion token's row is plen + clen - 2); the rows after a
 * sequence's end have weight 0 and, attention being causal, change no earlier row. All
 * its planned positions (all T, or its cp part) where the model cannot shorten. */
static int micro_batch_tokens(const rl_state *s, int k) {
    const loom_model *m = &s->run->model;
    if (s->run->pipelined || !loom_model_can_shorten(m)) return s->Tm;
    const int M = s->rc->ppo_micro_batch;
    int T = 1;
    for (int b = 0; b < M; b++) {
        const int q = s->q0 + k * M + b, end = s->plen[q] + s->clen[q] - 1;
        if (end > T) T = end;
    }
    /* sequence parallelism: each tp rank M x T / tp rows of the residual stream */
    const int tp = m->tp ? m->tp->size : 1;
    if (m->tp && m->tp->sequence_parallel)
        while ((M * T) % tp && T < s->Tm) T++;
    return T < s->Tm ? T : s->Tm;
}

/* Forward of micro-batch k under params, its first micro_batch_tokens positions a
 * sequence (m->T); the logits at the sampling temperature. */
static loom_status forward(rl_state *s, int k, const float *params, loom_error *err) {
    loom_model *m = &s->run->model;
    const int M = s->rc->ppo_micro_batch;
    loom_status st = loom_model_set_tokens(m, micro_batch_tokens(s, k), err);
    if (st) return st;
    loom_model_load_batch(m, s->run->batch, k * M);
    /* ZeRO-3: the embedding and tail gathered, the blocks by the model's hooks */
    st = s->run->sharded ? loom_fsdp_begin_micro_batch(s->run->sharded, err) : LOOM_OK;
    if (!st) st = loom_model_forward(m, params);
    const float temp = s->rc->sampling.temperature;
    if (!st && temp != 1.0f) {
        const size_t n = (size_t)M * m->T * s->Vl;
        for (size_t i = 0; i < n; i++) m->logits[i] /= temp;
    }
    return st;
}

/* The micro-batch's logits with whole vocabulary rows: the model's own (tp 1), or the tp
 * ranks' column slices gathered (every tp rank then computes the same loss). */
static loom_status whole_logits(rl_state *s, loom_model *m, float **out, loom_error *err) {
    if (!s->full) {
        *out = m->logits;
        return LOOM_OK;
    }
    loom_comm *tp = &s->run->mesh->tp;
    const int P = tp->size, N = s->rc->ppo_micro_batch * m->T, part = N * s->Vl;
    int counts[P], displs[P];
    for (int p = 0; p < P; p++) counts[p] = part, displs[p] = p * part;
    memcpy(s->parts + (size_t)tp->rank * part, m->logits, (size_t)part * sizeof(float));
    loom_status st = loom_comm_allgatherv(tp, s->parts, counts, displs, err);
    for (int p = 0; !st && p < P; p++)
        for (int i = 0; i < N; i++)
            memcpy(s->full + (size_t)i * s->V + (size_t)p * s->Vl,
                   s->parts + (size_t)p * part + (size_t)i * s->Vl, (size_t)s->Vl * sizeof(float));
    *out = s->full;
    return st;
}

/* d loss / d logits of whole rows -> this tp rank's columns (in the model's logits). */
static void own_dlogits(rl_state *s, loom_model *m) {
    if (!s->full) return;
    const int N = s->rc->ppo_micro_batch * m->T, v0 = s->run->mesh->tp.rank * s->Vl;
    for (int i = 0; i < N; i++)
        memcpy(m->logits + (size_t)i * s->Vl, s->full + (size_t)i * s->V + v0,
               (size_t)s->Vl * sizeof(float));
}

/* Micro-batch k's whole-vocabulary logits x ([M, m->T, V]; m->T <= T positions a
 * sequence): with logp, the log-probabilities into logp (rows of T a sequence); else the
 * GRPO loss (and the old log-probabilities first when the first epoch's forward gives
 * them), d loss / d logits into x. A run of consecutive positions of one sequence at a
 * time: s's per-token arrays have T rows a sequence (every position, whatever the layout).
 * With --cp the model's rows are this rank's chunks of every sequence ([chunk][sample]
 * [token], cp/cp.h): each chunk's run reads the per-token arrays at its global positions,
 * so the mask, advantages and old/reference log-probabilities follow cp's split. */
static double micro_batch_rows(rl_state *s, const loom_model *m, int k, float *x, float *logp,
                               loom_grpo_stats *stats) {
    const int M = s->rc->ppo_micro_batch;
    const int cp = m->cp && m->cp->size > 1, n = cp ? m->cp->n_chunks : 1, L = m->T / n;
    const float *ref = s->ref_params ? s->ref_logp : NULL;
    double loss = 0.0;
    for (int j = 0; j < n; j++)
        for (int b = 0; b < M; b++) {
            const size_t row = ((size_t)k * M + b) * s->T + (cp ? m->cp->chunk_pos[j] : 0);
            const size_t run = (size_t)j * M + b;
            float *xb = x + run * L * s->V;
            const int32_t *tb = m->targets + run * L;
            if (logp) {
                loom_grpo_logprobs(xb, tb, L, s->V, logp + row);
                continue;
            }
            if (s->old_from_update) loom_grpo_logprobs(xb, tb, L, s->V, s->old_logp + row);
            loss += loom_grpo_loss(&s->rc->grpo, xb, tb, s->weight + row, s->adv + row,
                                   s->old_logp + row, ref ? ref + row : NULL, L, s->V, xb, stats);
        }
    return loss;
}

/* --pp > 1: the last stage's loss (pipeline/pipeline.h's loom_pp_loss_fn) on micro-batch
 * mb's logits at the sampling temperature: the completions' log-probabilities into
 * s->stage_logp (forward only), or the GRPO loss and d loss / d logits (training). */
static loom_status stage_loss(void *ctx, loom_model *m, int mb, int backward, double *loss,
                              loom_error *err) {
    rl_state *s = ctx;
    const int N = s->rc->ppo_micro_batch * m->T; /* m->T: s->T, or its part under --cp */
    const size_t row = (size_t)mb * N, n = (size_t)N * s->Vl;
    /* MoE: the last chunk's auxiliary losses (the other chunks': the executor's, with the
     * same weight), in the update only, as without stages */
    const double aux = loom_moe_loss_sum(m->moe, backward ? s->aux_dloss : 0.0f, backward);
    if (backward && m->moe) *loss += s->aux_dloss * aux;
    const float temp = s->rc->sampling.temperature, inv_t = 1.0f / temp;
    if (temp != 1.0f)
        for (size_t i = 0; i < n; i++) m->logits[i] /= temp;
    float *x;
    loom_status st = whole_logits(s, m, &x, err); /* --tp > 1: the rows gathered */
    if (st) return st;
    if (m->cp && m->cp->size > 1) { /* --cp: this rank's chunks of each sequence */
        *loss += micro_batch_rows(s, m, mb, x, backward ? NULL : s->stage_logp,
                                  backward ? s->stage_stats : NULL);
        if (!backward) return LOOM_OK;
    } else if (!backward) {
        loom_grpo_logprobs(x, m->targets, N, s->V, s->stage_logp + row);
        return LOOM_OK;
    } else {
        const float *ref = s->ref_params ? s->ref_logp + row : NULL;
        if (s->old_from_update) loom_grpo_logprobs(x, m->targets, N, s->V, s->old_logp + row);
        *loss += loom_grpo_loss(&s->rc->grpo, x, m->targets, s->weight + row, s->adv + row,
                                s->old_logp + row, ref, N, s->V, x, s->stage_stats);
    }
    own_dlogits(s, m);
    if (inv_t != 1.0f) /* d/d(logits) of logits / temperature */
        for (size_t i = 0; i < n; i++) m->logits[i] *= inv_t;
    return LOOM_OK;
}

/* --pp > 1 with --dump-dir: after each forward action of the update, the stage's router
 * decisions of micro-batch mb (its layers at their places in the whole model's rows). */
static void stage_routes(void *ctx, loom_model *m, int mb) {
    rl_state *s = ctx;
    loom_route_dump_record(&s->routes, m->moe, s->route_step, s->per / s->rc->ppo_micro_batch, mb);
}

/* (3) Log-probabilities of the completions under params, every micro-batch. */
static loom_status logprobs(rl_state *s, const float *params, float *out, loom_error *err) {
    const int M = s->rc->ppo_micro_batch;
    loom_model *m = &s->run->model;
    loom_status st = LOOM_OK;
    if (s->run->pipelined) { /* the last stage's; the others keep theirs unused */
        double unused;
        s->stage_logp = out;
        const loom_pp_custom c = {.loss = stage_loss, .ctx = s};
        return loom_pipeline_forward_custom(s->run->pipelined, params, s->run->batch, &s->run->sync,
                                            &c, &unused, err);
    }
    float *x;
    for (int k = 0; !st && k < s->per / M; k++) {
        if (!(st = forward(s, k, params, err)) && !(st = whole_logits(s, m, &x, err)))
            micro_batch_rows(s, m, k, x, out, NULL);
        loom_moe_loss_sum(m->moe, 0.0f, 0); /* MoE: no auxiliary losses outside the update */
    }
    if (!st) st = loom_model_set_tokens(m, s->Tm, err); /* the model's whole length again */
    return st;
}

/* (4) One GRPO optimizer step over the rank's sequences (micro-batches accumulated), the
 * trainer's gradient sync, clipping and AdamW. */
static loom_status update(rl_state *s, int step, loom_grpo_stats *stats, double *loss, double *norm,
                          loom_error *err) {
    loom_run *r = s->run;
    loom_model *m = &r->model;
    const loom_train_config *tc = r->tc;
    const int accum = s->per / s->rc->ppo_micro_batch;
    const float inv_t = 1.0f / s->rc->sampling.temperature;
    loom_status st;
    loom_grad_sync_step_begin(&r->sync);
    *loss = 0.0;
    float *x;
    if (r->pipelined) { /* the pipeline's schedule, the GRPO loss on the last stage */
        s->stage_stats = stats;
        s->route_step = step;
        /* MoE: every chunk's auxiliary losses weighted as below (stage_loss: the last's) */
        const loom_pp_custom c = {.loss = stage_loss,
                                  .ctx = s,
                                  .aux_dloss = s->aux_dloss,
                                  .forwarded = s->routes.idx ? stage_routes : NULL};
        if ((st = loom_pipeline_step_custom(r->pipelined, r->params, r->grads, r->batch, &r->sync,
                                            &c, loss, err)))
            return st;
    }
    for (int k = 0; k < accum && !r->pipelined; k++) {
        if ((st = loom_param_gather_begin_micro_batch(&r->pg, err)) ||
            (st = forward(s, k, r->params, err)) || (st = whole_logits(s, m, &x, err)))
            return st;
        loom_route_dump_record(&s->routes, m->moe, step, accum, k); /* --dump-dir, MoE */
        *loss += micro_batch_rows(s, m, k, x, NULL, stats);
        /* MoE: the auxiliary losses weighted as loom train weights them (1 / the batch's
         * positions a token: --aux-loss-coef x their mean over micro-batches) */
        if (m->moe) *loss += s->aux_dloss * loom_moe_loss_sum(m->moe, s->aux_dloss, 1);
        own_dlogits(s, m);
        const size_t n = (size_t)s->rc->ppo_micro_batch * m->T * s->Vl;
        if (inv_t != 1.0f) /* d/d(logits) of logits / temperature */
            for (size_t i = 0; i < n; i++) m->logits[i] *= inv_t;
        if ((st = loom_step_backward(m, r->params, r->grads, &r->sync, k + 1 == accum, err)))
            return st;
    }
    if ((st = loom_model_set_tokens(m, s->Tm, err)) || /* the model's whole length again */
        (st = loom_grad_sync_finish(&r->sync, err)) ||
        (st = loom_comm_allreduce_sum_f64(&r->mesh->dp, loss, 1, err)) ||
        (st = loom_grad_sync_norm(&r->sync, norm, err)))
        return st;
    const float lr = loom_lr_at(step, tc->steps, tc->warmup_steps, tc->lr, tc->min_lr);
    loom_checkpointing_before_update(&r->ckpt); /* a save's copy of the weights is done */
    if ((st = loom_grad_sync_step(&r->sync, *norm, lr, &tc->adamw, step + 1, err))) return st;
    loom_compute_weights_refresh(&r->cw, step + 1); /* --precision bf16: the weights' copy */
    loom_grad_sync_step_end(&r->sync);
    return LOOM_OK;
}

static loom_status save_weights(loom_run *r, loom_error *err) {
    const loom_param_table *et;
    const float *ep;
    loom_status st = r->sharded ? loom_fsdp_gather_all(r->sharded, err) : LOOM_OK;
    if (!st) st = loom_run_export_flat(r, r->params, &et, &ep, err);
    if (!st && r->mesh->rank == 0) {
        loom_mkdir_parent(r->tc->save_weights);
        if (!(st = loom_weights_save(r->tc->save_weights, r->mc, et, ep, err)))
            fprintf(stderr, "loom rl: weights written to %s\n", r->tc->save_weights);
    }
    if (r->sharded) loom_fsdp_invalidate(r->sharded);
    return st;
}

/* The iteration's metrics line and progress line (rank 0). */
typedef struct {
    double t0, t1, t2, t3, t4, loss, norm, acc;
    double sums[5]; /* tokens, kl, clipped, entropy, ratio not one: first epoch */
    int eval_now;
    int checked; /* the old log-probabilities came from a pass of their own */
} iter_times;

static void report_iteration(rl_state *s, int it, const iter_times *m) {
    const loom_rl_config *rc = s->rc;
    FILE *mx = s->run->metrics.file;
    const double *sums = m->sums, t0 = m->t0, t1 = m->t1, t2 = m->t2, t3 = m->t3, t4 = m->t4;
    const double loss = m->loss, norm = m->norm, acc = m->acc;
    const int eval_now = m->eval_now;
    double mean = 0.0, var = 0.0, correct = 0.0, len = 0.0;
    for (int q = 0; q < s->n_global; q++) {
        mean += s->reward[q];
        correct += s->reward[q] >= 1.0f;
        len += s->sums[s->n_global + q];
    }
    mean /= s->n_global;
    for (int q = 0; q < s->n_global; q++) var += (s->reward[q] - mean) * (s->reward[q] - mean);
    const double tok = sums[0] > 0 ? sums[0] : 1.0;
    char heldout[64] = "", shown[48] = "", ratio[64] = "";
    if (m->checked) snprintf(ratio, sizeof ratio, "\"ratio_not_one_first_epoch\": %.0f, ", sums[4]);
    if (eval_now) {
        snprintf(heldout, sizeof heldout, ", \"heldout_accuracy\": %.6f", acc);
        snprintf(shown, sizeof shown, " | held-out %.4f", acc);
    }
    if (mx)
        fprintf(mx,
                "{\"iteration\": %d, \"reward_mean\": %.9g, \"reward_std\": %.9g, "
                "\"accuracy\": %.6f, \"kl\": %.9g, \"clip_fraction\": %.9g, "
                "%s\"completion_len\": %.4f, "
                "\"entropy\": %.9g, \"loss\": %.9g, \"grad_norm\": %.9g, \"rollout_ms\": %.1f, "
                "\"reward_ms\": %.1f, \"logprob_ms\": %.1f, \"update_ms\": %.1f, "
                "\"reshard_ms\": %.2f, \"iteration_ms\": %.1f%s}\n",
                it + 1, mean, sqrt(var / s->n_global), correct / s->n_global, sums[1] / tok,
                sums[2] / tok, ratio, len / s->n_global, sums[3] / tok, loss, norm, t1 - t0,
                t2 - t1, t3 - t2, t4 - t3 - s->reshard_ms, s->reshard_ms, loom_now_ms() - t0,
                heldout);
    if (mx) fflush(mx);
    fprintf(stderr,
            "iter %4d/%d | reward %.4f | acc %.4f%s | kl %.4g | clip %.3f | len %.2f | %.0f ms\n",
            it + 1, rc->iterations, mean, correct / s->n_global, shown, sums[1] / tok,
            sums[2] / tok, len / s->n_global, loom_now_ms() - t0);
}

/* The first iteration: 0, or the one after a checkpoint's (--resume, loom run). The
 * sampler's state is the iteration itself (every draw is Philox(seed, iteration, ...)),
 * the reference model is DIR/rl_reference.safetensors (rl/reference.h). */
static loom_status open_resume(rl_state *s, int *first_it, loom_error *err) {
    loom_run *r = s->run;
    const int E = s->rc->ppo_epochs;
    if (r->start_step % E != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: the checkpoint's step %d is not between two iterations "
                              "(--ppo-epochs %d)",
                              r->start_step, E);
    *first_it = r->start_step / E;
    if (!s->ref_params || !r->ckpt.enabled) return LOOM_OK;
    char path[LOOM_PATH_MAX + 32];
    loom_rl_reference_path(r->tc->ckpt_dir, path, sizeof path);
    if (*first_it == 0) return loom_rl_reference_save(r, s->ref_params, path, err);
    loom_status st = loom_rl_reference_load(r, s->ref_params, path, err);
    if (!st && r->mesh->rank == 0)
        fprintf(stderr, "loom rl: resumed at iteration %d; reference model from %s\n", *first_it,
                path);
    return st;
}

static loom_status loop(rl_state *s, loom_error *err) {
    loom_run *r = s->run;
    loom_trace *tr = r->trace;
    const loom_rl_config *rc = s->rc;
    const int lead = r->mesh->rank == 0, E = rc->ppo_epochs;
    FILE *mx = r->metrics.file;
    loom_status st;
    int first_it = 0, stop = 0, it;
    if ((st = open_resume(s, &first_it, err))) return st;
    loom_progress_set_step(r->start_step);
    /* --precision bf16: the GEMMs read the weights' bf16 copy (train/compute_weights.h),
     * rounded here from the initial (or resumed) weights and after every update */
    if (r->sharded) loom_fsdp_invalidate(r->sharded); /* ZeRO-3: gathers round from here */
    loom_compute_weights_refresh(&r->cw, r->start_step);
    double acc = NAN;
    if (first_it == 0 && s->eval.n) {
        loom_trace_begin(tr, "evaluate", "rl");
        st = evaluate(s, &acc, err);
        loom_trace_end(tr);
        if (st) return st;
        if (lead) {
            fprintf(stderr, "loom rl: held-out accuracy before RL %.4f (%d prompts)\n", acc,
                    s->eval.n);
            if (mx) fprintf(mx, "{\"iteration\": 0, \"heldout_accuracy\": %.6f}\n", acc);
        }
    }
    const double start_ms = loom_now_ms();
    for (it = first_it; it < rc->iterations && !stop; it++) {
        iter_times m = {.t0 = loom_now_ms()};
        /* --time-limit: rank 0's clock decides for every rank */
        double over = rc->time_limit_min > 0 && m.t0 - start_ms > rc->time_limit_min * 60e3;
        if (rc->time_limit_min > 0 &&
            (st = loom_comm_bcast(&r->mesh->world, &over, sizeof over, 0, err)))
            return st;
        if (over) {
            if (lead)
                fprintf(stderr, "loom rl: --time-limit %g min reached after %d iteration(s)\n",
                        rc->time_limit_min, it);
            if (s->eval.n && it > first_it) { /* the held-out accuracy of the policy saved */
                double acc_end;
                if ((st = evaluate(s, &acc_end, err))) return st;
                if (lead && mx) {
                    fprintf(mx, "{\"iteration\": %d, \"heldout_accuracy\": %.6f}\n", it, acc_end);
                    fflush(mx);
                }
                if (lead) fprintf(stderr, "loom rl: held-out accuracy %.4f\n", acc_end);
            }
            break;
        }
        loom_fault_on_step((int64_t)it * E + 1); /* crash@S: during this rollout */
        loom_progress_step_begin();
        loom_trace_begin(tr, "iteration", "rl");
        loom_trace_begin(tr, "generation", "rl");
        st = rollout(s, it, r->tc->seed, err);
        loom_trace_end(tr);
        if (st) return st;
        m.t1 = loom_now_ms();
        loom_trace_begin(tr, "reward", "rl");
        if (!(st = rewards(s, err))) st = build_batch(s, err);
        loom_trace_end(tr);
        if (st) return st;
        m.t2 = loom_now_ms();
        /* The old log-probabilities: the run's first iteration computes them in a forward
         * pass of their own, and its first epoch checks every token's ratio is exactly 1
         * (ratio_not_one_first_epoch); later iterations take them from the first epoch's
         * forward, the same computation on the same weights (not a second one). */
        m.checked = it == first_it;
        s->old_from_update = !m.checked;
        if (m.checked) {
            loom_trace_begin(tr, "logprob", "rl");
            st = logprobs(s, r->params, s->old_logp, err);
            loom_trace_end(tr);
            if (st) return st;
        }
        if (s->ref_params) {
            loom_trace_begin(tr, "reference", "rl");
            st = logprobs(s, s->ref_params, s->ref_logp, err);
            loom_trace_end(tr);
            if (st) return st;
        }
        m.t3 = loom_now_ms();
        loom_grpo_stats first = {0};
        for (int e = 0; e < E; e++) {
            const int step = it * E + e;
            if (e > 0) loom_fault_on_step(step + 1); /* crash@S: during this update */
            loom_grpo_stats stats = {0};
            loom_trace_begin(tr, "update", "rl");
            st = update(s, step, &stats, &m.loss, &m.norm, err);
            loom_trace_end(tr);
            if (st) return st;
            if (e == 0) first = stats;
            s->old_from_update = 0; /* later epochs: the log-probabilities before the update */
            loom_progress_step_done(step + 1, m.loss, loom_now_ms() - m.t0);
        }
        if ((st = loom_rl_reshard(s, err))) return st;
        m.t4 = loom_now_ms();
        double *sums = m.sums;
        sums[0] = first.tokens, sums[1] = first.kl, sums[2] = first.clipped;
        sums[3] = first.entropy, sums[4] = first.off;
        if ((st = loom_comm_allreduce_sum_f64(&r->mesh->dp, sums, 5, err)) ||
            (r->pipelined && /* the last stage's */
             (st = loom_comm_allreduce_sum_f64(r->pipelined->comm, sums, 5, err))))
            return st;
        const int last = it + 1 == rc->iterations;
        m.eval_now = s->eval.n && (last || (rc->eval_every > 0 && (it + 1) % rc->eval_every == 0));
        m.acc = NAN;
        if (m.eval_now) {
            loom_trace_begin(tr, "evaluate", "rl");
            st = evaluate(s, &m.acc, err);
            loom_trace_end(tr);
            if (st) return st;
        }
        loom_trace_end(tr); /* iteration */
        if (lead) report_iteration(s, it, &m);
        /* between two iterations: the policy, AdamW's state and the step (= iteration) */
        const int step = (it + 1) * E;
        if ((loom_checkpointing_saves_at(&r->ckpt, step) &&
             (st = loom_param_gather_wait_all(&r->pg, err))) ||
            (st = loom_checkpointing_step(&r->ckpt, step, &stop, err)))
            return st;
    }
    if ((st = loom_param_gather_wait_all(&r->pg, err)) ||
        (st = loom_checkpointing_finish(&r->ckpt, it * E, err)))
        return st;
    if (stop) return LOOM_OK; /* asked to stop (a signal): no final outputs */
    /* --dump-dir (MoE): one file a data rank, from its tp rank 0 (tp ranks route alike)
     * and first stage (--pp: the stages' layers summed over the pipeline group first) */
    if (s->routes.idx && r->pipelined &&
        (st = loom_route_dump_sum(&s->routes, r->pipelined->comm, err)))
        return st;
    /* the routes: one file a data rank; the rollouts' draws: one file a generation replica */
    const int routes = s->routes.idx && r->mesh->tp_rank == 0 && r->mesh->pp_rank == 0;
    const int samples = s->samples.seq && s->glead;
    if ((routes || samples) && loom_mkdir_p(rc->dump_dir) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--dump-dir '%s': cannot create: %s",
                              rc->dump_dir, strerror(errno));
    if (routes && (st = loom_route_dump_write(&s->routes, rc->dump_dir, r->mesh->data_rank, err)))
        return st;
    if (samples && (st = loom_sample_dump_write(&s->samples, rc->dump_dir, s->grank, err)))
        return st;
    return r->tc->save_weights[0] ? save_weights(r, err) : LOOM_OK;
}

loom_status loom_rl_run(const loom_model_config *mc, const loom_train_config *tc,
                        const loom_rl_config *rc, loom_mesh *mesh, loom_error *err) {
    loom_run r;
    loom_model_config own = *mc;
    own.fp32_logits = 1; /* the log-probabilities read fp32 logits (forward, whole_logits) */
    loom_status st = loom_run_setup(&r, &own, tc, mesh, err);
    if (st) return st;
    r.model.trace = NULL; /* --trace: the phases and the communication, not every layer */
    rl_state s;
    if (!(st = state_init(&s, &r, rc, err))) st = loop(&s, err);
    if (!st && r.trace) {
        mesh->dp.trace = mesh->tp.trace = mesh->world.trace = mesh->cp.trace = NULL;
        st = loom_comm_write_trace(&mesh->world, r.trace, tc->trace, err);
        if (!st && mesh->rank == 0) fprintf(stderr, "loom rl: trace written to %s\n", tc->trace);
    }
    state_free(&s);
    loom_run_free(&r);
    return st;
}
