#include "comm/liveness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

loom_status loom_liveness_open(loom_liveness *l, loom_error *err) {
    l->fd = -1;
    l->endpoint[0] = 0;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        const int e = errno;
        if (fd >= 0) close(fd);
        return loom_error_set(err, LOOM_ERR_IO, "liveness socket: %s", strerror(e));
    }
    char addrs[200];
    host_addresses(addrs, sizeof addrs);
    snprintf(l->endpoint, sizeof l->endpoint, "%s:%u", addrs, (unsigned)ntohs(a.sin_port));
    l->fd = fd;
    return LOOM_OK;
}

void loom_liveness_close(loom_liveness *l) {
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
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

int loom_liveness_probe(const char *endpoint, double timeout_ms) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", endpoint);
    char *colon = strrchr(buf, ':');
    if (!colon) return 0;
    *colon = 0;
    char *end = NULL;
    const unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || port == 0 || port > 65535) return 0;
    struct pollfd pf[MAX_ADDRS];
    int n = 0;
    char *save = NULL;
    for (char *ip = strtok_r(buf, ",", &save); ip && n < MAX_ADDRS;
         ip = strtok_r(NULL, ",", &save)) {
        const int fd = connect_start(ip, (unsigned)port);
        if (fd >= 0) pf[n].fd = fd, pf[n].events = POLLOUT, pf[n].revents = 0, n++;
    }
    int alive = 0, open = n;
    const double until = loom_now_ms() + timeout_ms;
    while (!alive && open > 0) {
        const double left = until - loom_now_ms();
        if (left <= 0 || poll(pf, (nfds_t)n, (int)left + 1) < 0) {
            if (left > 0 && errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < n; i++) {
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            int e = 0;
            socklen_t len = sizeof e;
            if (getsockopt(pf[i].fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e == 0) alive = 1;
            close(pf[i].fd);
            pf[i].fd = -1; /* poll skips negative descriptors */
            open--;
        }
    }
    for (int i = 0; i < n; i++)
        if (pf[i].fd >= 0) close(pf[i].fd);
    return alive;
}
