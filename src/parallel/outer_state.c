/* The outer optimizer's state in checkpoints (parallel/outer.h): one file per rank of
 * each worker group, "DIR/outer/step_%08d/rank_%05d.bin": a header, the round-start
 * parameters, and per fragment its last send, its last outer gradient norm part and this
 * worker's chunk of the momentum; a CRC-32C of all of it last. Written whole to a
 * temporary name, then renamed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/fs.h"
#include "parallel/outer.h"
#include "parallel/outer_impl.h"

/* version 2 adds --outer-start-step after the header (version 1: none, so 0) */
static const char MAGIC[8] = {'L', 'O', 'O', 'M', 'O', 'U', 'T', '2'};
static const char MAGIC1[8] = {'L', 'O', 'O', 'M', 'O', 'U', 'T', '1'};

typedef struct {
    char magic[8];
    int64_t step;
    uint64_t total;
    int32_t n_frag, workers, worker, rank;
} header;

static void path_of(char *out, size_t n, const char *dir, int step, int rank) {
    snprintf(out, n, "%s/outer/step_%08d/rank_%05d.bin", dir, step, rank);
}

typedef struct {
    FILE *f;
    uint32_t crc;
    int ok;
} stream;

static void put(stream *s, const void *p, size_t n) {
    s->crc = loom_crc32c(s->crc, p, n);
    if (s->ok && n && fwrite(p, 1, n, s->f) != n) s->ok = 0;
}

static void get(stream *s, void *p, size_t n) {
    if (s->ok && n && fread(p, 1, n, s->f) != n) s->ok = 0;
    if (s->ok) s->crc = loom_crc32c(s->crc, p, n);
}

/* The words of the buffer a fragment in flight keeps: the all-to-all's receive buffer,
 * or the all-gather's. */
static size_t flight_words(const loom_outer *o, const loom_outer_fragment *f, float **buf) {
    const int W = o->comm->size;
    const int *counts = f->ph == LOOM_OUTER_SCATTER ? f->rcounts : f->gcounts;
    *buf = f->ph == LOOM_OUTER_SCATTER ? f->recv : f->gather;
    size_t n = 0;
    for (int j = 0; j < W; j++) n += (size_t)counts[j];
    return f->ph == LOOM_OUTER_IDLE ? 0 : n;
}

loom_status loom_outer_save(loom_outer *o, const char *dir, int step, int rank, loom_error *err) {
    if (o->elastic) return loom_outer_elastic_save(o, dir, step, err);
    /* a fragment in flight: its data is waited for here (what arrives does not depend on
     * when), its processing stays where the schedule has it */
    loom_status st = loom_outer_wait_in_flight(o, err);
    if (st) return st;
    char path[1200], tmp[1216];
    path_of(path, sizeof path, dir, step, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    loom_mkdir_parent(path);
    stream s = {fopen(tmp, "wb"), 0, 1};
    if (!s.f)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-dir: cannot write %s: %s", tmp,
                              strerror(errno));
    header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.step = step, h.total = o->n_start, h.n_frag = o->n_frag;
    h.workers = o->comm->size, h.worker = o->comm->rank, h.rank = rank;
    put(&s, &h, sizeof h);
    const int32_t ext[2] = {o->cfg.start_step, 0};
    put(&s, ext, sizeof ext);
    put(&s, o->start, o->n_start * sizeof(float));
    for (int k = 0; k < o->n_frag; k++) {
        const loom_outer_fragment *f = &o->frag[k];
        const int32_t last = f->last_sent;
        const uint64_t own = loom_outer_chunk_len(f, o->comm->rank);
        put(&s, &last, sizeof last);
        put(&s, &o->norm_sq[k], sizeof(double));
        put(&s, &own, sizeof own);
        put(&s, f->mom, own * sizeof(float));
        float *buf;
        const int32_t ph = (int32_t)f->ph;
        const uint64_t words = flight_words(o, f, &buf);
        put(&s, &ph, sizeof ph);
        put(&s, &words, sizeof words);
        put(&s, buf, words * sizeof(float));
    }
    const uint32_t crc = s.crc;
    put(&s, &crc, sizeof crc);
    const int closed = fclose(s.f) == 0;
    if (!s.ok || !closed || rename(tmp, path) != 0) {
        remove(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-dir: writing %s failed: %s", path,
                              strerror(errno));
    }
    return LOOM_OK;
}

int loom_outer_saved(const loom_outer *o, const char *dir, int step, int rank) {
    if (o->elastic) return loom_outer_elastic_saved(o, dir, step);
    char path[1200];
    path_of(path, sizeof path, dir, step, rank);
    return access(path, F_OK) == 0;
}

loom_status loom_outer_load(loom_outer *o, const char *dir, int step, int rank, loom_error *err) {
    if (o->elastic) return loom_outer_elastic_load(o, dir, step, err);
    char path[1200];
    path_of(path, sizeof path, dir, step, rank);
    stream s = {fopen(path, "rb"), 0, 1};
    if (!s.f)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--resume: the outer optimizer's state %s: cannot open: %s (saved "
                              "by --outer diloco with the same workers and layout)",
                              path, strerror(errno));
    header h;
    get(&s, &h, sizeof h);
    loom_status st = LOOM_OK;
    const int v1 = s.ok && memcmp(h.magic, MAGIC1, 8) == 0;
    int32_t ext[2] = {0, 0};
    if (s.ok && !v1) get(&s, ext, sizeof ext);
    /* another S is named only once the CRC holds: a flipped bit there reads as corrupt */
    const int other_start = ext[0] != o->cfg.start_step;
    if (!s.ok || (!v1 && memcmp(h.magic, MAGIC, 8)) || h.step != step || h.total != o->n_start ||
        h.n_frag != o->n_frag || h.workers != o->comm->size || h.worker != o->comm->rank) {
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "--resume: %s: not this run's outer state (step, size, fragments or "
                            "workers differ)",
                            path);
    } else {
        get(&s, o->start, o->n_start * sizeof(float));
        for (int k = 0; k < o->n_frag && s.ok; k++) {
            loom_outer_fragment *f = &o->frag[k];
            int32_t last = 0;
            uint64_t own = 0;
            get(&s, &last, sizeof last);
            get(&s, &o->norm_sq[k], sizeof(double));
            get(&s, &own, sizeof own);
            if (own != loom_outer_chunk_len(f, o->comm->rank)) s.ok = 0;
            get(&s, f->mom, own * sizeof(float));
            f->last_sent = last;
            int32_t ph = 0;
            uint64_t words = 0;
            get(&s, &ph, sizeof ph);
            if (ph < LOOM_OUTER_IDLE || ph > LOOM_OUTER_GATHER) s.ok = 0;
            f->ph = s.ok ? (loom_outer_phase)ph : LOOM_OUTER_IDLE;
            float *buf;
            get(&s, &words, sizeof words);
            if (words != flight_words(o, f, &buf)) s.ok = 0;
            get(&s, buf, words * sizeof(float));
            memset(&f->op, 0, sizeof f->op); /* arrived: waiting for it is a no-op */
        }
        const uint32_t want = s.crc;
        uint32_t crc = 0;
        if (s.ok && fread(&crc, sizeof crc, 1, s.f) != 1) s.ok = 0;
        if (!s.ok || crc != want)
            st = loom_error_set(err, LOOM_ERR_INPUT, "--resume: %s: truncated or corrupt", path);
        else if (other_start)
            st = loom_outer_other_start(o, path, (int)ext[0], err);
    }
    fclose(s.f);
    return st;
}
