/* --vision-schedule bubbles: the encoder's pieces placed in the pipeline's idle slots
 * (pipeline/vision_plan.h). */
#include "pipeline/vision_plan.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/vlm.h"

/* Actions of a stage's list above which the placement searches linearly. */
#define LONG_LIST 48
/* Passes that re-place each micro-batch after the greedy one. */
#define REFINE_PASSES 3
/* The iterated local search's kicks at most, and its budget: placements simulated, as a
 * multiple of what the first local search simulated (so that large plans stay quick). */
#define KICKS 64
#define KICK_BUDGET 16

typedef enum { ITEM_ACT = 0, ITEM_EF = 1, ITEM_EB = 2 } item_kind;
typedef struct {
    item_kind kind;
    int idx; /* the action's index in the stage's list, or the micro-batch */
} item;

/* Stage r's list with its pieces: before action j, the EBs placed at j, then the EFs. */
static int items_of(const loom_pp_schedule *s, const loom_pp_vision *vp, int r, item *out) {
    int k = 0;
    for (int j = 0; j <= s->n[r]; j++) {
        for (int i = 0; i < s->m && r > 0; i++)
            if (vp->owner[i] == r && vp->eb_at[i] == j) out[k++] = (item){ITEM_EB, i};
        for (int i = 0; i < s->m && r > 0; i++)
            if (vp->owner[i] == r && vp->ef_at[i] == j) out[k++] = (item){ITEM_EF, i};
        if (j < s->n[r]) out[k++] = (item){ITEM_ACT, j};
    }
    return k;
}

/* Items a stage's list can hold: its actions and the pieces of every micro-batch. */
static int items_cap(const loom_pp_schedule *s) {
    int cap = 0;
    for (int r = 0; r < s->pp; r++)
        cap = s->n[r] + 2 * s->m + 1 > cap ? s->n[r] + 2 * s->m + 1 : cap;
    return cap;
}

/* The first stage's action that runs the embedding's backward. */
static loom_pp_op embed_backward_op(const loom_pp_schedule *s) {
    return s->split ? LOOM_PP_W : LOOM_PP_B;
}

/* Whether stage r's action a belongs to the first virtual stage (chunk 0 of stage 0: the
 * embedding's, where the encoder joins) and, if so, whether its micro-batch's image rows
 * come from a later stage (*remote). */
static int first_virtual(const loom_pp_vision *vp, int r, const loom_pp_action *a, int *remote) {
    const int first = r == 0 && a->chunk == 0;
    *remote = first && vp->owner[a->mb] != 0;
    return first;
}

/* Compute action a's duration on stage r (moves: 0); inline: the first stage encodes the
 * micro-batch itself (first virtual stage, not remote), inside its F and embedding
 * backward. */
static double action_duration(const loom_pp_schedule *s, const loom_pp_vision *vp, int r,
                              const loom_pp_action *a, int inline_enc) {
    if (a->op > LOOM_PP_W) return 0;
    const double d = a->op == LOOM_PP_B && !s->split ? 2 * vp->fwd[r] : vp->fwd[r];
    if (inline_enc && a->op == LOOM_PP_F) return d + vp->enc;
    if (inline_enc && a->op == embed_backward_op(s)) return d + 2 * vp->enc;
    return d;
}

/* An item's duration on stage r (the timeline's; simulate's own). */
static double duration(const loom_pp_schedule *s, const loom_pp_vision *vp, int r, item x) {
    if (x.kind == ITEM_EF) return vp->enc;
    if (x.kind == ITEM_EB) return 2 * vp->enc;
    const loom_pp_action *a = &s->acts[r][x.idx];
    int remote;
    const int first = first_virtual(vp, r, a, &remote);
    return action_duration(s, vp, r, a, first && !remote);
}

/* The plan's timeline: the step (-1: deadlock), each stage's idle share (idle may be
 * NULL), in *first_done the first stage's end of its own list (before it waits for the
 * other stages' encoder gradients) and, where start is not NULL, each item's start
 * (stage r's k-th item of items_of at start[r * items_cap + k]). */
static double simulate(const loom_pp_schedule *s, const loom_pp_vision *vp, double *idle,
                       double *first_done, double *start) {
    const int pp = s->pp, m = s->m, keys = 2 * s->pp * s->v * s->m, cap = items_cap(s);
    int total = 0;
    item *it = malloc(sizeof(item) * (size_t)cap * (size_t)pp);
    double *sent = malloc(sizeof(double) * (size_t)(keys + 2 * m));
    if (!it || !sent) {
        free(it);
        free(sent);
        return -1;
    }
    double *emb = sent + keys, *demb = emb + m;
    double clock[LOOM_PP_MAX_STAGES] = {0}, busy[LOOM_PP_MAX_STAGES] = {0};
    double grads_at[LOOM_PP_MAX_STAGES] = {0};
    int ni[LOOM_PP_MAX_STAGES], ptr[LOOM_PP_MAX_STAGES] = {0}, done = 0, progress = 1;
    for (int i = 0; i < keys + 2 * m; i++) sent[i] = -1;
    for (int r = 0; r < pp; r++) total += ni[r] = items_of(s, vp, r, it + (size_t)r * cap);
    const loom_pp_op eb_op = embed_backward_op(s);
    while (done < total && progress) {
        progress = 0;
        for (int r = 0; r < pp; r++)
            while (ptr[r] < ni[r]) {
                const item x = it[(size_t)r * cap + ptr[r]];
                double d;
                if (x.kind == ITEM_EF) {
                    d = vp->enc;
                    emb[x.idx] = clock[r] + d;
                } else if (x.kind == ITEM_EB) {
                    if (demb[x.idx] < 0) break;
                    if (demb[x.idx] > clock[r]) clock[r] = demb[x.idx];
                    d = 2 * vp->enc;
                    if (clock[r] + d > grads_at[r]) grads_at[r] = clock[r] + d;
                } else {
                    const loom_pp_action *a = &s->acts[r][x.idx];
                    int remote;
                    const int first = first_virtual(vp, r, a, &remote);
                    if (a->op == LOOM_PP_RECV_ACT || a->op == LOOM_PP_RECV_GRAD) {
                        const double t = sent[loom_pp_message_tag(s, r, a)];
                        if (t < 0) break;
                        if (t > clock[r]) clock[r] = t;
                    } else if (a->op == LOOM_PP_SEND_ACT || a->op == LOOM_PP_SEND_GRAD) {
                        sent[loom_pp_message_tag(s, r, a)] = clock[r];
                    } else if (a->op == LOOM_PP_F && remote) {
                        if (emb[a->mb] < 0) break;
                        if (emb[a->mb] > clock[r]) clock[r] = emb[a->mb];
                    }
                    d = action_duration(s, vp, r, a, first && !remote);
                    if (remote && a->op == eb_op) demb[a->mb] = clock[r] + d;
                }
                if (start) start[(size_t)r * cap + ptr[r]] = clock[r];
                clock[r] += d;
                busy[r] += d;
                ptr[r]++;
                done++;
                progress = 1;
            }
    }
    free(it);
    free(sent);
    if (done < total) return -1;
    /* the first stage adds the other stages' encoder gradients after its own */
    *first_done = clock[0];
    for (int r = 1; r < pp; r++)
        if (vp->pieces[r] > 0 && grads_at[r] > clock[0]) clock[0] = grads_at[r];
    double span = 0;
    for (int r = 0; r < pp; r++) span = clock[r] > span ? clock[r] : span;
    for (int r = 0; r < pp && idle; r++) idle[r] = span > 0 ? 1.0 - busy[r] / span : 0;
    return span;
}

double loom_pp_vision_simulate(const loom_pp_schedule *s, const loom_pp_vision *vp, double *idle) {
    double first_done;
    return simulate(s, vp, idle, &first_done, NULL);
}

/* A placement's worth: the step, then (ties) the first stage's end, so that pieces do not
 * hold up the stage that runs the encoder without them (the robust choice when the
 * durations are estimates). */
typedef struct {
    double span, first_done;
} score;

/* Placements simulated so far (the search's budget). */
static score score_of(const loom_pp_schedule *s, const loom_pp_vision *vp, long *evals) {
    score x;
    ++*evals;
    x.span = simulate(s, vp, NULL, &x.first_done, NULL);
    return x;
}

/* a better than b (a deadlock is never better; anything beats one) */
static int better(score a, score b) {
    if (a.span < 0) return 0;
    if (b.span < 0) return 1;
    if (a.span < b.span * (1 - 1e-9)) return 1;
    return a.span <= b.span * (1 + 1e-9) && a.first_done < b.first_done * (1 - 1e-9);
}

/* Pieces per stage and each piece's encoder model (the lowest free one at its EF). */
static void count_pieces(const loom_pp_schedule *s, loom_pp_vision *vp, item *buf) {
    memset(vp->pieces, 0, sizeof vp->pieces);
    memset(vp->slots, 0, sizeof vp->slots);
    for (int i = 0; i < s->m; i++) vp->pieces[vp->owner[i]]++;
    for (int r = 1; r < s->pp; r++) {
        const int n = items_of(s, vp, r, buf);
        int busy[64] = {0};
        for (int k = 0; k < n; k++) {
            const int i = buf[k].idx;
            if (buf[k].kind == ITEM_EF) {
                int e = 0;
                while (busy[e]) e++;
                busy[e] = 1;
                vp->enc_slot[i] = e;
                if (e + 1 > vp->slots[r]) vp->slots[r] = e + 1;
            } else if (buf[k].kind == ITEM_EB) {
                busy[vp->enc_slot[i]] = 0;
            }
        }
    }
}

/* Micro-batch i's best placement with the others fixed (its current one, worth
 * `current`, unless another is better): stage 0, or a later stage and its two positions.
 * Returns the chosen placement's worth. */
static score place(const loom_pp_schedule *s, loom_pp_vision *vp, int i, score current,
                   long *evals) {
    const int keep_o = vp->owner[i], keep_a = vp->ef_at[i], keep_b = vp->eb_at[i];
    vp->pieces[keep_o]--;
    vp->owner[i] = 0;
    vp->pieces[0]++;
    score best = score_of(s, vp, evals);
    vp->pieces[0]--;
    int bo = 0, ba = 0, bb = 0;
    if (keep_o != 0 && !better(best, current)) {
        bo = keep_o, ba = keep_a, bb = keep_b;
        best = current;
    }
    for (int r = 1; r < s->pp; r++) {
        /* every (EF, EB) pair of positions; on long lists (> LONG_LIST actions) the EF's
         * with the EB last, then the EB's after the best EF (linear, not quadratic) */
        const int n = s->n[r], quadratic = n <= LONG_LIST;
        int a_best = -1;
        score best_a = {-1, 0};
        for (int pass = 0; pass < (quadratic ? 1 : 2); pass++)
            for (int a = pass ? a_best : 0; a >= 0 && a <= (pass ? a_best : n); a++)
                for (int b = quadratic || pass ? a : n; b <= n; b++) {
                    vp->owner[i] = r;
                    vp->ef_at[i] = a;
                    vp->eb_at[i] = b;
                    vp->pieces[r]++;
                    const score x = score_of(s, vp, evals);
                    vp->pieces[r]--;
                    if (!quadratic && !pass && better(x, best_a)) {
                        a_best = a;
                        best_a = x;
                    }
                    if (better(x, best)) {
                        best = x;
                        bo = r;
                        ba = a;
                        bb = b;
                    }
                }
    }
    vp->owner[i] = bo;
    vp->ef_at[i] = ba;
    vp->eb_at[i] = bb;
    vp->pieces[bo]++;
    return best;
}

/* Re-places each micro-batch with the others fixed, pass after pass while the plan gets
 * better (the first pass from all on the first stage is the greedy one). */
static score local_search(const loom_pp_schedule *s, loom_pp_vision *vp, score best, long *evals) {
    for (int pass = 0; pass < 1 + REFINE_PASSES && best.span >= 0; pass++) {
        const score before = best;
        for (int i = 0; i < s->m; i++) best = place(s, vp, i, best, evals);
        if (!better(best, before)) break;
    }
    return best;
}

static int draw(uint64_t *rng, int n) { /* 0 .. n - 1 (a fixed LCG: every rank plans the same) */
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((*rng >> 33) % (uint64_t)n);
}

/* Iterated local search: the greedy one stops in a local optimum (at pp 2 with 8
 * micro-batches about 5-10% above the balanced step), so up to KICKS times two micro-batches
 * move to random places and the local search runs again; the result is kept where it is
 * better. */
static score kick_and_search(const loom_pp_schedule *s, loom_pp_vision *vp, score best,
                             long *evals) {
    const int m = s->m;
    const long budget = KICK_BUDGET * *evals;
    int *keep = malloc(sizeof(int) * 3 * (size_t)m);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int kick = 0; kick < KICKS && keep && best.span >= 0 && *evals < budget; kick++) {
        int pieces[LOOM_PP_MAX_STAGES];
        memcpy(pieces, vp->pieces, sizeof pieces);
        memcpy(keep, vp->owner, sizeof(int) * (size_t)m);
        memcpy(keep + m, vp->ef_at, sizeof(int) * (size_t)m);
        memcpy(keep + 2 * m, vp->eb_at, sizeof(int) * (size_t)m);
        for (int t = 0; t < 2; t++) {
            const int i = draw(&rng, m), r = draw(&rng, s->pp), a = draw(&rng, s->n[r] + 1);
            const int b = a + draw(&rng, s->n[r] + 1 - a);
            vp->pieces[vp->owner[i]]--;
            vp->owner[i] = r;
            vp->ef_at[i] = r ? a : 0;
            vp->eb_at[i] = r ? b : 0;
            vp->pieces[r]++;
        }
        const score x = local_search(s, vp, score_of(s, vp, evals), evals);
        if (better(x, best)) {
            best = x;
            continue;
        }
        memcpy(vp->pieces, pieces, sizeof pieces);
        memcpy(vp->owner, keep, sizeof(int) * (size_t)m);
        memcpy(vp->ef_at, keep + m, sizeof(int) * (size_t)m);
        memcpy(vp->eb_at, keep + 2 * m, sizeof(int) * (size_t)m);
    }
    free(keep);
    return best;
}

loom_status loom_pp_vision_build(loom_pp_vision *vp, const loom_pp_schedule *s, const double *fwd,
                                 double enc, loom_error *err) {
    memset(vp, 0, sizeof *vp);
    const int m = s->m, pp = s->pp;
    vp->m = m;
    vp->pp = pp;
    vp->enc = enc;
    for (int r = 0; r < pp; r++) vp->fwd[r] = fwd[r];
    vp->owner = calloc((size_t)m, sizeof(int));
    vp->ef_at = calloc((size_t)m, sizeof(int));
    vp->eb_at = calloc((size_t)m, sizeof(int));
    vp->enc_slot = calloc((size_t)m, sizeof(int));
    item *buf = malloc(sizeof(item) * (size_t)items_cap(s));
    if (!vp->owner || !vp->ef_at || !vp->eb_at || !vp->enc_slot || !buf) {
        free(buf);
        loom_pp_vision_free(vp);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--vision-schedule: out of memory");
    }
    vp->pieces[0] = m;
    vp->span_first = loom_pp_vision_simulate(s, vp, vp->idle_first);
    long evals = 0;
    score best = local_search(s, vp, score_of(s, vp, &evals), &evals);
    best = kick_and_search(s, vp, best, &evals);
    count_pieces(s, vp, buf);
    free(buf);
    for (int r = 1; r < pp; r++)
        if (vp->slots[r] > 64) {
            loom_pp_vision_free(vp);
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--vision-schedule bubbles: more than 64 encoder pieces in "
                                  "flight on stage %d (lower the micro-batches per step)",
                                  r);
        }
    vp->span = loom_pp_vision_simulate(s, vp, vp->idle);
    if (best.span < 0 || vp->span < 0) {
        loom_pp_vision_free(vp);
        return loom_error_set(err, LOOM_ERR_STATE, "--vision-schedule bubbles: the plan deadlocks");
    }
    return LOOM_OK;
}

void loom_pp_vision_durations(const loom_model_config *mc, const int *counts, int pp, int v,
                              int micro_batch, double *fwd, double *enc) {
    const double C = mc->d_model, hd = C / mc->n_head, T = mc->seq_len, B = micro_batch;
    const double block =
        C * (mc->n_head + 2.0 * mc->n_kv_head) * hd + C * C + T * C + 3.0 * C * mc->d_ff;
    const double head = C * mc->vocab_size + 4.0 * mc->vocab_size;
    const int S = pp * v;
    for (int r = 0; r < pp; r++) { /* the mean of the rank's chunks (virtual stage c pp + r) */
        double sum = 0;
        for (int c = 0; c < v; c++)
            sum += counts[c * pp + r] * block + (c * pp + r == S - 1 ? head : 0.0);
        fwd[r] = B * T * sum / v;
    }
    *enc = B * mc->max_images * loom_vlm_image_flops(mc) / 6.0;
}

void loom_pp_vision_free(loom_pp_vision *vp) {
    free(vp->owner);
    free(vp->ef_at);
    free(vp->eb_at);
    free(vp->enc_slot);
    memset(vp, 0, sizeof *vp);
}

/* Stage r's item x as the listing names it: F3.1 (the schedule's own name), F3.0+E
 * (stage 0 encodes micro-batch 3 inside it), E3 / e3 (a later stage's encoder forward /
 * backward), with the image rows' moves in *pre (before) and *post (after). */
static void item_text(const loom_pp_schedule *s, const loom_pp_vision *vp, int r, item x, char *t,
                      size_t n, char *pre, char *post) {
    pre[0] = post[0] = 0;
    if (x.kind == ITEM_EF) {
        snprintf(t, n, "E%d", x.idx);
        snprintf(post, n, "se%d>0", x.idx);
        return;
    }
    if (x.kind == ITEM_EB) {
        snprintf(pre, n, "rd%d<0", x.idx);
        snprintf(t, n, "e%d", x.idx);
        return;
    }
    /* the decoder's action as the schedule's listing names it; the encoder's work joins
     * the first virtual stage's (chunk 0 of stage 0) */
    const loom_pp_action *a = &s->acts[r][x.idx];
    int remote;
    const int first = first_virtual(vp, r, a, &remote);
    const int own = first && !remote && (a->op == LOOM_PP_F || a->op == embed_backward_op(s));
    loom_pp_format_action(s, a, t, n);
    if (own) strncat(t, "+E", n - strlen(t) - 1);
    if (remote && a->op == LOOM_PP_F) snprintf(pre, n, "re%d<%d", a->mb, vp->owner[a->mb]);
    if (remote && a->op == embed_backward_op(s))
        snprintf(post, n, "sd%d>%d", a->mb, vp->owner[a->mb]);
}

/* The timeline with the pieces: q cells a unit (stage 0's forward), enough that the
 * shortest compute covers a cell (at most 8); an item from t to t + d fills the cells
 * round(t q) to round((t + d) q) - 1 with its name. */
static void print_timeline(const loom_pp_schedule *s, const loom_pp_vision *vp, item *buf,
                           FILE *out) {
    const int cap = items_cap(s);
    double first_done, shortest = vp->enc;
    for (int r = 0; r < s->pp; r++) shortest = vp->fwd[r] < shortest ? vp->fwd[r] : shortest;
    const double unit = vp->fwd[0];
    if (!(unit > 0) || !(shortest > 0)) return;
    int q = (int)ceil(unit / shortest - 1e-9);
    q = q < 1 ? 1 : q > 8 ? 8 : q;
    double *start = malloc(sizeof(double) * (size_t)cap * (size_t)s->pp);
    const double span = start ? simulate(s, vp, NULL, &first_done, start) : -1;
    const long cells = lround(span * q / unit);
    if (span < 0 || cells > 4096) {
        fprintf(out, "timeline with the pieces: not drawn (%ld cells)\n", cells);
        free(start);
        return;
    }
    char t[32], pre[32], post[32];
    size_t width = 2;
    for (int r = 0; r < s->pp; r++) {
        const int n = items_of(s, vp, r, buf);
        for (int k = 0; k < n; k++) {
            item_text(s, vp, r, buf[k], t, sizeof t, pre, post);
            if (duration(s, vp, r, buf[k]) > 0 && strlen(t) + 1 > width) width = strlen(t) + 1;
        }
    }
    char *row = malloc((size_t)cells * width + 1);
    fprintf(out, "timeline with the pieces (%d cell(s) per stage 0's forward%s; '.' idle):\n", q,
            s->v > 1 ? " of one chunk" : "");
    for (int r = 0; r < s->pp && row; r++) {
        memset(row, ' ', (size_t)cells * width);
        row[(size_t)cells * width] = 0;
        for (long c = 0; c < cells; c++) row[(size_t)c * width] = '.';
        const int n = items_of(s, vp, r, buf);
        for (int k = 0; k < n; k++) {
            const double d = duration(s, vp, r, buf[k]), t0 = start[(size_t)r * cap + k];
            if (!(d > 0)) continue;
            item_text(s, vp, r, buf[k], t, sizeof t, pre, post);
            long c0 = lround(t0 * q / unit), c1 = lround((t0 + d) * q / unit);
            if (c1 <= c0) c1 = c0 + 1;
            for (long c = c0; c < c1 && c < cells; c++)
                memcpy(row + (size_t)c * width, t, strlen(t));
        }
        fprintf(out, "stage %2d |%s\n", r, row);
    }
    free(row);
    free(start);
}

void loom_pp_vision_print(const loom_pp_schedule *s, const loom_pp_vision *vp, FILE *out) {
    fprintf(out,
            "vision encoder pieces (--vision-schedule bubbles; encoder forward = %.3g x stage 0's "
            "forward%s, backward 2x; E = encoder forward, e = its backward on that stage, "
            "se/re image rows sent/received, sd/rd their gradient%s):\n",
            vp->fwd[0] > 0 ? vp->enc / vp->fwd[0] : 0.0, s->v > 1 ? " of one chunk" : "",
            s->v > 1 ? "; the encoder belongs to chunk 0 of stage 0" : "");
    item *buf = malloc(sizeof(item) * (size_t)items_cap(s));
    if (buf) print_timeline(s, vp, buf, out);
    for (int r = 0; r < s->pp && buf; r++) {
        const int n = items_of(s, vp, r, buf);
        fprintf(out, "stage %d:", r);
        for (int k = 0; k < n; k++) {
            char t[32], pre[32], post[32];
            item_text(s, vp, r, buf[k], t, sizeof t, pre, post);
            fprintf(out, "%s%s %s%s%s", pre[0] ? " " : "", pre, t, post[0] ? " " : "", post);
        }
        fprintf(out, "\n");
    }
    free(buf);
    fprintf(out,
            "simulated step: %.3f with the encoder on stage 0, %.3f with the pieces (%.1f%% "
            "shorter)\nidle share per stage, encoder on stage 0:",
            vp->span_first, vp->span,
            vp->span_first > 0 ? 100.0 * (1.0 - vp->span / vp->span_first) : 0.0);
    for (int r = 0; r < s->pp; r++) fprintf(out, " %.3f", vp->idle_first[r]);
    fprintf(out, "\nidle share per stage, with the pieces:");
    for (int r = 0; r < s->pp; r++) fprintf(out, " %.3f", vp->idle[r]);
    fprintf(out, "\n");
}
