/* The start-up timeline of this process: named marks (a fixed table, no allocation)
 * from the start of `loom train` to the end of its first step, printed as one line, so
 * the time from a (re)launch to the first step can be split into its parts (MPI start,
 * model allocation, checkpoint load, first step). Marks after the table is full, or
 * after the line was printed, are ignored. */
#ifndef LOOM_CORE_TIMELINE_H
#define LOOM_CORE_TIMELINE_H

#include <stdio.h>

/* Records `name` (a string literal) at the current time; the first mark is the origin. */
void loom_timeline_mark(const char *name);
/* One line: "loom: start-up (ms): a 12.3, b 45.6, ... (t0 WALL)": each part's duration
 * since the previous mark, and the origin's wall clock (seconds since the epoch, to be
 * aligned with the supervisor's events). Later marks are ignored. */
void loom_timeline_print(FILE *f, const char *who);
/* The same line for the marks so far, with the wall clock now, and the timeline stays open:
 * where a start-up that waits on something outside it (an elastic joiner) spent its time. */
void loom_timeline_print_so_far(FILE *f, const char *who);
/* Milliseconds since the first mark (0 before it). */
double loom_timeline_elapsed_ms(void);

#endif
