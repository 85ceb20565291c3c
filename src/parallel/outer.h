/* DiLoCo's outer optimizer (Douillard et al. 2023) and streaming DiLoCo (Douillard et al.
 * 2025) above the data-parallel step: W worker groups train alone for H inner steps, then
 * the outer gradient (round-start parameters minus the parameters now) is averaged over
 * the workers and SGD with (Nesterov) momentum moves the round-start parameters; every
 * worker goes on from the result. Each rank syncs its own flat buffer with the ranks of
 * the same place in the other worker groups (mesh->outer): its tp shard, its pipeline
 * stage, its experts; dp replicas inside a group each sync 1/replicas of every fragment
 * and all-gather the update inside the group (ZeRO-0/1/2: every replica holds the whole
 * buffer), or with ZeRO-3 each syncs its own parameter shard (the replicas hold disjoint
 * ranges: nothing is gathered, and no rank ever holds the whole buffer); the outer
 * momentum is sharded over the workers (each owns 1/W of every fragment, like ZeRO-1).
 *
 * The wire: an all-to-all of the workers' outer gradients in --outer-dtype (each worker
 * receives the W contributions to the chunk it owns, summed in worker order, so every
 * layout and every run adds the same numbers in the same order), the owner's outer step,
 * then an all-gather of the chunk's parameter update in --outer-dtype, which every worker
 * (the owner too) adds to its round-start parameters. int8/int4 carry one fp32 scale per
 * --outer-block values (absmax); no error feedback, as in the streaming DiLoCo paper.
 *
 * Streaming (--outer-fragments F > 1): the blocks are cut into F fragments of consecutive
 * layers (the embedding with the first, the head with the last); fragment f is sent after
 * inner steps (f + 1) * H / F + k * H, its all-to-all overlaps the next inner step and its
 * all-gather the one after, and when it arrives the local parameters are mixed with the
 * new global ones: local = merge * local + (1 - merge) * global (the paper's alpha). */
#ifndef LOOM_PARALLEL_OUTER_H
#define LOOM_PARALLEL_OUTER_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/mesh.h"

typedef enum { LOOM_OUTER_NONE, LOOM_OUTER_DILOCO } loom_outer_kind;
typedef enum {
    LOOM_OUTER_FP32,
    LOOM_OUTER_BF16,
    LOOM_OUTER_INT8,
    LOOM_OUTER_INT4
} loom_outer_dtype;

#define LOOM_OUTER_MAX_FRAGMENTS 64

/* The flags (--outer ...), as parsed. */
typedef struct {
    char kind[16];   /* --outer: "" or none | diloco */
    int workers;     /* --workers W: worker groups (the world's outermost dimension) */
    int inner_steps; /* --inner-steps H */
    float lr;        /* --outer-lr */
    float momentum;  /* --outer-momentum */
    int nesterov;    /* --outer-nesterov */
    int fragments;   /* --outer-fragments F (1: plain DiLoCo, blocking) */
    char dtype[8];   /* --outer-dtype fp32 | bf16 | int8 | int4 */
    int block;       /* --outer-block: values per scale (int8, int4) */
    float merge;     /* --outer-merge: streaming, the local weight alpha when a fragment lands */
    int warmup;      /* --outer-warmup R: a fragment's first R syncs only average */
    int start_step;  /* --outer-start-step S: steps 1..S synchronous dp over all workers */
    float inner_lr_scale; /* --inner-lr-scale: the lr schedule's factor after S (DiLoCo's rounds) */
    int total_batch;      /* set when split per worker: --global-batch over all workers (0: not) */
    int elastic_worker;   /* --elastic-worker I: this job is worker I (-1: off) */
    int elastic_join;     /* --elastic-join: join a running group (a restarted worker) */
    float elastic_timeout; /* --elastic-timeout S: the deadline of every outer exchange */
} loom_outer_config;

void loom_outer_config_defaults(loom_outer_config *c);
/* 1 when --outer diloco is on. */
int loom_outer_enabled(const loom_outer_config *c);
/* The flags alone (messages name them); n_layer <= 0 skips the check against the model. */
loom_status loom_outer_config_validate(const loom_outer_config *c, int n_layer, loom_error *err);
loom_status loom_outer_dtype_parse(const char *s, loom_outer_dtype *out, loom_error *err);

/* Where the step's outer sync went (the metrics line's "outer" object). */
typedef struct {
    double bytes_step;  /* bytes this rank sent to other workers during this step */
    double bytes_total; /* since the start, this rank */
    double exposed_ms;  /* this step: time waiting on the outer sync (not hidden) */
    double hidden_ms;   /* this step: time outer operations were in flight behind compute */
    double grad_norm;   /* the last outer gradient's norm (all fragments landed so far) */
    int syncs;          /* fragments landed during this step */
} loom_outer_step_stats;

typedef struct loom_outer_fragment loom_outer_fragment;

typedef struct {
    loom_outer_config cfg;
    loom_outer_dtype dtype;
    loom_comm *comm;                  /* the workers (mesh->outer) */
    loom_comm *group;                 /* this worker group (mesh->world) */
    int replicas;                     /* dp x cp: copies of this rank's buffer inside the group */
    struct loom_outer_engine *engine; /* drives the operations (comm/engine.h) */
    loom_comm *dp;                    /* those replicas (mesh->dp) */
    int shards, shard; /* elastic workers: replicas > 1 without --ep, each dp replica holds
                          the whole buffer (its lead gathers one copy) */
    int kinds;         /* 2 with --ep below ZeRO-3: each fragment's dense and expert tensors
                          are two (their replicas differ: dp, edp); else 1 */
    loom_comm *edp;    /* the experts' replicas (mesh->edp) */
    int owned;         /* ZeRO-3: params is this rank's parameter shard (loom_outer_buffer) */
    float *params;     /* [lo, lo + total) of this rank's flat buffer (trained in place) */
    size_t lo, total;
    const loom_flat_range *own; /* ZeRO-3 with --ep: params is valid on these only (or NULL) */
    int n_own;
    float *start;   /* the round-start (global) parameters: like params, or own's packed */
    size_t n_start; /* its floats: total, or own's */
    int moved;      /* the last loom_outer_after_step changed params (a fragment landed) */
    int n_frag;     /* --outer-fragments x kinds */
    loom_outer_fragment *frag;
    int steps; /* the run's last step: every fragment is synced there */
    double norm_sq[2 * LOOM_OUTER_MAX_FRAGMENTS]; /* each fragment's last outer gradient */
    loom_outer_step_stats stats;
    double sync_bytes, sync_ms; /* --outer-start-step: this step's gradient all-reduce */
    loom_flat_piece *grads;     /* ... where the reduced gradients are (set_grads) */
    int n_grads;
    float *grads_pack; /* ... several pieces packed for one all-reduce */
    size_t grads_n;
    struct loom_outer_elastic *elastic; /* --elastic-worker (parallel/outer_elastic.h) */
} loom_outer;

/* Where this rank's parameters are: params holds [lo, hi) of the flat buffer the registry
 * describes, the whole buffer (0, total), or with owned = 1 ZeRO-3's parameter shard
 * (parallel/fsdp.h), which no other replica of the group holds: the rank syncs that range
 * only, with the ranks of the same place in the other worker groups (whose shards are the
 * same ranges: the groups have one layout), and nothing is gathered inside the group.
 * With --ep, ZeRO-3's shard is full-layout and valid on its own ranges only (parallel/
 * ep_zero.h): own lists them (flat order, within [lo, hi)), and the rank syncs and keeps
 * round-start values for them alone; NULL: all of [lo, hi). */
typedef struct {
    float *params;
    size_t lo, hi;
    int owned;
    const loom_flat_range *own;
    int n_own;
} loom_outer_buffer;

/* After the parameters are set (initial or loaded): start = params. */
loom_status loom_outer_create(loom_outer *o, const loom_outer_config *cfg, loom_mesh *mesh,
                              const loom_param_table *table, int n_layer_global,
                              const loom_outer_buffer *buf, int steps, loom_error *err);
void loom_outer_free(loom_outer *o);
/* After inner step `step` (1-based): starts, advances and lands this step's fragments; at
 * the run's last step every fragment is synced (blocking); o->moved says whether the
 * parameters changed (ZeRO-3: the caller invalidates its gathered view). Collective over
 * the workers. */
loom_status loom_outer_after_step(loom_outer *o, int step, loom_error *err);
/* 1 when loom_outer_after_step(o, step) reads or writes the parameters (a fragment sent,
 * in flight or landing, an elastic sync, the warm start's end): with
 * --overlap-param-gather every gather into them must be complete first. */
int loom_outer_touches_params(const loom_outer *o, int step);
/* --outer-start-step S, a warm start: where the gradients this rank holds reduced in its
 * group are (parallel/grad_sync.h: loom_grad_sync_reduced_pieces; the ranks of the same
 * place in the other groups hold the same ranges). o takes the array (loom_outer_free
 * frees it); with several pieces a buffer for their sum is allocated here, once. */
loom_status loom_outer_set_grads(loom_outer *o, loom_flat_piece *pieces, int n, loom_error *err);
/* For steps 1..S (1-based `step`) those gradients are averaged over the workers (one
 * all-reduce over mesh->outer, before the norm and AdamW; several pieces packed into one),
 * so every worker takes the same synchronous data-parallel step; after step S the
 * round-start parameters are the parameters then and DiLoCo's rounds count from S.
 * Collective over the workers; nothing after step S. */
loom_status loom_outer_sync_grads(loom_outer *o, int step, loom_error *err);

/* v[0..n) summed over the workers and divided by W (the workers' mean of a per-worker
 * number: the loss). Collective over the workers. */
loom_status loom_outer_mean(loom_outer *o, double *v, int n, loom_error *err);

/* An elastic joiner resumed from a checkpoint of step `back` learns that the group is at
 * `step`: the caller loads its own checkpoint of `step` (parameters, AdamW moments) and the
 * outer state saved beside it (loom_outer_load) when its checkpoint folder holds a complete
 * one, and sets *loaded to 1; *loaded 0: none there, the state of `back` stays. Collective
 * over the worker's ranks. */
typedef loom_status (*loom_outer_reload_fn)(void *ctx, int step, int back, int *loaded,
                                            loom_error *err);

/* After the parameters and the outer state are loaded (a resume): an elastic worker
 * (parallel/outer_elastic.h) founds or joins its group here, and *step becomes the step the
 * run starts after (a joiner: the coordinator's; when that is not the step it resumed, it
 * calls reload(ctx, ...) first, unless reload is NULL: a run without --resume); otherwise
 * nothing. */
loom_status loom_outer_begin(loom_outer *o, int *step, loom_outer_reload_fn reload, void *ctx,
                             loom_error *err);

/* Checkpoints: this rank's outer state after step `step` to / from
 * DIR/outer/step_%08d/rank_%05d.bin (rank: the rank inside the worker group); an elastic
 * worker's lead writes its group's to DIR/outer/step_%08d/elastic.bin. */
loom_status loom_outer_save(loom_outer *o, const char *dir, int step, int rank, loom_error *err);
/* Waits until the operations in flight have arrived (their processing stays scheduled). */
loom_status loom_outer_wait_in_flight(loom_outer *o, loom_error *err);
loom_status loom_outer_load(loom_outer *o, const char *dir, int step, int rank, loom_error *err);
/* 1 when DIR holds the file loom_outer_load(o, dir, step, rank) reads (a complete save:
 * files are renamed into place whole), else 0. An elastic worker's lead: its group's file
 * (elastic.bin); its other ranks read nothing: 1. */
int loom_outer_saved(const loom_outer *o, const char *dir, int step, int rank);

/* ---- the wire format (parallel/outer_quant.c) ---- */
/* Bytes n values take in dtype with one scale per `block` values (int8, int4). */
size_t loom_outer_wire_bytes(loom_outer_dtype dtype, size_t n, int block);
void loom_outer_quantize(loom_outer_dtype dtype, const float *x, size_t n, int block, uint8_t *out);
void loom_outer_dequantize(loom_outer_dtype dtype, const uint8_t *in, size_t n, int block,
                           float *x);

#endif
