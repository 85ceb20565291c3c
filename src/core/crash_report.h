/* A fatal signal's report: on SIGSEGV, SIGBUS, SIGFPE or SIGILL the process writes to
 * stderr (so into its rank's log, which the supervisor's diagnosis quotes) one line naming
 * the signal, the faulting address and the instruction, then the call stack as
 * `module(+offset)` frames that `addr2line -f -e MODULE OFFSET` resolves. A call through a
 * NULL function pointer (instruction address 0) cannot be unwound: the line names the
 * caller instead (the return address the call left on the stack, minus one: inside the
 * call). Then the signal goes on to the handler installed before, if any, or to the
 * default action, so the process still dies of that signal (OpenMPI installs its own
 * handlers only where none is, so once main installed these it adds none).
 *
 * Not installed under AddressSanitizer, whose own report is better. */
#ifndef LOOM_CORE_CRASH_REPORT_H
#define LOOM_CORE_CRASH_REPORT_H

/* Installs the handlers; the report names `who` ("rank 3"; NULL: none). Again after
 * MPI_Init names the rank (the handlers stay). */
void loom_crash_report_install(const char *who);

#endif
