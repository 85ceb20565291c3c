/* Shard files: the glob, the read-only mapping and the tmp + fsync + rename commit shared by
 * the token and image shards (see shard_files.h). */
#include "data/shard_files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading ---- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

loom_status loom_shard_glob(const char *pattern, const char *flag, glob_t *g, loom_error *err) {
    memset(g, 0, sizeof *g);
    int rc = glob(pattern, GLOB_NOSORT, NULL, g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0)) {
        globfree(g);
        memset(g, 0, sizeof *g);
        return LOOM_OK;
    }
    if (rc != 0) {
        globfree(g);
        return loom_error_set(err, rc == GLOB_NOSPACE ? LOOM_ERR_NOMEM : LOOM_ERR_IO,
                              "%s'%s': cannot expand the pattern (glob error %d)", flag, pattern,
                              rc);
    }
    qsort(g->gl_pathv, g->gl_pathc, sizeof(char *), cmp_str);
    return LOOM_OK;
}

loom_status loom_shard_map(const char *path, int64_t min_bytes, const char *what, char **path_copy,
                           void **map, size_t *map_bytes, loom_error *err) {
    *map = NULL;
    *map_bytes = 0;
    if (!(*path_copy = strdup(path)))
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    int64_t size = (int64_t)st.st_size;
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: not a regular file", path);
    }
    if (size < min_bytes) {
        close(fd);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: truncated header: %" PRId64 " bytes, expected at least %" PRId64
                              "%s",
                              path, size, min_bytes, what);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED)
        return loom_error_set(err, LOOM_ERR_IO, "%s: mmap failed: %s", path, strerror(map_errno));
    *map = m;
    *map_bytes = (size_t)size;
    return LOOM_OK;
}

void loom_shard_unmap(char *path, void *map, size_t map_bytes) {
    if (map) munmap(map, map_bytes);
    free(path);
}

int loom_shard_find(const int64_t *first_key, size_t stride, int n, int64_t v) {
    const char *base = (const char *)first_key;
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (*(const int64_t *)(base + (size_t)mid * stride) <= v)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- writing ---- */

int loom_shard_numbered_path(char *path, size_t cap, const char *dir, const char *split,
                             int index) {
    int k = snprintf(path, cap, "%s/%s_%06d.bin", dir, split, index);
    return k < 0 || (size_t)k >= cap ? -1 : 0;
}

loom_status loom_shard_tmp_open(const char *path, char *tmp, size_t cap, int *fd, loom_error *err) {
    snprintf(tmp, cap, "%s.tmp", path);
    *fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return LOOM_OK;
}

/* pwrite when off >= 0, else write; 0 or -1 with errno set. */
static int write_full(int fd, const void *buf, size_t n, off_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = off >= 0 ? pwrite(fd, p, n, off) : write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
        if (off >= 0) off += w;
    }
    return 0;
}

loom_status loom_shard_tmp_write(int fd, const char *tmp, const void *buf, size_t n,
                                 loom_error *err) {
    if (write_full(fd, buf, n, -1) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    return LOOM_OK;
}

loom_status loom_shard_tmp_pwrite(int fd, const char *tmp, const void *buf, size_t n, off_t off,
                                  loom_error *err) {
    if (write_full(fd, buf, n, off) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    return LOOM_OK;
}

loom_status loom_shard_tmp_commit(int *fd, const char *tmp, const char *path, const char *dir,
                                  loom_error *err) {
    if (fsync(*fd) != 0) {
        loom_status st =
            loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        loom_shard_tmp_discard(fd, tmp);
        return st;
    }
    int rc = close(*fd);
    *fd = -1;
    if (rc != 0 || rename(tmp, path) != 0) {
        loom_status st = loom_error_set(
            err, LOOM_ERR_IO, "%s: cannot close and rename into place: %s", tmp, strerror(errno));
        unlink(tmp);
        return st;
    }
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) { /* makes the rename durable; some filesystems refuse, which is fine */
        (void)fsync(dfd);
        close(dfd);
    }
    return LOOM_OK;
}

void loom_shard_tmp_discard(int *fd, const char *tmp) {
    if (*fd < 0) return;
    close(*fd);
    unlink(tmp);
    *fd = -1;
}
