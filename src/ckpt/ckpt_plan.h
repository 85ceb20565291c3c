/* Checkpoint planning: which pieces of which global tensors a flat range of this rank's
 * buffers holds. A piece is a box of a global tensor (row and column offsets and
 * lengths; a 1-D tensor is n x 1) plus where its first element sits in the local flat
 * buffer and the local stride between its rows. Tensor-parallel placements
 * (model/params.h: tp_dim, tp_parts, tp_rank) split a local row range into one box per
 * fused part. The same function plans what a rank writes (its ZeRO shard) and what it
 * must read back (whatever it owns under the current layout). */
#ifndef LOOM_CKPT_CKPT_PLAN_H
#define LOOM_CKPT_CKPT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/params.h"

/* The three flat buffers a checkpoint holds, laid out like the parameters. */
typedef enum { LOOM_CKPT_PARAMS = 0, LOOM_CKPT_ADAM_M = 1, LOOM_CKPT_ADAM_V = 2 } loom_ckpt_kind;
#define LOOM_CKPT_KINDS 3

typedef struct {
    int64_t off[2], len[2]; /* rows, columns (a 1-D tensor: columns 0, 1) */
} loom_ckpt_box;

typedef struct {
    int param; /* index in the parameter table */
    loom_ckpt_kind kind;
    loom_ckpt_box box; /* in the global tensor */
    size_t local;      /* flat index of the box's first element */
    int64_t stride;    /* local floats from one row of the box to the next */
} loom_ckpt_piece;

typedef struct {
    loom_ckpt_piece *items;
    int n, cap;
} loom_ckpt_plan;

/* One flat buffer of this rank: element i (lo <= i < hi) is data[i - base]. */
typedef struct {
    float *data;
    size_t base, lo, hi;
} loom_ckpt_buffer;

/* Appends the pieces of flat range [lo, hi) of buffer `kind`. skip_tp_replicas: leave out
 * tensors replicated over tensor parallelism unless this is TP rank 0 (each replicated
 * tensor is written once). max_floats > 0 splits pieces into row blocks of at most that
 * many floats (bounded chunks: bounded over-read when resharding, finer checksums). */
loom_status loom_ckpt_plan_range(loom_ckpt_plan *plan, const loom_param_table *t,
                                 loom_ckpt_kind kind, size_t lo, size_t hi, int skip_tp_replicas,
                                 size_t max_floats, loom_error *err);
void loom_ckpt_plan_free(loom_ckpt_plan *plan);

/* Tensor name in a checkpoint: the parameter's name, "optim.m/NAME" or "optim.v/NAME". */
void loom_ckpt_tensor_name(char *out, size_t size, loom_ckpt_kind kind, const char *param);
int64_t loom_ckpt_box_volume(const loom_ckpt_box *b);
/* 1 and the intersection in *out when a and b overlap. */
int loom_ckpt_box_intersect(const loom_ckpt_box *a, const loom_ckpt_box *b, loom_ckpt_box *out);
/* Global shape as rows x columns (a 1-D tensor: n x 1). */
void loom_ckpt_param_global_2d(const loom_param *p, int64_t out[2]);

#endif
