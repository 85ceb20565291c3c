#include "train/batch_skip.h"

#include <stdlib.h>

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

loom_status loom_batch_skip_parse(loom_batch_skip *s, const char *list, loom_error *err) {
    s->n = 0;
    const char *p = list;
    while (*p) {
        char *end = NULL;
        if (*p < '0' || *p > '9') break;
        long long v = strtoll(p, &end, 10);
        if (v < 1 || v > 1000000000LL) break;
        if (s->n == LOOM_SKIP_MAX)
            return loom_error_set(err, LOOM_ERR_INPUT, "--skip-steps: more than %d steps",
                                  LOOM_SKIP_MAX);
        s->batches[s->n++] = v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            break;
    }
    if (*p)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--skip-steps '%s': expected comma-separated step numbers >= 1",
                              list);
    qsort(s->batches, (size_t)s->n, sizeof s->batches[0], cmp_i64);
    int k = 0;
    for (int i = 0; i < s->n; i++)
        if (k == 0 || s->batches[i] != s->batches[k - 1]) s->batches[k++] = s->batches[i];
    s->n = k;
    return LOOM_OK;
}

int64_t loom_batch_skip_batch_of(const loom_batch_skip *s, int64_t step) {
    /* The least b with b - |L within [1, b]| = step; b itself is then not skipped. */
    int64_t b = step;
    for (int i = 0; i < s->n && s->batches[i] <= b; i++) b++;
    return b;
}
