#include "ft/slurm.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"

/* One "prefix[ranges]suffix" or plain name of a list against host. */
static int item_has(const char *item, size_t n, const char *host) {
    const char *lb = memchr(item, '[', n);
    if (!lb) return strlen(host) == n && !strncmp(item, host, n);
    const char *rb = memchr(lb, ']', n - (size_t)(lb - item));
    if (!rb) return 0;
    const size_t pre = (size_t)(lb - item), suf = n - (size_t)(rb + 1 - item);
    const size_t hl = strlen(host);
    if (hl < pre + suf + 1 || strncmp(host, item, pre) || strncmp(host + hl - suf, rb + 1, suf))
        return 0;
    char num[32];
    const size_t nl = hl - pre - suf;
    if (nl >= sizeof num) return 0;
    memcpy(num, host + pre, nl);
    num[nl] = 0;
    for (size_t i = 0; i < nl; i++)
        if (!isdigit((unsigned char)num[i])) return 0;
    const long v = strtol(num, NULL, 10);
    for (const char *p = lb + 1; p < rb;) {
        size_t m = strcspn(p, ",]");
        if (p + m > rb) m = (size_t)(rb - p);
        char r[64];
        snprintf(r, sizeof r, "%.*s", (int)(m < sizeof r ? m : sizeof r - 1), p);
        p += m + 1;
        char *dash = strchr(r, '-'), *end = NULL;
        const long lo = strtol(r, &end, 10);
        const long hi = dash ? strtol(dash + 1, NULL, 10) : lo;
        const size_t width = dash ? (size_t)(dash - r) : strlen(r);
        /* zero padding: "01-12" names "01" .. "12", all of width 2 */
        const int padded = width > 1 && r[0] == '0';
        if (v >= lo && v <= hi && (padded ? nl == width : nl == 1 || num[0] != '0')) return 1;
    }
    return 0;
}

int loom_slurm_list_has(const char *list, const char *host) {
    if (!list || !host || !host[0]) return 0;
    for (const char *p = list; *p;) {
        size_t n = 0; /* up to the next comma outside brackets */
        int depth = 0;
        while (p[n] && (depth || p[n] != ',')) {
            depth += p[n] == '[';
            depth -= p[n] == ']';
            n++;
        }
        if (n && item_has(p, n, host)) return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* Runs argv with stdout + stderr into out (the newest bytes), killed after timeout_s:
 * its exit code, 128 + signal, -1 if it timed out, 127 if it cannot run. */
static int run_bounded(char *const argv[], double timeout_s, char *out, size_t size) {
    out[0] = 0;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(out, size, "pipe: %s", strerror(errno));
        return 127;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(out, size, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 127;
    }
    if (pid == 0) {
        setsid();
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        dprintf(2, "cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    const double deadline = loom_now_ms() + timeout_s * 1e3;
    int timed_out = 0;
    for (;;) {
        const double left = deadline - loom_now_ms();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, (int)left + 1) < 0 && errno != EINTR) break;
        if (!pfd.revents) continue;
        char buf[512];
        ssize_t r = read(fds[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++) {
            if (n + 1 >= size) { /* keep the newest half */
                memmove(out, out + size / 2, n - size / 2);
                n -= size / 2;
            }
            out[n++] = buf[i];
        }
    }
    out[n] = 0;
    close(fds[0]);
    int ws = 0;
    if (timed_out) kill(-pid, SIGKILL);
    waitpid(pid, &ws, 0);
    kill(-pid, SIGKILL); /* whatever it left in its group */
    if (timed_out) return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* The most telling line of scontrol's output: munge's complaint, a "cannot run", the
 * controller's state, else the first line. */
static void telling_line(char *text, char *out, size_t size) {
    const char *keys[] = {"Munge", "munge", "cannot run", "Unable to contact", "is DOWN", NULL};
    out[0] = 0;
    for (int k = 0; keys[k] && !out[0]; k++)
        for (char *save = NULL, *l = strtok_r(text, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save)) {
            if (!strstr(l, keys[k])) continue;
            snprintf(out, size, "%s", l);
            break;
        }
    if (!out[0]) snprintf(out, size, "%s", text);
    for (char *c = out; *c; c++)
        if (iscntrl((unsigned char)*c)) *c = ' ';
}

loom_status loom_slurm_check(const char *hosts, int ranks, double timeout_s, loom_error *err) {
    char said[4096], copy[4096], line[512];
    char *ping[] = {"scontrol", "ping", NULL};
    const int rc = run_bounded(ping, timeout_s, said, sizeof said);
    snprintf(copy, sizeof copy, "%s", said);
    if (rc != 0 || !strstr(said, "is UP")) {
        if (rc == 127 && strstr(said, "cannot run"))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "loom run: --launcher srun: 'scontrol' not found: expected "
                                  "Slurm's commands (srun, scontrol) on PATH");
        telling_line(copy, line, sizeof line);
        char what[64];
        if (rc < 0)
            snprintf(what, sizeof what, "did not end within %g s", timeout_s);
        else
            snprintf(what, sizeof what, "exit %d", rc);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --launcher srun: Slurm does not answer ('scontrol ping' "
                              "%s%s%s); expected a running slurmctld and munged (or --launcher "
                              "mpirun)",
                              what, line[0] ? ": " : "", line);
    }
    const char *nodes = getenv("SLURM_JOB_NODELIST");
    if (!nodes || !nodes[0]) return LOOM_OK; /* srun makes its own allocation */
    for (const char *p = hosts ? hosts : ""; *p;) {
        size_t n = strcspn(p, ",");
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)(n < sizeof host ? n : sizeof host - 1), p);
        p += n + (p[n] == ',');
        char *colon = strchr(host, ':');
        if (colon) *colon = 0;
        if (host[0] && !loom_slurm_list_has(nodes, host))
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "loom run: --hosts: host '%s' is not in this Slurm allocation "
                                  "(job %s, SLURM_JOB_NODELIST=%s); expected hosts of the "
                                  "allocation, or no --hosts",
                                  host, getenv("SLURM_JOB_ID") ? getenv("SLURM_JOB_ID") : "?",
                                  nodes);
    }
    const char *tasks = getenv("SLURM_NTASKS");
    if (tasks && atoi(tasks) > 0 && ranks > atoi(tasks))
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: -n %d: more ranks than this Slurm allocation's %d "
                              "task(s) (SLURM_NTASKS); expected -n <= %d",
                              ranks, atoi(tasks), atoi(tasks));
    return LOOM_OK;
}

int loom_slurm_node_addrs(const char *nodes, double timeout_s, char *out, size_t size) {
    out[0] = 0;
    if (size < 2) return 0;
    char said[8192];
    char *show[] = {"scontrol", "show", "node", "-o", nodes && nodes[0] ? (char *)nodes : NULL,
                    NULL};
    if (run_bounded(show, timeout_s, said, sizeof said) != 0) return 0;
    int found = 0;
    size_t at = 0;
    for (char *save = NULL, *l = strtok_r(said, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        const char *a = strstr(l, "NodeAddr=");
        if (!a) continue;
        a += strlen("NodeAddr=");
        const size_t n = strcspn(a, " \t");
        if (!n || at + n + 2 > size) continue;
        if (found) out[at++] = ',';
        memcpy(out + at, a, n);
        at += n;
        out[at] = 0;
        found++;
    }
    return found;
}
