/* Shard geometry: how a sequence of tensors is cut into one contiguous shard per rank,
 * and which part of a flat range each rank's shard holds. The leaf every sharded buffer
 * builds on (ZeRO's dense shards, the experts' segments of parallel/ep_zero.h, the
 * overlapped gathers of parallel/param_gather.h, ZeRO-3's gathers of parallel/fsdp.h).
 * Boundaries fall on whole rows of the tensor they land in (veScale-FSDP's rule), so a
 * row is never split between ranks. */
#ifndef LOOM_PARALLEL_SHARD_GEOMETRY_H
#define LOOM_PARALLEL_SHARD_GEOMETRY_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/error.h"
#include "model/params.h"

/* Which tensors a sequence takes. */
typedef enum {
    LOOM_SHARD_ALL,     /* every tensor, in flat order */
    LOOM_SHARD_DENSE,   /* the tensors that are not experts' */
    LOOM_SHARD_EXPERTS, /* the experts' tensors */
} loom_shard_kind;

/* Whether tensor p belongs to sequences of `kind`. */
int loom_shard_takes(loom_shard_kind kind, const loom_param *p);

/* Splits the sequence of kind's tensors (total elements) into R shards [displs[r],
 * displs[r] + counts[r]) of about total / R elements each, boundaries snapped to whole
 * rows: tensor i starts at position start[i] of the sequence (NULL: its flat offset).
 * 64-bit: a shard may hold more than 2^31 elements (collectives over whole shards go
 * through comm/'s large-count calls, loom_comm_allgatherv_large). */
void loom_shard_split_rows(const loom_param_table *t, const size_t *start, loom_shard_kind kind,
                           size_t total, int R, size_t *counts, size_t *displs);

/* The same split of positions [a, b) only (shard r: [displs[r], displs[r] + counts[r]),
 * displs[0] == a): loom_shard_split_rows is the case a = 0, b = total. */
void loom_shard_split_rows_span(const loom_param_table *t, const size_t *start,
                                loom_shard_kind kind, size_t a, size_t b, int R, size_t *counts,
                                size_t *displs);

/* Each of R shards' part (shards: shard_counts/shard_displs) of the range [begin, end):
 * counts[r] elements at displs[r] relative to begin (0, 0 where shard r misses it). The
 * range is one collective's (a bucket, a block): end - begin must be below 2^31. */
void loom_shard_range_parts(const size_t *shard_counts, const size_t *shard_displs, int R,
                            size_t begin, size_t end, int *counts, int *displs);

/* One sharded buffer's geometry: the sequence of kind's tensors (in flat order) cut into
 * one row-snapped segment per rank of group. ZeRO's dense shards are one instance (every
 * tensor over dp), ZeRO with experts two (the dense tensors over dp, the expert tensors
 * over edp: parallel/ep_zero.h), as Megatron builds its expert-parallel buffers from the
 * same buffer class as the dense ones. */
typedef struct {
    const loom_param_table *table;
    loom_shard_kind kind;
    loom_comm *group;
    size_t total;            /* elements in the sequence */
    size_t *start;           /* [n_params]: each tensor's position in it (kind ALL: NULL, the
                                flat offset) */
    size_t *counts, *displs; /* per group rank: its segment */
    size_t lo, hi;           /* this rank's segment */
} loom_shard_layout;

loom_status loom_shard_layout_init(loom_shard_layout *l, const loom_param_table *t,
                                   loom_shard_kind kind, loom_comm *group, loom_error *err);
/* Kind ALL cut over the flat range [a, b) only (positions are flat offsets; the ranks'
 * segments together cover [a, b)): ZeRO's shards of the trainable span (--freeze). */
loom_status loom_shard_layout_init_span(loom_shard_layout *l, const loom_param_table *t,
                                        loom_comm *group, size_t a, size_t b, loom_error *err);
void loom_shard_layout_free(loom_shard_layout *l);
/* Where tensor i starts in the sequence. */
static inline size_t loom_shard_layout_start(const loom_shard_layout *l, int i) {
    return l->start ? l->start[i] : l->table->params[i].offset;
}
/* Each group rank's part of sequence positions [begin, end) (loom_shard_range_parts). */
void loom_shard_layout_parts(const loom_shard_layout *l, size_t begin, size_t end, int *counts,
                             int *displs);
typedef enum { LOOM_SHARD_PACK, LOOM_SHARD_UNPACK } loom_shard_copy;
/* Copies sequence positions [a, b) between a flat buffer (laid out by the registry) and
 * buf (buf[0] = position a): PACK flat -> buf, UNPACK buf -> flat. */
void loom_shard_layout_copy(const loom_shard_layout *l, size_t a, size_t b, float *flat, float *buf,
                            loom_shard_copy dir);

#endif
