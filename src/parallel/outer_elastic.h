/* Elastic DiLoCo workers (--elastic-worker I): every worker is its own MPI job (of any
 * layout loom trains: dp/ZeRO, tp, pp inside it; its rank 0, the lead, speaks for the
 * worker: it gathers the group's outer gradient, exchanges it and spreads the result), and
 * the outer sync is point-to-point over intercommunicators made with
 * MPI_Comm_connect / MPI_Comm_accept (names through an ompi-server) instead of
 * collectives over one job's mesh->outer, so a worker that dies or is cut off is dropped
 * and the others go on; it rejoins later (docs/diloco.md, "Elastic workers").
 *
 * The coordinator (worker 0, the founder) decides every outer step's members: the members
 * send it their outer gradient, it averages those that arrived by the deadline (in worker
 * order, its own included), and sends the mean and the member list back; every member
 * (the coordinator too) applies the same outer step to the same round-start parameters
 * with the same momentum, so the members stay bitwise identical. A member that does not
 * hear back in time ends (its launcher restarts it as a joiner). The coordinator has no
 * successor: when it dies its launcher starts it again, without --elastic-join, from its
 * newest checkpoint, and it founds the group again (one authority). After an outer step the
 * coordinator looks up the names of the workers not in the group and connects to the
 * ones published: each gets the round-start parameters, the outer momentum and the step.
 * Streaming (--outer-fragments F > 1): the same exchange for one fragment at a time, at the
 * one-job mode's steps, run by the lead's exchange thread during the next two inner steps
 * (MPI_THREAD_MULTIPLE; else at the sync), and the parameters mixed with the fragment's new
 * round-start values two steps later, where the one-job mode's overlapped exchange lands. */
#ifndef LOOM_PARALLEL_OUTER_ELASTIC_H
#define LOOM_PARALLEL_OUTER_ELASTIC_H

#include "parallel/outer.h"

/* --elastic-worker: the mesh of this job becomes worker I of W (its data slice and output
 * files). */
void loom_outer_elastic_mesh(loom_mesh *m, const loom_outer_config *c);

#endif
