/* reshard_cmp: the same weights moved from a training layout (tensor parallel --tp-train
 * over all ranks) into a generation layout (--tp-gen, data-parallel replicas over the
 * rest) three ways, each timed (the best of --iters, slowest rank), and checked bit for
 * bit against the generation layout's own initialisation:
 *   reshard_ms    loom_reshard_run (parallel/reshard.h: one all-to-all of the pieces
 *                 each rank lacks, plus the packing and unpacking where a side is not
 *                 moved in place: send_in_place / recv_in_place say which, for rank 0);
 *   alltoall_ms   the bare all-to-all of the same counts (the transfer without packing);
 *   allgather_ms  gathering everything on every rank: an all-gather of every rank's
 *                 training buffer (only the transfer: assembling the generation layout
 *                 from it would come on top, so this favours the all-gather);
 *   ckpt_ms       saving a checkpoint of the training layout (ckpt/ckpt_writer.h, fsync,
 *                 the commit) into --dir and loading it into the generation layout
 *                 (ckpt/ckpt_loader.h), what a system without in-memory resharding does;
 *   bandwidth     bytes each rank receives in the all-gather / its time; predicted_ms =
 *                 the largest bytes a rank receives in the reshard / that bandwidth;
 *   predicted_with_copies_ms  adds the rank's copies in memory (what it keeps, packs and
 *                 unpacks: copied_bytes) at the memcpy bandwidth (a copy of the training
 *                 buffer, timed the same way); rank0_*_ms: where rank 0's best reshard
 *                 spent its time; ideal_allgather_over_reshard: the all-gather's bytes
 *                 received a rank over the reshard's (the all-gather's time over the
 *                 reshard's cannot exceed it at equal bandwidth, even with no copies).
 *
 *   mpirun -n N reshard_cmp --dir DIR [--tp-train N] [--tp-gen 1] [--n-layer 8]
 *                           [--d-model 512] [--vocab 4096] [--iters 5]
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

static int make(view *v, const loom_model_config *cfg, int world, int rank, int tp, int init) {
    loom_error err = {0};
    memset(v, 0, sizeof *v);
    loom_params_options o = {.tp_rank = rank % tp, .tp_size = tp};
    if (loom_params_build(&v->table, cfg, &o, &err) ||
        loom_ckpt_tensors_describe(&v->descs, &v->table, &err)) {
        fprintf(stderr, "reshard_cmp: %s\n", err.msg);
        return 1;
    }
    v->buf = calloc(v->table.total, sizeof(float));
    if (!v->buf) return 1;
    if (init) loom_params_init(&v->table, v->buf, 1234);
    v->side = (loom_reshard_side){&v->descs, v->table.total, rank / tp, world / tp};
    return 0;
}

/* The slowest rank's time of the best iteration. */
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
    const int tpa = arg_int(argc, argv, "--tp-train", c.size);
    const int tpb = arg_int(argc, argv, "--tp-gen", 1);
    const int iters = arg_int(argc, argv, "--iters", 5);
    loom_model_config cfg;
    loom_model_preset(&cfg, "llama-tiny", &err);
    cfg.n_layer = arg_int(argc, argv, "--n-layer", 8);
    cfg.d_model = arg_int(argc, argv, "--d-model", 512);
    cfg.n_head = 8, cfg.n_kv_head = 8, cfg.d_ff = 4 * cfg.d_model;
    cfg.vocab_size = arg_int(argc, argv, "--vocab", 4096), cfg.seq_len = 64;
    if (!dir || c.size > 64 || tpa < 1 || tpb < 1 || c.size % tpa || c.size % tpb ||
        cfg.n_head % tpa || cfg.n_head % tpb || iters < 1) {
        if (c.rank == 0)
            fprintf(stderr, "reshard_cmp: --dir DIR needed; --tp-train and --tp-gen must divide "
                            "the world and 8 heads; --iters >= 1\n");
        return 2;
    }
    view src, dst, want;
    if (make(&src, &cfg, c.size, c.rank, tpa, 1) || make(&dst, &cfg, c.size, c.rank, tpb, 0) ||
        make(&want, &cfg, c.size, c.rank, tpb, 1))
        return 1;
    loom_reshard r;
    if (loom_reshard_plan(&r, &c, &src.side, &dst.side, &err)) return fail(&c, "plan", &err);
    /* the all-gather: every rank's whole training buffer to every rank */
    int counts[64], displs[64];
    for (int p = 0, off = 0; p < c.size; p++)
        counts[p] = (int)src.table.total, displs[p] = off, off += counts[p];
    float *all = malloc((size_t)c.size * src.table.total * sizeof(float));
    float *raw_send = calloc(r.send_floats + 1, sizeof(float));
    float *raw_recv = calloc(r.recv_floats + 1, sizeof(float));
    if (!all || !raw_send || !raw_recv) return 1;
    /* this rank's copies in memory: what it keeps, packs and unpacks */
    double copied = (double)((r.src_displs ? 0 : r.send_floats) +
                             (r.dst_displs ? 0 : r.recv_floats) + r.local_floats) *
                    4.0;
    float *scratch = malloc(src.table.total * sizeof(float));
    if (!scratch) return 1;
    double best[3] = {1e30, 1e30, 1e30}, ck = 1e30, cp_best = 1e30, prof[3] = {0};
    for (int it = 0; it < iters + 1; it++) { /* the first is a warm-up */
        double t[3];
        loom_comm_barrier(&c, &err);
        double t0 = loom_now_ms();
        if (loom_reshard_run(&r, src.buf, dst.buf, &err)) return fail(&c, "reshard", &err);
        t[0] = loom_now_ms() - t0;
        if (c.rank == 0 && getenv("RESHARD_CMP_VERBOSE"))
            fprintf(stderr, "rank 0: pack %.1f ms, all-to-all %.1f ms, unpack %.1f ms\n", r.pack_ms,
                    r.move_ms, r.unpack_ms);
        loom_comm_barrier(&c, &err);
        t0 = loom_now_ms();
        if (loom_comm_alltoallv(&c, raw_send, r.send_counts, r.send_displs, raw_recv, r.recv_counts,
                                r.recv_displs, &err))
            return fail(&c, "alltoallv", &err);
        t[1] = loom_now_ms() - t0;
        memcpy(all + (size_t)c.rank * src.table.total, src.buf, src.table.total * sizeof(float));
        loom_comm_barrier(&c, &err);
        t0 = loom_now_ms();
        if (loom_comm_allgatherv(&c, all, counts, displs, &err)) return fail(&c, "allgather", &err);
        t[2] = loom_now_ms() - t0;
        loom_comm_barrier(&c, &err);
        t0 = loom_now_ms();
        memcpy(scratch, src.buf, src.table.total * sizeof(float));
        const double cp = slowest(&c, loom_now_ms() - t0);
        cp_best = cp < cp_best ? cp : cp_best;
        for (int k = 0; k < 3; k++) {
            const double s = slowest(&c, t[k]);
            if (k == 0 && s < best[0])
                prof[0] = r.pack_ms, prof[1] = r.move_ms, prof[2] = r.unpack_ms;
            best[k] = s < best[k] ? s : best[k];
        }
    }
    int bad = memcmp(dst.buf, want.buf, want.table.total * sizeof(float)) != 0;
    for (int it = 0; it < (iters < 2 ? iters : 2); it++) { /* a checkpoint is slow: at most 2 */
        memset(dst.buf, 0, dst.table.total * sizeof(float));
        char step[LOOM_CKPT_PATH_MAX];
        snprintf(step, sizeof step, "%s/step_%d", dir, it);
        double ms;
        if (ckpt_round(&c, &cfg, &src, &dst, step, &ms)) return 1;
        const double s = slowest(&c, ms);
        ck = s < ck ? s : ck;
        bad |= memcmp(dst.buf, want.buf, want.table.total * sizeof(float)) != 0;
    }
    double nbad = bad, recv_max = (double)r.recv_floats * 4.0;
    loom_comm_allreduce_sum_f64(&c, &nbad, 1, &err);
    double rv[64] = {0};
    rv[c.rank] = (double)r.recv_floats * 4.0;
    loom_comm_allreduce_sum_f64(&c, rv, c.size, &err);
    for (int p = 0; p < c.size; p++) recv_max = rv[p] > recv_max ? rv[p] : recv_max;
    const double ag_bytes = (double)(c.size - 1) * (double)src.table.total * 4.0; /* per rank */
    const double bw = ag_bytes / (best[2] * 1e-3);
    const double mem_bw = (double)src.table.total * 4.0 / (cp_best * 1e-3);
    double cmax[64] = {0};
    cmax[c.rank] = copied;
    loom_comm_allreduce_sum_f64(&c, cmax, c.size, &err);
    for (int p = 0; p < c.size; p++) copied = cmax[p] > copied ? cmax[p] : copied;
    if (c.rank == 0)
        printf("{\"ranks\": %d, \"tp_train\": %d, \"tp_gen\": %d, \"model_bytes\": %.0f, "
               "\"reshard_bytes_moved\": %.0f, \"reshard_max_recv_bytes\": %.0f, "
               "\"allgather_recv_bytes\": %.0f, \"reshard_ms\": %.3f, \"alltoall_ms\": %.3f, "
               "\"allgather_ms\": %.3f, \"ckpt_ms\": %.3f, \"bandwidth_bytes_per_s\": %.4g, "
               "\"predicted_ms\": %.3f, \"reshard_over_predicted\": %.3f, "
               "\"allgather_over_reshard\": %.3f, \"ckpt_over_reshard\": %.3f, "
               "\"memcpy_bytes_per_s\": %.4g, \"copied_bytes\": %.0f, "
               "\"predicted_with_copies_ms\": %.3f, \"rank0_pack_ms\": %.3f, "
               "\"rank0_alltoall_ms\": %.3f, \"rank0_unpack_ms\": %.3f, "
               "\"ideal_allgather_over_reshard\": %.3f, \"send_in_place\": %s, "
               "\"recv_in_place\": %s, \"bitwise\": %s}\n",
               c.size, tpa, tpb, (double)want.table.total * 4.0 * tpb, r.bytes_moved, recv_max,
               ag_bytes, best[0], best[1], best[2], ck, bw, recv_max / bw * 1e3,
               best[0] / (recv_max / bw * 1e3), best[2] / best[0], ck / best[0], mem_bw, copied,
               (recv_max / bw + copied / mem_bw) * 1e3, prof[0], prof[1], prof[2],
               ag_bytes / recv_max, r.src_displs ? "true" : "false",
               r.dst_displs ? "true" : "false", nbad ? "false" : "true");
    loom_reshard_free(&r);
    free(all), free(raw_send), free(raw_recv), free(scratch);
    loom_comm_free(&c);
    loom_world_finalize(&wo);
    return nbad ? 1 : 0;
}
