/* The hosts of `loom run` before a launch (ft/hosts.h): an OpenMPI hostfile read into
 * the --hosts form (bad lines named with the file and line number), slots counted, the
 * rsh agent found in --launcher-args, and the check: more ranks than slots, an unknown
 * name under ssh, an agent that fails or does not end in time (named with the host), and
 * this machine's own names passing without a probe; --hosts with --hostfile refused. And
 * between attempts: a lost host dropped from --hosts (by name or address, the slots left),
 * the addresses a restart waits for, a host answering on the network or not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/clock.h"
#include "ft/hosts.h"
#include "ft/run_config.h"
#include "test_common.h"

static void write_file(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_hostfile(void **state) {
    char path[512], out[1024], text[512];
    loom_error err = {0};
    snprintf(path, sizeof path, "%s/hostfile", (const char *)*state);
    int a = 1 + (int)(rnd() % 8), b = 1 + (int)(rnd() % 8);
    snprintf(text, sizeof text,
             "# test hosts\n\n  h1 slots=%d   # the first\nh2\tslots=%d max_slots=%d\nh3\n", a, b,
             b + 1);
    write_file(path, text);
    assert_int_equal(loom_hostfile_read(path, out, sizeof out, &err), LOOM_OK);
    char want[128];
    snprintf(want, sizeof want, "h1:%d,h2:%d,h3:1", a, b);
    assert_string_equal(out, want);
    assert_int_equal(loom_hosts_slots(out), a + b + 1);
    const char *bad[] = {"h1 slots=2\nh2 slot=2\n",  "h1 slots=0\n", "h1 slots=x\n",
                         "h1 slots=4 max_slots=2\n", "slots=2\n",    "h1,h2 slots=2\n"};
    const int line[] = {2, 1, 1, 1, 1, 1};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(path, bad[i]);
        assert_int_equal(loom_hostfile_read(path, out, sizeof out, &err), LOOM_ERR_INPUT);
        char where[600];
        snprintf(where, sizeof where, "--hostfile %s:%d:", path, line[i]);
        assert_non_null(strstr(err.msg, where));
        assert_non_null(strstr(err.msg, "expected 'HOST [slots=N]"));
        assert_null(strchr(err.msg, '\n'));
    }
    write_file(path, "# nothing\n\n");
    assert_int_equal(loom_hostfile_read(path, out, sizeof out, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "no hosts"));
    snprintf(path, sizeof path, "%s/missing", (const char *)*state);
    assert_int_equal(loom_hostfile_read(path, out, sizeof out, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, path));
}

static void test_config(void **state) {
    char path[512];
    snprintf(path, sizeof path, "%s/hf", (const char *)*state);
    write_file(path, "a slots=2\nb slots=3\n");
    loom_run_config c;
    loom_error err = {0};
    int child, help;
    char *both[] = {"run", "--hosts", "a:2", "--hostfile", path, "--", "--steps", "1"};
    assert_int_equal(loom_run_config_parse(&c, 8, both, &child, &help, &err), LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "--hosts"));
    assert_non_null(strstr(err.msg, "--hostfile"));
    char *file[] = {"run", "-n", "5", "--hostfile", path, "--", "--steps", "1"};
    assert_int_equal(loom_run_config_parse(&c, 8, file, &child, &help, &err), LOOM_OK);
    assert_string_equal(c.hosts, "a:2,b:3"); /* the same as --hosts a:2,b:3 */
    assert_string_equal(c.bind, "0.0.0.0");
}

static void test_agent(void **state) {
    (void)state;
    char agent[256];
    unsetenv("OMPI_MCA_plm_rsh_agent");
    loom_hosts_agent("", agent, sizeof agent);
    assert_string_equal(agent, "ssh");
    loom_hosts_agent("--mca btl tcp,self --mca plm_rsh_agent /x/agent.sh --oversubscribe", agent,
                     sizeof agent);
    assert_string_equal(agent, "/x/agent.sh");
    setenv("OMPI_MCA_plm_rsh_agent", "rsh : ssh", 1);
    loom_hosts_agent(NULL, agent, sizeof agent);
    assert_string_equal(agent, "rsh");
    loom_hosts_agent("-mca orte_rsh_agent /y", agent, sizeof agent);
    assert_string_equal(agent, "/y");
    unsetenv("OMPI_MCA_plm_rsh_agent");
}

static void test_check(void **state) {
    loom_error err = {0};
    int k = 1 + (int)(rnd() % 4);
    char hosts[128];
    snprintf(hosts, sizeof hosts, "localhost:%d,127.0.0.1:1", k);
    /* this machine's names: no probe (the agent would fail) */
    assert_int_equal(loom_hosts_check(hosts, "--hosts", k + 1, 0, "false", 5, &err), LOOM_OK);
    assert_int_equal(loom_hosts_check(hosts, "--hosts", k + 2, 0, "false", 5, &err),
                     LOOM_ERR_INPUT);
    char want[64];
    snprintf(want, sizeof want, "-n %d: more ranks than the %d slot(s) --hosts", k + 2, k + 1);
    assert_non_null(strstr(err.msg, want));
    assert_int_equal(loom_hosts_check(hosts, "--hosts", k + 2, 1, "false", 5, &err), LOOM_OK);
    const char *bad_lists[] = {"a:0", "a:x", "a:2,:3", "a:2x"};
    for (size_t i = 0; i < sizeof bad_lists / sizeof *bad_lists; i++) {
        assert_int_equal(loom_hosts_check(bad_lists[i], "--hosts", 1, 0, "false", 5, &err),
                         LOOM_ERR_INPUT);
        assert_non_null(strstr(err.msg, "expected HOST or HOST:N"));
    }
    /* ssh: a name that does not resolve is unknown, no probe */
    assert_int_equal(
        loom_hosts_check("localhost:1,nohost.invalid:2", "--hostfile F", 2, 0, "ssh", 5, &err),
        LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "--hostfile F: host 'nohost.invalid' is unknown"));
    /* an agent: it decides; one that fails names the host and what it said */
    char agent[512];
    snprintf(agent, sizeof agent, "%s/agent", (const char *)*state);
    write_file(agent, "#!/bin/sh\necho \"no such host: $1\" >&2\nexit 3\n");
    chmod(agent, 0755);
    assert_int_equal(loom_hosts_check("nohost.invalid:2", "--hosts", 2, 0, agent, 5, &err),
                     LOOM_ERR_INPUT);
    assert_non_null(strstr(err.msg, "--hosts: host 'nohost.invalid' is unknown"));
    assert_non_null(strstr(err.msg, "exit 3: no such host: nohost.invalid"));
    assert_null(strchr(err.msg, '\n'));
    write_file(agent, "#!/bin/sh\n[ \"$1\" = good.invalid ] && exit 0\nsleep 30\n");
    assert_int_equal(loom_hosts_check("good.invalid:1", "--hosts", 1, 0, agent, 5, &err), LOOM_OK);
    double t0 = loom_now_ms();
    assert_int_equal(
        loom_hosts_check("good.invalid:1,slow.invalid:1", "--hosts", 2, 0, agent, 0.5, &err),
        LOOM_ERR_INPUT);
    assert_true(loom_now_ms() - t0 < 5e3); /* bounded: killed at the deadline */
    assert_non_null(strstr(err.msg, "host 'slow.invalid'"));
    assert_non_null(strstr(err.msg, "did not end within 0.5 s"));
}

static void test_between_attempts(void **state) {
    (void)state;
    const int a = 1 + (int)(rnd() % 8), b = 1 + (int)(rnd() % 8), c = 1 + (int)(rnd() % 8);
    char hosts[LOOM_RUN_PATH], want[256];
    snprintf(hosts, sizeof hosts, "h1:%d,10.0.0.2:%d,h3,h1:%d", a, b, c);
    assert_int_equal(loom_hosts_drop(hosts, sizeof hosts, "h1", "10.9.9.9"), b + 1);
    snprintf(want, sizeof want, "10.0.0.2:%d,h3", b);
    assert_string_equal(hosts, want);
    assert_int_equal(loom_hosts_drop(hosts, sizeof hosts, "nohost", "10.0.0.2"), 1);
    assert_string_equal(hosts, "h3");
    /* No rank heard: the hosts --hosts gives by address, each once, `skip_addr` left out. */
    loom_monitor m = {0};
    char addrs[16][64];
    snprintf(hosts, sizeof hosts, "10.0.0.1:%d,h2,10.0.0.1,::1,10.0.0.3:%d", a, b);
    assert_int_equal(loom_hosts_restart_addrs(&m, "self", hosts, "", "", addrs, 16), 3);
    assert_string_equal(addrs[0], "10.0.0.1");
    assert_string_equal(addrs[1], "::1");
    assert_string_equal(addrs[2], "10.0.0.3");
    assert_int_equal(loom_hosts_restart_addrs(&m, "self", hosts, "h9", "::1", addrs, 16), 2);
    assert_string_equal(addrs[1], "10.0.0.3");
    /* This host answers (port 9 refused or open); no address is no answer. */
    assert_true(loom_host_rtt_ms("127.0.0.1", 1000) >= 0);
    assert_true(loom_host_answers("127.0.0.1"));
    assert_false(loom_host_answers(""));
    const volatile sig_atomic_t stop = 1;
    int said = 0;
    assert_false(loom_host_await("", loom_now_ms() + 10e3, &stop, &said)); /* stopped */
    assert_int_equal(said, 0);
}

int main(void) {
    const char *env = getenv("LOOM_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_hosts: seed %u (LOOM_TEST_SEED to repeat)\n", seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostfile),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_agent),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_between_attempts),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
