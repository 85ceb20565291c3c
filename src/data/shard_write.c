/* Writes one token shard atomically: PATH.tmp, fsync, rename. */
#include "data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Makes the rename durable; failure here is not fatal (some filesystems refuse). */
static void fsync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(copy);
}

/* Header, then tokens converted in chunks so no n_tokens-sized buffer is needed. */
static int write_body(int fd, const int32_t *tokens, int64_t n, int token_bytes) {
    int32_t header[LOOM_SHARD_HEADER_BYTES / 4] = {0};
    header[0] = token_bytes == 2 ? LOOM_SHARD_MAGIC_U16 : LOOM_SHARD_MAGIC_U32;
    header[1] = 1;
    header[2] = (int32_t)n;
    if (write_all(fd, header, sizeof header) != 0) return -1;
    enum { CHUNK = 4096 }; /* 24 KiB of stack: safe on small thread stacks */
    uint32_t buf32[CHUNK];
    uint16_t buf16[CHUNK];
    for (int64_t off = 0; off < n; off += CHUNK) {
        int64_t m = n - off < CHUNK ? n - off : CHUNK;
        int rc;
        if (token_bytes == 2) {
            for (int64_t i = 0; i < m; i++) buf16[i] = (uint16_t)tokens[off + i];
            rc = write_all(fd, buf16, (size_t)m * 2);
        } else {
            for (int64_t i = 0; i < m; i++) buf32[i] = (uint32_t)tokens[off + i];
            rc = write_all(fd, buf32, (size_t)m * 4);
        }
        if (rc != 0) return -1;
    }
    return fsync(fd);
}

loom_status loom_shard_write(const char *path, const int32_t *tokens, int64_t n_tokens,
                             int token_bytes, loom_error *err) {
    if (token_bytes != 2 && token_bytes != 4)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: token bytes %d (expected 2 or 4)", path,
                              token_bytes);
    if (n_tokens < 0 || n_tokens > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %" PRId64 " tokens (expected 0 to %d per shard)", path, n_tokens,
                              INT32_MAX);
    int64_t limit = token_bytes == 2 ? 65536 : (int64_t)INT32_MAX + 1;
    for (int64_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= limit)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s: token %" PRId32 " at position %" PRId64
                                  " does not fit in %d-byte tokens (expected 0 to %" PRId64 ")",
                                  path, tokens[i], i, token_bytes, limit - 1);
    }

    size_t len = strlen(path);
    char *tmp = malloc(len + 5);
    if (!tmp) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);

    loom_status st = LOOM_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        int wrc = write_body(fd, tokens, n_tokens, token_bytes);
        int e = errno;
        if (close(fd) != 0 && wrc == 0) {
            wrc = -1;
            e = errno;
        }
        if (wrc != 0)
            st = loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
        else if (rename(tmp, path) != 0)
            st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                                strerror(errno));
        if (st != LOOM_OK) unlink(tmp);
    }
    free(tmp);
    if (st == LOOM_OK) fsync_parent_dir(path);
    return st;
}
