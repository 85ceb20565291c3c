/* Context parallelism (cp.h): modes, validation, the local layout, buffers. The
 * exchanges and the kernel calls are in ring.c and ulysses.c. */
#include "cp/cp.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp/cp_impl.h"

const char *loom_cp_mode_name(loom_cp_mode m) {
    return m == LOOM_CP_ULYSSES ? "ulysses" : "ring";
}

loom_status loom_cp_mode_parse(const char *s, loom_cp_mode *m, loom_error *err) {
    if (s && strcmp(s, "ring") == 0) {
        *m = LOOM_CP_RING;
        return LOOM_OK;
    }
    if (s && strcmp(s, "ulysses") == 0) {
        *m = LOOM_CP_ULYSSES;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_INPUT, "--cp-mode '%s': expected ring or ulysses",
                          s ? s : "(null)");
}

loom_status loom_cp_validate(int cp, loom_cp_mode mode, int causal, int T, int H, int KV,
                             loom_error *err) {
    if (cp < 1) return loom_error_set(err, LOOM_ERR_INPUT, "--cp %d: must be at least 1", cp);
    if (mode != LOOM_CP_RING && mode != LOOM_CP_ULYSSES)
        return loom_error_set(err, LOOM_ERR_INPUT, "--cp-mode: unknown mode %d", (int)mode);
    if (T < 1 || T % cp != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--seq-len %d is not divisible by --cp %d (each rank holds "
                              "--seq-len / --cp tokens of every sample)",
                              T, cp);
    if (mode == LOOM_CP_RING && causal && T % (2 * cp) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--cp %d --cp-mode ring: zigzag needs --seq-len divisible by 2 x "
                              "--cp (%d), got --seq-len %d",
                              cp, 2 * cp, T);
    if (mode == LOOM_CP_ULYSSES && cp > 1) {
        if (H < 1 || H % cp != 0)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--cp %d --cp-mode ulysses: the %d query heads per tensor-"
                                  "parallel rank (--n-head / --tp) are not divisible by --cp",
                                  cp, H);
        if (KV < 1 || (KV % cp != 0 && cp % KV != 0))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--cp %d --cp-mode ulysses: the %d kv heads per tensor-parallel "
                                  "rank (--n-kv-head / --tp) must be a multiple or a divisor of "
                                  "--cp (replicated when fewer)",
                                  cp, KV);
    }
    return LOOM_OK;
}

int loom_cp_position(const loom_cp *cp, int t) {
    return cp->chunk_pos[t / cp->chunk] + t % cp->chunk;
}

int loom_cp_local_row(const loom_cp *cp, int b, int t) {
    return ((t / cp->chunk) * cp->o.B + b) * cp->chunk + t % cp->chunk;
}

/* Floats of every buffer create() makes (one plan for create and buffer_bytes). */
typedef struct {
    size_t kv, part_out, lse, scratch; /* ring: kv is one block (5 of them) */
    size_t kv16;                       /* ring, bf16_qkv: one block's bf16 (2 of them) */
    size_t msg, full_qkv, full_out;    /* ulysses */
    size_t msg16;                      /* ulysses, bf16_qkv: bf16 send and receive (2 of them) */
    int Hn, KVr;
} cp_plan;

static cp_plan plan(int N, const loom_cp_options *o, const loom_backend *be) {
    cp_plan p = {0};
    int Tl, n_chunks, chunk, pos[2];
    loom_cp_layout(N, 0, o, &Tl, &n_chunks, &chunk, pos);
    const size_t Nl = (size_t)o->B * Tl;
    if (o->mode == LOOM_CP_RING) {
        p.kv = Nl * 2 * o->KV * o->hd;
        p.kv16 = o->bf16_qkv ? p.kv : 0;
        p.part_out = Nl * o->H * o->hd;
        p.lse = Nl * o->H;
        p.scratch = loom_backend_attention_block_scratch_floats(be, chunk, n_chunks);
    } else {
        p.Hn = o->H / N;
        p.KVr = o->KV >= N ? o->KV / N : 1;
        const size_t Rr = (size_t)(p.Hn + 2 * p.KVr) * o->hd;
        p.msg = (size_t)o->B * o->T * Rr; /* all N messages of one exchange */
        p.full_qkv = p.msg;
        p.msg16 = o->bf16_qkv ? p.msg : 0;
        p.full_out = (size_t)o->B * o->T * p.Hn * o->hd;
        p.scratch = loom_backend_attention_scratch_floats(be, o->B, o->T, p.Hn);
    }
    return p;
}

static size_t plan_floats(const cp_plan *p) {
    return 5 * p->kv + p->kv16 + p->msg16 + p->part_out + 2 * p->lse + p->scratch + 2 * p->msg +
           2 * p->full_qkv + 2 * p->full_out; /* two bf16 blocks: one block's floats */
}

size_t loom_cp_buffer_bytes(int cp, const loom_cp_options *o) {
    if (cp < 1 || o->T % cp != 0) return 0;
    cp_plan p = plan(cp, o, loom_backend_cpu());
    size_t ints = o->mode == LOOM_CP_ULYSSES ? 4 * (size_t)cp : 0;
    return plan_floats(&p) * sizeof(float) + ints * sizeof(int);
}

static float *alloc_floats(loom_cp *cp, size_t n, int *failed) {
    if (n == 0 || *failed) return NULL;
    float *p = loom_backend_alloc(cp->be, n * sizeof(float));
    if (!p) *failed = 1;
    return p;
}

/* The ops each mode needs from the backend (NULL entries: not implemented there). */
static int backend_has(const loom_backend *be, loom_cp_mode mode, int causal) {
    const loom_backend_ops *op = be->ops;
    if (!op->copy_2d || !op->add_2d) return 0;
    if (mode == LOOM_CP_RING)
        return op->attention_block_scratch_floats && op->attention_block_forward &&
               op->attention_block_merge && op->attention_block_delta &&
               op->attention_block_backward;
    return causal ? op->attention_forward && op->attention_backward
                  : op->attention_bidir_forward && op->attention_bidir_backward;
}

static loom_status create(loom_cp *cp, loom_comm *comm, const loom_cp_options *o,
                          const loom_backend *be, int buffers, loom_error *err) {
    memset(cp, 0, sizeof *cp);
    const int N = comm->size;
    if (o->B < 1 || o->T < 1 || o->H < 1 || o->KV < 1 || o->hd < 1 || o->H % o->KV != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "context parallelism: bad shape B %d T %d H %d KV %d hd %d (all "
                              ">= 1, KV dividing H)",
                              o->B, o->T, o->H, o->KV, o->hd);
    /* the contiguous split (benchmark) needs only --seq-len divisible by --cp */
    int zigzag = o->causal && !(o->mode == LOOM_CP_RING && o->no_zigzag);
    loom_status st = loom_cp_validate(N, o->mode, zigzag, o->T, o->H, o->KV, err);
    if (st) return st;
    if (!backend_has(be, o->mode, o->causal))
        return loom_error_set(
            err, LOOM_ERR_INPUT, "--cp with --device %s: %s attention has no %s kernels yet",
            be->device == LOOM_DEVICE_CUDA ? "cuda" : be->name, loom_cp_mode_name(o->mode),
            be->device == LOOM_DEVICE_CUDA ? "CUDA" : "such");
    cp->comm = comm;
    cp->be = be;
    cp->rank = comm->rank;
    cp->size = N;
    cp->o = *o;
    cp->err = err;
    loom_cp_layout(N, cp->rank, o, &cp->Tl, &cp->n_chunks, &cp->chunk, cp->chunk_pos);
    cp_plan p = plan(N, o, be);
    /* MPI counts and displacements are ints: every message must fit. */
    if (p.kv > (size_t)INT_MAX || p.msg > (size_t)INT_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "context parallelism: --seq-len %d x %d samples is too large for "
                              "one message (over 2^31 floats)",
                              o->T, o->B);
    cp->Hn = p.Hn;
    cp->KVr = p.KVr;
    if (!buffers) return LOOM_OK; /* sized only: loom_cp_buffer_bytes says their bytes */
    int failed = 0;
    for (int i = 0; i < 2; i++) {
        cp->kv[i] = alloc_floats(cp, p.kv, &failed);
        cp->dkv_send[i] = alloc_floats(cp, p.kv, &failed);
        cp->kv16[i] = (loom_bf16 *)alloc_floats(cp, (p.kv16 + 1) / 2, &failed);
    }
    cp->dkv_recv = alloc_floats(cp, p.kv, &failed);
    cp->part_out = alloc_floats(cp, p.part_out, &failed);
    cp->part_lse = alloc_floats(cp, p.lse, &failed);
    cp->delta = alloc_floats(cp, p.lse, &failed);
    cp->scratch_floats = p.scratch;
    cp->scratch = alloc_floats(cp, p.scratch, &failed);
    cp->send = alloc_floats(cp, p.msg, &failed);
    cp->recv = alloc_floats(cp, p.msg, &failed);
    cp->send16 = (loom_bf16 *)alloc_floats(cp, (p.msg16 + 1) / 2, &failed);
    cp->recv16 = (loom_bf16 *)alloc_floats(cp, (p.msg16 + 1) / 2, &failed);
    cp->qkv_full = alloc_floats(cp, p.full_qkv, &failed);
    cp->dqkv_full = alloc_floats(cp, p.full_qkv, &failed);
    cp->out_full = alloc_floats(cp, p.full_out, &failed);
    cp->dout_full = alloc_floats(cp, p.full_out, &failed);
    if (o->mode == LOOM_CP_ULYSSES && !failed) {
        cp->counts = calloc(2 * (size_t)N, sizeof(int));
        cp->displs = calloc(2 * (size_t)N, sizeof(int));
        if (!cp->counts || !cp->displs) failed = 1;
        const int Nl = o->B * cp->Tl, Rr = (cp->Hn + 2 * cp->KVr) * o->hd, OCn = cp->Hn * o->hd;
        for (int r = 0; !failed && r < N; r++) {
            cp->counts[r] = Nl * Rr, cp->displs[r] = r * Nl * Rr;
            cp->counts[N + r] = Nl * OCn, cp->displs[N + r] = r * Nl * OCn;
        }
    }
    if (!failed && !(cp->labels = calloc(2 * (size_t)N + 2, sizeof *cp->labels))) failed = 1;
    for (int i = 0; !failed && i < N; i++) {
        snprintf(cp->labels[i], LOOM_CP_LABEL, "ring kv %d/%d", i + 1, N);
        snprintf(cp->labels[N + i], LOOM_CP_LABEL, "ring dkv %d/%d", i + 1, N);
    }
    if (!failed) {
        snprintf(cp->labels[2 * N], LOOM_CP_LABEL, "ulysses qkv a2a");
        snprintf(cp->labels[2 * N + 1], LOOM_CP_LABEL, "ulysses out a2a");
    }
    if (failed) {
        loom_cp_free(cp);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "context parallelism: out of memory for %zu bytes of buffers",
                              loom_cp_buffer_bytes(N, o));
    }
    cp->blocks =
        (loom_attention_blocks){o->B,         cp->chunk,    o->H,
                                o->KV,        o->hd,        o->causal,
                                cp->n_chunks, cp->n_chunks, {cp->chunk_pos[0], cp->chunk_pos[1]},
                                {0, 0}};
    return LOOM_OK;
}

loom_status loom_cp_create(loom_cp *cp, loom_comm *comm, const loom_cp_options *o,
                           const loom_backend *be, loom_error *err) {
    return create(cp, comm, o, be, 1, err);
}

loom_status loom_cp_size(loom_cp *cp, loom_comm *comm, const loom_cp_options *o,
                         const loom_backend *be, loom_error *err) {
    return create(cp, comm, o, be, 0, err);
}

void loom_cp_free(loom_cp *cp) {
    if (!cp->be) return;
    float *bufs[] = {cp->kv[0],    cp->kv[1],    cp->dkv_send[0], cp->dkv_send[1], cp->dkv_recv,
                     cp->part_out, cp->part_lse, cp->delta,       cp->scratch,     cp->send,
                     cp->recv,     cp->qkv_full, cp->dqkv_full,   cp->out_full,    cp->dout_full};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_backend_free(cp->be, bufs[i]);
    for (int i = 0; i < 2; i++) loom_backend_free(cp->be, cp->kv16[i]);
    loom_backend_free(cp->be, cp->send16);
    loom_backend_free(cp->be, cp->recv16);
    free(cp->counts);
    free(cp->displs);
    free(cp->labels);
    memset(cp, 0, sizeof *cp);
}

loom_status loom_cp_attention_forward(loom_cp *cp, float *out, float *lse, const float *qkv) {
    return cp->o.mode == LOOM_CP_RING ? loom_cp_ring_forward(cp, out, lse, qkv)
                                      : loom_cp_ulysses_forward(cp, out, lse, qkv);
}

loom_status loom_cp_attention_backward(loom_cp *cp, float *dqkv, const float *dout,
                                       const float *qkv, const float *out, const float *lse) {
    return cp->o.mode == LOOM_CP_RING ? loom_cp_ring_backward(cp, dqkv, dout, qkv, out, lse)
                                      : loom_cp_ulysses_backward(cp, dqkv, dout, qkv, out, lse);
}
