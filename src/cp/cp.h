/* Context parallelism: the attention of sequences split over a context-parallel group of
 * N ranks (--cp N). Two modes:
 *  - ring (--cp-mode ring): each rank keeps its queries; the key/value blocks travel
 *    around the ring (rank r sends to r+1, receives from r-1), the next block's transfer
 *    in flight while the current one is computed, partial results merged by log-sum-exp
 *    (kernels.h "Blockwise attention"). Causally the sequence is cut into 2N chunks and
 *    rank r holds chunks r and 2N-1-r (zigzag), so every step costs every rank the same.
 *    Backward sends the blocks round again with their dK/dV travelling along.
 *  - ulysses (--cp-mode ulysses): an all-to-all turns the sequence-sharded qkv into
 *    head-sharded full sequences, the ordinary attention kernel runs, an all-to-all
 *    brings the output back. Key/value heads are replicated when there are fewer than N.
 *
 * The local row layout (the data loader fills it): rank r holds Tl = T/N tokens of each
 * of B samples as n_chunks position ranges of chunk = Tl/n_chunks tokens, at chunk_pos[j]
 * (ring + causal: n_chunks = 2, chunk_pos = {r*chunk, (2N-1-r)*chunk}; otherwise
 * n_chunks = 1, chunk_pos = {r*Tl}). Local rows are [n_chunks][B][chunk]: row
 * (j*B + b)*chunk + t is token chunk_pos[j] + t of sample b (loom_cp_local_row). qkv rows
 * [B*Tl, (H + 2*KV)*hd] with RoPE applied at global positions; out [B*Tl, H*hd]; H, KV
 * the heads on this rank (after tensor parallelism).
 *
 * This layer sits below model/ with tp (src/LAYERS): it knows the group, the backend and
 * the shapes, nothing of the model. */
#ifndef LOOM_CP_CP_H
#define LOOM_CP_CP_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"

typedef enum { LOOM_CP_RING = 0, LOOM_CP_ULYSSES = 1 } loom_cp_mode;
#define LOOM_CP_LABEL 16 /* a transfer's name (core/progress.h keeps 16 characters) */
const char *loom_cp_mode_name(loom_cp_mode m); /* "ring", "ulysses" */
/* "ring" / "ulysses"; else LOOM_ERR_INPUT naming --cp-mode and the choices. */
loom_status loom_cp_mode_parse(const char *s, loom_cp_mode *m, loom_error *err);

typedef struct {
    loom_cp_mode mode;
    int causal;    /* 1: causal language model; 0: bidirectional (DiT) */
    int no_zigzag; /* 1: ring + causal with the plain contiguous split (benchmark only) */
    int B, T;      /* samples per micro-batch, GLOBAL tokens per sample */
    int H, KV, hd; /* query heads, kv heads on this rank; head width */
    /* 1: every qkv value passed in is a bf16 value and the caller rounds the output to bf16
     * (round to nearest even) before anything reads it: every family under
     * --precision bf16 (model/tp_linear.c loom_model_round_pre). Then the ring's key/value
     * blocks and Ulysses' qkv and output exchanges travel as bf16 bits: the same function,
     * half their bytes (docs/precision.md). */
    int bf16_qkv;
    /* 1: also d(out) passed to backward is bf16 values and the caller rounds the dqkv it
     * gets to bf16 values before anything reads it (the language models' blocks under
     * --precision bf16: model/transformer.c). Then Ulysses' d(out) and, with no key/value
     * head shared by ranks, its dqkv travel as bf16 too; the ring's dK/dV, sums across the
     * ranks, stay fp32. */
    int bf16_grads;
} loom_cp_options;

typedef struct loom_cp {
    loom_comm *comm; /* the context-parallel group (not owned) */
    const loom_backend *be;
    int rank, size;
    loom_cp_options o;
    int Tl, n_chunks, chunk, chunk_pos[2];
    double compute_ms; /* attention compute time so far on this rank (kernels only) */
    loom_error *err;   /* set by create: where failures inside forward/backward go */

    /* ring: the key/value block (2*KV*hd per token) double-buffered, dK/dV travel buffers
     * (two outgoing, one incoming), a partial result, D, the block kernels' scratch */
    float *kv[2], *dkv_send[2], *dkv_recv, *part_out, *part_lse, *delta, *scratch;
    loom_bf16 *kv16[2]; /* o.bf16_qkv: the blocks on the wire (widened into kv[] on arrival) */
    loom_attention_blocks blocks; /* geometry of the kernel calls (kpos set per step) */
    /* ulysses: heads per rank, all-to-all buffers, full-sequence head-sharded arrays */
    int Hn, KVr;                 /* query heads, key/value heads per rank after the exchange */
    float *send, *recv;          /* [N * B*Tl * (Hn + 2*KVr)*hd] */
    loom_bf16 *send16, *recv16;  /* o.bf16_qkv: the same, bf16 on the wire */
    float *qkv_full, *dqkv_full; /* [B, T, (Hn + 2*KVr)*hd] */
    float *out_full, *dout_full; /* [B, T, Hn*hd] */
    int *counts, *displs; /* [2][N]: qkv-wide messages, then out-wide ones (same both ways) */
    /* what the transfers are called in heartbeats, hang diagnoses and the trace: ring step
     * i of N forward ("ring kv i/N") and backward ("ring dkv i/N"), Ulysses' exchanges */
    char (*labels)[LOOM_CP_LABEL];
    size_t scratch_floats;
    double bytes_bf16, bytes_f32; /* bytes this rank sent so far, by wire type */
} loom_cp;

/* No MPI: checks the layout, every message names the flag. cp: --cp value; T: --seq-len;
 * H, KV: heads per tensor-parallel rank. Rules: T % cp == 0 (ring + causal:
 * T % (2*cp) == 0, zigzag); ulysses: H % cp == 0 and (KV % cp == 0 or cp % KV == 0)
 * (KV heads replicated when KV < cp). */
loom_status loom_cp_validate(int cp, loom_cp_mode mode, int causal, int T, int H, int KV,
                             loom_error *err);
/* Buffers from be (CPU only today: a backend without the block kernels is refused).
 * A comm of size 1 gives a valid module that computes whole-sequence attention. */
loom_status loom_cp_create(loom_cp *cp, loom_comm *comm, const loom_cp_options *o,
                           const loom_backend *be, loom_error *err);
/* The same without its buffers (their bytes: loom_cp_buffer_bytes): what sizing a
 * layout's memory reads (loom plan); attention on it fails. */
loom_status loom_cp_size(loom_cp *cp, loom_comm *comm, const loom_cp_options *o,
                         const loom_backend *be, loom_error *err);
void loom_cp_free(loom_cp *cp);
/* Bytes create() allocates (buffers + scratch, CPU kernels), for the start-up memory
 * report; no MPI. */
size_t loom_cp_buffer_bytes(int cp, const loom_cp_options *o);
/* Global position of local token t (0 <= t < Tl) of a sample, in the local order above. */
int loom_cp_position(const loom_cp *cp, int t);
/* Local row of local token t (0 <= t < Tl) of sample b: (t/chunk * B + b)*chunk + t%chunk. */
int loom_cp_local_row(const loom_cp *cp, int b, int t);
/* Fills out[Nl, H*hd] and lse (B*H*Tl floats, layout private to the module) from qkv.
 * Fails only on a communication error (message in cp->err). */
loom_status loom_cp_attention_forward(loom_cp *cp, float *out, float *lse, const float *qkv);
/* dqkv += d(loss)/d(qkv) given dout [Nl, H*hd] and forward's qkv, out, lse (the same contract
 * as loom_attention_backward: the caller zeroes dqkv). */
loom_status loom_cp_attention_backward(loom_cp *cp, float *dqkv, const float *dout,
                                       const float *qkv, const float *out, const float *lse);

#endif
