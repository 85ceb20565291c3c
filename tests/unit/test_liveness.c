/* The liveness endpoint (comm/liveness.h) an elastic joiner publishes beside its MPI port:
 * closing a zeroed one never opened touches no descriptor; a probe of an open endpoint
 * answers alive at once, many times over; once it is closed, or the process that opened it
 * is SIGKILLed, the probe answers dead, at once on this host; endpoints that do not parse are dead;
 * an endpoint that does not answer (a full accept queue drops the handshake, as a host that is gone
 * would) is dead after the timeout, not much later; and another listener at the same address and
 * port (one that never answers, or answers another token) is not taken for the process. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/liveness.h"
#include "core/clock.h"
#include "test_common.h"

#define TOKEN "0123456789abcdef0123456789abcdef"

/* The endpoint's port and token ("PORT/TOKEN"). */
static const char *port_of(const char *endpoint) {
    return strrchr(endpoint, ':') + 1;
}

static void test_open_close(void **state) {
    (void)state;
    /* a zeroed endpoint never opened closes to nothing (its fd 0 is not its own) */
    const int stdin_open = fcntl(0, F_GETFD) >= 0;
    loom_liveness zeroed = {0};
    loom_liveness_close(&zeroed);
    assert_int_equal(fcntl(0, F_GETFD) >= 0, stdin_open);
    loom_liveness l;
    loom_error err = {0};
    assert_int_equal(loom_liveness_open(&l, &err), LOOM_OK);
    assert_true(l.fd >= 0);
    assert_non_null(strrchr(l.endpoint, ':'));
    const double t0 = loom_now_ms();
    /* every probe leaves a connection in the never-accepted queue: many still answer */
    for (int i = 0; i < 20; i++) assert_int_equal(loom_liveness_probe(l.endpoint, 2000.0), 1);
    assert_true(loom_now_ms() - t0 < 2000.0);
    char loopback[64];
    snprintf(loopback, sizeof loopback, "127.0.0.1:%s", port_of(l.endpoint));
    assert_int_equal(loom_liveness_probe(loopback, 2000.0), 1);
    loom_liveness_close(&l);
    assert_int_equal(l.fd, -1);
    loom_liveness_close(&l); /* twice: nothing */
    assert_int_equal(loom_liveness_probe(loopback, 2000.0), 0);
    assert_int_equal(loom_liveness_probe(l.endpoint, 2000.0), 0);
}

static void test_killed_process(void **state) {
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        loom_liveness l;
        loom_error err = {0};
        if (loom_liveness_open(&l, &err)) _exit(1);
        (void)!write(fds[1], l.endpoint, sizeof l.endpoint);
        for (;;) pause();
    }
    char endpoint[256] = "";
    assert_int_equal(read(fds[0], endpoint, sizeof endpoint), (ssize_t)sizeof endpoint);
    close(fds[0]), close(fds[1]);
    assert_int_equal(loom_liveness_probe(endpoint, 2000.0), 1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    const double t0 = loom_now_ms();
    assert_int_equal(loom_liveness_probe(endpoint, 2000.0), 0);
    assert_true(loom_now_ms() - t0 < 1000.0); /* refused at once, not timed out */
}

static void test_bad_endpoints(void **state) {
    (void)state;
    const char *bad[] = {"",
                         ":",
                         "127.0.0.1",
                         "127.0.0.1:",
                         "127.0.0.1:0",
                         "127.0.0.1:70000",
                         "127.0.0.1:12x",
                         "not-an-address:80",
                         "1.2.3:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(loom_liveness_probe(bad[i], 500.0), 0);
}

/* A listener on 127.0.0.1 at a port the kernel picks; its port in *port. */
static int listener(unsigned *port, int backlog) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, backlog), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* A listening socket whose accept queue is full: Linux drops further SYNs, so a connect
 * there neither completes nor fails (as to a host that is gone) until the probe's time. */
static int full_listener(unsigned *port, int clients[4]) {
    const int fd = listener(port, 0);
    const struct sockaddr_in a = {.sin_family = AF_INET,
                                  .sin_port = htons((uint16_t)*port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < 4; i++) { /* fill the queue (backlog 0 holds one); never accepted */
        clients[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(clients[i] >= 0);
        (void)!connect(clients[i], (const struct sockaddr *)&a, sizeof a);
    }
    usleep(200 * 1000);
    return fd;
}

static void test_silent_address(void **state) {
    (void)state;
    unsigned port;
    int clients[4];
    const int fd = full_listener(&port, clients);
    char silent[80];
    snprintf(silent, sizeof silent, "127.0.0.1:%u/%s", port, TOKEN);
    const double t0 = loom_now_ms();
    assert_int_equal(loom_liveness_probe(silent, 300.0), 0);
    const double took = loom_now_ms() - t0;
    assert_true(took >= 250.0 && took < 1300.0); /* the timeout, not a refusal */
    /* an endpoint of several addresses: any one that answers makes it alive */
    loom_liveness l;
    loom_error err = {0};
    assert_int_equal(loom_liveness_open(&l, &err), LOOM_OK);
    char both[300];
    snprintf(both, sizeof both, "127.0.0.1,%s", l.endpoint);
    assert_int_equal(loom_liveness_probe(both, 2000.0), 1);
    loom_liveness_close(&l);
    for (int i = 0; i < 4; i++) close(clients[i]);
    close(fd);
}

static void test_impostors(void **state) {
    (void)state;
    char endpoint[80];
    unsigned port;
    /* a process that listens there and never answers: its kernel completes the handshake,
     * which is not the token */
    int fd = listener(&port, 16);
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%u/%s", port, TOKEN);
    double t0 = loom_now_ms();
    assert_int_equal(loom_liveness_probe(endpoint, 300.0), 0);
    assert_true(loom_now_ms() - t0 >= 250.0);
    close(fd);
    /* one that answers with another token, then closes: dead at once */
    fd = listener(&port, 16);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const int c = accept(fd, NULL, NULL);
        (void)!write(c, "fedcba9876543210fedcba9876543210", 32);
        close(c);
        _exit(0);
    }
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%u/%s", port, TOKEN);
    t0 = loom_now_ms();
    assert_int_equal(loom_liveness_probe(endpoint, 2000.0), 0);
    assert_true(loom_now_ms() - t0 < 1000.0);
    waitpid(pid, NULL, 0);
    close(fd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_close),    cmocka_unit_test(test_killed_process),
        cmocka_unit_test(test_bad_endpoints), cmocka_unit_test(test_silent_address),
        cmocka_unit_test(test_impostors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
