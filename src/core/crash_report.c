#include "core/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define LOOM_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_UNDER_ASAN 1
#endif
#endif

#ifndef LOOM_UNDER_ASAN
static const int SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
enum { N_SIGNALS = sizeof SIGNALS / sizeof *SIGNALS };
static struct sigaction previous[N_SIGNALS];
static char who[32];

/* The handler formats by hand: it may run with any lock held (malloc's, stdio's). */
static size_t put_str(char *buf, size_t at, size_t cap, const char *s) {
    while (*s && at + 1 < cap) buf[at++] = *s++;
    return at;
}
static size_t put_hex(char *buf, size_t at, size_t cap, uintptr_t v) {
    char digits[2 + 2 * sizeof v];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    at = put_str(buf, at, cap, "0x");
    while (n > 0 && at + 1 < cap) buf[at++] = digits[--n];
    return at;
}
static void put_line(char *buf, size_t at) {
    buf[at++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, at);
    (void)w;
}

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGSEGV:
        return "SIGSEGV";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    default:
        return "SIGILL";
    }
}

/* The instruction's address and, for a call to a NULL pointer, the caller's (the return
 * address the call pushed, on top of the stack; the link register on AArch64). */
static void registers_of(const void *context, uintptr_t *pc, uintptr_t *caller) {
    const ucontext_t *uc = context;
    *pc = *caller = 0;
#if defined(__x86_64__)
    *pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (*pc < 4096) *caller = *(const uintptr_t *)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    *pc = (uintptr_t)uc->uc_mcontext.pc;
    if (*pc < 4096) *caller = (uintptr_t)uc->uc_mcontext.regs[30];
#else
    (void)uc;
#endif
}

static void on_fatal_signal(int sig, siginfo_t *info, void *context) {
    uintptr_t pc, caller;
    registers_of(context, &pc, &caller);
    char line[256];
    size_t at = put_str(line, 0, sizeof line, "loom: ");
    if (who[0]) at = put_str(line, put_str(line, at, sizeof line, who), sizeof line, ": ");
    at = put_str(line, at, sizeof line, "fatal signal ");
    at = put_str(line, at, sizeof line, signal_name(sig));
    at = put_str(line, at, sizeof line, " at address ");
    at = put_hex(line, at, sizeof line, (uintptr_t)info->si_addr);
    at = put_str(line, at, sizeof line, ", instruction ");
    at = put_hex(line, at, sizeof line, pc);
    if (caller) {
        at = put_str(line, at, sizeof line,
                     ": a call through a NULL function pointer, made from the next frame");
        put_line(line, at);
        void *from = (void *)(caller - 1); /* inside the call instruction */
        backtrace_symbols_fd(&from, 1, STDERR_FILENO);
    } else {
        at = put_str(line, at, sizeof line,
                     "; the stack, innermost first (addr2line -f -e "
                     "MODULE OFFSET names each):");
        put_line(line, at);
        void *frames[48];
        const int n = backtrace(frames, 48);
        backtrace_symbols_fd(frames, n, STDERR_FILENO);
    }
    /* on to the handler before (or the default action): a fault re-executes the faulting
     * instruction on return; a signal that was sent is raised again */
    for (int i = 0; i < N_SIGNALS; i++)
        if (SIGNALS[i] == sig) sigaction(sig, &previous[i], NULL);
    if (info->si_code <= 0) raise(sig);
}

void loom_crash_report_install(const char *name) {
    snprintf(who, sizeof who, "%s", name ? name : "");
    static int ready;
    if (!ready) {
        void *frame;
        backtrace(&frame, 1); /* loads the unwinder now, not inside the handler */
        static char alt[1 << 16];
        stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt}; /* a stack overflow too */
        sigaltstack(&ss, NULL);
        ready = 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_SIGNALS; i++) {
        struct sigaction old;
        if (sigaction(SIGNALS[i], &sa, &old) != 0) continue;
        if (old.sa_sigaction != on_fatal_signal) previous[i] = old; /* not our own again */
    }
}
#else
void loom_crash_report_install(const char *name) {
    (void)name;
}
#endif
