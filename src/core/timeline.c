#include "core/timeline.h"

#include "core/clock.h"

#define MAX_MARKS 48

static struct {
    const char *name[MAX_MARKS];
    double ms[MAX_MARKS];
    double wall0;
    int n, closed;
} tl;

void loom_timeline_mark(const char *name) {
    if (tl.closed || tl.n == MAX_MARKS) return;
    if (tl.n == 0) tl.wall0 = loom_wall_s();
    tl.name[tl.n] = name;
    tl.ms[tl.n++] = loom_now_ms();
}

void loom_timeline_print(FILE *f, const char *who) {
    if (tl.closed || tl.n < 2) return;
    tl.closed = 1;
    char line[2048];
    int n = snprintf(line, sizeof line, "loom: %s start-up (ms):", who);
    for (int i = 1; i < tl.n && n < (int)sizeof line - 64; i++)
        n += snprintf(line + n, sizeof line - n, "%s %s %.1f", i > 1 ? "," : "", tl.name[i],
                      tl.ms[i] - tl.ms[i - 1]);
    snprintf(line + n, sizeof line - n, "; total %.1f (t0 %.6f)\n", tl.ms[tl.n - 1] - tl.ms[0],
             tl.wall0);
    fputs(line, f);
}
