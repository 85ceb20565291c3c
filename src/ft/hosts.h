/* The hosts of `loom run` before anything is launched: --hostfile read into the --hosts
 * form, the slots counted against -n, and every host that is not this one named when it
 * is unknown or does not answer the launcher's rsh agent (mpirun's plm_rsh_agent, ssh by
 * default) within a bounded time. */
#ifndef LOOM_FT_HOSTS_H
#define LOOM_FT_HOSTS_H

#include <stddef.h>

#include "core/error.h"

#define LOOM_HOSTS_PROBE_S 10.0 /* the agent's `HOST true` must end within this */

/* Reads an OpenMPI hostfile ("HOST [slots=N] [max_slots=M]" lines, '#' comments, blank
 * lines) into out as "HOST:N,HOST:N" (no slots= = 1 slot, as `--host HOST`); max_slots is
 * checked (>= slots) and otherwise ignored. LOOM_ERR_INPUT naming the file, the line and
 * what was expected. */
loom_status loom_hostfile_read(const char *path, char *out, size_t size, loom_error *err);

/* Slots of a --hosts list ("h1:2,h2,h1:1" = 4: a host without :N is 1 slot). */
int loom_hosts_slots(const char *hosts);

/* The rsh agent mpirun would use: --mca plm_rsh_agent/orte_rsh_agent X in launcher_args,
 * else $OMPI_MCA_plm_rsh_agent, else "ssh"; into out. */
void loom_hosts_agent(const char *launcher_args, char *out, size_t size);

/* Checks hosts (from `source`: "--hosts" or "--hostfile FILE") for `ranks` ranks: the
 * slots (unless oversubscribe), then each distinct host that is not this machine: with
 * ssh, a name must resolve here; every such host must answer `AGENT HOST true` (ssh gets
 * BatchMode and a ConnectTimeout) within timeout_s, all probed at once. LOOM_ERR_INPUT
 * naming the host, the source and what the agent said. */
loom_status loom_hosts_check(const char *hosts, const char *source, int ranks, int oversubscribe,
                             const char *agent, double timeout_s, loom_error *err);

#endif
