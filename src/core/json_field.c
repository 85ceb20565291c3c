#include "core/json_field.h"

int loom_json_int_in(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}
