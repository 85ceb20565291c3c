/* Which rank runs on which host: one start-up line, so that a layout's placement can be
 * checked (tensor-parallel groups inside a host, data-parallel groups across hosts). */
#ifndef LOOM_PARALLEL_PLACEMENT_H
#define LOOM_PARALLEL_PLACEMENT_H

#include <stdio.h>

#include "parallel/mesh.h"

/* Collective over the mesh's world (every rank calls it; nothing when size is 1): rank 0
 * writes "loom train: placement: H ranks A-B, ...; a tp group spans T host(s), dp D, pp P"
 * to f. */
void loom_placement_report(const loom_mesh *m, FILE *f);

#endif
