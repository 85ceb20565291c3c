/* The outer optimizer's insides, shared by parallel/outer.c and outer_state.c. */
#ifndef LOOM_PARALLEL_OUTER_IMPL_H
#define LOOM_PARALLEL_OUTER_IMPL_H

#include "comm/engine.h"
#include "parallel/outer.h"

typedef struct {
    size_t flat, numel; /* a tensor's part: [flat, flat + numel) of params (from o->lo) */
    size_t packed;      /* where its round-start values are in o->start */
    int counted;        /* counted in the outer gradient's norm */
} loom_outer_run;

typedef enum { LOOM_OUTER_IDLE, LOOM_OUTER_SCATTER, LOOM_OUTER_GATHER } loom_outer_phase;

struct loom_outer_fragment {
    int offset; /* sent after inner steps offset + k * H */
    loom_outer_run *runs;
    int n_runs;
    size_t n;               /* payload floats (the runs back to back) */
    loom_comm *reps;        /* the group's replicas of these values (dp; edp for experts) */
    int shards, shard;      /* their number (1: unsharded) and this rank's place among them */
    size_t part_lo, part_n; /* this replica's part of the payload (all of it unsharded) */
    size_t chunk;           /* floats of the part per worker chunk (a multiple of the block) */
    int *dcounts, *ddispls; /* the replicas' parts (the in-group all-gather of the update) */
    float *delta;           /* [n]: the outer gradient, then the update */
    float *mom, *acc;       /* [own]: momentum (this worker's chunk), sum of contributions */
    uint8_t *counted;       /* [n]: 1 where the value counts in the norm */
    float *send, *recv;     /* all-to-all wire buffers (words) */
    float *gather;          /* all-gather wire buffer (words) */
    int *scounts, *sdispls, *rcounts, *rdispls, *gcounts, *gdispls;
    loom_comm_op op; /* the operation in flight (on the outer engine) */
    loom_outer_phase ph;
    int last_sent; /* step of the last send (0: the initial parameters) */
    double t_start, wait_ms;
    double norm_sq; /* this rank's part of the last outer gradient's squared norm */
    int landed;     /* an outer gradient was computed during this step */
};

/* Worker j's chunk of this replica's part: [part_lo + j * chunk, + this). */
static inline size_t loom_outer_chunk_len(const loom_outer_fragment *f, int j) {
    const size_t lo = (size_t)j * f->chunk, n = f->part_n;
    return lo >= n ? 0 : (n - lo < f->chunk ? n - lo : f->chunk);
}

/* --outer-warmup R: whether the sync sent after inner step `step`, in a schedule whose
 * first sync comes after step `first`, is among the first R rounds (a function of the step,
 * so a resume keeps it); those only average the workers. */
static inline int loom_outer_warm(const loom_outer_config *c, int step, int first) {
    const int round = step >= first ? (step - first) / c->inner_steps : 0;
    return round < c->warmup;
}

/* Whether fragment f is sent (synced) after inner step `step`: after its offset, every H. */
static inline int loom_outer_sends_at(const loom_outer *o, const loom_outer_fragment *f, int step) {
    return step >= f->offset && (step - f->offset) % o->cfg.inner_steps == 0;
}

/* The outer step of one element: its mean outer gradient g in, the update of its
 * round-start value out (warm: -g, the momentum untouched; else SGD with momentum mom,
 * Nesterov's where asked, at the outer learning rate). */
static inline float loom_outer_update(const loom_outer_config *c, int warm, float *mom, float g) {
    if (warm) return -g;
    *mom = c->momentum * *mom + g;
    const float u = c->nesterov ? g + c->momentum * *mom : *mom;
    return -(c->lr * u);
}

/* Fragment f's outer gradient, start - params over its runs, back to back into out[f->n]
 * (outer.c; both modes send it). */
void loom_outer_fragment_delta(const loom_outer *o, const loom_outer_fragment *f, float *out);

/* ZeRO-3 with --ep (o->own): the own ranges' parameters packed into out[n_start], in flat
 * order, or set from such a packing (outer.c; the elastic workers' view of them). */
void loom_outer_params_pack(const loom_outer *o, float *out);
void loom_outer_params_unpack(loom_outer *o, const float *in);

/* A checkpoint's outer state (at path) saved with another --outer-start-step than this
 * run's: the error both loaders give (outer_state.c, outer_elastic_state.c), once its CRC held. */
static inline loom_status loom_outer_other_start(const loom_outer *o, const char *path, int saved,
                                                 loom_error *err) {
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "--outer-start-step %d: %s was saved by a run with "
                          "--outer-start-step %d (resume with the same value)",
                          o->cfg.start_step, path, saved);
}

/* ---- --elastic-worker (parallel/outer_elastic*.c; outer_elastic.h says what it does) ---- */
/* The elastic part of loom_outer_create / _free / _after_step (parallel/outer.c calls them
 * when cfg->elastic_worker >= 0). Create only allocates; begin connects the group: the
 * founder waits (up to LOOM_OUTER_ELASTIC_START_S) for the other workers, a joiner publishes
 * its name and blocks until the coordinator connects and sends it the state. */
#define LOOM_OUTER_ELASTIC_START_S 60.0
loom_status loom_outer_elastic_create(loom_outer *o, loom_error *err);
void loom_outer_elastic_free(loom_outer *o);
loom_status loom_outer_elastic_after_step(loom_outer *o, int step, loom_error *err);
/* --outer-start-step: a synchronous step's gradients averaged over the members through the
 * coordinator (loom_outer_sync_grads' elastic side; every rank's part, fp32). */
loom_status loom_outer_elastic_sync_grads(loom_outer *o, float *grads, size_t n, int step,
                                          loom_error *err);
/* After the checkpoint is loaded: the lead founds or joins the group (a founder waits up to
 * LOOM_OUTER_ELASTIC_START_S for the others); *step becomes the step the run starts after
 * (a joiner: the coordinator's; reload, when not NULL, loads its own checkpoint of that step
 * first: loom_outer_begin). Collective over the worker's job. */
loom_status loom_outer_elastic_begin(loom_outer *o, int *step, loom_outer_reload_fn reload,
                                     void *ctx, loom_error *err);
/* The group's outer state (round-start parameters, momentum, members; the lead's) to and
 * from DIR/outer/step_%08d/elastic.bin; the other ranks write and read nothing. */
loom_status loom_outer_elastic_save(loom_outer *o, const char *dir, int step, loom_error *err);
loom_status loom_outer_elastic_load(loom_outer *o, const char *dir, int step, loom_error *err);
/* 1 when the lead's file is there (the other ranks: 1, they read nothing). */
int loom_outer_elastic_saved(const loom_outer *o, const char *dir, int step);

#endif
