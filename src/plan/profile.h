/* A machine profile: what one step's pieces cost on a machine, read from the JSON file
 * `loom calibrate` writes (measured here) or a hand-written one for a GPU cluster
 * (profiles/, from public specifications). docs/PROFILE.md is the format: every field,
 * its unit, and the model each lookup evaluates. The planner asks only the lookups below.
 *
 * Loading validates every term the planner needs; a missing or malformed term is one
 * LOOM_ERR_INPUT naming the file and the field ("p.json: compute[0].gemm.nt.peak_gflops:
 * expected a positive number"). Lookups on a loaded profile fail only for a request the
 * profile has no entry for (a placement it does not describe) or a bad argument. */
#ifndef LOOM_PLAN_PROFILE_H
#define LOOM_PLAN_PROFILE_H

#include <stddef.h>

#include "core/error.h"

/* The GEMMs of a linear layer out[n, OC] = inp[n, IC] W[OC, IC]^T, as C[M, N] = A B:
 *  NT  forward (loom_linear_forward):          M = tokens, N = OC, K = IC
 *  NN  input gradient (linear_backward_input): M = tokens, N = IC, K = OC
 *  TN  weight gradient (backward_weight):      M = OC,     N = IC, K = tokens */
typedef enum { LOOM_GEMM_NT, LOOM_GEMM_NN, LOOM_GEMM_TN, LOOM_GEMM_OPS } loom_gemm_op;

/* Attention kernels. block_*: the ring's blockwise kernels on one fully visible
 * (chunk x chunk) block (loom_attention_block_forward / _backward, causal 0), T = chunk. */
typedef enum {
    LOOM_ATT_CAUSAL_FWD,
    LOOM_ATT_CAUSAL_BWD,
    LOOM_ATT_BIDIR_FWD,
    LOOM_ATT_BIDIR_BWD,
    LOOM_ATT_BLOCK_FWD,
    LOOM_ATT_BLOCK_BWD,
    LOOM_ATT_KINDS
} loom_attention_kind;

/* Memory-bound kernels; their bytes are loom_profile_elementwise_bytes (docs/PROFILE.md). */
typedef enum {
    LOOM_EW_LAYERNORM_FWD,
    LOOM_EW_LAYERNORM_BWD,
    LOOM_EW_RMSNORM_FWD,
    LOOM_EW_RMSNORM_BWD,
    LOOM_EW_GELU_FWD,
    LOOM_EW_GELU_BWD,
    LOOM_EW_SWIGLU_FWD,
    LOOM_EW_SWIGLU_BWD,
    LOOM_EW_ADD,
    LOOM_EW_CROSSENTROPY, /* forward + backward in one pass (loom_crossentropy_forward_backward) */
    LOOM_EW_BLOCK_MERGE,  /* the ring's log-sum-exp merge (loom_attention_block_merge) */
    LOOM_EW_KINDS
} loom_elementwise_kind;

/* Collectives; bytes as nccl-tests counts them (docs/PROFILE.md): all-reduce the buffer,
 * reduce-scatter the whole send buffer, all-gather the whole gathered buffer, all-to-all
 * one rank's whole send buffer, send/recv one message (every rank sends to the next). */
typedef enum {
    LOOM_COLL_ALLREDUCE,
    LOOM_COLL_REDUCE_SCATTER,
    LOOM_COLL_ALLGATHER,
    LOOM_COLL_ALLTOALL,
    LOOM_COLL_SENDRECV,
    LOOM_COLL_KINDS
} loom_collective_kind;

/* Where a group's ranks sit: one node (shared memory, NVLink) or several (network).
 * ANY: the entry for the group size whatever its placement (intra first). */
typedef enum { LOOM_PLACE_ANY, LOOM_PLACE_INTRA, LOOM_PLACE_INTER } loom_placement;

typedef struct loom_profile loom_profile;

/* Names as they appear in the file ("nt", "causal_fwd", "layernorm_fwd", "allreduce"). */
const char *loom_gemm_op_name(loom_gemm_op op);
const char *loom_attention_kind_name(loom_attention_kind k);
const char *loom_elementwise_kind_name(loom_elementwise_kind k);
const char *loom_collective_kind_name(loom_collective_kind k);
/* nccl-tests' bus-bandwidth factor: time = alpha + bytes * factor / busbw. */
double loom_collective_bus_factor(loom_collective_kind k, int group);
/* The bytes an elementwise kernel moves for rows x width fp32 values (width: C for the
 * norms, the element count per row for gelu/add, F for swiglu, V for cross-entropy,
 * H*hd for the merge). */
double loom_profile_elementwise_bytes(loom_elementwise_kind k, double rows, double width);

/* Reads and validates a profile file (LOOM_ERR_INPUT naming path and field). */
loom_status loom_profile_load(loom_profile **out, const char *path, loom_error *err);
/* The same from text; `name` stands for the file in messages. */
loom_status loom_profile_parse(loom_profile **out, const char *text, const char *name,
                               loom_error *err);
void loom_profile_free(loom_profile *p);

const char *loom_profile_name(const loom_profile *p);
/* "measured" or "published". */
const char *loom_profile_source(const loom_profile *p);
/* Memory one rank may use, bytes, with ranks_per_node ranks on a node: a device's own
 * memory (a GPU), or the node's memory divided among its ranks (machine.memory_shared). */
double loom_profile_memory_bytes(const loom_profile *p, int ranks_per_node);
int loom_profile_devices_per_node(const loom_profile *p);

/* Compute lookups, for `threads` threads per rank: the profile's entry with the most
 * threads <= threads (the fewest if none is), so a GPU profile's single entry serves all. */
loom_status loom_profile_gemm_ms(const loom_profile *p, loom_gemm_op op, double M, double N,
                                 double K, int threads, double *ms, loom_error *err);
/* --precision bf16's GEMMs (the bf16 backend's linear ops: operands rounded, oneDNN bf16
 * matmul, fp32 out): compute[i].gemm_bf16, optional in a profile; LOOM_ERR_INPUT naming
 * the profile when the entry has none. */
int loom_profile_has_gemm_bf16(const loom_profile *p, int threads);
loom_status loom_profile_gemm_bf16_ms(const loom_profile *p, loom_gemm_op op, double M, double N,
                                      double K, int threads, double *ms, loom_error *err);
/* The GEMM's peak rate, GFLOP/s (its `peak_gflops`: a datasheet's dense peak in a published
 * profile, the fitted asymptotic rate in a measured one), before `efficiency`. */
double loom_profile_gemm_peak_gflops(const loom_profile *p, loom_gemm_op op, int threads);
/* heads = B*H (samples x query heads) of length T, head width hd. */
loom_status loom_profile_attention_ms(const loom_profile *p, loom_attention_kind k, double heads,
                                      double T, double hd, int threads, double *ms,
                                      loom_error *err);
loom_status loom_profile_elementwise_ms(const loom_profile *p, loom_elementwise_kind k,
                                        double bytes, int threads, double *ms, loom_error *err);
/* AdamW over n parameters (loom_backend_adamw_update). */
loom_status loom_profile_adamw_ms(const loom_profile *p, double params, int threads, double *ms,
                                  loom_error *err);
/* One collective of `bytes` over `group` ranks. */
loom_status loom_profile_collective_ms(const loom_profile *p, loom_collective_kind k, int group,
                                       loom_placement place, double bytes, double *ms,
                                       loom_error *err);
/* The communication engine's CPU time (its thread's) for one operation of `bytes`, and the
 * compute thread's time to post one, microseconds. */
double loom_profile_engine_cpu_us(const loom_profile *p, double bytes);
double loom_profile_engine_post_us(const loom_profile *p);
/* Milliseconds to write `bytes` into pages handed back to the kernel (MADV_DONTNEED) and
 * faulted in again, zero-filled (machine.refault_gbps; 0 ms when the profile has none). */
double loom_profile_refault_ms(const loom_profile *p, double bytes);
/* The slowdown of a one-thread process's GEMMs (and attention) and of its memory-bound
 * kernels when `busy` such processes run at once, one a core (machine.corun, measured by
 * loom calibrate: the cores share the memory bandwidth and the last-level cache): linear
 * from 1 at one process through the measured points; 1 without measurements. */
void loom_profile_corun(const loom_profile *p, double busy, double *gemm, double *memory);

#endif
