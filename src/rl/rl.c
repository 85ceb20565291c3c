#include "rl/rl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/fs.h"
#include "core/philox.h"
#include "model/weights.h"
#include "rl/reward.h"
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
}

/* A prompt file: one prompt a line, byte tokens. */
typedef struct {
    char **text;
    int32_t **ids;
    int *len;
    int n;
} prompt_set;

static void prompts_free(prompt_set *p) {
    for (int i = 0; i < p->n; i++) free(p->text[i]), free(p->ids[i]);
    free(p->text), free(p->ids), free(p->len);
    memset(p, 0, sizeof *p);
}

static loom_status prompts_load(prompt_set *p, const char *flag, const char *path, int max_len,
                                loom_error *err) {
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "r");
    if (!f) return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': cannot open", flag, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int alloc = 0;
    loom_status st = LOOM_OK;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
        if (len == 0 || len > max_len) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s %s:%d: %s (expected one prompt a line of 1 to %d bytes)", flag,
                                path, p->n + 1, len ? "too long" : "empty line", max_len);
            break;
        }
        if (p->n == alloc) {
            alloc = alloc ? 2 * alloc : 256;
            char **t = realloc(p->text, (size_t)alloc * sizeof *t);
            if (t) p->text = t;
            int32_t **ids = realloc(p->ids, (size_t)alloc * sizeof *ids);
            if (ids) p->ids = ids;
            int *l = realloc(p->len, (size_t)alloc * sizeof *l);
            if (l) p->len = l;
            if (!t || !ids || !l) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", flag);
                break;
            }
        }
        p->text[p->n] = strdup(line);
        p->ids[p->n] = malloc((size_t)len * sizeof(int32_t));
        p->len[p->n] = (int)len;
        if (!p->text[p->n] || !p->ids[p->n]) {
            free(p->text[p->n]), free(p->ids[p->n]);
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", flag);
            break;
        }
        for (ssize_t i = 0; i < len; i++) p->ids[p->n][i] = (unsigned char)line[i];
        p->n++;
    }
    free(line);
    fclose(f);
    if (!st && p->n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': no prompt (expected one a line)", flag,
                            path);
    if (st) prompts_free(p);
    return st;
}

/* Everything one loop owns besides the trainer's run. */
typedef struct {
    const loom_rl_config *rc;
    loom_run *run;
    int n_global, per, q0; /* sequences of an iteration; this rank's: [q0, q0 + per) */
    int T, W, V;           /* positions, record words, vocabulary */
    prompt_set train, eval;
    loom_batch_generator gen;
    uint8_t *stop; /* [V]: the newline ends a completion */
    const int32_t **pptr;
    int *plen, *clen, *pidx; /* pidx: the prompt (a line of --prompts) of each sequence */
    int32_t *comp;
    uint64_t *stream;
    float *reward;              /* [n_global] */
    double *sums;               /* [2 n_global]: rewards and lengths, summed over dp */
    float *adv, *weight;        /* [per T] per token */
    float *old_logp, *ref_logp; /* [per T] */
    float *ref_params;          /* kl_coef > 0: the initial weights */
    char **ctext;               /* [per] completion bytes for the reward */
    size_t *ctext_len, *ptext_len;
} rl_state;

static void state_free(rl_state *s) {
    loom_batch_generator_free(&s->gen);
    prompts_free(&s->train);
    prompts_free(&s->eval);
    for (int i = 0; s->ctext && i < s->per; i++) free(s->ctext[i]);
    free(s->stop), free(s->pptr), free(s->plen), free(s->clen), free(s->pidx), free(s->comp),
        free(s->stream);
    free(s->reward), free(s->sums), free(s->adv), free(s->weight), free(s->old_logp);
    free(s->ref_logp), free(s->ref_params), free(s->ctext), free(s->ctext_len), free(s->ptext_len);
}

static loom_status state_init(rl_state *s, loom_run *r, const loom_rl_config *rc, loom_error *err) {
    memset(s, 0, sizeof *s);
    s->rc = rc;
    s->run = r;
    const loom_model_config *mc = r->mc;
    s->n_global = rc->prompts_per_iter * rc->group_size;
    s->per = s->n_global / r->mesh->layout.dp;
    s->q0 = r->mesh->data_rank * s->per;
    s->T = mc->seq_len;
    s->W = mc->seq_len + 1;
    s->V = mc->vocab_size;
    loom_status st;
    if ((st = prompts_load(&s->train, "--prompts", rc->prompts, s->T, err)) ||
        (rc->eval_prompts[0] &&
         (st = prompts_load(&s->eval, "--eval-prompts", rc->eval_prompts, s->T, err))))
        return st;
    const size_t per = (size_t)s->per, PT = per * s->T;
    s->stop = calloc((size_t)s->V, 1);
    s->pptr = calloc(per, sizeof *s->pptr);
    s->plen = calloc(per, sizeof *s->plen);
    s->clen = calloc(per, sizeof *s->clen);
    s->pidx = calloc(per, sizeof *s->pidx);
    s->comp = calloc(per * rc->max_new, sizeof *s->comp);
    s->stream = calloc(per, sizeof *s->stream);
    s->reward = calloc((size_t)s->n_global, sizeof *s->reward);
    s->sums = calloc(2 * (size_t)s->n_global, sizeof *s->sums);
    s->adv = calloc(PT, sizeof *s->adv);
    s->weight = calloc(PT, sizeof *s->weight);
    s->old_logp = calloc(PT, sizeof *s->old_logp);
    s->ref_logp = calloc(PT, sizeof *s->ref_logp);
    s->ctext = calloc(per, sizeof *s->ctext);
    s->ctext_len = calloc(per, sizeof *s->ctext_len);
    s->ptext_len = calloc(per, sizeof *s->ptext_len);
    for (size_t i = 0; s->ctext && i < per; i++) s->ctext[i] = malloc((size_t)rc->max_new + 1);
    int ok = s->stop && s->pptr && s->plen && s->clen && s->pidx && s->comp && s->stream &&
             s->reward && s->sums && s->adv && s->weight && s->old_logp && s->ref_logp &&
             s->ctext && s->ctext_len && s->ptext_len;
    for (size_t i = 0; ok && i < per; i++) ok = s->ctext[i] != NULL;
    if (ok && rc->grpo.kl_coef != 0.0f) {
        const size_t P = r->model.table.total;
        if ((ok = (s->ref_params = malloc(P * sizeof(float))) != NULL))
            memcpy(s->ref_params, r->params, P * sizeof(float));
    }
    if (!ok) return loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory");
    if (s->V > '\n') s->stop['\n'] = 1;
    return loom_batch_generator_create(&s->gen, mc, &r->model.table, r->params, s->per, err);
}

/* Greedy exact-match accuracy on the held-out prompts (each rank its slice). */
static loom_status evaluate(rl_state *s, double *accuracy, loom_error *err) {
    loom_run *r = s->run;
    const loom_rl_config *rc = s->rc;
    const int dp = r->mesh->layout.dp, n = s->eval.n;
    const int lo = (int)((int64_t)n * r->mesh->data_rank / dp);
    const int hi = (int)((int64_t)n * (r->mesh->data_rank + 1) / dp);
    loom_rollout_options ro = {{0.0f, 0, 1.0f}, rc->max_new, s->stop, 0};
    double correct = 0.0;
    loom_status st;
    for (int first = lo; first < hi; first += s->per) {
        const int m = hi - first < s->per ? hi - first : s->per;
        for (int i = 0; i < m; i++) s->stream[i] = (uint64_t)(first + i);
        if ((st = loom_rollout_run(&s->gen, &ro, m, (const int32_t *const *)s->eval.ids + first,
                                   s->eval.len + first, s->stream, s->comp, s->clen, err)))
            return st;
        for (int i = 0; i < m; i++) {
            char *c = s->ctext[i];
            for (int k = 0; k < s->clen[i]; k++) c[k] = (char)s->comp[(size_t)i * rc->max_new + k];
            correct += loom_reward_arith(s->eval.text[first + i], (size_t)s->eval.len[first + i], c,
                                         (size_t)s->clen[i]);
        }
    }
    if ((st = loom_comm_allreduce_sum_f64(&r->mesh->dp, &correct, 1, err))) return st;
    *accuracy = correct / n;
    return LOOM_OK;
}

/* (1) G completions of each of the iteration's P prompts, this rank's slice. */
static loom_status rollout(rl_state *s, int it, uint64_t seed, loom_error *err) {
    const loom_rl_config *rc = s->rc;
    const int G = rc->group_size;
    for (int i = 0; i < s->per; i++) {
        const int q = s->q0 + i, k = q / G;
        const int idx = (int)(loom_philox_u64(seed, PROMPT_STREAM, (uint64_t)it, (uint32_t)k) %
                              (uint64_t)s->train.n);
        s->pptr[i] = s->train.ids[idx];
        s->plen[i] = s->train.len[idx];
        s->pidx[i] = idx;
        s->stream[i] = (uint64_t)it * (uint64_t)s->n_global + (uint64_t)q;
    }
    loom_rollout_options ro = {rc->sampling, rc->max_new, s->stop, seed};
    return loom_rollout_run(&s->gen, &ro, s->per, s->pptr, s->plen, s->stream, s->comp, s->clen,
                            err);
}

/* (2) Rewards of this rank's completions, then every rank gets all of them (and the
 * lengths) for the group statistics and the normalisation. */
static loom_status rewards(rl_state *s, loom_error *err) {
    const loom_rl_config *rc = s->rc;
    const char **ptext = malloc((size_t)s->per * sizeof *ptext);
    float *mine = malloc((size_t)s->per * sizeof *mine);
    loom_status st = LOOM_OK;
    if (!ptext || !mine) st = loom_error_set(err, LOOM_ERR_NOMEM, "loom rl: out of memory");
    for (int i = 0; !st && i < s->per; i++) {
        const int idx = s->pidx[i];
        ptext[i] = s->train.text[idx];
        s->ptext_len[i] = (size_t)s->train.len[idx];
        for (int k = 0; k < s->clen[i]; k++)
            s->ctext[i][k] = (char)s->comp[(size_t)i * rc->max_new + k];
        s->ctext[i][s->clen[i]] = 0;
        s->ctext_len[i] = (size_t)s->clen[i];
    }
    if (!st && rc->reward_cmd[0])
        st = loom_reward_cmd(rc->reward_cmd, s->per, ptext, s->ptext_len,
                             (const char *const *)s->ctext, s->ctext_len, mine, err);
    else
        for (int i = 0; !st && i < s->per; i++)
            mine[i] = loom_reward_arith(ptext[i], s->ptext_len[i], s->ctext[i], s->ctext_len[i]);
    if (!st) {
        /* x + 0 = x: the sum over ranks of disjoint slices is exact */
        memset(s->sums, 0, 2 * (size_t)s->n_global * sizeof *s->sums);
        for (int i = 0; i < s->per; i++) {
            s->sums[s->q0 + i] = mine[i];
            s->sums[s->n_global + s->q0 + i] = s->clen[i];
        }
        st = loom_comm_allreduce_sum_f64(&s->run->mesh->dp, s->sums, 2 * s->n_global, err);
        for (int q = 0; !st && q < s->n_global; q++) s->reward[q] = (float)s->sums[q];
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
        int32_t *rec = batch + (size_t)i * s->W;
        float *a = s->adv + (size_t)i * s->T, *w = s->weight + (size_t)i * s->T;
        memset(rec, 0, (size_t)s->W * sizeof *rec);
        memcpy(rec, s->pptr[i], (size_t)s->plen[i] * sizeof *rec);
        memcpy(rec + s->plen[i], s->comp + (size_t)i * rc->max_new,
               (size_t)s->clen[i] * sizeof *rec);
        const double wt = rc->norm == LOOM_GRPO_NORM_SEQUENCE
                              ? 1.0 / ((double)s->n_global * (s->clen[i] > 0 ? s->clen[i] : 1))
                              : 1.0 / (tokens > 0 ? tokens : 1.0);
        for (int t = 0; t < s->T; t++) {
            const int in = t >= s->plen[i] - 1 && t < s->plen[i] - 1 + s->clen[i];
            w[t] = in ? (float)wt : 0.0f;
            a[t] = adv[s->q0 + i];
        }
    }
    free(adv);
    return LOOM_OK;
}

/* Forward of micro-batch k under params; the logits at the sampling temperature. */
static loom_status forward(rl_state *s, int k, const float *params) {
    loom_model *m = &s->run->model;
    const int M = s->rc->ppo_micro_batch;
    loom_model_load_batch(m, s->run->batch, k * M);
    loom_status st = loom_model_forward(m, params);
    const float temp = s->rc->sampling.temperature;
    if (!st && temp != 1.0f) {
        const size_t n = (size_t)M * s->T * s->V;
        for (size_t i = 0; i < n; i++) m->logits[i] /= temp;
    }
    return st;
}

/* (3) Log-probabilities of the completions under params, every micro-batch. */
static loom_status logprobs(rl_state *s, const float *params, float *out) {
    const int M = s->rc->ppo_micro_batch;
    loom_model *m = &s->run->model;
    loom_status st = LOOM_OK;
    for (int k = 0; !st && k < s->per / M; k++) {
        const size_t row = (size_t)k * M * s->T;
        if (!(st = forward(s, k, params)))
            loom_grpo_logprobs(m->logits, m->targets, M * s->T, s->V, out + row);
    }
    return st;
}

/* (4) One GRPO optimizer step over the rank's sequences (micro-batches accumulated), the
 * trainer's gradient sync, clipping and AdamW. */
static loom_status update(rl_state *s, int step, loom_grpo_stats *stats, double *loss, double *norm,
                          loom_error *err) {
    loom_run *r = s->run;
    loom_model *m = &r->model;
    const loom_train_config *tc = r->tc;
    const int M = s->rc->ppo_micro_batch, accum = s->per / M, N = M * s->T;
    const float inv_t = 1.0f / s->rc->sampling.temperature;
    const float *ref = s->ref_params ? s->ref_logp : NULL;
    loom_status st;
    loom_grad_sync_step_begin(&r->sync);
    *loss = 0.0;
    for (int k = 0; k < accum; k++) {
        const size_t row = (size_t)k * N;
        if ((st = loom_param_gather_begin_micro_batch(&r->pg, err)) ||
            (st = forward(s, k, r->params)))
            return st;
        *loss +=
            loom_grpo_loss(&s->rc->grpo, m->logits, m->targets, s->weight + row, s->adv + row,
                           s->old_logp + row, ref ? ref + row : NULL, N, s->V, m->logits, stats);
        if (inv_t != 1.0f) /* d/d(logits) of logits / temperature */
            for (size_t i = 0; i < (size_t)N * s->V; i++) m->logits[i] *= inv_t;
        const int final = k + 1 == accum;
        if (final) loom_grad_sync_begin(&r->sync);
        if ((st = loom_model_backward(m, r->params, r->grads, final ? loom_grad_sync_ready : NULL,
                                      &r->sync)))
            return st;
    }
    if ((st = loom_grad_sync_finish(&r->sync, err)) ||
        (st = loom_comm_allreduce_sum_f64(&r->mesh->dp, loss, 1, err)) ||
        (st = loom_grad_sync_norm(&r->sync, norm, err)))
        return st;
    const float lr = loom_lr_at(step, tc->steps, tc->warmup_steps, tc->lr, tc->min_lr);
    if ((st = loom_grad_sync_step(&r->sync, *norm, lr, &tc->adamw, step + 1, err))) return st;
    loom_grad_sync_step_end(&r->sync);
    return LOOM_OK;
}

static loom_status save_weights(loom_run *r, loom_error *err) {
    const loom_param_table *et;
    const float *ep;
    loom_status st = loom_run_export_flat(r, r->params, &et, &ep, err);
    if (st || r->mesh->rank != 0) return st;
    loom_mkdir_parent(r->tc->save_weights);
    if (!(st = loom_weights_save(r->tc->save_weights, r->mc, et, ep, err)))
        fprintf(stderr, "loom rl: weights written to %s\n", r->tc->save_weights);
    return st;
}

static loom_status loop(rl_state *s, loom_error *err) {
    loom_run *r = s->run;
    const loom_rl_config *rc = s->rc;
    const int lead = r->mesh->rank == 0;
    FILE *mx = r->metrics.file;
    loom_status st;
    double acc = NAN;
    if (s->eval.n && (st = evaluate(s, &acc, err))) return st;
    if (lead && s->eval.n) {
        fprintf(stderr, "loom rl: held-out accuracy before RL %.4f (%d prompts)\n", acc, s->eval.n);
        if (mx) fprintf(mx, "{\"iteration\": 0, \"heldout_accuracy\": %.6f}\n", acc);
    }
    for (int it = 0; it < rc->iterations; it++) {
        double t0 = loom_now_ms();
        if ((st = rollout(s, it, r->tc->seed, err))) return st;
        double t1 = loom_now_ms();
        if ((st = rewards(s, err)) || (st = build_batch(s, err))) return st;
        double t2 = loom_now_ms();
        if ((st = logprobs(s, r->params, s->old_logp)) ||
            (s->ref_params && (st = logprobs(s, s->ref_params, s->ref_logp))))
            return st;
        double t3 = loom_now_ms();
        loom_grpo_stats first = {0};
        double loss = 0.0, norm = 0.0;
        for (int e = 0; e < rc->ppo_epochs; e++) {
            loom_grpo_stats stats = {0};
            if ((st = update(s, it * rc->ppo_epochs + e, &stats, &loss, &norm, err))) return st;
            if (e == 0) first = stats;
        }
        double t4 = loom_now_ms();
        double sums[5] = {first.tokens, first.kl, first.clipped, first.entropy, first.off};
        if ((st = loom_comm_allreduce_sum_f64(&r->mesh->dp, sums, 5, err))) return st;
        const int last = it + 1 == rc->iterations;
        const int eval_now =
            s->eval.n && (last || (rc->eval_every > 0 && (it + 1) % rc->eval_every == 0));
        acc = NAN;
        if (eval_now && (st = evaluate(s, &acc, err))) return st;
        if (!lead) continue;
        double mean = 0.0, var = 0.0, correct = 0.0, len = 0.0;
        for (int q = 0; q < s->n_global; q++) {
            mean += s->reward[q];
            correct += s->reward[q] >= 1.0f;
            len += s->sums[s->n_global + q];
        }
        mean /= s->n_global;
        for (int q = 0; q < s->n_global; q++) var += (s->reward[q] - mean) * (s->reward[q] - mean);
        const double tok = sums[0] > 0 ? sums[0] : 1.0;
        char heldout[64] = "", shown[48] = "";
        if (eval_now) {
            snprintf(heldout, sizeof heldout, ", \"heldout_accuracy\": %.6f", acc);
            snprintf(shown, sizeof shown, " | held-out %.4f", acc);
        }
        if (mx)
            fprintf(mx,
                    "{\"iteration\": %d, \"reward_mean\": %.9g, \"reward_std\": %.9g, "
                    "\"accuracy\": %.6f, \"kl\": %.9g, \"clip_fraction\": %.9g, "
                    "\"ratio_not_one_first_epoch\": %.0f, \"completion_len\": %.4f, "
                    "\"entropy\": %.9g, \"loss\": %.9g, \"grad_norm\": %.9g, \"rollout_ms\": %.1f, "
                    "\"reward_ms\": %.1f, \"logprob_ms\": %.1f, \"update_ms\": %.1f, "
                    "\"iteration_ms\": %.1f%s}\n",
                    it + 1, mean, sqrt(var / s->n_global), correct / s->n_global, sums[1] / tok,
                    sums[2] / tok, sums[4], len / s->n_global, sums[3] / tok, loss, norm, t1 - t0,
                    t2 - t1, t3 - t2, t4 - t3, loom_now_ms() - t0, heldout);
        if (mx) fflush(mx);
        fprintf(
            stderr,
            "iter %4d/%d | reward %.4f | acc %.4f%s | kl %.4g | clip %.3f | len %.2f | %.0f ms\n",
            it + 1, rc->iterations, mean, correct / s->n_global, shown, sums[1] / tok,
            sums[2] / tok, len / s->n_global, loom_now_ms() - t0);
    }
    return r->tc->save_weights[0] ? save_weights(r, err) : LOOM_OK;
}

loom_status loom_rl_run(const loom_model_config *mc, const loom_train_config *tc,
                        const loom_rl_config *rc, loom_mesh *mesh, loom_error *err) {
    loom_run r;
    loom_status st = loom_run_setup(&r, mc, tc, mesh, err);
    if (st) return st;
    rl_state s;
    if (!(st = state_init(&s, &r, rc, err))) st = loop(&s, err);
    state_free(&s);
    loom_run_free(&r);
    return st;
}
