#include "ckpt/ckpt_commit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_dir.h"

loom_status loom_ckpt_write_atomic(const char *path, const char *text, loom_error *err) {
    char tmp[LOOM_CKPT_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    char dir[LOOM_CKPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    if (loom_ckpt_fsync_dir(slash ? dir : ".") != 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
    return LOOM_OK;
}

/* The outer optimizer's state beside the step folders (--outer diloco, parallel/outer.h:
 * TIER/outer/step_N/{rank_R,elastic}.bin): each folder of a step <= `step` whose step
 * folder is gone (pruned, or never written) goes too. */
static void prune_outer(const char *tier, int64_t step) {
    char outer[LOOM_CKPT_PATH_MAX];
    snprintf(outer, sizeof outer, "%s/outer", tier);
    loom_ckpt_entry *list = NULL;
    int n = loom_ckpt_list(outer, &list, 0);
    for (int i = 0; i < n; i++) {
        char own[LOOM_CKPT_PATH_MAX];
        loom_ckpt_step_dir(own, sizeof own, tier, list[i].step);
        if (list[i].step <= step && access(own, F_OK) != 0) loom_ckpt_remove_step(list[i].path);
    }
    free(list);
}

/* Removes all but the newest `keep` complete checkpoints older than or equal to `step`,
 * and incomplete folders older than the newest complete one; the outer state with them. */
static void prune(const char *tier, int keep, int64_t step) {
    loom_ckpt_entry *list = NULL;
    int n = loom_ckpt_list(tier, &list, 0);
    int complete = 0;
    for (int i = 0; i < n; i++) {
        if (list[i].step > step) continue; /* newer leftovers: overwritten later */
        char m[1500];
        snprintf(m, sizeof m, "%s/manifest.json", list[i].path);
        int valid = access(m, F_OK) == 0;
        if (valid && ++complete <= keep) continue;
        if (!valid && list[i].step == step) continue;
        loom_ckpt_remove_step(list[i].path);
    }
    free(list);
    prune_outer(tier, step);
}

loom_status loom_ckpt_commit(const char *dir, const char *tier, int keep, int world_size,
                             loom_ckpt_manifest *run, loom_error *err) {
    loom_status st = LOOM_OK;
    for (int r = 0; r < world_size && !st; r++) {
        char name[64], path[LOOM_CKPT_PATH_MAX];
        loom_ckpt_index_name(name, sizeof name, r);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        loom_ckpt_manifest idx;
        if (!(st = loom_ckpt_manifest_load(&idx, path, 1, err))) {
            st = loom_ckpt_manifest_merge(run, &idx, err);
            loom_ckpt_manifest_free(&idx);
        }
    }
    char path[LOOM_CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (!st) st = loom_ckpt_manifest_check_cover(run, path, err);
    char *text = st ? NULL : loom_ckpt_manifest_dump(run, 0);
    if (!st && !text) st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    if (!st) st = loom_ckpt_write_atomic(path, text, err);
    free(text);
    if (st || !tier[0]) return st;
    const char *base = strrchr(dir, '/');
    char latest[LOOM_CKPT_PATH_MAX], line[64];
    snprintf(latest, sizeof latest, "%s/latest", tier);
    snprintf(line, sizeof line, "%s\n", base ? base + 1 : dir);
    if ((st = loom_ckpt_write_atomic(latest, line, err))) return st;
    if (keep > 0) prune(tier, keep, run->step);
    return LOOM_OK;
}
