#include "core/fs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int loom_mkdir_p(const char *dir) {
    char *p = strdup(dir);
    if (!p) return -1;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                free(p);
                return -1;
            }
            *s = c;
            if (c == '\0') break;
        }
    }
    free(p);
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int loom_mkdir_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return 0;
    char *dir = strndup(path, (size_t)(slash - path));
    if (!dir) return -1;
    int rc = loom_mkdir_p(dir);
    free(dir);
    return rc;
}
