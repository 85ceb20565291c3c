#include "core/suggest.h"

#include <stdio.h>
#include <string.h>

enum { SUGGEST_MAX_LEN = 64 };

/* Optimal string alignment distance, capped at len <= SUGGEST_MAX_LEN. */
static int edit_distance(const char *a, const char *b) {
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > SUGGEST_MAX_LEN || m > SUGGEST_MAX_LEN) return SUGGEST_MAX_LEN + 1;
    int d[SUGGEST_MAX_LEN + 1][SUGGEST_MAX_LEN + 1];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int best = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* "--name" and "-n" are compared as "name" and "n" (a third dash is part of the word). */
static const char *strip_dashes(const char *s) {
    return s[0] == '-' ? s + 1 + (s[1] == '-') : s;
}

const char *loom_suggest_nearest(const char *word, const char *const *candidates, int n) {
    char w[SUGGEST_MAX_LEN + 1];
    snprintf(w, sizeof w, "%s", strip_dashes(word));
    char *eq = strchr(w, '='); /* --key=value */
    if (eq) *eq = 0;
    size_t len = strlen(w);
    if (len == 0) return NULL;
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    const char *best = NULL;
    int best_d = limit + 1;
    for (int i = 0; i < n; i++) {
        const char *c = strip_dashes(candidates[i]);
        int d = strncmp(c, w, len) == 0 && len >= 3 ? 1 : edit_distance(w, c);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    return best;
}

void loom_suggest_flag(char *out, size_t cap, const char *word, const char *const *candidates,
                       int n) {
    if (cap == 0) return;
    out[0] = 0;
    const char *s = loom_suggest_nearest(word, candidates, n);
    if (s) snprintf(out, cap, ": did you mean %s%s?", s[0] == '-' ? "" : "--", s);
}
