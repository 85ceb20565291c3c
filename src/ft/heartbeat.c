#include "ft/heartbeat.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fault.h"
#include "ft/beat.h"

static struct {
    int fd;
    pthread_t thread;
    int running;
    atomic_int stop;
    uint8_t token[LOOM_BEAT_TOKEN_BYTES];
    int rank, world, attempt;
    double interval_ms;
    char host[64];
    loom_beat beat; /* used by the thread only, then by stop() after the join */
} hb = {.fd = -1};

int loom_heartbeat_wanted(void) {
    const char *a = getenv("LOOM_FT_ADDR");
    return a && a[0];
}

static void send_beat(void) {
    loom_beat_fill(&hb.beat, hb.token, hb.rank, hb.world, hb.attempt, hb.host);
    /* Best effort: a lost datagram is covered by the next one. */
    (void)send(hb.fd, &hb.beat, sizeof hb.beat, MSG_DONTWAIT);
}

static void *beat_loop(void *arg) {
    (void)arg;
    const struct timespec poll = {0, 20 * 1000 * 1000};
    int64_t last_steps = -1;
    loom_phase last_phase = LOOM_PHASE_COUNT;
    double last_sent = 0;
    while (!atomic_load(&hb.stop)) {
        int64_t steps = loom_progress_steps_done();
        double now = loom_now_ms();
        /* At once after a step, and when leaving the start-up/loading phases. */
        loom_phase phase = loom_progress_current_phase();
        int phase_news =
            phase != last_phase && (last_phase == LOOM_PHASE_INIT ||
                                    last_phase == LOOM_PHASE_CKPT || phase == LOOM_PHASE_CKPT);
        if (steps != last_steps || phase_news || now - last_sent >= hb.interval_ms) {
            send_beat();
            last_steps = steps;
            last_phase = phase;
            last_sent = now;
        }
        nanosleep(&poll, NULL);
    }
    return NULL;
}

/* "host:port" or "[v6]:port" -> a connected UDP socket. */
static loom_status open_socket(const char *addr, loom_error *err) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || !colon[1])
        return loom_error_set(err, LOOM_ERR_INPUT, "LOOM_FT_ADDR '%s': expected host:port", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "LOOM_FT_ADDR '%s': %s", addr, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return loom_error_set(err, LOOM_ERR_IO, "LOOM_FT_ADDR '%s': %s", addr, strerror(e));
    }
    freeaddrinfo(res);
    hb.fd = fd;
    return LOOM_OK;
}

loom_status loom_heartbeat_start(int rank, int world, loom_error *err) {
    if (!loom_heartbeat_wanted() || hb.running) return LOOM_OK;
    const char *token = getenv("LOOM_FT_TOKEN");
    loom_status st = loom_beat_token_parse(hb.token, token ? token : "", err);
    if (st) return st;
    const char *iv = getenv("LOOM_FT_INTERVAL_MS");
    hb.interval_ms = iv ? atof(iv) : 250.0;
    if (!(hb.interval_ms >= 10 && hb.interval_ms <= 1000)) hb.interval_ms = 250.0;
    hb.rank = rank;
    hb.world = world;
    hb.attempt = loom_fault_attempt_from_env();
    if (gethostname(hb.host, sizeof hb.host) != 0) snprintf(hb.host, sizeof hb.host, "?");
    hb.host[sizeof hb.host - 1] = 0;
    if ((st = open_socket(getenv("LOOM_FT_ADDR"), err))) return st;
    atomic_store(&hb.stop, 0);
    if (pthread_create(&hb.thread, NULL, beat_loop, NULL) != 0) {
        close(hb.fd);
        hb.fd = -1;
        return loom_error_set(err, LOOM_ERR_IO, "heartbeat thread: cannot start");
    }
    hb.running = 1;
    return LOOM_OK;
}

void loom_heartbeat_stop(int failed, const char *msg) {
    if (!hb.running) return;
    atomic_store(&hb.stop, 1);
    pthread_join(hb.thread, NULL);
    hb.running = 0;
    loom_progress_phase(failed ? LOOM_PHASE_FAILED : LOOM_PHASE_DONE);
    loom_beat_fill(&hb.beat, hb.token, hb.rank, hb.world, hb.attempt, hb.host);
    if (failed && msg) snprintf(hb.beat.msg, sizeof hb.beat.msg, "%s", msg);
    for (int i = 0; i < 3; i++) (void)send(hb.fd, &hb.beat, sizeof hb.beat, 0);
    if (failed) {
        /* The caller ends the job next (MPI_Abort): give the other ranks' last beats, which
         * may name the culprit (e.g. whose own loss was NaN), a moment to leave first. */
        const struct timespec pause = {0, 150 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    close(hb.fd);
    hb.fd = -1;
}
