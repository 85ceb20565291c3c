/* loom calibrate's measurements (docs/PROFILE.md): this machine through loom's own
 * kernels (the backend table), AdamW and communication API, as the JSON parts of a
 * machine profile that plan/profile.h reads. The command (cli/cmd_calibrate.c) parses its
 * flags, launches one `mpirun -n G loom calibrate --comm-worker` per group size (which
 * calls loom_calibrate_comm) and writes the file. Progress lines go to stderr. */
#ifndef LOOM_PLAN_CALIBRATE_H
#define LOOM_PLAN_CALIBRATE_H

#include <jansson.h>

#include "comm/comm.h"
#include "core/error.h"

/* The machine's description: CPU, cores, memory, the refault speed of pages handed back
 * (ZeRO-3's), the load average (a warning when the machine is shared), version, date. */
json_t *loom_calibrate_machine(int quick);
/* The compute part: an array of one object per thread count (1, then `threads` when > 1)
 * of GEMM, attention, elementwise and AdamW timings; NULL when the buffers do not fit. */
json_t *loom_calibrate_compute(int quick, int threads);
/* Collective over c: every collective kind's alpha and bus bandwidth over c's ranks and
 * the communication engine's cost; *out (rank 0): {"group", "thread_level",
 * "collectives", "engine"}. */
loom_status loom_calibrate_comm(loom_comm *c, int quick, json_t **out, loom_error *err);
/* Cores busy at once, with c's ranks one one-thread process a core (c no larger than the
 * cores; else *out stays NULL): the time of GEMMs and of memory-bound kernels when every
 * rank runs them at once over rank 0's alone; *out (rank 0): {"processes", "gemm",
 * "memory"}, an entry of the profile's machine.corun. */
loom_status loom_calibrate_corun(loom_comm *c, int quick, json_t **out, loom_error *err);

#endif
