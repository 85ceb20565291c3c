/* reshard_cmp: the same weights moved from a training layout (tensor parallel --tp-train,
 * or --pp-train pipeline stages, data-parallel replicas over the rest) into a generation
 * layout (--tp-gen, data-parallel replicas over the rest) three ways, each timed (the best
 * of --iters, slowest rank), and checked bit for bit against the generation layout's own
 * initialisation:
 *   reshard_ms    loom_reshard_run (parallel/reshard.h: point-to-point messages of the
 *                 pieces each rank lacks, straight between the buffers where the rows lie
 *                 in order, else staged and unpacked or packed, plus the rank's own copies);
 *   allgather_ms  gathering everything on every rank: an all-gather of every rank's
 *                 training buffer (only the transfer: assembling the generation layout
 *                 from it would come on top, so this favours the all-gather);
 *   ckpt_ms       saving a checkpoint of the training layout (ckpt/ckpt_writer.h, fsync,
 *                 the commit) into --dir and loading it into the generation layout
 *                 (ckpt/ckpt_loader.h), what a system without in-memory resharding does.
 * The model of the reshard's time, both bandwidths measured in the same run:
 *   p2p_bytes_per_s     one contiguous message of the reshard's largest received size,
 *                       every rank sending to the next and receiving from the previous at
 *                       once (MPI_Isend / MPI_Irecv), slowest rank;
 *   pair_bytes_per_s    the same message exchanged both ways at once between rank pairs
 *                       (rank ^ 1: each rank sends to the rank it receives from, as a
 *                       tensor-parallel pair does in the reshard; 0 for a world of one);
 *   memcpy_bytes_per_s  every rank copying its training buffer at once, slowest rank;
 *   predicted_ms        the largest over ranks of what the rank receives / p2p + what it
 *                       copies in memory (keeps, packs, unpacks) / memcpy (a rank's MPI
 *                       receives and its copies both run on its own core, in turn);
 *   allgather_over_predicted  the all-gather's time over that: the most the reshard could
 *                       beat the all-gather by at these bandwidths.
 * phases_ms: the slowest rank's pack, local, wait and unpack in the best iteration;
 * messages: sends and receives posted over all ranks (each message counted at both ends);
 * critical_*: the bytes of the rank the model predicts slowest.
 * median: the same comparisons from the medians over the timed iterations (the best of a
 * short operation is luckier than the best of a long one on a loaded machine).
 * --link-dev IFACE (one rank per host, e.g. eth0 of a test host, tests/hosts): each rank's
 * bytes received and sent on that network device of its own network namespace
 * (/proc/self/net/dev, read after the barrier that follows each operation, so what its
 * peers sent it has arrived), per operation: the mean over the timed iterations of the
 * reshard, the point-to-point message and the all-gather, the checkpoint's rounds' mean
 * ("link": {"dev", "rx_bytes": {op: [per rank]}, "tx_bytes": {...}}).
 *
 *   mpirun -n N reshard_cmp --dir DIR [--tp-train N | --pp-train N] [--tp-gen 1]
 *                           [--n-layer 8] [--d-model 512] [--vocab 4096] [--iters 5]
 *                           [--min-message FLOATS] [--ckpt-iters 2 (0: none)]
 *                           [--link-dev IFACE]
 *
 * Prints ONE JSON line (rank 0). Exit status 2 on bad arguments, 1 on a failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_commit.h"
#include "ckpt/ckpt_loader.h"
#include "ckpt/ckpt_writer.h"
#include "ckpt/manifest.h"
#include "comm/comm.h"
#include "comm/world.h"
#include "core/clock.h"
#include "model/config.h"
#include "model/config_json.h"
#include "model/params.h"
#include "parallel/reshard.h"
#include "train/ckpt_tensors.h"

typedef struct {
    loom_param_table table;
    loom_ckpt_descs descs;
    float *buf;
    loom_reshard_side side;
} view;

/* tp > 1: a tensor-parallel shard (tp rank rank % tp, replica rank / tp); pp > 1: the
 * pipeline stage rank / (world / pp) (its replica rank % (world / pp)), its tensors
 * described in the whole model's order (whole: that model's descriptors). */
static int make(view *v, const loom_model_config *cfg, int world, int rank, int tp, int pp,
                const view *whole, int init) {
    loom_error err = {0};
    memset(v, 0, sizeof *v);
    const int dp = world / pp, stage = rank / dp;
    loom_layer_set ls = {.n_chunks = 1, .first = stage == 0, .last = stage == pp - 1};
    ls.lo[0] = stage * cfg->n_layer / pp, ls.hi[0] = (stage + 1) * cfg->n_layer / pp;
    loom_params_options o = {.tp_rank = rank % tp, .tp_size = tp, .layers = pp > 1 ? &ls : NULL};
    if (loom_params_build(&v->table, cfg, &o, &err) ||
        (pp > 1 ? loom_ckpt_tensors_describe_as(&v->descs, &v->table, &whole->descs, &err)
                : loom_ckpt_tensors_describe(&v->descs, &v->table, &err))) {
        fprintf(stderr, "reshard_cmp: %s\n", err.msg);
        return 1;
    }
    v->buf = calloc(v->table.total, sizeof(float));
    if (!v->buf) return 1;
    if (init) loom_params_init(&v->table, v->buf, 1234);
    v->side = pp > 1 ? (loom_reshard_side){&v->descs, v->table.total, rank % dp, dp}
                     : (loom_reshard_side){&v->descs, v->table.total, rank / tp, world / tp};
    return 0;
}

static void view_free(view *v) {
    loom_params_free(&v->table);
    loom_ckpt_descs_free(&v->descs);
    free(v->buf);
}

/* The bytes received (rx) and sent (tx) so far on device dev of this process's network
 * namespace; 0 when it has no such device. */
static void link_bytes(const char *dev, double *rx, double *tx) {
    *rx = *tx = 0;
    FILE *f = dev ? fopen("/proc/self/net/dev", "r") : NULL;
    if (!f) return;
    char line[512];
    const size_t n = strlen(dev);
    while (fgets(line, sizeof line, f)) {
        const char *p = line;
        while (*p == ' ') p++;
        unsigned long long r = 0, t = 0;
        if (!strncmp(p, dev, n) && p[n] == ':' &&
            sscanf(p + n + 1, "%llu %*u %*u %*u %*u %*u %*u %*u %llu", &r, &t) == 2) {
            *rx = (double)r, *tx = (double)t;
            break;
        }
    }
    fclose(f);
}

enum { LINK_RESHARD, LINK_P2P, LINK_PAIR, LINK_ALLGATHER, LINK_CKPT, LINK_OPS };
static const char *const link_op[LINK_OPS] = {"reshard", "p2p", "pair", "allgather", "ckpt"};

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The largest over ranks (the slowest rank's time). */
static double slowest(loom_comm *c, double ms) {
    loom_error err = {0};
    double all[64] = {0};
    all[c->rank] = ms;
    loom_comm_allreduce_sum_f64(c, all, c->size, &err);
    double m = 0;
    for (int r = 0; r < c->size; r++) m = all[r] > m ? all[r] : m;
    return m;
}

static int fail(loom_comm *c, const char *what, const loom_error *err) {
    fprintf(stderr, "reshard_cmp: rank %d: %s: %s\n", c->rank, what, err->msg);
    return 1;
}

static int arg_int(int argc, char **argv, const char *name, int def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoi(argv[i + 1]);
    return def;
}

static const char *arg_str(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return NULL;
}

/* Save the training layout's weights as a checkpoint in dir, load them into dst. */
static int ckpt_round(loom_comm *c, const loom_model_config *cfg, view *src, view *dst,
                      const char *dir, double *ms) {
    loom_error err = {0};
    loom_ckpt_buffer b[LOOM_CKPT_KINDS] = {{0}}, d[LOOM_CKPT_KINDS] = {{0}};
    /* data-parallel replicas hold the same pieces: the first writes them */
    const size_t hi = src->side.replica ? 0 : src->table.total;
    b[LOOM_CKPT_PARAMS] = (loom_ckpt_buffer){src->buf, 0, 0, hi};
    d[LOOM_CKPT_PARAMS] = (loom_ckpt_buffer){dst->buf, 0, 0, dst->table.total};
    loom_ckpt_writer w;
    if (loom_ckpt_writer_create(&w, &src->descs, b, c->rank, &err)) return fail(c, "writer", &err);
    loom_comm_barrier(c, &err);
    const double t0 = loom_now_ms();
    loom_status st = loom_ckpt_writer_start(&w, dir, &err);
    if (!st) st = loom_ckpt_writer_wait(&w, &err);
    loom_ckpt_writer_destroy(&w);
    if (st) return fail(c, "save", &err);
    if (loom_comm_barrier(c, &err)) return fail(c, "barrier", &err);
    if (c->rank == 0) {
        loom_ckpt_manifest run = {0};
        run.layout = (loom_ckpt_layout){1, (int)(c->size), 1, 1, 0, c->size, 1};
        run.model = loom_model_config_to_json(cfg);
        st = loom_ckpt_commit(dir, "", 0, c->size, &run, &err);
        loom_ckpt_manifest_free(&run);
        if (st) return fail(c, "commit", &err);
    }
    if (loom_comm_barrier(c, &err)) return fail(c, "barrier", &err);
    char path[LOOM_CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    loom_ckpt_manifest m;
    if (loom_ckpt_manifest_load(&m, path, 0, &err)) return fail(c, "manifest", &err);
    st = loom_ckpt_load(dir, &m, &dst->descs, d, NULL, &err);
    loom_ckpt_manifest_free(&m);
    if (st) return fail(c, "load", &err);
    *ms = loom_now_ms() - t0;
    return 0;
}

int main(int argc, char **argv) {
    loom_world wo;
    loom_comm c;
    loom_error err = {0};
    if (loom_world_init(&wo, &argc, &argv, &err) || !wo.mpi) {
        fprintf(stderr, "reshard_cmp: run under mpirun\n");
        return 2;
    }
    if (loom_comm_from_mpi(&c, MPI_COMM_WORLD, "world", &err)) return fail(&c, "comm", &err);
    const char *dir = arg_str(argc, argv, "--dir");
    const int ppa = arg_int(argc, argv, "--pp-train", 1);
    const int tpa = arg_int(argc, argv, "--tp-train", ppa > 1 ? 1 : c.size);
    const int tpb = arg_int(argc, argv, "--tp-gen", 1);
    const int iters = arg_int(argc, argv, "--iters", 5);
    const int ckpt_iters = arg_int(argc, argv, "--ckpt-iters", 2); /* a checkpoint is slow */
    const long min_msg = (long)arg_int(argc, argv, "--min-message", (int)LOOM_RESHARD_MIN_MESSAGE);
    const char *dev = arg_str(argc, argv, "--link-dev");
    loom_model_config cfg;
    loom_model_preset(&cfg, "llama-tiny", &err);
    cfg.n_layer = arg_int(argc, argv, "--n-layer", 8);
    cfg.d_model = arg_int(argc, argv, "--d-model", 512);
    cfg.n_head = 8, cfg.n_kv_head = 8, cfg.d_ff = 4 * cfg.d_model;
    cfg.vocab_size = arg_int(argc, argv, "--vocab", 4096), cfg.seq_len = 64;
    if (!dir || c.size > 64 || tpa < 1 || tpb < 1 || ppa < 1 || (ppa > 1 && tpa > 1) ||
        c.size % tpa || c.size % tpb || c.size % ppa || cfg.n_layer % ppa || cfg.n_head % tpa ||
        cfg.n_head % tpb || iters < 1 || iters > 64 || min_msg < 1 ||
        (dev && (!*dev || strlen(dev) > 32))) {
        if (c.rank == 0)
            fprintf(stderr, "reshard_cmp: --dir DIR needed; --tp-train (or --pp-train, not both) "
                            "and --tp-gen must divide the world and 8 heads (--pp-train: the "
                            "layers); --iters 1-64; --min-message >= 1; --link-dev: a "
                            "network device's name\n");
        return 2;
    }
    view whole, src, dst, want;
    if (make(&whole, &cfg, c.size, c.rank, 1, 1, NULL, 0) ||
        make(&src, &cfg, c.size, c.rank, tpa, ppa, &whole, 1) ||
        make(&dst, &cfg, c.size, c.rank, tpb, 1, NULL, 0) ||
        make(&want, &cfg, c.size, c.rank, tpb, 1, NULL, 1))
        return 1;
    loom_reshard r;
    if (loom_reshard_plan_with(&r, &c, &src.side, &dst.side, (size_t)min_msg, &err))
        return fail(&c, "plan", &err);
    /* the all-gather: every rank's whole training buffer to every rank (stages: the
     * largest stage's size from each) */
    double tmax = slowest(&c, (double)src.table.total);
    const size_t per = (size_t)tmax;
    int counts[64], displs[64];
    for (int p = 0, off = 0; p < c.size; p++)
        counts[p] = (int)per, displs[p] = off, off += counts[p];
    float *all = calloc((size_t)c.size * per, sizeof(float));
    /* the point-to-point yardstick: one message of the reshard's largest received size */
    const size_t p2p = (size_t)slowest(&c, (double)r.recv_floats) + 1;
    float *p2p_send = calloc(p2p, sizeof(float)), *p2p_recv = calloc(p2p, sizeof(float));
    float *scratch = malloc(src.table.total * sizeof(float));
    if (!all || !p2p_send || !p2p_recv || !scratch) return 1;
    double best[3] = {1e30, 1e30, 1e30}, ck = 1e30, cp_best = 1e30, p2p_best = 1e30,
           pair_best = 1e30;
    double phase[4] = {0}, runs[4][64]; /* each timed iteration: reshard, p2p, all-gather, memcpy */
    /* --link-dev: this rank's bytes on the link per operation (summed over the timed
     * iterations; rx then tx), and the counters after each barrier */
    double link[2][LINK_OPS] = {{0}}, lrx[5], ltx[5];
    const int partner = (c.rank ^ 1) < c.size ? c.rank ^ 1 : c.rank; /* the pair exchange's */
    for (int it = 0; it < iters + 1; it++) {                         /* the first is a warm-up */
        double t[4];
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[0], &ltx[0]);
        double t0 = loom_now_ms();
        if (loom_reshard_run(&r, src.buf, dst.buf, &err)) return fail(&c, "reshard", &err);
        t[0] = loom_now_ms() - t0;
        if (getenv("RESHARD_CMP_VERBOSE"))
            fprintf(stderr, "rank %d: %.1f ms: pack %.1f, local %.1f, wait %.1f, unpack %.1f\n",
                    c.rank, t[0], r.pack_ms, r.local_ms, r.wait_ms, r.unpack_ms);
        const double ph[4] = {r.pack_ms, r.local_ms, r.wait_ms, r.unpack_ms};
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[1], &ltx[1]);
        t0 = loom_now_ms();
        loom_comm_handle hs, hr;
        if (loom_comm_irecv(&c, p2p_recv, p2p, (c.rank + c.size - 1) % c.size, 5, &hr, &err) ||
            loom_comm_isend(&c, p2p_send, p2p, (c.rank + 1) % c.size, 5, &hs, &err) ||
            loom_comm_wait(&hr, &err) || loom_comm_wait(&hs, &err))
            return fail(&c, "point-to-point", &err);
        t[1] = loom_now_ms() - t0;
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[2], &ltx[2]);
        t0 = loom_now_ms();
        if (partner != c.rank && (loom_comm_irecv(&c, p2p_recv, p2p, partner, 6, &hr, &err) ||
                                  loom_comm_isend(&c, p2p_send, p2p, partner, 6, &hs, &err) ||
                                  loom_comm_wait(&hr, &err) || loom_comm_wait(&hs, &err)))
            return fail(&c, "pair exchange", &err);
        t[3] = loom_now_ms() - t0;
        if (getenv("RESHARD_CMP_VERBOSE"))
            fprintf(stderr, "rank %d: point-to-point %.1f ms, pair exchange %.1f ms\n", c.rank,
                    t[1], t[3]);
        memcpy(all + (size_t)c.rank * per, src.buf, src.table.total * sizeof(float));
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[3], &ltx[3]);
        t0 = loom_now_ms();
        if (loom_comm_allgatherv(&c, all, counts, displs, &err)) return fail(&c, "allgather", &err);
        t[2] = loom_now_ms() - t0;
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[4], &ltx[4]);
        t0 = loom_now_ms();
        memcpy(scratch, src.buf, src.table.total * sizeof(float));
        const double cp = slowest(&c, loom_now_ms() - t0);
        const double pt = slowest(&c, t[1]), pr = slowest(&c, t[3]);
        /* the slowest rank of the reshard: its phases */
        double all_t[64] = {0}, who = 0;
        all_t[c.rank] = t[0];
        loom_comm_allreduce_sum_f64(&c, all_t, c.size, &err);
        for (int p = 1; p < c.size; p++) who = all_t[p] > all_t[(int)who] ? p : who;
        double phw[4];
        for (int k = 0; k < 4; k++) phw[k] = c.rank == (int)who ? ph[k] : 0.0;
        loom_comm_allreduce_sum_f64(&c, phw, 4, &err);
        const double ag = slowest(&c, t[2]);
        if (it == 0) continue;
        for (int k = 0; k < 4; k++) /* reshard, p2p, pair, all-gather: consecutive counters */
            link[0][k] += lrx[k + 1] - lrx[k], link[1][k] += ltx[k + 1] - ltx[k];
        if (all_t[(int)who] < best[0])
            for (int k = 0; k < 4; k++) phase[k] = phw[k];
        best[0] = all_t[(int)who] < best[0] ? all_t[(int)who] : best[0];
        best[2] = ag < best[2] ? ag : best[2];
        cp_best = cp < cp_best ? cp : cp_best;
        p2p_best = pt < p2p_best ? pt : p2p_best;
        pair_best = pr < pair_best ? pr : pair_best;
        runs[0][it - 1] = all_t[(int)who], runs[1][it - 1] = pt, runs[2][it - 1] = ag;
        runs[3][it - 1] = cp;
    }
    double med[4]; /* the medians over the timed iterations */
    for (int k = 0; k < 4; k++) {
        qsort(runs[k], (size_t)iters, sizeof(double), by_value);
        med[k] =
            iters % 2 ? runs[k][iters / 2] : 0.5 * (runs[k][iters / 2 - 1] + runs[k][iters / 2]);
    }
    int bad = memcmp(dst.buf, want.buf, want.table.total * sizeof(float)) != 0;
    const int ck_n = iters < ckpt_iters ? iters : ckpt_iters;
    for (int it = 0; it < ck_n; it++) {
        memset(dst.buf, 0, dst.table.total * sizeof(float));
        char step[LOOM_CKPT_PATH_MAX];
        snprintf(step, sizeof step, "%s/step_%d", dir, it);
        double ms;
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[0], &ltx[0]);
        if (ckpt_round(&c, &cfg, &src, &dst, step, &ms)) return 1;
        loom_comm_barrier(&c, &err);
        link_bytes(dev, &lrx[1], &ltx[1]);
        link[0][LINK_CKPT] += (lrx[1] - lrx[0]) / ck_n,
            link[1][LINK_CKPT] += (ltx[1] - ltx[0]) / ck_n;
        const double s = slowest(&c, ms);
        ck = s < ck ? s : ck;
        bad |= memcmp(dst.buf, want.buf, want.table.total * sizeof(float)) != 0;
    }
    if (ck == 1e30) ck = 0; /* --ckpt-iters 0 */
    double nbad = bad;
    loom_comm_allreduce_sum_f64(&c, &nbad, 1, &err);
    const double bw = (double)p2p * 4.0 / (p2p_best * 1e-3);
    const double pair_bw = pair_best > 0 ? (double)p2p * 4.0 / (pair_best * 1e-3) : 0;
    const double mem_bw = (double)src.table.total * 4.0 / (cp_best * 1e-3);
    /* per rank: bytes received, copied in memory (kept, packed, unpacked), its prediction */
    const double recv = (double)r.recv_floats * 4.0;
    const double copied = (double)(r.local_floats + r.packed_floats + r.unpacked_floats) * 4.0;
    double v[7 * 64] = {0};
    double *mine = v + 7 * c.rank;
    mine[0] = recv, mine[1] = copied, mine[2] = (recv / bw + copied / mem_bw) * 1e3;
    /* the same at the median bandwidths (folded into the slot of its own below) */
    double vm[64] = {0};
    vm[c.rank] =
        (recv * med[1] / ((double)p2p * 4.0) + copied * med[3] / ((double)src.table.total * 4.0));
    loom_comm_allreduce_sum_f64(&c, vm, c.size, &err);
    double pred_med = 0;
    for (int p = 0; p < c.size; p++) pred_med = vm[p] > pred_med ? vm[p] : pred_med;
    mine[3] = (double)r.direct_floats * 4.0, mine[4] = (double)r.local_floats * 4.0;
    mine[5] = (double)r.unpacked_floats * 4.0, mine[6] = (double)r.packed_floats * 4.0;
    loom_comm_allreduce_sum_f64(&c, v, 7 * c.size, &err);
    int crit = 0; /* the rank the model predicts slowest */
    double recv_max = 0;
    for (int p = 0; p < c.size; p++) {
        crit = v[7 * p + 2] > v[7 * crit + 2] ? p : crit;
        recv_max = v[7 * p] > recv_max ? v[7 * p] : recv_max;
    }
    const double *cr = v + 7 * crit, pred = cr[2];
    const double ag_bytes = (double)(c.size - 1) * (double)per * 4.0; /* per rank */
    int msgs = r.n_sends + r.n_recvs;
    double nm = msgs;
    loom_comm_allreduce_sum_f64(&c, &nm, 1, &err);
    double lk[2 * LINK_OPS * 64] = {0}; /* [rx|tx][op][rank], the timed iterations' mean */
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < LINK_OPS; k++)
            lk[(d * LINK_OPS + k) * 64 + c.rank] = k == LINK_CKPT ? link[d][k] : link[d][k] / iters;
    loom_comm_allreduce_sum_f64(&c, lk, 2 * LINK_OPS * 64, &err);
    if (c.rank == 0)
        printf("{\"ranks\": %d, \"pp_train\": %d, \"tp_train\": %d, \"tp_gen\": %d, "
               "\"model_bytes\": %.0f, \"reshard_bytes_moved\": %.0f, "
               "\"reshard_max_recv_bytes\": %.0f, \"allgather_recv_bytes\": %.0f, "
               "\"ideal_allgather_over_reshard_bytes\": %.3f, \"messages\": %.0f, "
               "\"min_message_floats\": %ld, \"reshard_ms\": %.3f, \"allgather_ms\": %.3f, "
               "\"ckpt_ms\": %.3f, \"p2p_bytes_per_s\": %.4g, \"pair_bytes_per_s\": %.4g, "
               "\"memcpy_bytes_per_s\": %.4g, "
               "\"critical_rank\": %d, \"critical_recv_bytes\": %.0f, "
               "\"critical_direct_bytes\": %.0f, \"critical_copied_bytes\": %.0f, "
               "\"critical_local_bytes\": %.0f, \"critical_unpacked_bytes\": %.0f, "
               "\"critical_packed_bytes\": %.0f, \"predicted_ms\": %.3f, "
               "\"reshard_over_predicted\": %.3f, \"allgather_over_reshard\": %.3f, "
               "\"allgather_over_predicted\": %.3f, \"ckpt_over_reshard\": %.3f, "
               "\"phases_ms\": {\"pack\": %.3f, \"local\": %.3f, \"wait\": %.3f, "
               "\"unpack\": %.3f}, \"median\": {\"reshard_ms\": %.3f, \"allgather_ms\": %.3f, "
               "\"predicted_ms\": %.3f, \"reshard_over_predicted\": %.3f, "
               "\"allgather_over_reshard\": %.3f, \"allgather_over_predicted\": %.3f}, "
               "\"iters\": %d, \"bitwise\": %s",
               c.size, ppa, tpa, tpb, (double)whole.table.total * 4.0, r.bytes_moved, recv_max,
               ag_bytes, ag_bytes / (recv_max > 0 ? recv_max : 1), nm, min_msg, best[0], best[2],
               ck, bw, pair_bw, mem_bw, crit, cr[0], cr[3], cr[1], cr[4], cr[5], cr[6], pred,
               best[0] / pred, best[2] / best[0], best[2] / pred, ck / best[0], phase[0], phase[1],
               phase[2], phase[3], med[0], med[2], pred_med, med[0] / pred_med, med[2] / med[0],
               med[2] / pred_med, iters, nbad ? "false" : "true");
    if (c.rank == 0 && dev) {
        printf(", \"link\": {\"dev\": \"%s\"", dev);
        for (int d = 0; d < 2; d++) {
            printf(", \"%s_bytes\": {", d ? "tx" : "rx");
            for (int k = 0; k < LINK_OPS; k++) {
                printf("%s\"%s\": [", k ? ", " : "", link_op[k]);
                for (int p = 0; p < c.size; p++)
                    printf("%s%.0f", p ? ", " : "", lk[(d * LINK_OPS + k) * 64 + p]);
                printf("]");
            }
            printf("}");
        }
        printf("}");
    }
    if (c.rank == 0) printf("}\n");
    loom_reshard_free(&r);
    view_free(&whole), view_free(&src), view_free(&dst), view_free(&want);
    free(all), free(p2p_send), free(p2p_recv), free(scratch);
    loom_comm_free(&c);
    loom_world_finalize(&wo);
    return nbad ? 1 : 0;
}
