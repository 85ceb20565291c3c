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

double loom_timeline_elapsed_ms(void) {
    return tl.n ? loom_now_ms() - tl.ms[0] : 0.0;
}

/* The marks so far as "a 12.3, b 45.6, ...; total T (t0 WALL)" into line. */
static void format_marks(char *line, size_t size) {
    int n = 0;
    line[0] = 0;
    for (int i = 1; i < tl.n && n < (int)size - 64; i++)
        n += snprintf(line + n, size - n, "%s %s %.1f", i > 1 ? "," : "", tl.name[i],
                      tl.ms[i] - tl.ms[i - 1]);
    if (n < (int)size - 64)
        snprintf(line + n, size - n, "; total %.1f (t0 %.6f)",
                 tl.n ? tl.ms[tl.n - 1] - tl.ms[0] : 0.0, tl.wall0);
}

void loom_timeline_print(FILE *f, const char *who) {
    if (tl.closed || tl.n < 2) return;
    tl.closed = 1;
    char line[2048];
    format_marks(line, sizeof line);
    fprintf(f, "loom: %s start-up (ms):%s\n", who, line);
}

void loom_timeline_print_so_far(FILE *f, const char *who) {
    char line[2048];
    format_marks(line, sizeof line);
    fprintf(f, "loom: %s start-up so far (ms):%s; now %.3f\n", who, line, loom_wall_s());
}
