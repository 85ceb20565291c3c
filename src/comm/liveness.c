#include "comm/liveness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"

#define MAX_ADDRS 8

/* This host's IPv4 addresses that are up and not loopback, comma-separated into buf (at
 * most MAX_ADDRS); "127.0.0.1" when there is none. */
static void host_addresses(char *buf, size_t n) {
    struct ifaddrs *all = NULL;
    size_t at = 0;
    int count = 0;
    buf[0] = 0;
    if (getifaddrs(&all) == 0) {
        for (const struct ifaddrs *i = all; i && count < MAX_ADDRS; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                (i->ifa_flags & IFF_LOOPBACK))
                continue;
            char ip[INET_ADDRSTRLEN];
            const struct sockaddr_in *a = (const struct sockaddr_in *)i->ifa_addr;
            if (!inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip)) continue;
            const int w = snprintf(buf + at, n - at, "%s%s", count ? "," : "", ip);
            if (w < 0 || (size_t)w >= n - at) {
                buf[at] = 0; /* this one does not fit: the ones before stand */
                break;
            }
            at += (size_t)w, count++;
        }
        freeifaddrs(all);
    }
    if (!count) snprintf(buf, n, "127.0.0.1");
}

/* The answering thread: every connection gets the token, then is closed; it ends when
 * stop_fd is written. */
static void *answer(void *arg) {
    loom_liveness *l = arg;
    struct pollfd pf[2] = {{.fd = l->fd, .events = POLLIN}, {.fd = l->stop_fd, .events = POLLIN}};
    for (;;) {
        if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
        if (pf[1].revents) break;
        if (!(pf[0].revents & POLLIN)) continue;
        const int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) continue;
        /* 32 bytes into a fresh connection's empty send buffer: never blocks */
        (void)!send(c, l->token, LOOM_LIVENESS_TOKEN_CHARS, MSG_NOSIGNAL | MSG_DONTWAIT);
        close(c);
    }
    return NULL;
}

static loom_status random_token(char *token, loom_error *err) {
    uint8_t r[LOOM_LIVENESS_TOKEN_CHARS / 2];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return loom_error_set(err, LOOM_ERR_IO, "liveness token: getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof r; i++) snprintf(token + 2 * i, 3, "%02x", r[i]);
    return LOOM_OK;
}

loom_status loom_liveness_open(loom_liveness *l, loom_error *err) {
    memset(l, 0, sizeof *l);
    l->fd = l->stop_fd = -1;
    loom_status st = random_token(l->token, err);
    if (st) return st;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    l->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (l->fd < 0 || l->stop_fd < 0 || bind(l->fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(l->fd, SOMAXCONN) != 0 || getsockname(l->fd, (struct sockaddr *)&a, &len) != 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "liveness socket: %s", strerror(errno));
    } else if (pthread_create(&l->thread, NULL, answer, l) != 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "liveness socket: cannot start its thread");
    } else {
        l->running = 1;
        char addrs[160];
        host_addresses(addrs, sizeof addrs);
        snprintf(l->endpoint, sizeof l->endpoint, "%s:%u/%s", addrs, (unsigned)ntohs(a.sin_port),
                 l->token);
        return LOOM_OK;
    }
    if (l->fd >= 0) close(l->fd);
    if (l->stop_fd >= 0) close(l->stop_fd);
    l->fd = l->stop_fd = -1;
    return st;
}

void loom_liveness_close(loom_liveness *l) {
    if (!l->running) return; /* its descriptors are this endpoint's only while it runs */
    const uint64_t one = 1;
    (void)!write(l->stop_fd, &one, sizeof one);
    pthread_join(l->thread, NULL);
    close(l->fd);
    close(l->stop_fd);
    l->fd = l->stop_fd = -1;
    l->running = 0;
}

/* A non-blocking connect to ip:port started: the socket, or -1 if it failed at once. */
static int connect_start(const char *ip, unsigned port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) return -1;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EINPROGRESS) return fd;
    close(fd);
    return -1;
}

/* One probe in flight: connecting (POLLOUT), then reading the answer (POLLIN). */
typedef struct {
    int got;
    char answer[LOOM_LIVENESS_TOKEN_CHARS];
} probe_conn;

/* A readiness event on pf for c: 1 the token came, 0 still waiting, -1 this one failed. */
static int probe_step(struct pollfd *pf, probe_conn *c, const char *token) {
    if (pf->events == POLLOUT) {
        int e = 0;
        socklen_t len = sizeof e;
        if (getsockopt(pf->fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0 || e != 0) return -1;
        pf->events = POLLIN; /* connected: now the answer */
        return 0;
    }
    const ssize_t n =
        recv(pf->fd, c->answer + c->got, LOOM_LIVENESS_TOKEN_CHARS - (size_t)c->got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) return -1; /* closed before the whole token, or an error */
    c->got += (int)n;
    if (memcmp(c->answer, token, (size_t)c->got) != 0) return -1;
    return c->got == LOOM_LIVENESS_TOKEN_CHARS ? 1 : 0;
}

int loom_liveness_probe(const char *endpoint, double timeout_ms) {
    char buf[256], *end = NULL;
    snprintf(buf, sizeof buf, "%s", endpoint);
    char *slash = strrchr(buf, '/');
    if (!slash || strlen(slash + 1) != LOOM_LIVENESS_TOKEN_CHARS) return 0;
    *slash = 0;
    const char *token = slash + 1;
    char *colon = strrchr(buf, ':');
    if (!colon) return 0;
    *colon = 0;
    const unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || port == 0 || port > 65535) return 0;
    struct pollfd pf[MAX_ADDRS];
    probe_conn conn[MAX_ADDRS];
    int n = 0;
    char *save = NULL;
    for (char *ip = strtok_r(buf, ",", &save); ip && n < MAX_ADDRS;
         ip = strtok_r(NULL, ",", &save)) {
        const int fd = connect_start(ip, (unsigned)port);
        if (fd < 0) continue;
        pf[n] = (struct pollfd){.fd = fd, .events = POLLOUT};
        conn[n++].got = 0;
    }
    int alive = 0, open = n;
    const double until = loom_now_ms() + timeout_ms;
    while (!alive && open > 0) {
        const double left = until - loom_now_ms();
        if (left <= 0) break;
        const int ready = poll(pf, (nfds_t)n, (int)left + 1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) break;
        for (int i = 0; i < n && !alive; i++) {
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            const int r = probe_step(&pf[i], &conn[i], token);
            if (r > 0) alive = 1;
            if (r < 0) {
                close(pf[i].fd);
                pf[i].fd = -1; /* poll skips negative descriptors */
                open--;
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (pf[i].fd >= 0) close(pf[i].fd);
    return alive;
}
