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

#endif
