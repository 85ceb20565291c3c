/* The address `loom run` tells the ranks to beat to (ft/rank_addr.h): --bind's own when
 * concrete, loopback alone, this host's routed address towards --hosts otherwise, and
 * (unless this host's name has an address that is not loopback) a message naming --hosts
 * and --bind when no host resolves; --launcher-args' words in the
 * launcher's command line, in order, before the program. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>

#include <cmocka.h>

#include "ft/launch_argv.h"
#include "ft/rank_addr.h"
#include "test_common.h"

static void test_concrete_bind(void **state) {
    (void)state;
    char out[64], bind[32];
    loom_error err = {0};
    snprintf(bind, sizeof bind, "10.%d.%d.%d", (int)(rnd() % 256), (int)(rnd() % 256),
             1 + (int)(rnd() % 250));
    assert_int_equal(loom_rank_addr(bind, "h1:2,h2:2", out, sizeof out, &err), LOOM_OK);
    assert_string_equal(out, bind); /* told as given, whatever --hosts says */
    assert_int_equal(loom_rank_addr("127.0.0.1", "", out, sizeof out, &err), LOOM_OK);
    assert_string_equal(out, "127.0.0.1");
    assert_true(loom_addr_is_wildcard("0.0.0.0") && loom_addr_is_wildcard("::") &&
                loom_addr_is_wildcard("") && !loom_addr_is_wildcard(bind));
}

static void test_wildcard(void **state) {
    (void)state;
    char out[64], hosts[128];
    loom_error err = {0};
    assert_int_equal(loom_rank_addr("0.0.0.0", "", out, sizeof out, &err), LOOM_OK);
    assert_string_equal(out, "127.0.0.1"); /* alone on this host */
    snprintf(hosts, sizeof hosts, "localhost:%d,127.0.0.1:%d", 1 + (int)(rnd() % 8),
             1 + (int)(rnd() % 8));
    assert_int_equal(loom_rank_addr("0.0.0.0", hosts, out, sizeof out, &err), LOOM_OK);
    assert_string_equal(out, "127.0.0.1"); /* every host is this one */
    /* no host resolves: this host's name's address if not loopback, else a message that
     * names both flags */
    snprintf(hosts, sizeof hosts, "nohost%d.invalid:2", (int)(rnd() % 1000));
    if (loom_rank_addr("0.0.0.0", hosts, out, sizeof out, &err) == LOOM_OK) {
        assert_string_not_equal(out, "127.0.0.1");
    } else {
        assert_non_null(strstr(err.msg, "--hosts"));
        assert_non_null(strstr(err.msg, "--bind"));
        assert_non_null(strstr(err.msg, hosts));
    }
    /* a remote address (TEST-NET-1; nothing is sent): this host's own address on its route,
     * never loopback; after a loopback host of the list too */
    snprintf(hosts, sizeof hosts, "127.0.0.1:2,192.0.2.%d:2", 1 + (int)(rnd() % 250));
    loom_status st = loom_rank_addr("0.0.0.0", hosts, out, sizeof out, &err);
    if (st == LOOM_ERR_INPUT) { /* no route at all from this machine (no default route) */
        assert_non_null(strstr(err.msg, "--bind"));
        return;
    }
    struct in_addr a;
    assert_int_equal(st, LOOM_OK);
    assert_int_equal(inet_pton(AF_INET, out, &a), 1);
    assert_true((ntohl(a.s_addr) >> 24) != 127);
}

static int index_of(const loom_launch_cmd *c, const char *s) {
    for (int i = 0; i < c->argc; i++)
        if (!strcmp(c->argv[i], s)) return i;
    return -1;
}

static void test_launcher_args(void **state) {
    (void)state;
    char *train[] = {"--steps", "3"};
    for (int srun = 0; srun < 2; srun++) {
        char words[8][32], text[512] = "";
        const int n = 1 + (int)(rnd() % 8);
        size_t len = 0;
        for (int i = 0; i < n; i++) {
            snprintf(words[i], sizeof words[i], "%s%d", i % 2 ? "v" : "--opt", (int)(rnd() % 999));
            const char *sep = !i ? "" : rnd() % 2 ? " \t " : "  "; /* blanks of any kind */
            len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", sep, words[i]);
        }
        loom_launch_spec spec = {srun ? "srun" : "mpirun",
                                 "h1:2,h2:2",
                                 4,
                                 4,
                                 "/tmp/a",
                                 "/x/loom",
                                 NULL,
                                 train,
                                 2,
                                 "",
                                 0,
                                 1,
                                 2,
                                 text};
        static loom_launch_cmd c;
        loom_launch_cmd_build(&c, &spec);
        const int exe = index_of(&c, "/x/loom");
        assert_true(exe > n);
        for (int i = 0; i < n; i++) assert_string_equal(c.argv[exe - n + i], words[i]);
        assert_string_equal(c.argv[exe + 1], "train");
        spec.launcher_args = NULL; /* none: the program follows the launcher's own words */
        loom_launch_cmd_build(&c, &spec);
        assert_int_equal(index_of(&c, words[0]), -1);
    }
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_rank_addr: seed %u (LOOM_TEST_SEED to repeat)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concrete_bind),
        cmocka_unit_test(test_wildcard),
        cmocka_unit_test(test_launcher_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
