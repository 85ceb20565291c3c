#include "parallel/reshard.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

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

/* The message from rank s to rank d (this rank one of them) as a span of s's source
 * buffer: where the rows of their copies, in the planned order, lie in increasing order
 * with gaps of at most an eighth of their floats in all (a tp rank's replicated tensors,
 * which another rank's copy supplies, between its shards), the message is the source from
 * the first row to the end of the last (*start, *len; the gaps travel unused), sent in
 * place or copied in one piece. 0: the rows packed back to back. Both ends decide alike
 * (they hold the same copies). */
static int span_of(const loom_reshard *r, int s, int d, size_t *start, size_t *len) {
    size_t next = 0, rows = 0, first = 0;
    int n = 0;
    for (int i = 0; i < r->n_copies; i++) {
        const loom_reshard_copy *c = &r->copies[i];
        if (c->src_rank != s || c->dst_rank != d) continue;
        for (int64_t row = 0; row < c->box.len[0]; row++, n++) {
            const size_t off = c->src_local + (size_t)(row * c->src_stride);
            if (n == 0) first = off;
            if (n > 0 && off < next) return 0;
            next = off + (size_t)c->box.len[1];
            rows += (size_t)c->box.len[1];
        }
    }
    if (n == 0 || first > (size_t)INT_MAX || next - first > (size_t)INT_MAX ||
        (next - first - rows) * 8 > rows)
        return 0;
    *start = first, *len = next - first;
    return 1;
}

/* Whether this rank's copies from `peer`, in the planned order, are one contiguous run of
 * its destination buffer that an int displacement reaches; its start into *start. */
static int one_run(const loom_reshard *r, int peer, int *start) {
    const int me = r->comm->rank;
    size_t next = 0;
    int n = 0;
    for (int i = 0; i < r->n_copies; i++) {
        const loom_reshard_copy *c = &r->copies[i];
        if (c->dst_rank != me || c->src_rank != peer) continue;
        for (int64_t row = 0; row < c->box.len[0]; row++, n++) {
            const size_t off = c->dst_local + (size_t)(row * c->dst_stride);
            if (n == 0) {
                if (off > (size_t)INT_MAX) return 0;
                *start = (int)off;
            } else if (off != next) {
                return 0;
            }
            next = off + (size_t)c->box.len[1];
        }
    }
    return 1;
}

/* The messages' sizes and formats: each peer's span (span_of) or its packed rows; the
 * source read in place when every message this rank sends is a span, the destination
 * written in place when every message it receives is one run of it without gaps. */
static loom_status plan_messages(loom_reshard *r, loom_error *err) {
    const int P = r->comm->size, me = r->comm->rank;
    r->span_to = malloc((size_t)P * sizeof *r->span_to);
    r->span_from = malloc((size_t)P * sizeof *r->span_from);
    r->src_displs = calloc((size_t)P, sizeof *r->src_displs);
    r->dst_displs = calloc((size_t)P, sizeof *r->dst_displs);
    if (!r->span_to || !r->span_from || !r->src_displs || !r->dst_displs)
        return loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
    int send_direct = 1, recv_direct = 1;
    for (int p = 0; p < P; p++) {
        size_t start, len;
        r->span_to[p] = r->span_from[p] = SIZE_MAX;
        if (p == me) continue;
        if (r->send_counts[p] && span_of(r, me, p, &start, &len)) {
            r->span_to[p] = start, r->send_counts[p] = (int)len, r->src_displs[p] = (int)start;
        } else if (r->send_counts[p]) {
            send_direct = 0;
        }
        if (r->recv_counts[p] && span_of(r, p, me, &start, &len)) {
            recv_direct &= len == (size_t)r->recv_counts[p] && one_run(r, p, &r->dst_displs[p]);
            r->span_from[p] = start, r->recv_counts[p] = (int)len;
        } else if (r->recv_counts[p]) {
            recv_direct &= one_run(r, p, &r->dst_displs[p]);
        }
    }
    for (int p = 0; p < P; p++) {
        r->send_displs[p] = (int)r->send_floats;
        r->recv_displs[p] = (int)r->recv_floats;
        r->send_floats += (size_t)r->send_counts[p];
        r->recv_floats += (size_t)r->recv_counts[p];
    }
    if (!send_direct) free(r->src_displs), r->src_displs = NULL;
    if (!recv_direct) free(r->dst_displs), r->dst_displs = NULL;
    return LOOM_OK;
}

loom_status loom_reshard_plan(loom_reshard *r, loom_comm *comm, const loom_reshard_side *src,
                              const loom_reshard_side *dst, loom_error *err) {
    memset(r, 0, sizeof *r);
    r->comm = comm;
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
    const int64_t missing = walk(&sp, &dp, P, me, NULL, &n, &r->bytes_moved, &covered);
    if (missing) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "reshard: %lld destination elements have no source (the source "
                            "side does not hold every tensor whole)",
                            (long long)missing);
        goto done;
    }
    r->copies = calloc((size_t)(n ? n : 1), sizeof *r->copies);
    r->send_counts = calloc((size_t)P, sizeof(int));
    r->send_displs = calloc((size_t)P, sizeof(int));
    r->recv_counts = calloc((size_t)P, sizeof(int));
    r->recv_displs = calloc((size_t)P, sizeof(int));
    if (!r->copies || !r->send_counts || !r->send_displs || !r->recv_counts || !r->recv_displs) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
        goto done;
    }
    covered = 0;
    walk(&sp, &dp, P, me, r->copies, &r->n_copies, &r->bytes_moved, &covered);
    for (int i = 0; i < r->n_copies; i++) {
        const loom_reshard_copy *c = &r->copies[i];
        const int v = (int)loom_ckpt_box_volume(&c->box);
        if (c->src_rank == me && c->dst_rank != me) r->send_counts[c->dst_rank] += v;
        if (c->dst_rank == me && c->src_rank != me) r->recv_counts[c->src_rank] += v;
    }
    for (int i = 0; i < r->n_copies; i++)
        if (r->copies[i].src_rank == me && r->copies[i].dst_rank == me)
            r->local_floats += (size_t)loom_ckpt_box_volume(&r->copies[i].box);
    if ((st = plan_messages(r, err))) goto done;
    if (!r->src_displs) r->send_buf = malloc((r->send_floats ? r->send_floats : 1) * sizeof(float));
    if (!r->dst_displs) r->recv_buf = malloc((r->recv_floats ? r->recv_floats : 1) * sizeof(float));
    if ((!r->src_displs && !r->send_buf) || (!r->dst_displs && !r->recv_buf))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory for %zu + %zu floats",
                            r->send_floats, r->recv_floats);
done:
    pieces_free(&sp);
    pieces_free(&dp);
    if (st) loom_reshard_free(r);
    return st;
}

/* Copies box rows between two strided places. */
static void copy_box(float *to, int64_t to_stride, const float *from, int64_t from_stride,
                     const loom_ckpt_box *b) {
    for (int64_t row = 0; row < b->len[0]; row++)
        memcpy(to + row * to_stride, from + row * from_stride, (size_t)b->len[1] * sizeof(float));
}

loom_status loom_reshard_run(loom_reshard *r, const float *src, float *dst, loom_error *err) {
    const int P = r->comm->size, me = r->comm->rank;
    int *cur = calloc((size_t)P, sizeof *cur);
    if (!cur) return loom_error_set(err, LOOM_ERR_NOMEM, "reshard: out of memory");
    const double t0 = loom_now_ms();
    for (int p = 0; !r->src_displs && p < P; p++) /* a span: one copy */
        if (r->span_to[p] != SIZE_MAX)
            memcpy(r->send_buf + r->send_displs[p], src + r->span_to[p],
                   (size_t)r->send_counts[p] * sizeof(float));
    for (int i = 0; !r->src_displs && i < r->n_copies; i++) { /* pack, in the planned order */
        const loom_reshard_copy *c = &r->copies[i];
        if (c->src_rank != me || c->dst_rank == me || r->span_to[c->dst_rank] != SIZE_MAX) continue;
        float *to = r->send_buf + r->send_displs[c->dst_rank] + cur[c->dst_rank];
        copy_box(to, c->box.len[1], src + c->src_local, c->src_stride, &c->box);
        cur[c->dst_rank] += (int)loom_ckpt_box_volume(&c->box);
    }
    const double t1 = loom_now_ms();
    /* the all-to-all in flight (the peers read what this rank sends) while the rank copies
     * what it keeps: the destination's parts that nothing is received into */
    loom_comm_handle h;
    loom_status st = loom_comm_ialltoallv(
        r->comm, r->src_displs ? src : r->send_buf, r->send_counts,
        r->src_displs ? r->src_displs : r->send_displs, r->dst_displs ? dst : r->recv_buf,
        r->recv_counts, r->dst_displs ? r->dst_displs : r->recv_displs, &h, err);
    for (int i = 0; !st && i < r->n_copies; i++) {
        const loom_reshard_copy *c = &r->copies[i];
        if (c->src_rank == me && c->dst_rank == me)
            copy_box(dst + c->dst_local, c->dst_stride, src + c->src_local, c->src_stride, &c->box);
    }
    if (!st) st = loom_comm_wait(&h, err);
    const double t2 = loom_now_ms();
    memset(cur, 0, (size_t)P * sizeof *cur);
    for (int i = 0; !st && !r->dst_displs && i < r->n_copies; i++) { /* unpack, same order */
        const loom_reshard_copy *c = &r->copies[i];
        if (c->dst_rank != me || c->src_rank == me) continue;
        const size_t span = r->span_from[c->src_rank];
        const float *from = r->recv_buf + r->recv_displs[c->src_rank];
        if (span != SIZE_MAX) { /* the rows where the sender holds them */
            copy_box(dst + c->dst_local, c->dst_stride, from + (c->src_local - span), c->src_stride,
                     &c->box);
            continue;
        }
        copy_box(dst + c->dst_local, c->dst_stride, from + cur[c->src_rank], c->box.len[1],
                 &c->box);
        cur[c->src_rank] += (int)loom_ckpt_box_volume(&c->box);
    }
    r->pack_ms = t1 - t0, r->move_ms = t2 - t1, r->unpack_ms = loom_now_ms() - t2;
    free(cur);
    return st;
}

void loom_reshard_free(loom_reshard *r) {
    free(r->copies), free(r->send_counts), free(r->send_displs), free(r->recv_counts);
    free(r->recv_displs), free(r->send_buf), free(r->recv_buf), free(r->src_displs);
    free(r->dst_displs), free(r->span_to), free(r->span_from);
    memset(r, 0, sizeof *r);
}
