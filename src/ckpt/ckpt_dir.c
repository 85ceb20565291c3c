#include "ckpt/ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void loom_ckpt_step_dir(char *out, size_t size, const char *dir, int64_t step) {
    snprintf(out, size, "%s/step_%08lld", dir, (long long)step);
}

void loom_ckpt_data_name(char *out, size_t size, int rank) {
    snprintf(out, size, "rank_%05d.safetensors", rank);
}

void loom_ckpt_index_name(char *out, size_t size, int rank) {
    snprintf(out, size, "rank_%05d.index.json", rank);
}

static int newest_first(const void *a, const void *b) {
    const loom_ckpt_entry *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : strcmp(x->path, y->path);
}

int loom_ckpt_list(const char *dir, loom_ckpt_entry **list, int n) {
    DIR *d = opendir(dir);
    if (!d) return n;
    int first = n;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *s = e->d_name;
        if (strncmp(s, "step_", 5) != 0 || strlen(s) != 13 || strspn(s + 5, "0123456789") != 8)
            continue;
        loom_ckpt_entry *l = realloc(*list, (size_t)(n + 1) * sizeof *l);
        if (!l) {
            closedir(d);
            return -1;
        }
        *list = l;
        snprintf(l[n].path, sizeof l[n].path, "%s/%s", dir, s);
        l[n].step = strtoll(s + 5, NULL, 10);
        n++;
    }
    closedir(d);
    if (n > first) /* *list may be NULL when nothing was found: qsort wants a pointer */
        qsort(*list + first, (size_t)(n - first), sizeof **list, newest_first);
    return n;
}

int loom_ckpt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int loom_ckpt_remove_step(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    char f[1700];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        unlink(f);
    }
    closedir(d);
    return rmdir(path);
}
