#include "ft/hosts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"

#define MAX_PROBES 256

/* The next "host[:slots]" of a --hosts list: 1 and host/slots set, 0 at the end. */
static int next_host(const char **p, char *host, size_t size, int *slots) {
    while (**p == ',') (*p)++;
    if (!**p) return 0;
    size_t n = strcspn(*p, ",");
    snprintf(host, size, "%.*s", (int)(n < size ? n : size - 1), *p);
    *p += n;
    *slots = 1;
    char *colon = strrchr(host, ':'); /* "h:slots"; a bare IPv6 address has several */
    if (colon && strchr(host, ':') == colon) {
        char *end = NULL;
        long x = strtol(colon + 1, &end, 10);
        *slots = colon[1] && !*end && x >= 1 && x <= 1 << 20 ? (int)x : -1; /* -1: bad */
        *colon = 0;
    }
    size_t len = strlen(host);
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        memmove(host, host + 1, len - 2);
        host[len - 2] = 0;
    }
    return 1;
}

int loom_hosts_slots(const char *hosts) {
    char host[256];
    int slots, total = 0;
    for (const char *p = hosts ? hosts : ""; next_host(&p, host, sizeof host, &slots);)
        if (host[0] && slots > 0) total += slots;
    return total;
}

static int to_count(const char *v, int *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < 1 || x > 1 << 20) return -1;
    *out = (int)x;
    return 0;
}

loom_status loom_hostfile_read(const char *path, char *out, size_t size, loom_error *err) {
    FILE *fp = fopen(path, "r");
    if (!fp)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: --hostfile '%s': cannot open: %s",
                              path, strerror(errno));
    out[0] = 0;
    size_t used = 0;
    char line[1024];
    int lineno = 0, hosts = 0;
    loom_status st = LOOM_OK;
    while (!st && fgets(line, sizeof line, fp)) {
        lineno++;
        line[strcspn(line, "#")] = 0;
        line[strcspn(line, "\r\n")] = 0;
        char *save = NULL, *host = strtok_r(line, " \t", &save);
        if (!host) continue;
        int slots = 1, max_slots = 0, bad = strchr(host, '=') != NULL || strchr(host, ',');
        const char *what = host;
        for (char *w; !bad && (w = strtok_r(NULL, " \t", &save));) {
            what = w;
            if (!strncmp(w, "slots=", 6))
                bad = to_count(w + 6, &slots);
            else if (!strncmp(w, "max_slots=", 10) || !strncmp(w, "max-slots=", 10))
                bad = to_count(w + 10, &max_slots);
            else
                bad = 1;
        }
        if (!bad && max_slots && max_slots < slots) {
            bad = 1;
            what = "max_slots < slots";
        }
        if (bad) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "loom run: --hostfile %s:%d: '%s': expected 'HOST [slots=N] "
                                "[max_slots=M]' (N, M >= 1, M >= N)",
                                path, lineno, what);
            break;
        }
        int n = snprintf(out + used, size - used, "%s%s:%d", hosts ? "," : "", host, slots);
        if (n < 0 || (size_t)n >= size - used) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "loom run: --hostfile %s:%d: too many hosts (the list is at most "
                                "%zu characters)",
                                path, lineno, size - 1);
            break;
        }
        used += (size_t)n;
        hosts++;
    }
    fclose(fp);
    if (!st && !hosts)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "loom run: --hostfile %s: no hosts in it (expected lines 'HOST "
                            "[slots=N]')",
                            path);
    return st;
}

void loom_hosts_agent(const char *launcher_args, char *out, size_t size) {
    const char *env = getenv("OMPI_MCA_plm_rsh_agent");
    snprintf(out, size, "%s", env && env[0] ? env : "ssh");
    char words[1100];
    snprintf(words, sizeof words, "%s", launcher_args ? launcher_args : "");
    char *save = NULL, *prev = NULL, *prev2 = NULL;
    for (char *w = strtok_r(words, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
        if (prev2 && (!strcmp(prev2, "--mca") || !strcmp(prev2, "-mca")) &&
            (!strcmp(prev, "plm_rsh_agent") || !strcmp(prev, "orte_rsh_agent")))
            snprintf(out, size, "%s", w);
        prev2 = prev;
        prev = w;
    }
    out[strcspn(out, ":")] = 0; /* "ssh : rsh": the first one */
    size_t n = strlen(out);
    while (n && isspace((unsigned char)out[n - 1])) out[--n] = 0;
}

static int is_local_addr(const struct sockaddr *sa, const struct ifaddrs *ifs) {
    if (sa->sa_family == AF_INET) {
        const struct in_addr *a = &((const struct sockaddr_in *)sa)->sin_addr;
        if ((ntohl(a->s_addr) >> 24) == 127) return 1;
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a->s_addr)
                return 1;
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
                !memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, a, sizeof *a))
                return 1;
    }
    return 0;
}

/* 1: this machine (mpirun starts no daemon through the agent), 0: another, -1: does not
 * resolve here (*why set). */
static int locality(const char *host, const struct ifaddrs *ifs, const char **why) {
    char self[256] = "";
    gethostname(self, sizeof self - 1);
    size_t dot = strcspn(self, ".");
    if (!strcmp(host, "localhost") || !strcmp(host, self) ||
        (strlen(host) == dot && !strncmp(host, self, dot)))
        return 1;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        *why = gai_strerror(rc);
        return -1;
    }
    int local = 0;
    for (struct addrinfo *a = res; a && !local; a = a->ai_next)
        local = is_local_addr(a->ai_addr, ifs);
    freeaddrinfo(res);
    return local;
}

typedef struct {
    char host[256];
    int resolves;
    pid_t pid;
    int fd; /* the agent's stdout + stderr */
    char said[256];
    size_t said_n;
    int status; /* exit code, 128 + signal, -1 = timed out */
} probe;

static void start_probe(probe *p, const char *agent, double timeout_s) {
    p->pid = -1;
    p->fd = -1;
    p->status = 127;
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        snprintf(p->said, sizeof p->said, "pipe: %s", strerror(errno));
        return;
    }
    char words[512], connect_timeout[64];
    snprintf(words, sizeof words, "%s", agent);
    snprintf(connect_timeout, sizeof connect_timeout, "ConnectTimeout=%d",
             (int)(timeout_s > 2 ? timeout_s - 1 : 1));
    char *argv[40];
    int n = 0;
    char *save = NULL;
    for (char *w = strtok_r(words, " \t", &save); w && n < 30; w = strtok_r(NULL, " \t", &save))
        argv[n++] = w;
    const char *base = n ? strrchr(argv[0], '/') : NULL;
    base = base ? base + 1 : (n ? argv[0] : "");
    if (!strcmp(base, "ssh")) {
        argv[n++] = "-o";
        argv[n++] = "BatchMode=yes";
        argv[n++] = "-o";
        argv[n++] = connect_timeout;
    }
    argv[n++] = p->host;
    argv[n++] = "true";
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(p->said, sizeof p->said, "fork: %s", strerror(errno));
        close(pipefd[0]);
        close(pipefd[1]);
        return;
    }
    if (pid == 0) {
        setsid(); /* its own group: a timed-out agent is killed with all it started */
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        dprintf(2, "cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pipefd[1]);
    p->pid = pid;
    p->fd = pipefd[0];
}

/* The agent's last non-empty line, on one line. */
static void last_line(probe *p) {
    p->said[p->said_n] = 0;
    char *s = p->said;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    char *nl = strrchr(s, '\n');
    if (nl) memmove(s, nl + 1, strlen(nl + 1) + 1);
    for (char *c = s; *c; c++)
        if (iscntrl((unsigned char)*c)) *c = ' ';
}

loom_status loom_hosts_check(const char *hosts, const char *source, int ranks, int oversubscribe,
                             const char *agent, double timeout_s, loom_error *err) {
    if (!hosts || !hosts[0]) return LOOM_OK;
    char host[256];
    int s;
    for (const char *p = hosts; next_host(&p, host, sizeof host, &s);)
        if (!host[0] || s < 1)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "loom run: %s: '%s' in '%s': expected HOST or HOST:N (N >= 1 "
                                  "slots)",
                                  source, host, hosts);
    int slots = loom_hosts_slots(hosts);
    if (!oversubscribe && ranks > slots)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: -n %d: more ranks than the %d slot(s) %s gives ('%s'); "
                              "expected -n <= %d",
                              ranks, slots, source, hosts, slots);
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) ifs = NULL;
    static probe probes[MAX_PROBES];
    int np = 0,
        is_ssh = !strcmp(agent, "ssh") || strstr(agent, "/ssh") || !strncmp(agent, "ssh ", 4);
    loom_status st = LOOM_OK;
    for (const char *p = hosts; !st && next_host(&p, host, sizeof host, &s);) {
        if (!host[0]) continue;
        int seen = 0;
        for (int i = 0; i < np; i++) seen |= !strcmp(probes[i].host, host);
        if (seen) continue;
        const char *why = "";
        int where = locality(host, ifs, &why);
        if (where == 1) continue;
        if (where < 0 && is_ssh)
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "loom run: %s: host '%s' is unknown: it does not resolve here "
                                "(%s); expected a host name or address of a machine to run on",
                                source, host, why);
        else if (np == MAX_PROBES)
            break; /* more distinct hosts than probed at once: mpirun checks the rest */
        else {
            memset(&probes[np], 0, sizeof probes[np]);
            snprintf(probes[np].host, sizeof probes[np].host, "%s", host);
            probes[np++].resolves = where == 0;
        }
    }
    if (ifs) freeifaddrs(ifs);
    if (st) return st;
    for (int i = 0; i < np; i++) start_probe(&probes[i], agent, timeout_s);
    double deadline = loom_now_ms() + timeout_s * 1e3;
    for (;;) {
        struct pollfd fds[MAX_PROBES];
        int idx[MAX_PROBES], nf = 0;
        for (int i = 0; i < np; i++)
            if (probes[i].fd >= 0) {
                fds[nf].fd = probes[i].fd;
                fds[nf].events = POLLIN;
                idx[nf++] = i;
            }
        double left = deadline - loom_now_ms();
        if (!nf || left <= 0) break;
        if (poll(fds, (nfds_t)nf, (int)(left < 100 ? 100 : left)) < 0 && errno != EINTR) break;
        for (int k = 0; k < nf; k++) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            probe *p = &probes[idx[k]];
            char buf[256];
            ssize_t r = read(p->fd, buf, sizeof buf);
            if (r > 0) { /* keep the newest bytes */
                size_t keep = sizeof p->said - 1;
                if ((size_t)r >= keep) {
                    memcpy(p->said, buf + r - keep, keep);
                    p->said_n = keep;
                } else {
                    if (p->said_n + (size_t)r > keep) {
                        size_t drop = p->said_n + (size_t)r - keep;
                        memmove(p->said, p->said + drop, p->said_n - drop);
                        p->said_n -= drop;
                    }
                    memcpy(p->said + p->said_n, buf, (size_t)r);
                    p->said_n += (size_t)r;
                }
            } else if (r == 0 || errno != EINTR) {
                close(p->fd);
                p->fd = -1;
            }
        }
    }
    for (int i = 0; i < np; i++) {
        probe *p = &probes[i];
        if (p->pid <= 0) continue;
        int ws = 0;
        if (p->fd >= 0) { /* still open at the deadline: timed out */
            kill(-p->pid, SIGKILL);
            close(p->fd);
            p->fd = -1;
            waitpid(p->pid, &ws, 0);
            p->status = -1;
            continue;
        }
        /* output closed: the agent ends now (or its children held the pipe: bounded) */
        double until = loom_now_ms() + 2e3;
        pid_t r;
        while ((r = waitpid(p->pid, &ws, WNOHANG)) == 0 && loom_now_ms() < until) usleep(10000);
        if (r == 0) {
            kill(-p->pid, SIGKILL);
            waitpid(p->pid, &ws, 0);
            p->status = -1;
        } else
            p->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        kill(-p->pid, SIGKILL); /* anything the agent left behind in its group */
    }
    for (int i = 0; i < np && !st; i++) {
        probe *p = &probes[i];
        if (p->status == 0) continue;
        last_line(p);
        char what[400];
        if (p->status < 0)
            snprintf(what, sizeof what, "did not end within %g s", timeout_s);
        else
            snprintf(what, sizeof what, "failed (exit %d%s%s)", p->status, p->said[0] ? ": " : "",
                     p->said);
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "loom run: %s: host '%s' %s: '%s %s true' %s; expected a host that "
                            "the launcher's rsh agent reaches (--mca plm_rsh_agent, default ssh)",
                            source, p->host,
                            p->resolves ? "does not answer" : "is unknown (does not resolve here)",
                            agent, p->host, what);
    }
    return st;
}

double loom_host_rtt_ms(const char *addr, int timeout_ms) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST;
    if (!addr[0] || getaddrinfo(addr, "9", &hints, &res) != 0) return -1;
    double rtt = -1;
    const double t0 = loom_now_ms();
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc == 0 || errno == ECONNREFUSED)
            rtt = loom_now_ms() - t0;
        else if (errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int e = 0;
            socklen_t len = sizeof e;
            if (poll(&p, 1, timeout_ms) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 &&
                (e == 0 || e == ECONNREFUSED))
                rtt = loom_now_ms() - t0;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rtt;
}

int loom_host_answers(const char *addr) {
    return loom_host_rtt_ms(addr, 1000) >= 0;
}

int loom_host_await(const char *addr, double until_ms, const volatile sig_atomic_t *stop,
                    int *said) {
    int back = loom_host_answers(addr);
    while (!back && !*stop && loom_now_ms() < until_ms) {
        if (said && !*said)
            fprintf(stderr,
                    "loom run: host %s does not answer: waiting up to %.0f s before the "
                    "restart\n",
                    addr, (until_ms - loom_now_ms()) * 1e-3);
        if (said) *said = 1;
        usleep(200000);
        back = loom_host_answers(addr);
    }
    return back;
}

int loom_hosts_remote(const loom_monitor *m, int world, const char *self, const char *skip_host,
                      const char *skip_addr, char (*addr)[64], char (*host)[64], int max) {
    int n = 0;
    for (int r = 0; r < world && n < max; r++) {
        const loom_rank_state *rs = &m->ranks[r];
        if (!rs->seen || !rs->from[0] || !strcmp(rs->beat.host, self) ||
            (skip_host[0] && !strcmp(rs->beat.host, skip_host)) || !strcmp(rs->from, skip_addr))
            continue;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= !strcmp(addr[i], rs->from);
        if (dup) continue;
        snprintf(addr[n], 64, "%s", rs->from);
        if (host) snprintf(host[n], 64, "%s", rs->beat.host);
        n++;
    }
    return n;
}

int loom_hosts_restart_addrs(const loom_monitor *m, const char *self, const char *hosts,
                             const char *skip, const char *skip_addr, char (*addrs)[64], int max) {
    int n = loom_hosts_remote(m, m->world, self, skip, skip_addr, addrs, NULL, max);
    for (const char *p = hosts; *p && n < max;) {
        const size_t w = strcspn(p, ",");
        char host[64];
        snprintf(host, sizeof host, "%.*s", (int)(w < sizeof host ? w : sizeof host - 1), p);
        p += w + (p[w] == ',');
        char *colon = strrchr(host, ':');
        if (colon && strchr(host, ':') == colon) *colon = 0; /* slots (not an IPv6 address) */
        unsigned char bin[16];
        if (inet_pton(AF_INET, host, bin) != 1 && inet_pton(AF_INET6, host, bin) != 1) continue;
        int dup = skip_addr[0] && !strcmp(host, skip_addr);
        for (int i = 0; i < n; i++) dup |= !strcmp(addrs[i], host);
        if (!dup) snprintf(addrs[n++], 64, "%s", host);
    }
    return n;
}

int loom_hosts_probe_links(loom_link_watch *w, const loom_monitor *m, int world, const char *self,
                           double now, loom_slow_link *out) {
    if (!w->n) { /* the hosts: where the ranks' beats come from, not this one */
        char addr[16][64], host[16][64];
        w->n = loom_hosts_remote(m, world, self, "", "", addr, host, 16);
        for (int i = 0; i < w->n; i++) {
            memset(&w->probes[i], 0, sizeof w->probes[i]);
            snprintf(w->probes[i].addr, sizeof w->probes[i].addr, "%s", addr[i]);
            snprintf(w->probes[i].host, sizeof w->probes[i].host, "%s", host[i]);
        }
        if (!w->n) w->n = -1; /* every rank on this host: nothing to probe */
    }
    if (w->n <= 0) return 0;
    loom_link_probe *next = NULL;
    for (int i = 0; i < w->n; i++)
        if (w->probes[i].next_ms <= now && (!next || w->probes[i].next_ms < next->next_ms))
            next = &w->probes[i];
    if (!next) return 0;
    const double rtt = loom_host_rtt_ms(next->addr, 300);
    /* No answer (a firewall, a cut): not a sample; asked again later. */
    next->next_ms = now + (rtt < 0 ? 2000 : 100.0 * w->n);
    if (rtt < 0) return 0;
    next->rtt_ms[next->n++ % LOOM_LINK_SAMPLES] = rtt;
    return loom_detect_slow_link(m, w->probes, w->n, 10.0, out);
}

/* Runs argv (stdio on /dev/null, its own session) for at most 5 s, then kills it. */
static void run_bounded(char **argv) {
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid < 0) return;
    const double until = loom_now_ms() + 5e3;
    while (waitpid(pid, NULL, WNOHANG) == 0 && loom_now_ms() < until) usleep(20000);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, WNOHANG);
}

void loom_hosts_stop_remote_ranks(const loom_monitor *m, const char *self, const char *agent) {
    for (int r = 0; r < m->world; r++) {
        const loom_rank_state *rs = &m->ranks[r];
        if (!rs->seen || !strcmp(rs->beat.host, self) || !rs->from[0]) continue;
        int first = 1;
        for (int q = 0; q < r; q++)
            first &= !(m->ranks[q].seen && !strcmp(m->ranks[q].from, rs->from));
        if (!first) continue;
        char words[512], pids[16][16];
        snprintf(words, sizeof words, "%s", agent);
        char *argv[64];
        int n = 0, np = 0;
        for (char *save = NULL, *w = strtok_r(words, " \t", &save); w && n < 30;
             w = strtok_r(NULL, " \t", &save))
            argv[n++] = w;
        argv[n++] = (char *)rs->from;
        argv[n++] = "kill";
        argv[n++] = "-9";
        for (int q = r; q < m->world && np < 16; q++)
            if (m->ranks[q].seen && !strcmp(m->ranks[q].from, rs->from)) {
                snprintf(pids[np], sizeof pids[np], "%d", (int)m->ranks[q].beat.pid);
                argv[n++] = pids[np++];
            }
        argv[n] = NULL;
        run_bounded(argv);
    }
}

int loom_hosts_drop(char *hosts, size_t size, const char *name, const char *addr) {
    char out[size];
    out[0] = 0;
    size_t k = 0;
    int slots = 0;
    for (const char *p = hosts; *p;) {
        size_t w = strcspn(p, ",");
        char entry[256];
        snprintf(entry, sizeof entry, "%.*s", (int)(w < sizeof entry ? w : sizeof entry - 1), p);
        p += w + (p[w] == ',');
        char host[256];
        snprintf(host, sizeof host, "%s", entry);
        char *colon = strrchr(host, ':');
        int n = 1;
        if (colon && strchr(host, ':') == colon) {
            n = atoi(colon + 1);
            *colon = 0;
        }
        if (!strcmp(host, name) || !strcmp(host, addr)) continue;
        slots += n;
        k += (size_t)snprintf(out + k, size - k, "%s%s", k ? "," : "", entry);
    }
    snprintf(hosts, size, "%s", out);
    return slots;
}
