/* Checkpoint planning: which pieces of which global tensors a flat range of this rank's
 * buffers holds. ckpt/ knows tensors only through descriptors (loom_ckpt_desc: name,
 * global shape, where the local part sits in the global tensor and in the flat buffers)
 * that the caller makes from its own registry (train/ckpt_tensors.h). A piece is a box
 * of a global tensor (row and column offsets and lengths; a 1-D tensor is n x 1) plus
 * where its first element sits in the local flat buffer and the local stride between its
 * rows. A local part made of several blocks (a tensor-parallel slice of a fused matrix
 * such as [q; k; v]) splits a local row range into one box per block. The same function
 * plans what a rank writes (its ZeRO shard) and what it must read back (whatever it owns
 * under the current layout). Every buffer is F32. */
#ifndef LOOM_CKPT_CKPT_PLAN_H
#define LOOM_CKPT_CKPT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* The flat buffers a checkpoint holds, laid out like the parameters: the parameters,
 * AdamW's moments and (with --ema-decay) the exponential moving average of the weights.
 * A buffer whose data is NULL is not part of the checkpoint. */
typedef enum {
    LOOM_CKPT_PARAMS = 0,
    LOOM_CKPT_ADAM_M = 1,
    LOOM_CKPT_ADAM_V = 2,
    LOOM_CKPT_EMA = 3
} loom_ckpt_kind;
#define LOOM_CKPT_KINDS 4

typedef struct {
    int64_t off[2], len[2]; /* rows, columns (a 1-D tensor: columns 0, 1) */
} loom_ckpt_box;

#define LOOM_CKPT_NAME_MAX 192 /* with an "optim.m/" prefix it fits a 224-byte name */

/* One tensor as this rank holds it. Shapes are rows x columns (a 1-D tensor: n x 1). The
 * local part is `parts` equal blocks along dimension `dim` (parts 1: one box); block j
 * starts in the global tensor at origin, plus j * part_step along dim. */
typedef struct {
    char name[LOOM_CKPT_NAME_MAX];
    int ndim;
    int64_t global_shape[2];
    int64_t local_shape[2];
    int64_t origin[2];
    int dim, parts;
    int64_t part_step;
    size_t offset; /* flat index (in floats) of the local part's first element */
    int written;   /* 1: this rank's copy is the one a checkpoint holds (not a replica) */
} loom_ckpt_desc;

/* The descriptors of every tensor in the flat buffers (the order of the caller's registry). */
typedef struct {
    loom_ckpt_desc *items;
    int n;
} loom_ckpt_descs;

void loom_ckpt_descs_free(loom_ckpt_descs *d);

typedef struct {
    int tensor; /* index in the descriptors */
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

/* Appends the pieces of flat range [lo, hi) of buffer `kind`. written_only: leave out the
 * tensors whose descriptor says another rank writes them (each replicated tensor is
 * written once). max_floats > 0 splits pieces into row blocks of at most that many floats
 * (bounded chunks: bounded over-read when resharding, finer checksums). */
loom_status loom_ckpt_plan_range(loom_ckpt_plan *plan, const loom_ckpt_descs *d,
                                 loom_ckpt_kind kind, size_t lo, size_t hi, int written_only,
                                 size_t max_floats, loom_error *err);
void loom_ckpt_plan_free(loom_ckpt_plan *plan);

/* Tensor name in a checkpoint: the parameter's name, "optim.m/NAME" or "optim.v/NAME". */
void loom_ckpt_tensor_name(char *out, size_t size, loom_ckpt_kind kind, const char *param);
int64_t loom_ckpt_box_volume(const loom_ckpt_box *b);
/* 1 and the intersection in *out when a and b overlap. */
int loom_ckpt_box_intersect(const loom_ckpt_box *a, const loom_ckpt_box *b, loom_ckpt_box *out);

#endif
