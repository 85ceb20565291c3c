#include "parallel/reshard.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

/* One intersection of a destination piece with a source piece: a box of rows. */
typedef struct {
    int64_t tensor, src_rank, dst_rank;
    loom_ckpt_box box;
    size_t src_local, dst_local; /* flat indices of the box's first element */
    int64_t src_stride, dst_stride;
} loom_reshard_copy;

/* A piece as every rank sees it: tensor, box, local index and stride, the replica. */
enum {
    REC_TENSOR,
    REC_OFF0,
    REC_OFF1,
    REC_LEN0,
    REC_LEN1,
    REC_LOCAL,
    REC_STRIDE,
    REC_REPLICA,
    REC_REPLICAS,
    REC_WORDS
};

/* Every rank's records of one side: rec + displ[r] * REC_WORDS are rank r's n[r] pieces. */
typedef struct {
    int64_t *rec;
    int *n, *displ;
    int total;
} all_pieces;

static void pieces_free(all_pieces *a) {
    free(a->rec), free(a->n), free(a->displ);
    memset(a, 0, sizeof *a);
}

/* The pieces of this side (written_only for a source), gathered from every rank. The
 * records travel as float words (MPI copies them bit for bit). */
static loom_status gather_pieces(loom_comm *c, const loom_reshard_side *s, int written_only,
                                 all_pieces *out, loom_error *err) {
    memset(out, 0, sizeof *out);
    loom_ckpt_plan plan = {0};
    loom_status st =
        loom_ckpt_plan_range(&plan, s->descs, LOOM_CKPT_PARAMS, 0, s->floats, written_only, 0, err);
    if (st) return st;
    const int P = c->size;
    double *counts = calloc((size_t)P, sizeof *counts);
    out->n = calloc((size_t)P, sizeof *out->n);
    out->displ = calloc((size_t)P, sizeof *out->displ);
    if (!counts || !out->n || !out->displ) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
        goto done;
    }
    counts[c->rank] = plan.n;
    if ((st = loom_comm_allreduce_sum_f64(c, counts, P, err))) goto done;
    for (int r = 0; r < P; r++) {
        out->n[r] = (int)counts[r];
        out->displ[r] = out->total;
        out->total += out->n[r];
    }
    const int words = 2 * REC_WORDS; /* floats per record */
    int *fc = malloc((size_t)P * sizeof *fc), *fd = malloc((size_t)P * sizeof *fd);
    out->rec = calloc((size_t)(out->total ? out->total : 1), REC_WORDS * sizeof(int64_t));
    if (!fc || !fd || !out->rec) {
        free(fc), free(fd);
        st = loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
        goto done;
    }
    for (int r = 0; r < P; r++) fc[r] = out->n[r] * words, fd[r] = out->displ[r] * words;
    int64_t *mine = out->rec + (size_t)out->displ[c->rank] * REC_WORDS;
    for (int i = 0; i < plan.n; i++) {
        const loom_ckpt_piece *p = &plan.items[i];
        int64_t *w = mine + (size_t)i * REC_WORDS;
        w[REC_TENSOR] = p->tensor;
        w[REC_OFF0] = p->box.off[0], w[REC_OFF1] = p->box.off[1];
        w[REC_LEN0] = p->box.len[0], w[REC_LEN1] = p->box.len[1];
        w[REC_LOCAL] = (int64_t)p->local, w[REC_STRIDE] = p->stride;
        w[REC_REPLICA] = s->replica, w[REC_REPLICAS] = s->n_replicas;
    }
    st = loom_comm_allgatherv(c, (float *)out->rec, fc, fd, err);
    free(fc), free(fd);
done:
    free(counts);
    loom_ckpt_plan_free(&plan);
    if (st) pieces_free(out);
    return st;
}

static loom_ckpt_box box_of(const int64_t *w) {
    return (loom_ckpt_box){{w[REC_OFF0], w[REC_OFF1]}, {w[REC_LEN0], w[REC_LEN1]}};
}

/* Flat index of global element (row, col) of box b inside the piece w. */
static size_t local_of(const int64_t *w, const loom_ckpt_box *b) {
    return (size_t)(w[REC_LOCAL] + (b->off[0] - w[REC_OFF0]) * w[REC_STRIDE] +
                    (b->off[1] - w[REC_OFF1]));
}

static loom_status check_sides(const loom_reshard_side *a, const loom_reshard_side *b,
                               loom_error *err) {
    if (a->descs->n != b->descs->n)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "reshard: %d tensors on one side, %d on the other", a->descs->n,
                              b->descs->n);
    for (int i = 0; i < a->descs->n; i++) {
        const loom_ckpt_desc *x = &a->descs->items[i], *y = &b->descs->items[i];
        if (strcmp(x->name, y->name) || x->global_shape[0] != y->global_shape[0] ||
            x->global_shape[1] != y->global_shape[1])
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "reshard: tensor %d is %s on one side and %s on the other", i,
                                  x->name, y->name);
    }
    return LOOM_OK;
}

/* Walks every (destination piece, source piece) intersection of every rank in one fixed
 * order; keeps this rank's copies (when out is not NULL) and counts the volumes. */
static int64_t walk(const all_pieces *src, const all_pieces *dst, int P, int me,
                    loom_reshard_copy *out, int *n_out, double *moved, int64_t *covered_mine) {
    int n = 0;
    /* The replica a rank reads from: its own where it holds source pieces (what it has
     * stays local, the rest comes from its own replica group), else rank % replicas. */
    int64_t own[P];
    for (int d = 0; d < P; d++)
        own[d] = src->n[d] ? src->rec[(size_t)src->displ[d] * REC_WORDS + REC_REPLICA] : d;
    int64_t missing = 0;
    *moved = 0.0;
    for (int d = 0; d < P; d++)
        for (int i = 0; i < dst->n[d]; i++) {
            const int64_t *dw = dst->rec + (size_t)(dst->displ[d] + i) * REC_WORDS;
            const loom_ckpt_box db = box_of(dw);
            int64_t covered = 0;
            for (int s = 0; s < P; s++)
                for (int j = 0; j < src->n[s]; j++) {
                    const int64_t *sw = src->rec + (size_t)(src->displ[s] + j) * REC_WORDS;
                    if (sw[REC_TENSOR] != dw[REC_TENSOR] ||
                        sw[REC_REPLICA] != own[d] % (sw[REC_REPLICAS] > 0 ? sw[REC_REPLICAS] : 1))
                        continue;
                    const loom_ckpt_box sb = box_of(sw);
                    loom_ckpt_box x;
                    if (!loom_ckpt_box_intersect(&db, &sb, &x)) continue;
                    const int64_t v = loom_ckpt_box_volume(&x);
                    covered += v;
                    if (s != d) *moved += 4.0 * (double)v;
                    if (s != me && d != me) continue;
                    if (out)
                        out[n] = (loom_reshard_copy){dw[REC_TENSOR],
                                                     s,
                                                     d,
                                                     x,
                                                     local_of(sw, &x),
                                                     local_of(dw, &x),
                                                     sw[REC_STRIDE],
                                                     dw[REC_STRIDE]};
                    n++;
                }
            if (d == me) *covered_mine += covered;
            if (covered != loom_ckpt_box_volume(&db))
                missing += loom_ckpt_box_volume(&db) - covered;
        }
    *n_out = n;
    return missing;
}

/* The planning's growable lists (plan time only; the run allocates nothing). */
typedef struct {
    loom_reshard_seg *v;
    int n, cap;
} seg_list;
typedef struct {
    loom_reshard_msg *v;
    int n, cap;
} msg_list;

static int grow(void **v, int *cap, int n, size_t size) {
    if (n < *cap) return 0;
    const int c = *cap ? 2 * *cap : 16;
    void *p = realloc(*v, (size_t)c * size);
    if (!p) return 1;
    *v = p, *cap = c;
    return 0;
}

/* Appends a copy of n floats (from -> to), merged into the last one when both continue it. */
static int seg_push(seg_list *l, size_t to, size_t from, size_t n) {
    loom_reshard_seg *last = l->n ? &l->v[l->n - 1] : NULL;
    if (last && last->to + last->n == to && last->from + last->n == from) {
        last->n += n;
        return 0;
    }
    if (grow((void **)&l->v, &l->cap, l->n, sizeof *l->v)) return 1;
    l->v[l->n++] = (loom_reshard_seg){to, from, n};
    return 0;
}

/* Appends a message (split into pieces of at most LOOM_RESHARD_MSG_MAX floats: MPI counts
 * are ints); both ends split alike. packed: the sender sends it from its staging buffer
 * (the message's tag says so on both ends). */
static int msg_push(msg_list *l, int peer, size_t at, size_t n, int staged, int packed) {
    for (size_t done = 0; done < n; done += LOOM_RESHARD_MSG_MAX) {
        if (grow((void **)&l->v, &l->cap, l->n, sizeof *l->v)) return 1;
        const size_t k = n - done < LOOM_RESHARD_MSG_MAX ? n - done : LOOM_RESHARD_MSG_MAX;
        l->v[l->n++] = (loom_reshard_msg){at + done, k, peer, staged, packed};
    }
    return 0;
}

/* Rows that lie one after the other in both the sender's source and the receiver's
 * destination, merged; its kind (below) and the first run of its span, once planned. */
typedef struct {
    size_t src, dst, n;
    int kind, first;
} run_t;

/* A run's message: its own (DIRECT), a span of the source unpacked by the receiver
 * (STAGED), a span of the destination packed by the sender (GATHERED), or the pair's last
 * message, packed and unpacked (PACKED). */
enum { RUN_DIRECT, RUN_STAGED, RUN_GATHERED, RUN_PACKED };

typedef struct {
    msg_list sends, recvs;
    seg_list pack, unpack, local;
    size_t send_at, recv_at; /* floats of send_buf / recv_buf handed out so far */
    run_t *runs;
    int cap;
} builder;

/* The runs of the rows rank s sends rank d, in the planned order (both ends hold the same
 * copies of the pair, so both find the same runs). */
static int pair_runs(builder *b, const loom_reshard_copy *copies, int n_copies, int s, int d,
                     int *nr) {
    *nr = 0;
    for (int i = 0; i < n_copies; i++) {
        const loom_reshard_copy *c = &copies[i];
        if (c->src_rank != s || c->dst_rank != d) continue;
        for (int64_t row = 0; row < c->box.len[0]; row++) {
            const size_t src = c->src_local + (size_t)(row * c->src_stride);
            const size_t dst = c->dst_local + (size_t)(row * c->dst_stride),
                         n = (size_t)c->box.len[1];
            run_t *last = *nr ? &b->runs[*nr - 1] : NULL;
            if (last && last->src + last->n == src && last->dst + last->n == dst) {
                last->n += n;
                continue;
            }
            if (grow((void **)&b->runs, &b->cap, *nr, sizeof *b->runs)) return 1;
            b->runs[(*nr)++] = (run_t){src, dst, n, RUN_PACKED, 0};
        }
    }
    return 0;
}

/* The messages between this rank and peer in one direction (sending: this rank is the
 * source), in an order both ends find alike: each run of at least min_floats moves on its
 * own, straight from the source into the destination. Consecutive shorter runs whose rows
 * lie in order in the source with few gaps (at most an eighth of their floats) form a
 * source span, sent from the source in place into the receiver's staging buffer and
 * unpacked there; those that follow one another in the destination without a gap form a
 * destination span, packed by the sender and received in place; either when it holds at
 * least min_floats (the longer of the two). The remaining rows are packed into one last
 * message and unpacked. */
static int plan_pair(builder *b, int nr, int peer, int sending, size_t min_floats) {
    const run_t *R = b->runs;
    for (int i = 0; i < nr;) {
        if (R[i].n >= min_floats) {
            b->runs[i].kind = RUN_DIRECT, b->runs[i].first = i, i++;
            continue;
        }
        size_t rows = R[i].n, gaps = 0, end = R[i].src + R[i].n;
        int j = i + 1;
        for (; j < nr && R[j].n < min_floats && R[j].src >= end &&
               (gaps + R[j].src - end) * 8 <= rows + R[j].n;
             j++)
            gaps += R[j].src - end, rows += R[j].n, end = R[j].src + R[j].n;
        size_t drows = R[i].n;
        int k = i + 1;
        for (; k < nr && R[k].n < min_floats && R[k].dst == R[k - 1].dst + R[k - 1].n; k++)
            drows += R[k].n;
        int kind = RUN_PACKED;
        if (rows >= min_floats && rows >= drows)
            kind = RUN_STAGED;
        else if (drows >= min_floats)
            kind = RUN_GATHERED, j = k;
        for (int q = i; q < j; q++) b->runs[q].kind = kind, b->runs[q].first = i;
        i = j;
    }
    msg_list *ml = sending ? &b->sends : &b->recvs;
    for (int i = 0; i < nr;) {
        int j = i + 1;
        while (j < nr && b->runs[j].kind == b->runs[i].kind && b->runs[j].first == i) j++;
        size_t len = R[j - 1].src + R[j - 1].n - R[i].src, rows = 0;
        for (int q = i; q < j; q++) rows += R[q].n;
        int bad = 0;
        if (b->runs[i].kind == RUN_DIRECT) {
            bad = msg_push(ml, peer, sending ? R[i].src : R[i].dst, R[i].n, 0, 0);
        } else if (b->runs[i].kind == RUN_STAGED && sending) {
            bad = msg_push(ml, peer, R[i].src, len, 0, 0);
        } else if (b->runs[i].kind == RUN_STAGED) {
            bad = msg_push(ml, peer, b->recv_at, len, 1, 0);
            for (int q = i; q < j && !bad; q++)
                bad = seg_push(&b->unpack, R[q].dst, b->recv_at + (R[q].src - R[i].src), R[q].n);
            b->recv_at += len;
        } else if (b->runs[i].kind == RUN_GATHERED && sending) {
            bad = msg_push(ml, peer, b->send_at, rows, 1, 1);
            size_t cur = 0;
            for (int q = i; q < j && !bad; cur += R[q].n, q++)
                bad = seg_push(&b->pack, b->send_at + cur, R[q].src, R[q].n);
            b->send_at += rows;
        } else if (b->runs[i].kind == RUN_GATHERED) {
            bad = msg_push(ml, peer, R[i].dst, rows, 0, 1);
        }
        if (bad) return 1;
        i = j;
    }
    size_t packed = 0, *at = sending ? &b->send_at : &b->recv_at;
    for (int i = 0; i < nr; i++) {
        if (b->runs[i].kind != RUN_PACKED) continue;
        if (sending ? seg_push(&b->pack, *at + packed, R[i].src, R[i].n)
                    : seg_push(&b->unpack, R[i].dst, *at + packed, R[i].n))
            return 1;
        packed += R[i].n;
    }
    if (packed && msg_push(ml, peer, *at, packed, 1, 1)) return 1;
    *at += packed;
    return 0;
}

static loom_status plan_messages(loom_reshard *r, const loom_reshard_copy *copies, int n_copies,
                                 size_t min_floats, loom_error *err) {
    const int P = r->comm->size, me = r->comm->rank;
    builder b = {0};
    int bad = 0;
    for (int i = 0; i < n_copies && !bad; i++) { /* what the rank keeps: one copy a span */
        const loom_reshard_copy *c = &copies[i];
        if (c->src_rank != me || c->dst_rank != me) continue;
        for (int64_t row = 0; row < c->box.len[0] && !bad; row++)
            bad = seg_push(&b.local, c->dst_local + (size_t)(row * c->dst_stride),
                           c->src_local + (size_t)(row * c->src_stride), (size_t)c->box.len[1]);
    }
    for (int p = 0; p < P && !bad; p++) {
        if (p == me) continue;
        int nr;
        bad = pair_runs(&b, copies, n_copies, p, me, &nr) || plan_pair(&b, nr, p, 0, min_floats) ||
              pair_runs(&b, copies, n_copies, me, p, &nr) || plan_pair(&b, nr, p, 1, min_floats);
    }
    free(b.runs);
    r->sends = b.sends.v, r->n_sends = b.sends.n;
    r->recvs = b.recvs.v, r->n_recvs = b.recvs.n;
    r->pack = b.pack.v, r->n_pack = b.pack.n;
    r->unpack = b.unpack.v, r->n_unpack = b.unpack.n;
    r->local = b.local.v, r->n_local = b.local.n;
    if (bad) return loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
    for (int i = 0; i < r->n_sends; i++) r->send_floats += r->sends[i].n;
    for (int i = 0; i < r->n_recvs; i++) {
        r->recv_floats += r->recvs[i].n;
        if (!r->recvs[i].staged) r->direct_floats += r->recvs[i].n;
    }
    for (int i = 0; i < r->n_pack; i++) r->packed_floats += r->pack[i].n;
    for (int i = 0; i < r->n_unpack; i++) r->unpacked_floats += r->unpack[i].n;
    for (int i = 0; i < r->n_local; i++) r->local_floats += r->local[i].n;
    r->send_buf = malloc((b.send_at ? b.send_at : 1) * sizeof(float));
    r->recv_buf = malloc((b.recv_at ? b.recv_at : 1) * sizeof(float));
    r->handles = calloc((size_t)(r->n_sends + r->n_recvs + 1), sizeof *r->handles);
    if (!r->send_buf || !r->recv_buf || !r->handles)
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "reshard: out of memory for %zu + %zu staged floats", b.send_at,
                              b.recv_at);
    return LOOM_OK;
}

loom_status loom_reshard_plan_with(loom_reshard *r, loom_comm *comm, const loom_reshard_side *src,
                                   const loom_reshard_side *dst, size_t min_message_floats,
                                   loom_error *err) {
    memset(r, 0, sizeof *r);
    r->comm = comm;
    if (comm->device != LOOM_COMM_HOST) /* host copies; NCCL would match sends in order */
        return loom_error_set(err, LOOM_ERR_STATE, "reshard on %s: host communicators only",
                              comm->name);
    loom_status st = check_sides(src, dst, err);
    if (st) return st;
    all_pieces sp, dp;
    if ((st = gather_pieces(comm, src, 1, &sp, err))) return st;
    if ((st = gather_pieces(comm, dst, 0, &dp, err))) {
        pieces_free(&sp);
        return st;
    }
    const int P = comm->size, me = comm->rank;
    int n = 0;
    int64_t covered = 0;
    loom_reshard_copy *copies = NULL;
    const int64_t missing = walk(&sp, &dp, P, me, NULL, &n, &r->bytes_moved, &covered);
    if (missing) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "reshard: %lld destination elements have no source (the source "
                            "side does not hold every tensor whole)",
                            (long long)missing);
        goto done;
    }
    if (!(copies = calloc((size_t)(n ? n : 1), sizeof *copies))) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
        goto done;
    }
    covered = 0;
    walk(&sp, &dp, P, me, copies, &n, &r->bytes_moved, &covered);
    st = plan_messages(r, copies, n, min_message_floats ? min_message_floats : 1, err);
done:
    free(copies);
    pieces_free(&sp);
    pieces_free(&dp);
    if (st) loom_reshard_free(r);
    return st;
}

loom_status loom_reshard_plan(loom_reshard *r, loom_comm *comm, const loom_reshard_side *src,
                              const loom_reshard_side *dst, loom_error *err) {
    return loom_reshard_plan_with(r, comm, src, dst, LOOM_RESHARD_MIN_MESSAGE, err);
}

static void copy_segs(float *to, const float *from, const loom_reshard_seg *s, int n) {
    for (int i = 0; i < n; i++) memcpy(to + s[i].to, from + s[i].from, s[i].n * sizeof(float));
}

loom_status loom_reshard_run(loom_reshard *r, const float *src, float *dst, loom_error *err) {
    /* one tag for the messages sent from the source in place, one for the packed ones:
     * each class is posted in the planned order on both ends, so the receives match */
    enum { TAG_IN_PLACE = 9200, TAG_PACKED = 9201 };
    loom_comm *c = r->comm;
    const char *label = c->label;
    c->label = "reshard";
    loom_status st = LOOM_OK;
    loom_comm_handle *h = r->handles;
    const double t0 = loom_now_ms();
    /* every receive first (straight into the destination, or into the staging buffer),
     * then every send from the source in place, then packing and the packed ones */
    for (int i = 0; !st && i < r->n_recvs; i++) {
        const loom_reshard_msg *m = &r->recvs[i];
        st = loom_comm_irecv(c, (m->staged ? r->recv_buf : dst) + m->at, m->n, m->peer,
                             m->packed ? TAG_PACKED : TAG_IN_PLACE, &h[i], err);
    }
    for (int i = 0; !st && i < r->n_sends; i++) {
        const loom_reshard_msg *m = &r->sends[i];
        if (!m->staged)
            st = loom_comm_isend(c, src + m->at, m->n, m->peer, TAG_IN_PLACE, &h[r->n_recvs + i],
                                 err);
    }
    const double t1 = loom_now_ms();
    if (!st) copy_segs(r->send_buf, src, r->pack, r->n_pack);
    const double t2 = loom_now_ms();
    for (int i = 0; !st && i < r->n_sends; i++) {
        const loom_reshard_msg *m = &r->sends[i];
        if (m->staged)
            st = loom_comm_isend(c, r->send_buf + m->at, m->n, m->peer, TAG_PACKED,
                                 &h[r->n_recvs + i], err);
    }
    /* what the rank keeps, while the peers read what it sends */
    if (!st) copy_segs(dst, src, r->local, r->n_local);
    const double t3 = loom_now_ms();
    for (int i = 0; i < r->n_recvs + r->n_sends; i++) { /* posted ones even after a failure */
        loom_status w = loom_comm_wait(&h[i], err);
        if (!st) st = w;
    }
    const double t4 = loom_now_ms();
    if (!st) copy_segs(dst, r->recv_buf, r->unpack, r->n_unpack);
    const double t5 = loom_now_ms();
    r->pack_ms = t2 - t1, r->local_ms = t3 - t2, r->wait_ms = (t1 - t0) + (t4 - t3);
    r->unpack_ms = t5 - t4;
    c->label = label;
    return st;
}

void loom_reshard_free(loom_reshard *r) {
    free(r->sends), free(r->recvs), free(r->pack), free(r->unpack), free(r->local);
    free(r->send_buf), free(r->recv_buf), free(r->handles);
    memset(r, 0, sizeof *r);
}
