/* Errors: fallible functions return a loom_status and fill a loom_error with what
 * failed, where and what was expected. Library code never exits on bad input. */
#ifndef LOOM_CORE_ERROR_H
#define LOOM_CORE_ERROR_H

typedef enum {
    LOOM_OK = 0,
    LOOM_ERR_INPUT = 2, /* bad input from the user: flag, config, file contents (exit code 2) */
    LOOM_ERR_IO = 3,    /* an operating-system call failed */
    LOOM_ERR_NOMEM = 4, /* an allocation failed */
    LOOM_ERR_STATE = 5, /* an internal invariant failed or a feature is not available */
} loom_status;

typedef struct {
    loom_status code;
    char msg[1024];
} loom_error;

/* Sets err (if non-NULL) and returns code; printf-style message. */
loom_status loom_error_set(loom_error *err, loom_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the existing message with more context ("while loading X: ..."). */
loom_status loom_error_prefix(loom_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
