/* Reading validated fields out of parsed JSON (jansson): the checks the manifest and the
 * model configuration share. */
#ifndef LOOM_CORE_JSON_FIELD_H
#define LOOM_CORE_JSON_FIELD_H

#include <jansson.h>
#include <stdint.h>

/* 1 and *out = v when v is an integer in [lo, hi]; 0 otherwise (missing, other type, out
 * of range). */
int loom_json_int_in(const json_t *v, int64_t lo, int64_t hi, int64_t *out);

#endif
