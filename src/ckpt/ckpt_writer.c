#include "ckpt/ckpt_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef LOOM_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* XXH3 with AVX2/AVX-512 chosen at run time (CMakeLists.txt) */
#endif

#include "ckpt/ckpt_commit.h"
#include "ckpt/safetensors.h"
#include "core/fault.h"
#include "core/clock.h"
#include "core/fs.h"

static void *thread_main(void *arg);

static loom_status build_image(loom_ckpt_writer *w, const loom_ckpt_descs *t, loom_error *err) {
    const int n = w->plan.n;
    loom_tensor_view *views = calloc((size_t)(n ? n : 1), sizeof *views);
    char(*keys)[256] = calloc((size_t)(n ? n : 1), sizeof *keys);
    w->names = calloc((size_t)(n ? n : 1), sizeof *w->names);
    w->dims = calloc((size_t)(n ? n : 1), sizeof *w->dims);
    w->gshape = calloc((size_t)(n ? n : 1), sizeof *w->gshape);
    w->file_offset = calloc((size_t)(n ? n : 1), sizeof *w->file_offset);
    w->checksum = calloc((size_t)(n ? n : 1), sizeof *w->checksum);
    if (!views || !keys || !w->names || !w->dims || !w->gshape || !w->file_offset || !w->checksum) {
        free(views);
        free(keys);
        return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint writer: out of memory");
    }
    uint64_t data = 0;
    for (int i = 0; i < n; i++) {
        const loom_ckpt_piece *q = &w->plan.items[i];
        const loom_ckpt_desc *p = &t->items[q->tensor];
        loom_ckpt_tensor_name(w->names[i], sizeof w->names[i], q->kind, p->name);
        w->dims[i][0] = p->ndim;
        w->gshape[i][0] = p->global_shape[0];
        w->gshape[i][1] = p->ndim == 2 ? p->global_shape[1] : 0;
        /* The safetensors key names the box: NAME[r0:r1,c0:c1] */
        const loom_ckpt_box *b = &q->box;
        if (p->ndim == 2)
            snprintf(keys[i], sizeof keys[i], "%s[%lld:%lld,%lld:%lld]", w->names[i],
                     (long long)b->off[0], (long long)(b->off[0] + b->len[0]), (long long)b->off[1],
                     (long long)(b->off[1] + b->len[1]));
        else
            snprintf(keys[i], sizeof keys[i], "%s[%lld:%lld]", w->names[i], (long long)b->off[0],
                     (long long)(b->off[0] + b->len[0]));
        views[i].name = keys[i];
        views[i].dtype = LOOM_DTYPE_F32;
        views[i].ndim = p->ndim;
        views[i].shape[0] = b->len[0];
        views[i].shape[1] = b->len[1];
        w->file_offset[i] = data; /* relative to the data section for now */
        data += (uint64_t)loom_ckpt_box_volume(b) * 4;
    }
    char rank[16];
    snprintf(rank, sizeof rank, "%d", w->rank);
    const char *mk[2] = {"format", "rank"}, *mv[2] = {"loom-checkpoint-shard-1", rank};
    char *header = loom_safetensors_header(views, n, mk, mv, 2);
    free(views);
    free(keys);
    if (!header) return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint writer: out of memory");
    size_t len = strlen(header), padded = (len + 7) & ~(size_t)7;
    w->image_bytes = 8 + padded + data;
    /* 2 MiB aligned, transparent huge pages where the kernel allows: fewer TLB misses
     * and page faults over a buffer of ~1.5 GB for a 124M model. */
    if (posix_memalign((void **)&w->image, (size_t)2 << 20, w->image_bytes) != 0) w->image = NULL;
    if (w->image) madvise(w->image, w->image_bytes, MADV_HUGEPAGE);
    if (!w->image) {
        free(header);
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "checkpoint writer: cannot allocate a %zu-byte staging buffer",
                              w->image_bytes);
    }
    /* Only the header now: the writer thread touches the data pages when it starts (off
     * the path of a restart to its first step), so the first save does not pay for page
     * faults unless it comes before that is done. */
    w->data_start = 8 + padded;
    uint64_t hlen = padded;
    memcpy(w->image, &hlen, 8);
    memcpy(w->image + 8, header, len);
    memset(w->image + 8 + len, ' ', padded - len);
    free(header);
    for (int i = 0; i < n; i++) w->file_offset[i] += 8 + padded;
    return LOOM_OK;
}

loom_status loom_ckpt_writer_create(loom_ckpt_writer *w, const loom_ckpt_descs *t,
                                    const loom_ckpt_buffer src[LOOM_CKPT_KINDS], int rank,
                                    loom_error *err) {
    return loom_ckpt_writer_create_planned(w, t, src, NULL, rank, err);
}

loom_status loom_ckpt_writer_create_planned(loom_ckpt_writer *w, const loom_ckpt_descs *t,
                                            const loom_ckpt_buffer src[LOOM_CKPT_KINDS],
                                            loom_ckpt_plan *plan, int rank, loom_error *err) {
    memset(w, 0, sizeof *w);
    w->rank = rank;
    loom_status st = LOOM_OK;
    if (plan) { /* taken over */
        w->plan = *plan;
        memset(plan, 0, sizeof *plan);
    }
    for (int k = 0; k < LOOM_CKPT_KINDS && !st; k++) {
        w->src[k] = src[k];
        if (!plan && src[k].data)
            st = loom_ckpt_plan_range(&w->plan, t, (loom_ckpt_kind)k, src[k].lo, src[k].hi, 1,
                                      LOOM_CKPT_CHUNK_FLOATS, err);
    }
    if (!st) st = build_image(w, t, err);
    if (!st && !(w->hash = XXH3_createState()))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint writer: out of memory");
    w->staged = 1; /* nothing to stage yet */
    if (st) {
        loom_ckpt_writer_destroy(w);
        return st;
    }
    if (loom_worker_start(&w->worker, thread_main, w) != 0) {
        loom_ckpt_writer_destroy(w);
        return loom_error_set(err, LOOM_ERR_IO, "checkpoint writer: cannot start a thread");
    }
    return LOOM_OK;
}

void loom_ckpt_writer_destroy(loom_ckpt_writer *w) {
    loom_worker_stop(&w->worker);
    loom_ckpt_manifest_free(&w->run);
    loom_ckpt_plan_free(&w->plan);
    free(w->names);
    free(w->dims);
    free(w->gshape);
    free(w->file_offset);
    free(w->checksum);
    free(w->image);
    XXH3_freeState(w->hash);
    memset(w, 0, sizeof *w);
}

/* Copies piece i into the staging image and checksums it on the way: XXH3's streaming
 * digest equals the one-shot one, so each row is hashed while it is still in cache. */
static void stage_piece(loom_ckpt_writer *w, int i, XXH3_state_t *h) {
    const loom_ckpt_piece *q = &w->plan.items[i];
    const loom_ckpt_buffer *b = &w->src[q->kind];
    float *dst = (float *)(w->image + w->file_offset[i]);
    const size_t cols = (size_t)q->box.len[1];
    XXH3_64bits_reset(h);
    for (int64_t r = 0; r < q->box.len[0]; r++) {
        float *row = dst + (size_t)r * cols;
        memcpy(row, b->data + (q->local + (size_t)(r * q->stride) - b->base), cols * sizeof(float));
        XXH3_64bits_update(h, row, cols * sizeof(float));
    }
    w->checksum[i] = XXH3_64bits_digest(h);
}

/* The staging copy (background thread): afterwards the training buffers may change. */
static void stage(loom_ckpt_writer *w) {
    double t0 = loom_now_ms(), c0 = loom_thread_cpu_ms();
    for (int i = 0; i < w->plan.n; i++) stage_piece(w, i, w->hash);
    w->stage_ms = loom_now_ms() - t0;
    w->stage_cpu_ms = loom_thread_cpu_ms() - c0;
    pthread_mutex_lock(&w->worker.mu);
    w->staged = 1;
    pthread_cond_broadcast(&w->worker.cv);
    pthread_mutex_unlock(&w->worker.mu);
}

double loom_ckpt_writer_wait_staged(loom_ckpt_writer *w) {
    double t0 = loom_now_ms();
    pthread_mutex_lock(&w->worker.mu);
    while (!w->staged) pthread_cond_wait(&w->worker.cv, &w->worker.mu);
    pthread_mutex_unlock(&w->worker.mu);
    return loom_now_ms() - t0;
}

static loom_status submit(loom_ckpt_writer *w, loom_ckpt_job job, loom_error *err) {
    if (!loom_worker_claim(&w->worker))
        return loom_error_set(err, LOOM_ERR_STATE, "checkpoint writer: a job is still running");
    w->job = job;
    if (job == LOOM_CKPT_JOB_WRITE) w->staged = 0;
    loom_worker_post(&w->worker);
    return LOOM_OK;
}

loom_status loom_ckpt_writer_start(loom_ckpt_writer *w, const char *dir, loom_error *err) {
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    return submit(w, LOOM_CKPT_JOB_WRITE, err);
}

loom_status loom_ckpt_writer_start_commit(loom_ckpt_writer *w, const char *dir, const char *tier,
                                          int keep, int world_size, loom_ckpt_manifest *run,
                                          loom_error *err) {
    if (!loom_worker_idle(&w->worker))
        return loom_error_set(err, LOOM_ERR_STATE, "checkpoint writer: a job is still running");
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    snprintf(w->tier, sizeof w->tier, "%s", tier);
    w->keep = keep;
    w->world_size = world_size;
    loom_ckpt_manifest_free(&w->run);
    w->run = *run;
    memset(run, 0, sizeof *run);
    return submit(w, LOOM_CKPT_JOB_COMMIT, err);
}

int loom_ckpt_writer_idle(loom_ckpt_writer *w) {
    return loom_worker_idle(&w->worker);
}

loom_status loom_ckpt_writer_wait(loom_ckpt_writer *w, loom_error *err) {
    return loom_worker_wait(&w->worker, err);
}

#define WRITE_BLOCK ((size_t)32 << 20)
#define DIRECT_BLOCK ((size_t)4 << 20) /* larger O_DIRECT writes fail (EFAULT) on some VMs */
#define DIRECT_ALIGN ((size_t)4096)

/* Turns O_DIRECT off for the rest of the file (a tail that is not block-sized, or a
 * filesystem or device that refuses direct I/O). */
static int direct_off(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags & ~O_DIRECT);
}

/* Writes n bytes to path through path.tmp: write, fsync, rename. direct: try O_DIRECT
 * (data must be DIRECT_ALIGN aligned): the bytes go from the staging buffer to the device
 * with no page-cache copy, which on a shared machine is most of a buffered write's CPU
 * time; where it is refused (tmpfs, odd block sizes) buffered writes take over, in large
 * blocks with the disk's writeback started behind each. times (or NULL): adds the ms
 * spent in write() and in fsync(); *used_direct: whether O_DIRECT wrote any of it. */
static loom_status write_file(const char *path, const void *data, size_t n, int direct,
                              double times[2], int *used_direct, loom_error *err) {
    char tmp[LOOM_CKPT_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = direct ? open(tmp, flags | O_DIRECT, 0644) : -1;
    if (fd < 0) {
        direct = 0;
        fd = open(tmp, flags, 0644);
    }
    if (fd < 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const uint8_t *p = data;
    size_t done = 0, queued = 0;
    int e = 0, wrote_direct = 0;
    double t0 = loom_now_ms();
    while (done < n) {
        size_t len = n - done < WRITE_BLOCK ? n - done : WRITE_BLOCK;
        if (direct && len > DIRECT_BLOCK) len = DIRECT_BLOCK;
        if (direct && len % DIRECT_ALIGN != 0) {
            direct = 0, queued = done;
            if (direct_off(fd) != 0) {
                e = errno;
                break;
            }
        }
        ssize_t k = write(fd, p + done, len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && direct && (errno == EINVAL || errno == EFAULT)) { /* refused: buffered */
            direct = 0, queued = done;
            if (direct_off(fd) == 0) continue;
        }
        if (k <= 0) {
            e = k < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)k;
        wrote_direct |= direct;
        /* Buffered: start the disk writing the block just copied into the page cache
         * while the next one is copied (advisory: fsync below reports any error). */
        if (!direct && (done - queued >= WRITE_BLOCK || done == n)) {
            (void)sync_file_range(fd, (off_t)queued, (off_t)(done - queued), SYNC_FILE_RANGE_WRITE);
            queued = done;
        }
    }
    double t1 = loom_now_ms();
    if (!e && fsync(fd) != 0) e = errno;
    if (times) times[0] += t1 - t0, times[1] += loom_now_ms() - t1;
    if (used_direct) *used_direct = wrote_direct;
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    return LOOM_OK;
}

char *loom_ckpt_writer_index_text(const loom_ckpt_writer *w, const char *data_name) {
    loom_ckpt_manifest idx;
    memset(&idx, 0, sizeof idx);
    int ok = loom_ckpt_manifest_add_file(&idx, data_name) == 0;
    for (int i = 0; i < w->plan.n && ok; i++) {
        const loom_ckpt_piece *q = &w->plan.items[i];
        loom_ckpt_chunk c = {0,
                             {q->box.off[0], q->box.off[1]},
                             {q->box.len[0], q->box.len[1]},
                             w->file_offset[i],
                             (uint64_t)loom_ckpt_box_volume(&q->box) * 4,
                             w->checksum[i]};
        ok = loom_ckpt_manifest_add_chunk(&idx, w->names[i], w->dims[i][0], w->gshape[i], &c,
                                          NULL) == LOOM_OK;
    }
    char *text = ok ? loom_ckpt_manifest_dump(&idx, 1) : NULL;
    loom_ckpt_manifest_free(&idx);
    return text;
}

static loom_status write_index(loom_ckpt_writer *w, const char *data_name, loom_error *err) {
    char *text = loom_ckpt_writer_index_text(w, data_name);
    if (!text) return loom_error_set(err, LOOM_ERR_NOMEM, "checkpoint index: out of memory");
    char name[64], path[LOOM_CKPT_PATH_MAX];
    loom_ckpt_index_name(name, sizeof name, w->rank);
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    loom_status st = write_file(path, text, strlen(text), 0, NULL, NULL, err);
    free(text);
    return st;
}

/* A save, in the background thread: stage (copy + checksums; then the training thread may
 * update the buffers again), the data file, the chunk index. */
static loom_status run_write(loom_ckpt_writer *w, loom_error *err) {
    stage(w);
    double t0 = loom_now_ms(), c0 = loom_thread_cpu_ms();
    if (loom_mkdir_p(w->dir) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", w->dir, strerror(errno));
    if (w->rank == 0) { /* a stale manifest of the same step must not survive a rewrite */
        char m[LOOM_CKPT_PATH_MAX + 16];
        snprintf(m, sizeof m, "%s/manifest.json", w->dir);
        unlink(m);
    }
    char name[64], path[LOOM_CKPT_PATH_MAX];
    loom_ckpt_data_name(name, sizeof name, w->rank);
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    double times[2] = {0, 0};
    loom_status st = write_file(path, w->image, w->image_bytes, 1, times, &w->direct_io, err);
    w->data_write_ms = times[0];
    w->fsync_ms = times[1];
    if (!st) st = write_index(w, name, err);
    if (!st) loom_fault_in_save(w->dir, path); /* injected faults (off unless asked for) */
    w->written_bytes = w->image_bytes;
    w->write_ms = loom_now_ms() - t0;
    w->write_cpu_ms = loom_thread_cpu_ms() - c0;
    return st;
}

static void *thread_main(void *arg) {
    loom_ckpt_writer *w = arg;
    memset(w->image + w->data_start, 0, w->image_bytes - w->data_start);
    while (loom_worker_next(&w->worker)) {
        loom_error e = {0};
        loom_status st =
            w->job == LOOM_CKPT_JOB_WRITE
                ? run_write(w, &e)
                : loom_ckpt_commit(w->dir, w->tier, w->keep, w->world_size, &w->run, &e);
        loom_worker_done(&w->worker, st, &e);
    }
    return NULL;
}
