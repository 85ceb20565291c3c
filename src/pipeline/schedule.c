#include "pipeline/schedule.h"

#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[] = {"gpipe", "1f1b", "interleaved", "zb", "forward"};

loom_status loom_pp_kind_parse(const char *name, loom_pp_kind *kind, loom_error *err) {
    for (int k = 0; k < 4; k++)
        if (strcmp(name, KIND_NAMES[k]) == 0) {
            *kind = (loom_pp_kind)k;
            return LOOM_OK;
        }
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "--pp-schedule '%s': expected gpipe, 1f1b, interleaved or zb", name);
}

const char *loom_pp_kind_name(loom_pp_kind kind) {
    return KIND_NAMES[kind];
}

loom_status loom_pp_schedule_check(loom_pp_kind kind, int pp, int m, int v, loom_error *err) {
    if (pp < 1 || pp > LOOM_PP_MAX_STAGES)
        return loom_error_set(err, LOOM_ERR_INPUT, "--pp %d: expected 1..%d", pp,
                              LOOM_PP_MAX_STAGES);
    if (m < 1) return loom_error_set(err, LOOM_ERR_INPUT, "micro-batches %d: expected >= 1", m);
    if (v < 1 || v > 16)
        return loom_error_set(err, LOOM_ERR_INPUT, "--virtual-stages %d: expected 1..16", v);
    if (kind == LOOM_PP_INTERLEAVED && v < 2)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp-schedule interleaved: needs --virtual-stages >= 2 (model "
                              "chunks per rank)");
    if (kind != LOOM_PP_INTERLEAVED && kind != LOOM_PP_FORWARD_ONLY && v != 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--virtual-stages %d: only with --pp-schedule interleaved", v);
    if ((kind == LOOM_PP_1F1B || kind == LOOM_PP_ZB || kind == LOOM_PP_INTERLEAVED) && m < pp)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp-schedule %s: %d micro-batch(es) per step, fewer than --pp %d "
                              "(raise --global-batch or lower --micro-batch; gpipe accepts any "
                              "number)",
                              KIND_NAMES[kind], m, pp);
    if (kind == LOOM_PP_INTERLEAVED && m % pp != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--pp-schedule interleaved: %d micro-batches per step must be a "
                              "multiple of --pp %d",
                              m, pp);
    return LOOM_OK;
}

/* A compute action of one rank before the moves are added. */
typedef struct {
    loom_pp_op op;
    int chunk, mb;
} work;

static void push(work *w, int *n, loom_pp_op op, int chunk, int mb) {
    w[*n].op = op;
    w[*n].chunk = chunk;
    w[*n].mb = mb;
    (*n)++;
}

/* ZB-H1 (Qi et al. 2023, handcrafted): stage r runs 1F1B's warm-up of pp - r - 1
 * forwards, then r F/B pairs with their W deferred, then F/B/W triples until the
 * forwards are done, B/W pairs for the remaining backwards, and the r deferred W's last,
 * where 1F1B's cooldown would idle. A micro-batch is held from F to W: at most pp on every
 * stage (warm-up + deferred = pp - 1, plus the one in the steady state), 1F1B's stage-0
 * bound. Needs m >= pp (checked). */
static void build_zb(work **w, int *n, int pp, int m) {
    for (int r = 0; r < pp; r++) {
        int f = 0, b = 0, wt = 0;
        for (int k = 0; k < pp - r - 1 && f < m; k++) push(w[r], &n[r], LOOM_PP_F, 0, f++);
        for (int k = 0; k < r && f < m; k++) {
            push(w[r], &n[r], LOOM_PP_F, 0, f++);
            push(w[r], &n[r], LOOM_PP_B, 0, b++);
        }
        while (f < m) {
            push(w[r], &n[r], LOOM_PP_F, 0, f++);
            push(w[r], &n[r], LOOM_PP_B, 0, b++);
            push(w[r], &n[r], LOOM_PP_W, 0, wt++);
        }
        while (b < m) {
            push(w[r], &n[r], LOOM_PP_B, 0, b++);
            push(w[r], &n[r], LOOM_PP_W, 0, wt++);
        }
        while (wt < m) push(w[r], &n[r], LOOM_PP_W, 0, wt++);
    }
}

loom_status loom_pp_schedule_build(loom_pp_schedule *s, loom_pp_kind kind, int pp, int m, int v,
                                   loom_error *err) {
    memset(s, 0, sizeof *s);
    loom_status st = loom_pp_schedule_check(kind, pp, m, v, err);
    if (st) return st;
    s->kind = kind;
    s->pp = pp;
    s->m = m;
    s->v = v;
    s->split = kind == LOOM_PP_ZB;
    work *w[LOOM_PP_MAX_STAGES];
    int n[LOOM_PP_MAX_STAGES] = {0};
    const int total = m * v;
    for (int r = 0; r < pp; r++) {
        w[r] = malloc(sizeof(work) * (size_t)(3 * total));
        s->acts[r] = malloc(sizeof(loom_pp_action) * (size_t)(7 * total));
        if (!w[r] || !s->acts[r]) {
            for (int q = 0; q <= r; q++) free(w[q]);
            loom_pp_schedule_free(s);
            return loom_error_set(err, LOOM_ERR_NOMEM, "pipeline schedule: out of memory");
        }
    }
    if (kind == LOOM_PP_ZB) build_zb(w, n, pp, m);
    for (int r = 0; r < pp && kind != LOOM_PP_ZB; r++) {
        if (kind == LOOM_PP_GPIPE) {
            for (int i = 0; i < m; i++) push(w[r], &n[r], LOOM_PP_F, 0, i);
            for (int i = 0; i < m; i++) push(w[r], &n[r], LOOM_PP_B, 0, i);
            continue;
        }
        /* 1F1B (v = 1) and Megatron's interleaved order: forward k runs chunk (k / pp) % v
         * of micro-batch (k / (pp v)) pp + k % pp; backwards visit the chunks reversed. */
        int warm = kind == LOOM_PP_1F1B ? pp - r - 1 : (pp - r - 1) * 2 + (v - 1) * pp;
        if (warm > total || kind == LOOM_PP_FORWARD_ONLY) warm = total; /* forwards only */
#define FWD(k) push(w[r], &n[r], LOOM_PP_F, ((k) / pp) % v, ((k) / (pp * v)) * pp + (k) % pp)
#define BWD(k)                                                                                     \
    push(w[r], &n[r], LOOM_PP_B, v - 1 - ((k) / pp) % v, ((k) / (pp * v)) * pp + (k) % pp)
        for (int k = 0; k < warm; k++) FWD(k);
        for (int k = 0; k < total - warm; k++) {
            FWD(warm + k);
            BWD(k);
        }
        for (int k = total - warm; k < total && kind != LOOM_PP_FORWARD_ONLY; k++) BWD(k);
#undef FWD
#undef BWD
    }
    /* The moves: a receive right before the compute that needs it, a send right after
     * the compute that produced it. Virtual stage of chunk c on rank r: c * pp + r. */
    const int S = pp * v;
    for (int r = 0; r < pp; r++) {
        loom_pp_action *a = s->acts[r];
        int k = 0;
        for (int j = 0; j < n[r]; j++) {
            const work x = w[r][j];
            const int vs = x.chunk * pp + r;
            const int prev = (vs - 1 + S) % pp, next = (vs + 1) % pp;
            if (x.op == LOOM_PP_F && vs > 0)
                a[k++] = (loom_pp_action){LOOM_PP_RECV_ACT, x.mb, x.chunk, prev};
            if (x.op == LOOM_PP_B && vs < S - 1)
                a[k++] = (loom_pp_action){LOOM_PP_RECV_GRAD, x.mb, x.chunk, next};
            a[k++] = (loom_pp_action){x.op, x.mb, x.chunk, -1};
            if (x.op == LOOM_PP_F && vs < S - 1)
                a[k++] = (loom_pp_action){LOOM_PP_SEND_ACT, x.mb, x.chunk, next};
            if (x.op == LOOM_PP_B && vs > 0)
                a[k++] = (loom_pp_action){LOOM_PP_SEND_GRAD, x.mb, x.chunk, prev};
        }
        s->n[r] = k;
        free(w[r]);
    }
    return LOOM_OK;
}

void loom_pp_schedule_free(loom_pp_schedule *s) {
    for (int r = 0; r < LOOM_PP_MAX_STAGES; r++) free(s->acts[r]);
    memset(s, 0, sizeof *s);
}

int loom_pp_schedule_max_in_flight(const loom_pp_schedule *s, int stage) {
    /* a micro-batch is held from its first F until all its v chunks' last B (W) */
    const int last_op = s->split ? LOOM_PP_W : LOOM_PP_B;
    int *left = calloc((size_t)s->m, sizeof *left), live = 0, most = 0;
    if (!left) return -1;
    for (int j = 0; j < s->n[stage]; j++) {
        const loom_pp_action *a = &s->acts[stage][j];
        if (a->op == LOOM_PP_F && left[a->mb] == 0 && ++live > most) most = live;
        if (a->op == LOOM_PP_F) left[a->mb]++;
        if ((int)a->op == last_op && --left[a->mb] == 0) live--;
    }
    free(left);
    return s->kind == LOOM_PP_FORWARD_ONLY ? 1 : most;
}

/* The message an action sends or waits for: (gradient?, receiving rank, its chunk, mb). */
int loom_pp_message_tag(const loom_pp_schedule *s, int rank, const loom_pp_action *a) {
    const int S = s->pp * s->v, vs = a->chunk * s->pp + rank;
    int to_vs = vs, grad = a->op == LOOM_PP_SEND_GRAD || a->op == LOOM_PP_RECV_GRAD;
    if (a->op == LOOM_PP_SEND_ACT) to_vs = vs + 1;
    if (a->op == LOOM_PP_SEND_GRAD) to_vs = vs - 1;
    return ((grad * S + to_vs) * s->m) + a->mb;
}

/* The simulation as events: a rank runs its list until an input it waits for has not
 * been sent or it starts a computation; then time moves to the next computation's end,
 * the running ranks progressing at the shared rate. A message is sent when its SEND is
 * reached, so a RECV passes once the sender's clock has reached that point. */
double loom_pp_schedule_simulate_shared(const loom_pp_schedule *s, const double (*dur)[3],
                                        double slots, double *idle, double *busy_out,
                                        int *start_out) {
    const int keys = 2 * s->pp * s->v * s->m;
    char *sent = calloc((size_t)keys, 1);
    double left[LOOM_PP_MAX_STAGES] = {0}, busy[LOOM_PP_MAX_STAGES] = {0}, now = 0;
    int ptr[LOOM_PP_MAX_STAGES] = {0}, running[LOOM_PP_MAX_STAGES] = {0}, off[LOOM_PP_MAX_STAGES];
    if (!sent) return -1;
    for (int r = 0, o = 0; r < s->pp; o += s->n[r], r++) off[r] = o;
    for (;;) {
        /* every idle rank goes as far as it can at `now` (a SEND may free another's RECV) */
        for (int moved = 1; moved;) {
            moved = 0;
            for (int r = 0; r < s->pp; r++)
                while (!running[r] && ptr[r] < s->n[r]) {
                    const loom_pp_action *a = &s->acts[r][ptr[r]];
                    if (a->op == LOOM_PP_RECV_ACT || a->op == LOOM_PP_RECV_GRAD) {
                        if (!sent[loom_pp_message_tag(s, r, a)]) break;
                    } else if (a->op == LOOM_PP_SEND_ACT || a->op == LOOM_PP_SEND_GRAD) {
                        sent[loom_pp_message_tag(s, r, a)] = 1;
                    } else {
                        const double *d = dur[a->chunk * s->pp + r];
                        if (start_out) start_out[off[r] + ptr[r]] = (int)(now + 0.5);
                        left[r] = d[a->op] + (a->op == LOOM_PP_B && !s->split ? d[LOOM_PP_W] : 0);
                        if (left[r] > 0) {
                            running[r] = 1;
                            break;
                        }
                    }
                    ptr[r]++;
                    moved = 1;
                }
        }
        int n_run = 0, first = -1;
        for (int r = 0; r < s->pp; r++)
            if (running[r] && (first < 0 || left[r] < left[first]))
                first = r, n_run++;
            else if (running[r])
                n_run++;
        if (first < 0) break; /* all done, or stuck */
        const double rate = slots > 0 && n_run > slots ? slots / n_run : 1.0;
        const double dt = left[first] / rate, step = left[first];
        now += dt;
        for (int r = 0; r < s->pp; r++) {
            if (!running[r]) continue;
            busy[r] += dt;
            left[r] -= step;
            if (r == first || left[r] <= 1e-12 * step) running[r] = 0, ptr[r]++;
        }
    }
    free(sent);
    for (int r = 0; r < s->pp; r++)
        if (ptr[r] < s->n[r]) return -1;
    for (int r = 0; r < s->pp && idle; r++) idle[r] = now > 0 ? 1.0 - busy[r] / now : 0;
    for (int r = 0; r < s->pp && busy_out; r++) busy_out[r] = busy[r];
    return now;
}

double loom_pp_schedule_simulate(const loom_pp_schedule *s, const double dur[3], double *idle,
                                 int *start_out) {
    const int S = s->pp * s->v;
    double(*each)[3] = malloc(sizeof(double[3]) * (size_t)S);
    if (!each) return -1;
    for (int k = 0; k < S; k++) memcpy(each[k], dur, sizeof(double[3]));
    const double span =
        loom_pp_schedule_simulate_shared(s, (const double(*)[3])each, 0, idle, NULL, start_out);
    free(each);
    return span;
}

static const char OP_CHAR[] = {'F', 'B', 'W'};

void loom_pp_format_action(const loom_pp_schedule *s, const loom_pp_action *a, char *buf,
                           size_t n) {
    static const char *const MOVE[] = {"sa", "ra", "sg", "rg"};
    char chunk[16] = "";
    if (s->v > 1) snprintf(chunk, sizeof chunk, ".%d", a->chunk);
    if (a->op <= LOOM_PP_W)
        snprintf(buf, n, "%c%d%s", OP_CHAR[a->op], a->mb, chunk);
    else
        snprintf(buf, n, "%s%d%s%c%d", MOVE[a->op - LOOM_PP_SEND_ACT], a->mb, chunk,
                 a->op == LOOM_PP_SEND_ACT || a->op == LOOM_PP_SEND_GRAD ? '>' : '<', a->peer);
}

loom_status loom_pp_schedule_print(const loom_pp_schedule *s, FILE *out, loom_error *err) {
    int total = 0;
    for (int r = 0; r < s->pp; r++) total += s->n[r];
    int *starts = malloc(sizeof(int) * (size_t)(total ? total : 1));
    double idle[LOOM_PP_MAX_STAGES];
    const double unit[3] = {1, 1, 1};
    double span = starts ? loom_pp_schedule_simulate(s, unit, idle, starts) : -1;
    if (span < 0) {
        free(starts);
        return loom_error_set(err, LOOM_ERR_STATE, "pipeline schedule %s deadlocks",
                              loom_pp_kind_name(s->kind));
    }
    int width = 3;
    for (int x = s->m - 1; x >= 10; x /= 10) width++;
    if (s->v > 1) width += 2;
    fprintf(out, "schedule %s: pp %d, micro-batches %d, virtual stages %d, W %s\n",
            loom_pp_kind_name(s->kind), s->pp, s->m, s->v, s->split ? "split from B" : "inside B");
    fprintf(out, "timeline (F = B = W = 1 time unit, B includes W unless split; '.' idle):\n");
    const int cells = (int)(span + 0.5);
    char *row = malloc((size_t)cells * (size_t)width + 1);
    for (int r = 0, o = 0; r < s->pp && row; o += s->n[r], r++) {
        memset(row, ' ', (size_t)cells * (size_t)width);
        row[(size_t)cells * (size_t)width] = 0;
        for (int c = 0; c < cells; c++) row[(size_t)c * (size_t)width] = '.';
        for (int j = 0; j < s->n[r]; j++) {
            const loom_pp_action *a = &s->acts[r][j];
            if (a->op > LOOM_PP_W) continue;
            const int len = a->op == LOOM_PP_B && !s->split ? 2 : 1;
            char t[32];
            loom_pp_format_action(s, a, t, sizeof t);
            for (int u = 0; u < len; u++)
                memcpy(row + (size_t)(starts[o + j] + u) * (size_t)width, t, strlen(t));
        }
        fprintf(out, "stage %2d |%s\n", r, row);
    }
    free(row);
    free(starts);
    fprintf(out, "bubble (idle / step, simulated):");
    for (int r = 0; r < s->pp; r++) fprintf(out, " %.3f", idle[r]);
    fprintf(out, "\nmax micro-batches in flight:");
    for (int r = 0; r < s->pp; r++) fprintf(out, " %d", loom_pp_schedule_max_in_flight(s, r));
    fprintf(out, "\nactions:\n");
    for (int r = 0; r < s->pp; r++) {
        fprintf(out, "stage %d:", r);
        for (int j = 0; j < s->n[r]; j++) {
            char t[32];
            loom_pp_format_action(s, &s->acts[r][j], t, sizeof t);
            fprintf(out, " %s", t);
        }
        fprintf(out, "\n");
    }
    return LOOM_OK;
}
