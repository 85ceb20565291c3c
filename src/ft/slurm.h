/* Slurm before `loom run --launcher srun` launches anything: Slurm's controller answers
 * (`scontrol ping`, which also needs munged), and inside an allocation, --hosts and -n
 * agree with it (SLURM_JOB_NODELIST, SLURM_NTASKS). */
#ifndef LOOM_FT_SLURM_H
#define LOOM_FT_SLURM_H

#include <stddef.h>

#include "core/error.h"

#define LOOM_SLURM_PROBE_S 12.0 /* `scontrol ping` must end within this */

/* 1 if host is one of a Slurm host list ("n1,n[2-4,7],gpu[01-02]x": ranges in brackets,
 * zero padding kept), 0 if not. */
int loom_slurm_list_has(const char *list, const char *host);

/* Checks, in order: `scontrol ping` says the primary controller is UP within timeout_s
 * (its most telling line otherwise: munge's error, "is DOWN"); inside an allocation
 * (SLURM_JOB_NODELIST set), every host of `hosts` ("h1:2,h2" or "") is in the
 * allocation and ranks <= SLURM_NTASKS when that is set. LOOM_ERR_INPUT naming the flag
 * or host and what was expected. */
loom_status loom_slurm_check(const char *hosts, int ranks, double timeout_s, loom_error *err);

/* The addresses Slurm knows for the nodes of a host list, or of every node when nodes is
 * NULL or "" (`scontrol show node -o`'s NodeAddr, within timeout_s), comma-separated into
 * out: how many, 0 when Slurm does not say. A submit host outside the allocation
 * (salloc's shell, or srun making its own allocation) may not resolve the nodes' names at
 * all; their NodeAddr is what slurmctld itself reaches them at. */
int loom_slurm_node_addrs(const char *nodes, double timeout_s, char *out, size_t size);

#endif
