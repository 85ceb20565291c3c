/* Chrome/Perfetto trace writer: the JSON trace-event format that chrome://tracing and
 * ui.perfetto.dev open ({"traceEvents": [...], "displayTimeUnit": "ms"}).
 *
 * One process (pid) per rank, named "rank N"; one thread track "compute" (tid 0) for
 * properly nested begin/end spans, and lanes "comm 0", "comm 1", ... (tid 1, 2, ...) for
 * finished communication spans, placed so that spans never overlap within a lane.
 *
 * Events go to a buffer preallocated at open: recording never allocates. When it is full
 * further events are dropped and counted; the count appears in the file (the process's
 * "process_name" args: dropped_events, and a "process_labels" entry). A NULL trace makes
 * every call a no-op, so callers need no "if tracing" tests.
 *
 * Time: CLOCK_MONOTONIC, stored in integer nanoseconds relative to the trace's open time
 * and written as microseconds with three decimals. Ranks on one host share that clock,
 * so opening every rank's trace right after a barrier lines them up to within the
 * barrier's skew. Ranks on different hosts have unrelated monotonic clocks: their
 * timelines are aligned only by their open times, not to each other's clocks.
 *
 * Threads: begin/end must come from one thread (the one whose work they describe); comm
 * spans may come from any thread. A mutex guards the buffer. */
#ifndef LOOM_CORE_TRACE_H
#define LOOM_CORE_TRACE_H

#include <stddef.h>

#include "core/error.h"

/* Longest communication span name kept (bytes, with the terminating NUL); longer names
 * are truncated at a UTF-8 character boundary. */
#define LOOM_TRACE_NAME_MAX 48
/* Deepest nesting of compute spans recorded; deeper spans are dropped and counted. */
#define LOOM_TRACE_MAX_DEPTH 64
/* Most communication lanes; a span that fits none is dropped and counted. */
#define LOOM_TRACE_MAX_LANES 32

typedef struct loom_trace loom_trace;

/* Preallocates room for max_events (about 80 bytes each). On failure *t is NULL, which
 * is a disabled trace. */
loom_status loom_trace_open(loom_trace **t, int rank, size_t max_events, loom_error *err);
void loom_trace_close(loom_trace *t);
/* CLOCK_MONOTONIC in microseconds (the clock of loom_comm_now_ms() * 1000). */
double loom_trace_now_us(void);

/* Compute spans on the "compute" track, properly nested. name and cat must outlive the
 * trace (string literals / static strings): only the pointer is stored. An end without
 * a begin is ignored and counted (unmatched_ends). */
void loom_trace_begin(loom_trace *t, const char *name, const char *cat);
void loom_trace_end(loom_trace *t);

/* A finished span on a communication track, times from loom_trace_now_us(): it goes to
 * the lowest "comm k" lane whose last span ended at or before start_us. `name` is copied
 * (e.g. "allreduce #12 dp"). end_us < start_us is taken as end_us == start_us. */
void loom_trace_comm(loom_trace *t, const char *name, double start_us, double end_us);

/* This rank's events (metadata first) as one JSON array fragment: comma-separated
 * objects without the enclosing brackets, in a malloc'd NUL-terminated buffer of *len
 * bytes (the caller frees it). Spans still open are written as ending now, with args
 * {"unfinished": true}. A disabled trace gives an empty fragment (*len == 0). */
loom_status loom_trace_serialize(const loom_trace *t, char **json, size_t *len, loom_error *err);

/* Writes a complete trace file from the fragments of all ranks (fragments[r] for rank r;
 * empty or NULL with lens[r] == 0 for a rank without events), via PATH.tmp + rename.
 * Creates the file's folder if missing. */
loom_status loom_trace_write_file(const char *path, char **fragments, const size_t *lens,
                                  int n_ranks, loom_error *err);

#endif
