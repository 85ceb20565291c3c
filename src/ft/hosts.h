/* The hosts of `loom run`. Before anything is launched: --hostfile read into the --hosts
 * form, the slots counted against -n, and every host that is not this one named when it
 * is unknown or does not answer the launcher's rsh agent (mpirun's plm_rsh_agent, ssh by
 * default) within a bounded time. While the job runs and between attempts: the other
 * hosts the ranks beat from, probed on the network (round trips, slow links, a host
 * answering again), their ranks ended through the rsh agent, a lost host dropped. */
#ifndef LOOM_FT_HOSTS_H
#define LOOM_FT_HOSTS_H

#include <signal.h>
#include <stddef.h>

#include "core/error.h"
#include "ft/detect.h"
#include "ft/monitor.h"

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

/* One round trip to `addr` (a numeric address; a TCP connection to port 9, refused or
 * accepted), in ms, or -1 when there is no answer within timeout_ms. */
double loom_host_rtt_ms(const char *addr, int timeout_ms);

/* A lost or cut-off host answers on the network again: a TCP connection to its address
 * (port 9: refused is an answer, silence or "unreachable" is not) within 1 s. */
int loom_host_answers(const char *addr);

/* Asks `addr` (loom_host_answers) every 200 ms until it answers, until_ms (loom_now_ms
 * clock) passes or *stop is set; 1 when it answered. With `said`, a first question left
 * unanswered while there is time to wait prints "loom run: host ADDR does not answer:
 * waiting up to N s before the restart" and sets *said. */
int loom_host_await(const char *addr, double until_ms, const volatile sig_atomic_t *stop,
                    int *said);

/* The other hosts the ranks 0..world-1 of m beat from (not `self`, this host's name), each
 * once: addresses and, when `host` is given, names; a host named skip_host or at skip_addr
 * ("": none) left out. At most max. */
int loom_hosts_remote(const loom_monitor *m, int world, const char *self, const char *skip_host,
                      const char *skip_addr, char (*addr)[64], char (*host)[64], int max);

/* The hosts a restart across hosts waits for: those of loom_hosts_remote (every rank of
 * the last attempt) and those of the --hosts list `hosts` given by address (a start-up
 * failure hears no rank), each once; `skip` / `skip_addr` (a host already waited for:
 * its name and address, or "") left out. At most max. */
int loom_hosts_restart_addrs(const loom_monitor *m, const char *self, const char *hosts,
                             const char *skip, const char *skip_addr, char (*addrs)[64], int max);

/* Slow links (ft/detect.h): the hosts the ranks beat from (not `self`), found on the first
 * call; one of them probed per call, each every 100 ms x hosts in turn (a host that does
 * not answer: asked again 2 s later, no sample). */
typedef struct {
    loom_link_probe probes[16];
    int n; /* 0: not looked for yet; -1: every rank on this host, nothing to probe */
} loom_link_watch;

/* Probes the next host of w due at `now`; 1 and *out filled when loom_detect_slow_link
 * names a slow link (each host once per attempt), else 0. */
int loom_hosts_probe_links(loom_link_watch *w, const loom_monitor *m, int world, const char *self,
                           double now, loom_slow_link *out);

/* Ends the ranks of m's stopped attempt that ran on other hosts than `self` (a cut-off
 * host keeps them: mpirun could not reach them): `AGENT HOST kill -9 PID...` per host, by
 * the pids their beats gave, each bounded to 5 s. */
void loom_hosts_stop_remote_ranks(const loom_monitor *m, const char *self, const char *agent);

/* Drops the entries of host `name` or `addr` from the --hosts list `hosts` (size bytes,
 * rewritten in place); the slots left. */
int loom_hosts_drop(char *hosts, size_t size, const char *name, const char *addr);

#endif
