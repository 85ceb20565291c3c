/* Which address `loom run` tells the ranks to send heartbeats to (LOOM_FT_ADDR's host).
 * The supervisor's hostname is no answer: on many machines /etc/hosts maps it to a
 * loopback address, which on another host is that host's own loopback. */
#ifndef LOOM_FT_RANK_ADDR_H
#define LOOM_FT_RANK_ADDR_H

#include <stddef.h>

#include "core/error.h"

/* 1 when addr is a wildcard (any interface): "", "0.0.0.0", "::", "*". */
int loom_addr_is_wildcard(const char *addr);

/* The address for the ranks, into out: --bind's own address when it is a concrete one;
 * alone on this host (hosts ""), 127.0.0.1; with --hosts (mpirun "h1:2,h2:2") and a
 * wildcard --bind, the address of this host's interface that routes to the first host of
 * the list that is not this host (found with a connected UDP socket, nothing is sent);
 * loopback when every host is this one. When no host of the list resolves here (a Slurm
 * range "n[1-4]", names only the launcher's agent knows): this host's name's address if
 * that is not loopback, else the one IPv4 address of an interface that is up and not
 * loopback when there is exactly one (a Slurm node or test host with one network), else
 * LOOM_ERR_INPUT naming --hosts and --bind. */
loom_status loom_rank_addr(const char *bind, const char *hosts, char *out, size_t size,
                           loom_error *err);

#endif
