#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

loom_status loom_error_set(loom_error *err, loom_status code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

loom_status loom_error_prefix(loom_error *err, const char *fmt, ...) {
    if (!err) return LOOM_ERR_STATE;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->code;
}
