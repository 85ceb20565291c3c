/* Large-count collectives: more than 2^31 elements (or bytes) in one call. OpenMPI 4.1 has
 * no MPI-4 `_c` functions and takes counts and displacements as int, so these split the
 * call into pieces of at most `chunk` elements (0: LOOM_COMM_CHUNK), each an ordinary
 * collective of comm.c. Every rank makes the same calls in the same order (the sequence
 * numbers stay in step). A sum's elements are summed exactly as one call would (an
 * element-wise reduction does not depend on where the call is cut); gathers and
 * broadcasts copy. */
#include "comm/comm.h"

#include <limits.h>
#include <stdint.h>

static size_t chunk_of(size_t chunk) {
    return chunk ? chunk : (size_t)LOOM_COMM_CHUNK;
}

loom_status loom_comm_allreduce_sum_large(loom_comm *c, float *buf, size_t count, size_t chunk,
                                          loom_error *err) {
    const size_t k = chunk_of(chunk);
    loom_status st = LOOM_OK;
    for (size_t at = 0; at < count && !st; at += k)
        st = loom_comm_allreduce_sum(c, buf + at, count - at < k ? count - at : k, err);
    return st;
}

loom_status loom_comm_bcast_large(loom_comm *c, void *buf, size_t bytes, int root, size_t chunk,
                                  loom_error *err) {
    const size_t k = chunk_of(chunk);
    loom_status st = LOOM_OK;
    for (size_t at = 0; at < bytes && !st; at += k)
        st = loom_comm_bcast(c, (uint8_t *)buf + at, bytes - at < k ? bytes - at : k, root, err);
    return st;
}

loom_status loom_comm_allgatherv_large(loom_comm *c, float *buf, const size_t *counts,
                                       const size_t *displs, size_t chunk, loom_error *err) {
    /* Within int (or the test's chunk): the ordinary call (every model below 2^31). */
    const size_t k = chunk_of(chunk), fit = chunk ? chunk : (size_t)INT_MAX;
    size_t end = 0;
    for (int r = 0; r < c->size; r++)
        if (displs[r] + counts[r] > end) end = displs[r] + counts[r];
    if (end <= fit && c->size <= 4096) {
        int n[4096], d[4096];
        for (int r = 0; r < c->size; r++) n[r] = (int)counts[r], d[r] = (int)displs[r];
        return loom_comm_allgatherv(c, buf, n, d, err);
    }
    /* Past int: each rank's part broadcast from it, in pieces of at most chunk floats. */
    loom_status st = LOOM_OK;
    for (int r = 0; r < c->size && !st; r++)
        st = loom_comm_bcast_large(c, buf + displs[r], counts[r] * sizeof(float), r,
                                   k * sizeof(float), err);
    return st;
}
