/* In-memory resharding (parallel/reshard.h) between layouts of one model on 1, 2 or 4
 * ranks: tensor-parallel shards with data-parallel replicas (tp 2 x dp 2, GPT-2's fused
 * qkv and a llama's), whole replicas (dp 4), tp 4, pipeline stages (pp 2 x dp, GPT-2's
 * tied embedding a replica on the last stage; each stage's tensors described in the whole
 * model's order, train/ckpt_tensors.h) into whole replicas and into tp 2 shards, and back;
 * the layout pairs take four thresholds for a run's own message in turn (every run its own
 * message, short runs staged, the default, everything packed: the same bits, and every
 * destination float received in place, unpacked or copied locally exactly once). loom rl's
 * tensor-parallel generation layout: the batched KV-cache decoder on the resharded tp 2 shards (2
 * ranks) gives the whole model's logits (<= 1e-5 of their scale) at every step. Expert parallelism:
 * a MoE llama's ep 2 ranks (each its own experts) -> whole replicas -> ep 2. Every destination
 * element must be the source's bit for bit, and the round trip train -> gen -> train gives the
 * training buffer back bitwise. A random seed each run (printed). Run under mpirun -n N. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/world.h"
#include "model/config.h"
#include "model/generate_batch.h"
#include "model/params.h"
#include "parallel/reshard.h"
#include "train/ckpt_tensors.h"

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* One layout's view on this rank: tp group size tp, this rank's tp and dp indices. */
typedef struct {
    loom_param_table table;
    loom_ckpt_descs descs;
    float *buf;
    loom_reshard_side side;
} view;

static int make(view *v, const loom_model_config *cfg, int world, int rank, int tp, uint64_t seed,
                int init) {
    loom_error err = {0};
    memset(v, 0, sizeof *v);
    const int tp_rank = rank % tp, dp_rank = rank / tp, dp = world / tp;
    loom_params_options o = {.tp_rank = tp_rank, .tp_size = tp};
    if (loom_params_build(&v->table, cfg, &o, &err) ||
        loom_ckpt_tensors_describe(&v->descs, &v->table, &err)) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    v->buf = calloc(v->table.total, sizeof(float));
    if (init) loom_params_init(&v->table, v->buf, seed);
    v->side = (loom_reshard_side){&v->descs, v->table.total, dp_rank, dp};
    return 0;
}

static void drop(view *v) {
    loom_params_free(&v->table);
    loom_ckpt_descs_free(&v->descs);
    free(v->buf);
}

/* The batched decoder on tp shards (the group: c) against the whole model: 3 sequences,
 * 6 positions, the logits of every step. */
static void check_generate(loom_comm *c, const loom_model_config *cfg, view *whole, view *shard,
                           uint64_t seed, const char *what) {
    enum { M = 3, STEPS = 6 };
    loom_batch_generator gw, gs;
    loom_error err = {0};
    if (loom_batch_generator_create(&gw, cfg, &whole->table, whole->buf, M, &err) ||
        loom_batch_generator_create(&gs, cfg, &shard->table, shard->buf, M, &err) ||
        loom_batch_generator_shard(&gs, c, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    double worst = 0.0;
    for (int p = 0; p < STEPS; p++) {
        int seq[M], pos[M];
        int32_t tok[M];
        for (int r = 0; r < M; r++)
            seq[r] = r, pos[r] = p, tok[r] = (int32_t)((seed >> (r + p)) % 200 + 17 * r + p) % 256;
        loom_batch_generator_step(&gw, M, seq, tok, pos, &err);
        if (loom_batch_generator_step(&gs, M, seq, tok, pos, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            break;
        }
        double scale = 1e-30, diff = 0.0;
        for (size_t i = 0; i < (size_t)M * cfg->vocab_size; i++) {
            scale = fmax(scale, fabs(gw.logits[i]));
            diff = fmax(diff, fabs((double)gw.logits[i] - gs.logits[i]));
        }
        worst = fmax(worst, diff / scale);
    }
    CHECK(worst <= 1e-5, "%s: rank %d: tp %d decoder's logits %.2e from the whole model's", what,
          c->rank, c->size, worst);
    if (c->rank == 0)
        printf("%s: the batched decoder on tp %d shards: logits within %.2e of the whole model's\n",
               what, c->size, worst);
    loom_batch_generator_free(&gw);
    loom_batch_generator_free(&gs);
}

/* src layout (tp a) -> dst layout (tp b) -> a again: both bitwise. */
static void round_trip_with(loom_comm *c, const loom_model_config *cfg, int a, int b, uint64_t seed,
                            const char *what, size_t min_msg) {
    view src, dst, want, back;
    if (make(&src, cfg, c->size, c->rank, a, seed, 1) ||
        make(&dst, cfg, c->size, c->rank, b, seed, 0) ||
        make(&want, cfg, c->size, c->rank, b, seed, 1) ||
        make(&back, cfg, c->size, c->rank, a, seed, 0)) {
        failures++;
        return;
    }
    loom_error err = {0};
    loom_reshard there, home;
    if (loom_reshard_plan_with(&there, c, &src.side, &dst.side, min_msg, &err) ||
        loom_reshard_run(&there, src.buf, dst.buf, &err) ||
        loom_reshard_plan_with(&home, c, &dst.side, &back.side, min_msg, &err) ||
        loom_reshard_run(&home, dst.buf, back.buf, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    CHECK(memcmp(dst.buf, want.buf, want.table.total * sizeof(float)) == 0,
          "%s: rank %d: tp %d -> tp %d (min message %zu) differs from the layout's own "
          "initialisation",
          what, c->rank, a, b, min_msg);
    CHECK(memcmp(back.buf, src.buf, src.table.total * sizeof(float)) == 0,
          "%s: rank %d: the round trip tp %d -> %d -> %d (min message %zu) is not bitwise", what,
          c->rank, a, b, a, min_msg);
    /* every float the rank lacks arrived, each once: received straight into the
     * destination, or unpacked; the rest copied locally */
    CHECK(there.direct_floats + there.unpacked_floats + there.local_floats == dst.table.total,
          "%s: rank %d: tp %d -> tp %d (min message %zu): %zu direct + %zu unpacked + %zu local "
          "floats, the destination holds %zu",
          what, c->rank, a, b, min_msg, there.direct_floats, there.unpacked_floats,
          there.local_floats, dst.table.total);
    CHECK(min_msg != SIZE_MAX || there.direct_floats == 0,
          "%s: rank %d: everything packed, yet %zu floats received in place", what, c->rank,
          there.direct_floats);
    /* on 2 ranks only: 4 oversubscribed ranks make its many small all-reduces slow */
    if (a == 1 && b == 2 && c->size == 2) check_generate(c, cfg, &src, &dst, seed, what);
    if (c->rank == 0)
        printf("%s: tp %d -> tp %d -> tp %d on %d ranks (min message %zu): %.0f bytes moved "
               "between ranks, %d + %d messages\n",
               what, a, b, a, c->size, min_msg, there.bytes_moved, there.n_sends, there.n_recvs);
    loom_reshard_free(&there);
    loom_reshard_free(&home);
    drop(&src), drop(&dst), drop(&want), drop(&back);
}

/* The thresholds for a run's own message (parallel/reshard.h): every run on its
 * own (straight between the buffers where the rows lie in order, else a staged span),
 * runs of at least 48 floats on their own and spans of shorter ones staged (this model's
 * split rows are 32 floats), the default (here: almost everything packed), and everything
 * packed. */
static const size_t min_messages[] = {1, 48, LOOM_RESHARD_MIN_MESSAGE, SIZE_MAX};
enum { N_MIN = sizeof min_messages / sizeof min_messages[0] };

/* The threshold of the next layout pair: each in turn, from one chosen by the seed (a run
 * covers all four over its pairs; trying every threshold on every pair took 4x as long). */
static int next_min;
static size_t min_message(void) {
    return min_messages[next_min++ % N_MIN];
}

/* src layout (tp a) -> dst layout (tp b) -> a again: both bitwise. */
static void round_trip(loom_comm *c, const loom_model_config *cfg, int a, int b, uint64_t seed,
                       const char *what) {
    round_trip_with(c, cfg, a, b, seed, what, min_message());
}

/* Pipeline stages (pp 2 x dp world/2, one layer each) -> tp b shards with dp replicas
 * (b 1: whole replicas, dp world) -> stages again: both bitwise. */
static void round_trip_pp(loom_comm *c, const loom_model_config *cfg, int b, uint64_t seed,
                          const char *what, size_t min_msg) {
    const int dp = c->size / 2, stage = c->rank / dp;
    loom_layer_set ls = {.n_chunks = 1, .first = stage == 0, .last = stage == 1};
    ls.lo[0] = stage, ls.hi[0] = stage + 1;
    view whole, gen, want;
    loom_param_table st[2];
    loom_ckpt_descs sd[2];
    float *buf[2];
    loom_error err = {0};
    if (make(&whole, cfg, c->size, c->rank, 1, seed, 0) ||
        make(&gen, cfg, c->size, c->rank, b, seed, 0) ||
        make(&want, cfg, c->size, c->rank, b, seed, 1)) {
        failures++;
        return;
    }
    for (int k = 0; k < 2; k++) {
        if (loom_params_build(&st[k], cfg, &(loom_params_options){.layers = &ls}, &err) ||
            loom_ckpt_tensors_describe_as(&sd[k], &st[k], &whole.descs, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            return;
        }
        buf[k] = calloc(st[k].total, sizeof(float));
    }
    loom_params_init(&st[0], buf[0], seed);
    loom_reshard_side src = {&sd[0], st[0].total, c->rank % dp, dp};
    loom_reshard_side back = {&sd[1], st[1].total, c->rank % dp, dp};
    loom_reshard there, home;
    if (loom_reshard_plan_with(&there, c, &src, &gen.side, min_msg, &err) ||
        loom_reshard_run(&there, buf[0], gen.buf, &err) ||
        loom_reshard_plan_with(&home, c, &gen.side, &back, min_msg, &err) ||
        loom_reshard_run(&home, gen.buf, buf[1], &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    CHECK(memcmp(gen.buf, want.buf, want.table.total * sizeof(float)) == 0,
          "%s: rank %d: pp 2 -> tp %d x dp %d (min message %zu) differs from the layout's own "
          "initialisation",
          what, c->rank, b, c->size / b, min_msg);
    CHECK(memcmp(buf[1], buf[0], st[0].total * sizeof(float)) == 0,
          "%s: rank %d: the round trip pp 2 -> tp %d x dp %d -> pp 2 (min message %zu) is not "
          "bitwise",
          what, c->rank, b, c->size / b, min_msg);
    CHECK(there.direct_floats + there.unpacked_floats + there.local_floats == gen.table.total,
          "%s: rank %d: pp 2 -> tp %d (min message %zu): %zu direct + %zu unpacked + %zu local "
          "floats, the destination holds %zu",
          what, c->rank, b, min_msg, there.direct_floats, there.unpacked_floats, there.local_floats,
          gen.table.total);
    if (c->rank == 0)
        printf("%s: pp 2 x dp %d -> tp %d x dp %d -> pp 2 x dp %d (min message %zu): %.0f bytes "
               "moved between ranks; rank 0 received %zu floats in place, unpacked %zu, packed "
               "%zu, kept %zu\n",
               what, dp, b, c->size / b, dp, min_msg, there.bytes_moved, there.direct_floats,
               there.unpacked_floats, there.packed_floats, there.local_floats);
    loom_reshard_free(&there);
    loom_reshard_free(&home);
    for (int k = 0; k < 2; k++)
        loom_params_free(&st[k]), loom_ckpt_descs_free(&sd[k]), free(buf[k]);
    drop(&whole), drop(&gen), drop(&want);
}

/* Expert parallelism (loom rl's --ep in training): ep 2 x dp world/2, each ep rank's
 * experts registered alone (its tensors described in the whole model's order; the ep
 * group one replica, its dense tensors written by ep rank 0) -> whole replicas (dp world)
 * -> ep ranks again: both bitwise. */
static void round_trip_ep(loom_comm *c, const loom_model_config *cfg, uint64_t seed,
                          const char *what) {
    const int ep = 2, groups = c->size / ep;
    view whole, want;
    loom_param_table et[2];
    loom_ckpt_descs ed[2];
    float *buf[2];
    loom_error err = {0};
    if (make(&whole, cfg, c->size, c->rank, 1, seed, 0) ||
        make(&want, cfg, c->size, c->rank, 1, seed, 1)) {
        failures++;
        return;
    }
    whole.side = (loom_reshard_side){&whole.descs, whole.table.total, c->rank, c->size};
    const loom_params_options o = {.ep_rank = c->rank % ep, .ep_size = ep};
    for (int k = 0; k < 2; k++) {
        if (loom_params_build(&et[k], cfg, &o, &err) ||
            loom_ckpt_tensors_describe_as(&ed[k], &et[k], &whole.descs, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            return;
        }
        buf[k] = calloc(et[k].total, sizeof(float));
    }
    loom_params_init(&et[0], buf[0], seed);
    loom_reshard_side src = {&ed[0], et[0].total, c->rank / ep, groups};
    loom_reshard_side back = {&ed[1], et[1].total, c->rank / ep, groups};
    loom_reshard there, home;
    if (loom_reshard_plan(&there, c, &src, &whole.side, &err) ||
        loom_reshard_run(&there, buf[0], whole.buf, &err) ||
        loom_reshard_plan(&home, c, &whole.side, &back, &err) ||
        loom_reshard_run(&home, whole.buf, buf[1], &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    CHECK(memcmp(whole.buf, want.buf, want.table.total * sizeof(float)) == 0,
          "%s: rank %d: ep 2 -> dp %d differs from the whole model's initialisation", what, c->rank,
          c->size);
    CHECK(memcmp(buf[1], buf[0], et[0].total * sizeof(float)) == 0,
          "%s: rank %d: the round trip ep 2 -> dp %d -> ep 2 is not bitwise", what, c->rank,
          c->size);
    if (c->rank == 0)
        printf("%s: dp %d ep 2 -> dp %d -> dp %d ep 2: %.0f bytes moved between ranks\n", what,
               c->size, c->size, c->size, there.bytes_moved);
    loom_reshard_free(&there);
    loom_reshard_free(&home);
    for (int k = 0; k < 2; k++)
        loom_params_free(&et[k]), loom_ckpt_descs_free(&ed[k]), free(buf[k]);
    drop(&whole), drop(&want);
}

int main(int argc, char **argv) {
    loom_world w;
    loom_comm world;
    loom_error err = {0};
    if (loom_world_init(&w, &argc, &argv, &err)) { /* MPI only when launched by mpirun */
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    if (w.mpi) {
        if (loom_comm_from_mpi(&world, MPI_COMM_WORLD, "world", &err)) {
            fprintf(stderr, "FAIL: %s\n", err.msg);
            return 1;
        }
    } else {
        loom_comm_self(&world, "world");
    }
    double seed = (double)(time(NULL) & 0xffffff);
    if (loom_comm_bcast(&world, &seed, sizeof seed, 0, &err)) failures++;
    if (world.rank == 0) printf("seed %.0f\n", seed);
    next_min = (int)((uint64_t)seed % N_MIN);
    for (int fam = 0; fam < 2; fam++) {
        loom_model_config cfg;
        loom_model_preset(&cfg, fam ? "llama-tiny" : "gpt2-tiny", &err);
        cfg.n_layer = 2, cfg.d_model = 64, cfg.n_head = 4, cfg.n_kv_head = 4;
        cfg.d_ff = 128, cfg.vocab_size = 256, cfg.seq_len = 32;
        const char *what = fam ? "llama" : "gpt2";
        for (int a = 1; a <= world.size; a *= 2)
            for (int b = 1; b <= world.size; b *= 2)
                if (cfg.n_head % a == 0 && cfg.n_head % b == 0)
                    round_trip(&world, &cfg, a, b, (uint64_t)seed + (uint64_t)(a * 8 + b), what);
        /* GPT-2 (its tied embedding a replica on the last stage); loom rl's layout test
         * reshards a llama's stages every iteration */
        if (world.size >= 2 && !fam)
            for (int b = 1; b <= 2; b++) {
                round_trip_pp(&world, &cfg, b, (uint64_t)seed + 99, what, min_message());
                /* the tp shard's half rows of whole source rows: packed by the sender,
                 * received in place (a destination span) */
                if (b == 2) round_trip_pp(&world, &cfg, b, (uint64_t)seed + 98, what, 48);
            }
        /* a MoE llama (4 experts and a shared one, replicated like the dense tensors) */
        if (world.size >= 2 && fam) {
            loom_model_config moe = cfg;
            moe.n_experts = 4, moe.top_k = 2, moe.shared_expert = 1;
            round_trip_ep(&world, &moe, (uint64_t)seed + 77, "llama MoE");
        }
    }
    double total = failures;
    if (loom_comm_allreduce_sum_f64(&world, &total, 1, &err)) total += 1;
    if (world.rank == 0) printf("%s: %.0f failure(s)\n", total ? "FAIL" : "ok", total);
    loom_comm_free(&world);
    loom_world_finalize(&w);
    return total ? 1 : 0;
}
