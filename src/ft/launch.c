#include "ft/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

loom_status loom_launch_start(loom_launch *l, char *const argv[], const char *log_path,
                              loom_error *err) {
    memset(l, 0, sizeof *l);
    int out = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0)
        return loom_error_set(err, LOOM_ERR_IO, "loom run: cannot open %s: %s", log_path,
                              strerror(errno));
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) {
        close(out);
        return loom_error_set(err, LOOM_ERR_IO, "loom run: pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(out);
        close(ready[0]);
        close(ready[1]);
        return loom_error_set(err, LOOM_ERR_IO, "loom run: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setsid(); /* own process group: the job is signalled as one */
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        dup2(out, 1);
        dup2(out, 2);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        int e = errno; /* tell the parent why (the pipe closes on a successful exec) */
        (void)!write(ready[1], &e, sizeof e);
        _exit(127);
    }
    close(out);
    close(ready[1]);
    int e = 0;
    ssize_t n = read(ready[0], &e, sizeof e);
    close(ready[0]);
    if (n == (ssize_t)sizeof e) {
        waitpid(pid, NULL, 0);
        return loom_error_set(err, LOOM_ERR_INPUT, "loom run: cannot run '%s': %s", argv[0],
                              strerror(e));
    }
    l->pid = pid;
    l->running = 1;
    return LOOM_OK;
}

int loom_launch_poll(loom_launch *l) {
    if (!l->running) return 1;
    int ws;
    pid_t r = waitpid(l->pid, &ws, WNOHANG);
    if (r != l->pid) return 0;
    l->running = 0;
    l->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    return 1;
}

int loom_pid_dead(pid_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp) return kill(pid, 0) != 0 && errno == ESRCH;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

static void wait_until(loom_launch *l, double deadline_ms) {
    const struct timespec tick = {0, 10 * 1000 * 1000};
    while (!loom_launch_poll(l) && loom_now_ms() < deadline_ms) nanosleep(&tick, NULL);
}

void loom_launch_stop(loom_launch *l, double grace_s, const pid_t *rank_pids, int n) {
    if (loom_launch_poll(l)) {
        /* Ranks of a launcher that already ended may linger a moment; never wait long. */
        kill(-l->pid, SIGKILL);
        for (int i = 0; i < n; i++)
            if (rank_pids[i] > 0 && !loom_pid_dead(rank_pids[i])) kill(rank_pids[i], SIGKILL);
        return;
    }
    kill(l->pid, SIGTERM);
    wait_until(l, loom_now_ms() + grace_s * 1e3);
    kill(-l->pid, SIGKILL); /* whatever is left of the group */
    for (int i = 0; i < n; i++)
        if (rank_pids[i] > 0 && !loom_pid_dead(rank_pids[i])) kill(rank_pids[i], SIGKILL);
    if (l->running) {
        kill(l->pid, SIGKILL);
        wait_until(l, loom_now_ms() + 10e3);
    }
}
