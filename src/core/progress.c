#include "core/progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/clock.h"

/* One slot per communicator name, claimed on first use (under claim_lock: the training
 * thread and the communication engine's thread both start operations) and published
 * with n_comms; after that each slot has one writer, the thread driving that communicator. Strings
 * are stored as pointers to the callers' string literals, so a store is one word. */
typedef struct {
    char name[LOOM_PROGRESS_NAME];
    _Atomic int group_first, group_size;
    _Atomic uint64_t started;
    _Atomic(const char *) started_op;
    _Atomic uint64_t waiting_seq;
    _Atomic(const char *) waiting_op;
    _Atomic int64_t wait_start_us;
    _Atomic int wait_blocks; /* the wait blocks the training thread (counted in blocked_us) */
} comm_slot;

typedef struct {
    _Atomic int64_t step;
    _Atomic uint64_t loss_bits, compute_bits, local_bits, blocked_bits; /* doubles, as bits */
} ring_slot;

static struct {
    _Atomic int64_t steps_done, nonfinite_step, start_step;
    _Atomic int phase;
    _Atomic int n_comms;
    comm_slot comms[LOOM_PROGRESS_COMMS];
    _Atomic uint64_t n_steps; /* ring entries written */
    ring_slot ring[LOOM_PROGRESS_RING];
    _Atomic int64_t blocked_us; /* total time blocked in communication */
    int64_t blocked_at_last_step;
    double local_loss; /* of the step in progress (training thread only) */
} g;

static const char *PHASES[LOOM_PHASE_COUNT] = {"init", "forward",    "backward", "optimizer",
                                               "eval", "checkpoint", "done",     "failed"};

const char *loom_phase_name(loom_phase p) {
    return p >= 0 && p < LOOM_PHASE_COUNT ? PHASES[p] : "unknown";
}

static uint64_t bits_of(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static double double_of(uint64_t b) {
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static int64_t now_us(void) {
    return (int64_t)(loom_now_ms() * 1e3);
}

void loom_progress_phase(loom_phase p) {
    atomic_store_explicit(&g.phase, (int)p, memory_order_relaxed);
}

void loom_progress_local_loss(double loss) {
    g.local_loss = loss;
}

void loom_progress_nonfinite(int64_t step) {
    atomic_store(&g.nonfinite_step, step);
}

void loom_progress_set_step(int64_t step) {
    atomic_store(&g.start_step, step);
    atomic_store(&g.steps_done, step);
}

void loom_progress_step_begin(void) {
    /* Waits between two steps (evaluation, checkpoint votes) are not this step's. */
    g.blocked_at_last_step = atomic_load_explicit(&g.blocked_us, memory_order_relaxed);
}

void loom_progress_step_done(int64_t step, double loss, double wall_ms) {
    int64_t blocked = atomic_load_explicit(&g.blocked_us, memory_order_relaxed);
    double compute = wall_ms - (double)(blocked - g.blocked_at_last_step) * 1e-3;
    g.blocked_at_last_step = blocked;
    uint64_t n = atomic_load_explicit(&g.n_steps, memory_order_relaxed);
    ring_slot *r = &g.ring[n % LOOM_PROGRESS_RING];
    atomic_store_explicit(&r->step, -1, memory_order_relaxed); /* invalid while rewritten */
    atomic_store_explicit(&r->loss_bits, bits_of(loss), memory_order_relaxed);
    atomic_store_explicit(&r->compute_bits, bits_of(compute > 0 ? compute : 0),
                          memory_order_relaxed);
    atomic_store_explicit(&r->local_bits, bits_of(g.local_loss), memory_order_relaxed);
    atomic_store_explicit(&r->blocked_bits, bits_of(compute > 0 ? wall_ms - compute : wall_ms),
                          memory_order_relaxed);
    atomic_store_explicit(&r->step, step, memory_order_release);
    atomic_store_explicit(&g.n_steps, n + 1, memory_order_release);
    atomic_store_explicit(&g.steps_done, step, memory_order_release);
}

static pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER;

static comm_slot *find_slot(const char *comm, int n) {
    for (int i = 0; i < n; i++)
        if (strncmp(g.comms[i].name, comm, LOOM_PROGRESS_NAME - 1) == 0) return &g.comms[i];
    return NULL;
}

static comm_slot *slot_of(const char *comm) {
    comm_slot *s = find_slot(comm, atomic_load_explicit(&g.n_comms, memory_order_acquire));
    if (s) return s;
    pthread_mutex_lock(&claim_lock);
    int n = atomic_load_explicit(&g.n_comms, memory_order_relaxed);
    s = find_slot(comm, n);              /* claimed by the other thread meanwhile? */
    if (!s && n < LOOM_PROGRESS_COMMS) { /* more names than slots: not tracked */
        s = &g.comms[n];
        strncpy(s->name, comm, LOOM_PROGRESS_NAME - 1);
        atomic_store_explicit(&s->group_first, -1, memory_order_relaxed);
        atomic_store_explicit(&g.n_comms, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&claim_lock);
    return s;
}

void loom_progress_comm_start(const char *comm, uint64_t seq, const char *op, int blocking) {
    comm_slot *s = slot_of(comm);
    if (!s) return;
    /* One thread drives a communicator: starting an operation means no wait is pending
     * (also clears a blocking call that returned early, e.g. with nothing to send). */
    atomic_store_explicit(&s->waiting_seq, 0, memory_order_relaxed);
    atomic_store_explicit(&s->started_op, op, memory_order_relaxed);
    atomic_store_explicit(&s->started, seq, memory_order_release);
    if (blocking) loom_progress_comm_wait(comm, seq, op);
}

static void record_wait(const char *comm, uint64_t seq, const char *op, int blocks) {
    comm_slot *s = slot_of(comm);
    if (!s) return;
    atomic_store_explicit(&s->wait_blocks, blocks, memory_order_relaxed);
    atomic_store_explicit(&s->wait_start_us, now_us(), memory_order_relaxed);
    atomic_store_explicit(&s->waiting_op, op, memory_order_relaxed);
    atomic_store_explicit(&s->waiting_seq, seq, memory_order_release);
}

void loom_progress_comm_wait(const char *comm, uint64_t seq, const char *op) {
    record_wait(comm, seq, op, 1);
}

void loom_progress_blocked_us(int64_t us) {
    atomic_fetch_add_explicit(&g.blocked_us, us, memory_order_relaxed);
}

void loom_progress_comm_inflight(const char *comm, uint64_t seq, const char *op) {
    record_wait(comm, seq, op, 0);
}

void loom_progress_comm_done(const char *comm) {
    comm_slot *s = slot_of(comm);
    if (!s || !atomic_load_explicit(&s->waiting_seq, memory_order_relaxed)) return;
    int64_t dt = now_us() - atomic_load_explicit(&s->wait_start_us, memory_order_relaxed);
    if (atomic_load_explicit(&s->wait_blocks, memory_order_relaxed))
        atomic_fetch_add_explicit(&g.blocked_us, dt, memory_order_relaxed);
    atomic_store_explicit(&s->waiting_seq, 0, memory_order_release);
}

void loom_progress_comm_group(const char *comm, int first_world_rank, int size) {
    comm_slot *s = slot_of(comm);
    if (!s) return;
    atomic_store_explicit(&s->group_size, size, memory_order_relaxed);
    atomic_store_explicit(&s->group_first, first_world_rank, memory_order_release);
}

static void copy_op(char *dst, const char *op) {
    size_t n = op ? strnlen(op, LOOM_PROGRESS_OP - 1) : 0;
    if (n) memcpy(dst, op, n);
    dst[n] = 0;
}

void loom_progress_read(loom_progress_snapshot *s) {
    memset(s, 0, sizeof *s);
    s->steps_done = atomic_load_explicit(&g.steps_done, memory_order_acquire);
    s->nonfinite_step = atomic_load_explicit(&g.nonfinite_step, memory_order_relaxed);
    s->start_step = atomic_load_explicit(&g.start_step, memory_order_relaxed);
    s->phase = (loom_phase)atomic_load_explicit(&g.phase, memory_order_relaxed);
    s->n_comms = atomic_load_explicit(&g.n_comms, memory_order_acquire);
    const int64_t now = now_us();
    for (int i = 0; i < s->n_comms; i++) {
        comm_slot *c = &g.comms[i];
        loom_progress_comm *o = &s->comms[i];
        memcpy(o->name, c->name, LOOM_PROGRESS_NAME);
        o->group_first = atomic_load_explicit(&c->group_first, memory_order_acquire);
        o->group_size = atomic_load_explicit(&c->group_size, memory_order_relaxed);
        o->started = atomic_load_explicit(&c->started, memory_order_acquire);
        copy_op(o->started_op, atomic_load_explicit(&c->started_op, memory_order_relaxed));
        o->waiting_seq = atomic_load_explicit(&c->waiting_seq, memory_order_acquire);
        if (o->waiting_seq) {
            copy_op(o->waiting_op, atomic_load_explicit(&c->waiting_op, memory_order_relaxed));
            int64_t t0 = atomic_load_explicit(&c->wait_start_us, memory_order_relaxed);
            o->waited_ms = now > t0 ? (double)(now - t0) * 1e-3 : 0;
        }
    }
    uint64_t n = atomic_load_explicit(&g.n_steps, memory_order_acquire);
    for (uint64_t k = 0; k < n && k < LOOM_PROGRESS_RING - 1; k++) {
        /* The newest entries; one slot is left alone as the writer's next target. */
        ring_slot *r = &g.ring[(n - 1 - k) % LOOM_PROGRESS_RING];
        int64_t step = atomic_load_explicit(&r->step, memory_order_acquire);
        loom_progress_step e = {
            step, double_of(atomic_load_explicit(&r->loss_bits, memory_order_relaxed)),
            double_of(atomic_load_explicit(&r->compute_bits, memory_order_relaxed)),
            double_of(atomic_load_explicit(&r->local_bits, memory_order_relaxed)),
            double_of(atomic_load_explicit(&r->blocked_bits, memory_order_relaxed))};
        if (atomic_load_explicit(&r->step, memory_order_acquire) != step || step < 0) break;
        s->recent[s->n_recent++] = e;
    }
}

loom_phase loom_progress_current_phase(void) {
    return (loom_phase)atomic_load_explicit(&g.phase, memory_order_relaxed);
}

int64_t loom_progress_steps_done(void) {
    return atomic_load_explicit(&g.steps_done, memory_order_acquire);
}
