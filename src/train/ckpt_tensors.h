/* The checkpoint view of the parameter registry: one ckpt/ descriptor per parameter, in
 * registry order (a plan piece's `tensor` is then a parameter index). The only place
 * that turns model/'s placements (tensor-parallel slices of fused matrices, replicas
 * over tp and pipeline stages) into ckpt/'s neutral terms. */
#ifndef LOOM_TRAIN_CKPT_TENSORS_H
#define LOOM_TRAIN_CKPT_TENSORS_H

#include "ckpt/ckpt_plan.h"
#include "core/error.h"
#include "model/params.h"

/* Fills out (free with loom_ckpt_descs_free). */
loom_status loom_ckpt_tensors_describe(loom_ckpt_descs *out, const loom_param_table *t,
                                       loom_error *err);

/* A pipeline stage's registry t described in the order of another layout's descriptors
 * `order` (the whole model's): in-memory resharding matches tensors by index. A tensor
 * of `order` that t does not hold gets a descriptor with no local element, not written
 * (another stage holds it, or another expert-parallel rank: an expert's tensors are
 * registered only on its ep rank). With expert parallelism (t's ep_size > 1) the ep group
 * counts as one replica of the whole model: its ranks write their own experts, and only
 * ep rank 0 its dense tensors (the others' copies are replicas). Fails when t holds a
 * tensor `order` does not name. */
loom_status loom_ckpt_tensors_describe_as(loom_ckpt_descs *out, const loom_param_table *t,
                                          const loom_ckpt_descs *order, loom_error *err);

#endif
