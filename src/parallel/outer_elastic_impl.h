/* Inside the elastic DiLoCo workers (parallel/outer_elastic.h), shared by its files:
 *   outer_elastic.c           the worker's life in the group: create, found or join, the
 *                             syncs of plain DiLoCo and of a warm start, and inside the
 *                             worker's job the lead's gather and spread;
 *   outer_elastic_exchange.c  between the workers' leads: names, admission, and each
 *                             exchange through the coordinator (the members' mean);
 *   outer_elastic_stream.c    streaming (--outer-fragments F > 1): one fragment at a time,
 *                             overlapped on the lead's exchange thread;
 *   outer_elastic_state.c     the lead's outer state in checkpoints (elastic.bin).
 * The message formats and the state below are private to these files. */
#ifndef LOOM_PARALLEL_OUTER_ELASTIC_IMPL_H
#define LOOM_PARALLEL_OUTER_ELASTIC_IMPL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/liveness.h"
#include "core/worker.h"
#include "parallel/outer_elastic.h"
#include "parallel/outer_impl.h"

#define MAX_W LOOM_OUTER_MAX_FRAGMENTS
#define TAG 71
/* A worker's names: loom-elastic-wI, then loom-elastic-wI.1 ... when the ones before are
 * held by processes that are gone (a name outlives a SIGKILLed job: docs/diloco.md) */
#define MAX_NAMES 8
/* How long the coordinator waits for a joiner's liveness endpoint to answer */
#define LIVENESS_TIMEOUT_MS 1000.0
/* A value found stale is probed again after this long (its joiner may be cut off only) */
#define STALE_RETRY_MS 10000.0

typedef enum {
    MSG_DELTA = 1,  /* a member's outer gradient */
    MSG_UPDATE = 2, /* the coordinator's mean of them */
    MSG_STATE = 3,  /* the group's state, to a joiner */
    MSG_GRADS = 4,  /* a member's gradients of a warm-start step */
    MSG_MEAN = 5    /* the coordinator's mean of them */
} msg_kind;

/* What heads every message: its kind, the step, the fragment (streaming; -1: the whole
 * model), the sender, the members (UPDATE, STATE). */
typedef struct {
    int32_t kind, step, part, from, n_members;
    int32_t members[MAX_W];
} msg_head;

/* Streaming (--outer-fragments F > 1): where the group's values of one fragment are (lead;
 * o->frag[k] holds this rank's runs of it). */
typedef struct {
    size_t at, n; /* a run of the fragment in start_all and mom */
} span;
typedef struct {
    int *counts, *displs; /* floats of the fragment each job rank sends, and where */
    size_t all;           /* the group's floats of the fragment */
    span *map;            /* where they are in start_all, in that order */
    int n_map;
} frag_part;

/* An exchange's progress (poll). */
typedef enum { EX_PENDING, EX_DONE, EX_FAILED } ex_state;

struct loom_outer_elastic {
    int me, W, coordinator; /* worker ids */
    double timeout_ms;
    /* the worker's own job (dp/tp/pp inside the worker): its rank 0, the lead, does every
     * exchange with the other workers for the whole group; the arrays below marked "lead"
     * exist only there. The group's buffers are its ranks' flat buffers back to back in rank
     * order, each once (a dp replica of another rank's buffer contributes nothing). */
    MPI_Comm job;           /* MPI_COMM_NULL: a job of one rank */
    int lead, contrib;      /* this rank is the job's rank 0; contributes its buffer */
    int *counts, *displs;   /* lead: floats each job rank contributes, and where */
    size_t all;             /* the group's floats (the counts' sum) */
    int *gcounts, *gdispls; /* --outer-start-step: the same for gradients (every rank's) */
    size_t gall;
    float *gbuf;          /* lead: the group's gradients of a warm-start step, then their mean */
    float *start_all;     /* lead: the group's round-start parameters */
    float *mine;          /* this rank's outer gradient start - params */
    float *view;          /* ZeRO-3 with --ep: its own ranges' parameters, packed (o->own) */
    MPI_Comm peer[MAX_W]; /* coordinator: one per member; member: peer[coordinator] */
    int member[MAX_W];    /* the last membership this worker knows */
    float *mom;           /* lead: the outer momentum, whole (every member holds the same) */
    float *g;             /* lead: the group's outer gradient, then the members' mean */
    float *acc,
        *wide; /* coordinator: the mean being added up; a member's, widened (max(all, gall)) */
    unsigned char *out;           /* lead: a message being sent */
    unsigned char *in[MAX_W];     /* coordinator: each member's message; member: [0] */
    size_t state_bytes;           /* head + 2 x all floats: the state a joiner takes */
    size_t msg_bytes;             /* the largest message: the state, or a warm start's gradients */
    size_t wire_bytes;            /* an outer gradient or mean in --outer-dtype */
    int start_step;               /* the step the run starts after (a joiner: the coordinator's) */
    int loaded;                   /* lead: start_all and mom came from this worker's checkpoint */
    int32_t saved_members[MAX_W]; /* lead, loaded: the members at the save (reported) */
    int n_saved_members;
    int finished; /* the last step's sync is done: disconnect at the end */
    double sent;  /* bytes the exchanges (answer, ask) sent, not yet in the step's count */
    /* streaming: the lead's exchange thread (MPI_THREAD_MULTIPLE: overlap) and the
     * fragment it works on; pending (every rank): a sync started, not yet landed */
    int overlap, pending;
    loom_worker xthread;
    int flight_u, flight_step;
    enum { FLIGHT_NONE, FLIGHT_RUNNING, FLIGHT_APPLIED } flight;
    loom_status flight_st;
    double flight_ms;
    int part;         /* the fragment being synced (msg_head.part; -1: the whole model) */
    frag_part *parts; /* lead, streaming: o->n_frag of them */
    /* coordinator: what an admission window saw of each missing worker (its closing line) */
    int lookups[MAX_W], lookups_failed[MAX_W], lookup_rc[MAX_W], connects_failed[MAX_W];
    char last_port[MAX_W][96];
    /* coordinator: each worker's port whose connect or state transfer failed. The name
     * server may still list it (the joiner withdraws its name only after taking the state,
     * and a joiner that died never does); a connect to a port nobody accepts on any more
     * blocks in MPI_Comm_connect (OpenMPI 4.1 waits 600 s), so it is never tried again: a
     * joiner started again publishes a new port (its new job's). */
    char failed_port[MAX_W][MPI_MAX_PORT_NAME];
    /* coordinator: hashes of each worker's published values found stale (their process
     * did not answer at its liveness endpoint): skipped until their retry time */
    uint64_t stale[MAX_W][MAX_NAMES];
    double stale_retry[MAX_W][MAX_NAMES];      /* not probed again before (loom_now_ms) */
    int stale_next[MAX_W], stale_found[MAX_W]; /* the next slot; found in this window */
    /* a joiner's lead: its proof of life (comm/liveness.h), open from publishing its name
     * until it joined, and the value published: "PORT alive=ENDPOINT" */
    loom_liveness alive;
    char published[MPI_MAX_PORT_NAME];
};

typedef struct loom_outer_elastic elastic;

/* One exchange through the coordinator: an outer sync (each member's outer gradient up,
 * the mean down), or a warm-start step's gradients (--outer-start-step). */
typedef struct {
    msg_kind up, down; /* a member's message, the coordinator's answer */
    float *v;          /* lead: this worker's vector in, the members' mean out */
    size_t n;
    loom_outer_dtype dtype; /* on the wire, both ways */
    const char *what;       /* the member's vector, for the lines */
    const char *answer;     /* the coordinator's, for the lines */
} exchange;

/* ---- outer_elastic_exchange.c: between the workers' leads ---- */

/* Opens a port and a liveness endpoint and publishes both (e->published) under this
 * worker's first name not held by a live process (through ompi-server); name: the name. */
loom_status loom_elastic_publish(elastic *e, char name[64], char port[MPI_MAX_PORT_NAME],
                                 loom_error *err);
/* Withdraws the name and closes the port and the liveness endpoint. */
void loom_elastic_withdraw(elastic *e, const char *name, const char *port);
/* Polls n exchanges (requests rq[2 i], rq[2 i + 1]) until done, failed or the deadline. */
void loom_elastic_poll(MPI_Request *rq, int n, ex_state *st, double timeout_ms);
/* The receive buffer for worker w (allocated once; NULL when out of memory). */
unsigned char *loom_elastic_in_buf(elastic *e, int w);
/* One line: what happened at step, the members and the round-start checksum. */
void loom_elastic_say(const loom_outer *o, int step, const char *what);
/* The bytes the exchanges sent into this step's count. */
void loom_elastic_take_sent(loom_outer *o);
/* Coordinator: admits the published workers not in the group; how many joined. */
int loom_elastic_admit(loom_outer *o, int step);
/* Coordinator: an admission window opens, and closes with one line per missing worker. */
void loom_elastic_window_open(elastic *e);
void loom_elastic_window_close(const elastic *e, int step, const char *what, double waited_s);
/* Coordinator, after an outer step: admits the workers waiting to join (admit@S: there). */
void loom_elastic_admit_now(loom_outer *o, int step);
/* How the coordinator turns the members' sum into their mean: the rounding of the one-job
 * mode's matching step (an outer gradient: its chunk owner divides; a warm start's
 * gradients: its all-reduce is scaled by 1/W). */
typedef enum { MEAN_DIVIDE, MEAN_TIMES_INVERSE } mean_rule;
/* Lead: x->v becomes the members' mean through the coordinator (summed in worker order);
 * a member that cannot reach the coordinator in time fails, the coordinator drops members
 * that do not answer. */
loom_status loom_elastic_mean(loom_outer *o, int step, const exchange *x, mean_rule rule,
                              loom_error *err);

/* ---- outer_elastic.c: inside the worker's job ---- */

/* The lead's verdict st and v[0..2) to every rank of the job; on its failure every rank
 * fails. */
loom_status loom_elastic_group_verdict(loom_outer *o, loom_status st, int v[2], loom_error *err);

/* ---- outer_elastic_stream.c: streaming ---- */

/* The lead learns where each rank's runs of every fragment are in start_all. */
loom_status loom_elastic_group_fragments(loom_outer *o, loom_error *err);
/* The lead's exchange thread (loom_worker_start's fn; its arg: the loom_outer). */
void *loom_elastic_exchange_thread(void *arg);
/* After inner step `step`: the landings and syncs of the fragments due. */
loom_status loom_elastic_streaming_step(loom_outer *o, int step, loom_error *err);
/* The lead: the fragment's exchange under way joined and its outer step taken (a save). */
loom_status loom_elastic_flight_apply(loom_outer *o, loom_error *err);

#endif
