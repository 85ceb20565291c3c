/* The one monotonic clock loom times everything with (steps, collectives, progress), and the
 * wall clock its logs are stamped with. */
#ifndef LOOM_CORE_CLOCK_H
#define LOOM_CORE_CLOCK_H

/* CLOCK_MONOTONIC in milliseconds. */
double loom_now_ms(void);

/* A polling loop whose rounds come every few ms (or 50 ms) and sees a gap this long between
 * two of them was not scheduled: the machine paused or starved it. Time in such a gap is
 * nobody's silence (ft/watch.c, ft/elastic_workers.c, parallel/outer_elastic.c). */
#define LOOM_STALL_MS 1000.0
/* CLOCK_REALTIME in seconds since the epoch: for log lines and files that other processes' and
 * hosts' records are laid beside (events, fault lines, TensorBoard's wall_time). */
double loom_wall_s(void);

/* CPU time of the calling thread in milliseconds (CLOCK_THREAD_CPUTIME_ID). */
double loom_thread_cpu_ms(void);

#endif
