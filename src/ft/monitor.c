#include "ft/monitor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

loom_status loom_monitor_open(loom_monitor *m, const char *bind_addr, const char *addr_for_ranks,
                              int64_t max_steps, loom_error *err) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    loom_status st = loom_beat_token_new(m->token, err);
    if (st) return st;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(bind_addr, "0", &hints, &res);
    if (rc != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: --bind '%s': %s", bind_addr,
                              gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return loom_error_set(err, LOOM_ERR_IO, "loom run: heartbeat socket on %s: %s", bind_addr,
                              strerror(e));
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    /* A big receive buffer: every rank may beat at once after a step. */
    int rcvbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    const char *host = addr_for_ranks && addr_for_ranks[0] ? addr_for_ranks : bind_addr;
    snprintf(m->addr, sizeof m->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    m->fd = fd;
    m->max_steps = max_steps;
    m->loss = malloc((size_t)(max_steps + 1) * sizeof(double));
    if (!m->loss) return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    for (int64_t s = 0; s <= max_steps; s++) m->loss[s] = NAN;
    return LOOM_OK;
}

void loom_monitor_close(loom_monitor *m) {
    if (m->fd >= 0) close(m->fd);
    m->fd = -1;
    free(m->ranks);
    free(m->loss);
    m->ranks = NULL;
    m->loss = NULL;
}

loom_status loom_monitor_reset(loom_monitor *m, int world, int attempt, loom_error *err) {
    m->attempt = attempt;
    free(m->ranks);
    m->ranks = calloc((size_t)world, sizeof *m->ranks);
    m->world = world;
    if (!m->ranks) return loom_error_set(err, LOOM_ERR_NOMEM, "loom run: out of memory");
    return LOOM_OK;
}

/* New steps of a beat: compute times into the rank's history, losses by step. */
static void record(loom_monitor *m, loom_rank_state *r, const loom_beat *b) {
    int64_t last = r->hist_n ? r->hist_step[(r->hist_n - 1) % LOOM_MONITOR_HISTORY] : 0;
    for (int i = b->n_recent - 1; i >= 0; i--) { /* oldest first */
        int64_t s = b->recent_step[i];
        if (s <= last) continue;
        r->hist_step[r->hist_n % LOOM_MONITOR_HISTORY] = s;
        r->hist_compute[r->hist_n % LOOM_MONITOR_HISTORY] = b->recent_compute_ms[i];
        r->hist_local_loss[r->hist_n % LOOM_MONITOR_HISTORY] = b->recent_local_loss[i];
        r->hist_blocked[r->hist_n % LOOM_MONITOR_HISTORY] = b->recent_blocked_ms[i];
        r->hist_n++;
        last = s;
        if (s >= 1 && s <= m->max_steps) m->loss[s] = b->recent_loss[i];
    }
}

int loom_monitor_drain(loom_monitor *m, double now_ms) {
    int got = 0;
    for (;;) {
        unsigned char buf[2048]; /* larger than a beat, so an oversized datagram shows */
        struct sockaddr_storage src;
        socklen_t src_len = sizeof src;
        ssize_t n = recvfrom(m->fd, buf, sizeof buf, 0, (struct sockaddr *)&src, &src_len);
        if (n < 0) break;
        loom_beat b;
        if (!loom_beat_accept(buf, (size_t)n, m->token, &b) || b.world != m->world ||
            b.attempt != m->attempt) {
            m->rejected++;
            continue;
        }
        loom_rank_state *r = &m->ranks[b.rank];
        if (r->seen && b.pid == r->beat.pid && b.seq <= r->beat.seq) continue; /* reordered */
        if (!r->seen || b.steps_done != r->beat.steps_done) r->steps_changed_ms = now_ms;
        r->seen = 1;
        r->beat = b;
        r->last_beat_ms = now_ms;
        if (getnameinfo((struct sockaddr *)&src, src_len, r->from, sizeof r->from, NULL, 0,
                        NI_NUMERICHOST) != 0)
            r->from[0] = 0;
        record(m, r, &b);
        m->accepted++;
        r->accepted++;
        got++;
    }
    return got;
}

void loom_monitor_excuse_gap(loom_monitor *m, double gap_ms) {
    for (int r = 0; r < m->world; r++) {
        m->ranks[r].last_beat_ms += gap_ms;
        m->ranks[r].steps_changed_ms += gap_ms;
    }
}

int64_t loom_monitor_step(const loom_monitor *m) {
    int64_t s = 0;
    for (int r = 0; r < m->world; r++)
        if (m->ranks[r].seen && m->ranks[r].beat.steps_done > s) s = m->ranks[r].beat.steps_done;
    return s;
}
