/* The one monotonic clock loom times everything with (steps, collectives, progress). */
#ifndef LOOM_CORE_CLOCK_H
#define LOOM_CORE_CLOCK_H

/* CLOCK_MONOTONIC in milliseconds. */
double loom_now_ms(void);
/* CPU time of the calling thread in milliseconds (CLOCK_THREAD_CPUTIME_ID). */
double loom_thread_cpu_ms(void);

#endif
