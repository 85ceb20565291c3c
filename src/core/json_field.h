/* Reading validated fields out of parsed JSON (jansson): the checks and the error lines the
 * checkpoint manifest, the model configuration, the machine profile and the tokenizer's
 * encoder.json share. */
#ifndef LOOM_CORE_JSON_FIELD_H
#define LOOM_CORE_JSON_FIELD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* One reading of a JSON document: where it came from and what it should be, for the errors. */
typedef struct {
    const char *origin; /* the file (or the name) the JSON came from */
    const char *kind;   /* "invalid checkpoint manifest", or NULL: no such word */
    loom_error *err;
} loom_json_reader;

/* Sets r->err to "origin: kind: <printf of fmt>" ("origin: <...>" without a kind; the part
 * after the kind at most 511 bytes) and returns LOOM_ERR_INPUT. */
loom_status loom_json_fail(const loom_json_reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* 1 and *out = v when v is an integer in [lo, hi]; 0 otherwise (missing, other type, out
 * of range). */
int loom_json_int_in(const json_t *v, int64_t lo, int64_t hi, int64_t *out);

/* One integer field of an object and where it goes. */
typedef struct {
    const char *key;
    int *dst;
} loom_json_int_field;

/* Reads fields[i].key of obj, in order, as integers in [lo, hi] into *fields[i].dst; returns
 * the index of the first that is not one (its *dst untouched), or n when all are. */
size_t loom_json_ints_in(const json_t *obj, const loom_json_int_field *fields, size_t n, int64_t lo,
                         int64_t hi);

#endif
