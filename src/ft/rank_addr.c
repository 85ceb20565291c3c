#include "ft/rank_addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int loom_addr_is_wildcard(const char *addr) {
    return !addr || !addr[0] || !strcmp(addr, "0.0.0.0") || !strcmp(addr, "::") ||
           !strcmp(addr, "*");
}

static int is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* This host's address on the route to `host`: 0 and *local set, or -1 (not resolved). */
static int route_to(const char *host, struct sockaddr_storage *local, const char **why) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    int rc = getaddrinfo(host, "9", &hints, &res);
    if (rc != 0) {
        *why = gai_strerror(rc);
        return -1;
    }
    int ok = -1;
    for (struct addrinfo *a = res; a && ok; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        socklen_t len = sizeof *local;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)local, &len) == 0)
            ok = 0;
        else
            *why = strerror(errno);
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

loom_status loom_rank_addr(const char *bind, const char *hosts, char *out, size_t size,
                           loom_error *err) {
    if (!loom_addr_is_wildcard(bind)) {
        snprintf(out, size, "%s", bind);
        return LOOM_OK;
    }
    snprintf(out, size, "127.0.0.1");
    if (!hosts || !hosts[0]) return LOOM_OK;
    char first[256] = "";
    const char *why = "";
    int resolved = 0;
    for (const char *p = hosts; *p;) {
        size_t n = strcspn(p, ",");
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)(n < sizeof host ? n : sizeof host - 1), p);
        p += n + (p[n] == ',');
        char *colon = strrchr(host, ':'); /* "h:slots"; a bare IPv6 address has several */
        if (colon && strchr(host, ':') == colon) *colon = 0;
        if (host[0] == '[' && host[strlen(host) - 1] == ']') {
            memmove(host, host + 1, strlen(host));
            host[strlen(host) - 1] = 0;
        }
        if (!host[0]) continue;
        if (!first[0]) snprintf(first, sizeof first, "%s", host);
        struct sockaddr_storage local;
        if (route_to(host, &local, &why) != 0) continue;
        resolved = 1;
        if (is_loopback(&local)) continue; /* this host itself: look further */
        char text[INET6_ADDRSTRLEN] = "";
        const void *a = local.ss_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)&local)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr;
        inet_ntop(local.ss_family, a, text, sizeof text);
        snprintf(out, size, "%s", text);
        return LOOM_OK;
    }
    /* None resolves here (e.g. a Slurm range "node[1-4]"): this host's name, when it
     * resolves to an address that is not loopback. */
    char self[256];
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    if (!resolved && gethostname(self, sizeof self) == 0 &&
        getaddrinfo(self, NULL, &hints, &res) == 0) {
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            struct sockaddr_storage ss = {0};
            memcpy(&ss, a->ai_addr, a->ai_addrlen);
            if (is_loopback(&ss)) continue;
            char text[INET6_ADDRSTRLEN] = "";
            if (getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, NULL, 0,
                            NI_NUMERICHOST) != 0)
                continue;
            snprintf(out, size, "%s", text);
            resolved = 1;
            break;
        }
        freeaddrinfo(res);
    }
    /* Nor this host's name (hosts only Slurm or the launcher's agent knows, e.g. test
     * hosts in network namespaces): the one address of an interface that is up and not
     * loopback, when there is exactly one. */
    if (!resolved) {
        struct ifaddrs *ifs = NULL;
        char only[INET6_ADDRSTRLEN] = "";
        int count = 0;
        if (getifaddrs(&ifs) == 0) {
            for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
                if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                    (i->ifa_flags & IFF_LOOPBACK))
                    continue;
                struct sockaddr_storage ss = {0};
                memcpy(&ss, i->ifa_addr, sizeof(struct sockaddr_in));
                if (is_loopback(&ss)) continue;
                count++;
                inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, only,
                          sizeof only);
            }
            freeifaddrs(ifs);
        }
        if (count == 1) {
            snprintf(out, size, "%s", only);
            return LOOM_OK;
        }
    }
    if (!resolved)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "loom run: --hosts '%s': cannot find this host's address on the "
                              "ranks' network ('%s': %s): give --bind ADDR, the address of this "
                              "host that the ranks reach",
                              hosts, first, why);
    return LOOM_OK;
}
