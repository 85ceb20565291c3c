/* Elastic DiLoCo workers: the lead's outer state in checkpoints, DIR/outer/step_N/elastic.bin
 * (parallel/outer.h's save and load; parallel/outer_elastic_impl.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/fs.h"
#include "parallel/outer_elastic_impl.h"

/* Version 2 adds the run's --outer-start-step after the head (version 1 files: 0). */
static const char MAGIC1[8] = {'L', 'O', 'O', 'M', 'E', 'L', 'A', '1'};
static const char MAGIC[8] = {'L', 'O', 'O', 'M', 'E', 'L', 'A', '2'};

typedef struct {
    char magic[8];
    int64_t step;
    uint64_t all;
    int32_t workers, worker, n_members;
    int32_t members[MAX_W];
} state_head;

static void state_path(char *out, size_t n, const char *dir, int step) {
    snprintf(out, n, "%s/outer/step_%08d/elastic.bin", dir, step);
}

int loom_outer_elastic_saved(const loom_outer *o, const char *dir, int step) {
    if (!o->elastic->lead) return 1;
    char path[1200];
    state_path(path, sizeof path, dir, step);
    return access(path, F_OK) == 0;
}

loom_status loom_outer_elastic_save(loom_outer *o, const char *dir, int step, loom_error *err) {
    elastic *e = o->elastic;
    if (!e->lead) return LOOM_OK; /* the lead holds the group's outer state */
    /* a streaming sync under way: its outer step is part of this step's state (the landing
     * then only spreads it; a resume lands it from the saved round-start values) */
    loom_status fs;
    if (e->pending && (fs = loom_elastic_flight_apply(o, err))) return fs;
    char path[1200], tmp[1216];
    state_path(path, sizeof path, dir, step);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    loom_mkdir_parent(path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-dir: cannot write %s: %s", tmp,
                              strerror(errno));
    state_head h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.step = step, h.all = e->all, h.workers = e->W, h.worker = e->me;
    for (int w = 0; w < e->W; w++)
        if (e->member[w]) h.members[h.n_members++] = w;
    const size_t bytes = e->all * sizeof(float);
    const int32_t ext[2] = {o->cfg.start_step, 0};
    uint32_t crc = loom_crc32c(0, &h, sizeof h);
    crc = loom_crc32c(crc, ext, sizeof ext);
    crc = loom_crc32c(crc, e->start_all, bytes);
    crc = loom_crc32c(crc, e->mom, bytes);
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(ext, sizeof ext, 1, f) == 1 &&
             (!bytes || fwrite(e->start_all, bytes, 1, f) == 1) &&
             (!bytes || fwrite(e->mom, bytes, 1, f) == 1) && fwrite(&crc, sizeof crc, 1, f) == 1;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-dir: writing %s failed: %s", path,
                              strerror(errno));
    }
    return LOOM_OK;
}

loom_status loom_outer_elastic_load(loom_outer *o, const char *dir, int step, loom_error *err) {
    elastic *e = o->elastic;
    if (!e->lead) return LOOM_OK;
    char path[1200];
    state_path(path, sizeof path, dir, step);
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: the elastic worker's outer state %s: cannot open: %s "
                              "(saved by --elastic-worker with the same workers and layout)",
                              path, strerror(errno));
    state_head h;
    const size_t bytes = e->all * sizeof(float);
    int ok = fread(&h, sizeof h, 1, f) == 1;
    const int v1 = ok && !memcmp(h.magic, MAGIC1, 8);
    int32_t ext[2] = {0, 0};
    ok = ok && (v1 || (!memcmp(h.magic, MAGIC, 8) && fread(ext, sizeof ext, 1, f) == 1));
    ok = ok && h.step == step && h.all == e->all && h.workers == e->W && h.worker == e->me &&
         h.n_members >= 0 && h.n_members <= MAX_W;
    uint32_t crc = 0;
    ok = ok && (!bytes || fread(e->start_all, bytes, 1, f) == 1) &&
         (!bytes || fread(e->mom, bytes, 1, f) == 1) && fread(&crc, sizeof crc, 1, f) == 1;
    fclose(f);
    if (ok) {
        uint32_t want = loom_crc32c(0, &h, sizeof h);
        if (!v1) want = loom_crc32c(want, ext, sizeof ext);
        want = loom_crc32c(want, e->start_all, bytes);
        ok = loom_crc32c(want, e->mom, bytes) == crc;
    }
    if (!ok) {
        memset(e->mom, 0, bytes);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: %s: not this worker's outer state (step, size or workers "
                              "differ), truncated or corrupt",
                              path);
    }
    if (ext[0] != o->cfg.start_step) { /* named only once the CRC holds */
        memset(e->mom, 0, bytes);
        return loom_outer_other_start(o, path, (int)ext[0], err);
    }
    e->loaded = 1;
    e->n_saved_members = h.n_members;
    memcpy(e->saved_members, h.members, sizeof h.members);
    return LOOM_OK;
}
