#include "core/json_field.h"

#include <stdarg.h>
#include <stdio.h>

loom_status loom_json_fail(const loom_json_reader *r, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->kind)
        return loom_error_set(r->err, LOOM_ERR_INPUT, "%s: %s: %s", r->origin, r->kind, msg);
    return loom_error_set(r->err, LOOM_ERR_INPUT, "%s: %s", r->origin, msg);
}

int loom_json_int_in(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

size_t loom_json_ints_in(const json_t *obj, const loom_json_int_field *fields, size_t n, int64_t lo,
                         int64_t hi) {
    for (size_t i = 0; i < n; i++) {
        int64_t x;
        if (!loom_json_int_in(json_object_get(obj, fields[i].key), lo, hi, &x)) return i;
        *fields[i].dst = (int)x;
    }
    return n;
}
