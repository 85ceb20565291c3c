#include "ckpt/ckpt_loader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#include "ckpt/safetensors.h"
#include "core/clock.h"

typedef struct {
    int *fd;
    uint64_t *size;
    int n;
} file_set;

static void files_close(file_set *fs) {
    for (int i = 0; i < fs->n; i++)
        if (fs->fd[i] >= 0) close(fs->fd[i]);
    free(fs->fd);
    free(fs->size);
    memset(fs, 0, sizeof *fs);
}

static loom_status files_open(file_set *fs, const char *dir, const loom_ckpt_manifest *m,
                              const char *used, loom_error *err) {
    fs->n = m->n_files;
    fs->fd = malloc((size_t)(fs->n ? fs->n : 1) * sizeof *fs->fd);
    fs->size = calloc((size_t)(fs->n ? fs->n : 1), sizeof *fs->size);
    if (!fs->fd || !fs->size) {
        fs->n = 0;
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    }
    for (int i = 0; i < fs->n; i++) fs->fd[i] = -1;
    for (int i = 0; i < fs->n; i++) {
        if (used && !used[i]) continue;
        char path[1700];
        snprintf(path, sizeof path, "%s/%s", dir, m->files[i]);
        struct stat sb;
        if ((fs->fd[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fs->fd[i], &sb) != 0)
            return loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot open: %s", path,
                                  strerror(errno));
        fs->size[i] = (uint64_t)sb.st_size;
        (void)posix_fadvise(fs->fd[i], 0, 0, POSIX_FADV_SEQUENTIAL); /* larger readahead */
    }
    return LOOM_OK;
}

/* Chunk c's byte range inside its (open) file. Checked for every chunk before a read
 * buffer is sized, so a manifest's byte counts never decide an allocation on their own. */
static loom_status chunk_in_file(const char *dir, const loom_ckpt_manifest *m, const file_set *fs,
                                 const char *name, const loom_ckpt_chunk *c, loom_error *err) {
    if (c->byte_offset > fs->size[c->file] || c->bytes > fs->size[c->file] - c->byte_offset)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s/%s: tensor '%s': chunk bytes [%" PRIu64 ", %" PRIu64
                              ") beyond the end of the file (%" PRIu64 " bytes; truncated?)",
                              dir, m->files[c->file], name, c->byte_offset,
                              c->byte_offset + c->bytes, fs->size[c->file]);
    return LOOM_OK;
}

#define READ_BLOCK ((size_t)512 << 10) /* cache-sized: read, hash and scatter while hot */

/* Where the rows of a chunk go: this rank's pieces of the same tensor (NULL: verify only). */
typedef struct {
    const loom_ckpt_plan *plan;
    const int *ptensor; /* per piece: its tensor's index in the manifest */
    int tensor;
    const loom_ckpt_buffer *dst;
    int64_t *covered; /* per piece: elements copied */
} scatter_ctx;

/* Copies rows [g0, g0 + nr) of chunk box cb (src: those rows, contiguous) into every piece
 * they intersect. */
static void scatter_rows(const scatter_ctx *s, const loom_ckpt_box *cb, int64_t g0, int64_t nr,
                         const float *src) {
    const loom_ckpt_box bb = {{g0, cb->off[1]}, {nr, cb->len[1]}};
    for (int i = 0; i < s->plan->n; i++) {
        const loom_ckpt_piece *q = &s->plan->items[i];
        loom_ckpt_box ib;
        if (s->ptensor[i] != s->tensor || !loom_ckpt_box_intersect(&bb, &q->box, &ib)) continue;
        const loom_ckpt_buffer *b = &s->dst[q->kind];
        for (int64_t g = ib.off[0]; g < ib.off[0] + ib.len[0]; g++) {
            const float *from = src + (g - g0) * cb->len[1] + (ib.off[1] - cb->off[1]);
            size_t f =
                q->local + (size_t)((g - q->box.off[0]) * q->stride + (ib.off[1] - q->box.off[1]));
            memcpy(b->data + (f - b->base), from, (size_t)ib.len[1] * sizeof(float));
        }
#pragma omp atomic
        s->covered[i] += loom_ckpt_box_volume(&ib);
    }
}

/* Where the whole chunk cb goes when one piece takes all of it into one contiguous run of
 * its buffer (the same layout as at save time, and most chunks when resharding), or NULL:
 * then its bytes are read straight into place, with no scatter copy. *piece: that piece. */
static float *direct_target(const scatter_ctx *s, const loom_ckpt_box *cb, int *piece) {
    float *to = NULL;
    for (int i = 0; i < s->plan->n; i++) {
        const loom_ckpt_piece *q = &s->plan->items[i];
        loom_ckpt_box ib;
        if (s->ptensor[i] != s->tensor || !loom_ckpt_box_intersect(cb, &q->box, &ib)) continue;
        if (to || loom_ckpt_box_volume(&ib) != loom_ckpt_box_volume(cb)) return NULL;
        const int contiguous =
            cb->len[0] == 1 || (cb->len[1] == q->box.len[1] && q->stride == q->box.len[1]);
        if (!contiguous) return NULL;
        const loom_ckpt_buffer *b = &s->dst[q->kind];
        size_t f = q->local + (size_t)((cb->off[0] - q->box.off[0]) * q->stride +
                                       (cb->off[1] - q->box.off[1]));
        to = b->data + (f - b->base);
        *piece = i;
    }
    return to;
}

/* The read buffer a chunk needs: READ_BLOCK, or one row when a row is larger. */
static size_t block_bytes(const loom_ckpt_chunk *c) {
    size_t row = (size_t)c->len[1] * sizeof(float);
    return row > READ_BLOCK ? row : READ_BLOCK;
}

/* A thread's share of the load's phase times (loom_ckpt_load_stats). */
typedef struct {
    double populate, read, hash, copy;
    uint64_t direct, copied;
} phase_times;

/* pread of exactly n bytes at `at` (EINTR and short reads retried). */
static loom_status read_full(const char *dir, const char *file, int fd, void *to, uint64_t n,
                             uint64_t at, loom_error *err) {
    for (uint64_t done = 0; done < n;) {
        ssize_t k = pread(fd, (char *)to + done, n - done, (off_t)(at + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return loom_error_set(err, LOOM_ERR_IO, "%s/%s: read failed: %s", dir, file,
                                  k < 0 ? strerror(errno) : "unexpected end of file");
        done += (uint64_t)k;
    }
    return LOOM_OK;
}

/* How a chunk reaches its destination. */
typedef enum {
    VIA_BUFFER = 0, /* read through the block buffer and scattered (or only verified) */
    INTO_PLACE = 1, /* pread straight into fresh destination pages, made just before */
    COPY_WHOLE = 2  /* read through the block buffer, copied as one run into place */
} route;

/* Reads chunk c of tensor `name` in row-aligned blocks, checksumming each block while it is
 * in cache; the checksum is compared at the end (on a mismatch the destination holds
 * unverified data: the caller discards it). INTO_PLACE preads into `to` (fresh pages: their
 * huge pages are made first, one madvise for the chunk); COPY_WHOLE and VIA_BUFFER read
 * through buf (block_bytes(c)) and copy each block into `to`, or (when s) scatter it. */
static loom_status read_chunk(const char *dir, const loom_ckpt_manifest *m, const file_set *fs,
                              const char *name, const loom_ckpt_chunk *c, route how, float *to,
                              void *buf, XXH3_state_t *h, const scatter_ctx *s, phase_times *pt,
                              loom_error *err) {
    const char *file = m->files[c->file];
    loom_status st = chunk_in_file(dir, m, fs, name, c, err);
    if (st) return st;
    const loom_ckpt_box cb = {{c->off[0], c->off[1]}, {c->len[0], c->len[1]}};
    const uint64_t row = (uint64_t)c->len[1] * sizeof(float);
    const uint64_t rows_per_block = block_bytes(c) / row;
    XXH3_64bits_reset(h);
    double t = loom_now_ms(), u;
    if (how == INTO_PLACE) {
#ifdef MADV_POPULATE_WRITE
        /* one call for the chunk's whole pages (the edges are faulted by the reads) instead
         * of a page fault per page inside the copy, each an exit to the hypervisor on a VM */
        const uintptr_t page = 4096, a = ((uintptr_t)to + page - 1) & ~(page - 1),
                        b = ((uintptr_t)to + c->bytes) & ~(page - 1);
        if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#endif
        u = loom_now_ms();
        pt->populate += u - t;
        t = u;
    }
    for (uint64_t r0 = 0; r0 < (uint64_t)c->len[0]; r0 += rows_per_block) {
        const uint64_t nr =
            (uint64_t)c->len[0] - r0 < rows_per_block ? (uint64_t)c->len[0] - r0 : rows_per_block;
        const uint64_t n = nr * row, at = c->byte_offset + r0 * row;
        char *into = how == INTO_PLACE ? (char *)to + r0 * row : buf;
        if ((st = read_full(dir, file, fs->fd[c->file], into, n, at, err))) return st;
        u = loom_now_ms();
        pt->read += u - t;
        XXH3_64bits_update(h, into, n);
        t = loom_now_ms();
        pt->hash += t - u;
        if (how == COPY_WHOLE)
            memcpy((char *)to + r0 * row, buf, n);
        else if (how == VIA_BUFFER && s)
            scatter_rows(s, &cb, c->off[0] + (int64_t)r0, (int64_t)nr, buf);
        if (how != INTO_PLACE) {
            u = loom_now_ms();
            pt->copy += u - t;
            t = u;
        }
    }
    if (how == INTO_PLACE)
        pt->direct += c->bytes;
    else if (s)
        pt->copied += c->bytes;
    uint64_t sum = XXH3_64bits_digest(h);
    if (sum != c->checksum)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s/%s: tensor '%s' chunk at [%" PRId64 ", %" PRId64
                              "]: checksum mismatch (xxh3 %016" PRIx64 ", manifest says %016" PRIx64
                              "): the file is corrupt",
                              dir, file, name, c->off[0], c->off[1], sum, c->checksum);
    return LOOM_OK;
}

typedef struct {
    int tensor, chunk;
    route how;
    int piece; /* INTO_PLACE, COPY_WHOLE: the piece that takes the whole chunk */
    float *to; /* INTO_PLACE, COPY_WHOLE: where */
} job;

/* 1 when most pages of [p, p + n) are resident: memory the caller has already written
 * (e.g. after a reset before trying an older checkpoint; on --resume the parameters are
 * initialised only after the load, so they are fresh). The kernel's first copy into such 4 KiB
 * pages is slow on a VM with shadow paging (measured here: 3.3 s/GB for a pread into pages the
 * program had memset, 0.25 s/GB the second time), while a user-space copy from a hot
 * buffer runs at memory speed; pages not yet there (a fresh calloc, such as AdamW's
 * moments) are made as huge pages and read into straight. */
static int mostly_resident(const void *p, size_t n) {
    const uintptr_t page = 4096, a = (uintptr_t)p & ~(page - 1),
                    b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    const size_t pages = (b - a) / page;
    unsigned char vec[1024]; /* 4 MiB of pages per call */
    size_t resident = 0;
    for (size_t i = 0; i < pages; i += sizeof vec) {
        const size_t k = pages - i < sizeof vec ? pages - i : sizeof vec;
        if (mincore((void *)(a + i * page), k * page, vec) != 0) return 0;
        for (size_t j = 0; j < k; j++) resident += vec[j] & 1;
    }
    return 2 * resident > pages;
}

/* Marks the page-aligned inside of [p, p + n) for huge pages (one madvise per buffer, so
 * the mapping is not split per chunk). Advisory: a kernel without THP keeps 4 KiB pages. */
static void want_huge_pages(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1),
                    b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

/* A tensor frozen (--freeze) in the run that saved m: its weights are there, neither of
 * its AdamW moments nor its moving average is (a checkpoint holds no optimizer state for
 * frozen tensors). Returns its weights' entry, or NULL. */
static const loom_ckpt_tensor *frozen_when_saved(const loom_ckpt_manifest *m, const char *param,
                                                 loom_ckpt_kind kind) {
    if (kind != LOOM_CKPT_ADAM_M && kind != LOOM_CKPT_ADAM_V && kind != LOOM_CKPT_EMA) return NULL;
    char name[224];
    static const loom_ckpt_kind state[3] = {LOOM_CKPT_ADAM_M, LOOM_CKPT_ADAM_V, LOOM_CKPT_EMA};
    for (int k = 0; k < 3; k++) {
        loom_ckpt_tensor_name(name, sizeof name, state[k], param);
        if (loom_ckpt_manifest_find(m, name)) return NULL;
    }
    loom_ckpt_tensor_name(name, sizeof name, LOOM_CKPT_PARAMS, param);
    return loom_ckpt_manifest_find(m, name);
}

/* Zeros into piece q's place in its buffer. */
static void zero_piece(const loom_ckpt_piece *q, const loom_ckpt_buffer dst[LOOM_CKPT_KINDS]) {
    const loom_ckpt_buffer *b = &dst[q->kind];
    float *at = b->data + (q->local - b->base);
    for (int64_t r = 0; r < q->box.len[0]; r++)
        memset(at + r * q->stride, 0, (size_t)q->box.len[1] * sizeof(float));
}

#define PREFETCH_BYTES ((uint64_t)32 << 20) /* read ahead of the current chunk (WILLNEED) */

loom_status loom_ckpt_load(const char *dir, const loom_ckpt_manifest *m, const loom_ckpt_descs *t,
                           const loom_ckpt_buffer dst[LOOM_CKPT_KINDS], loom_ckpt_load_stats *stats,
                           loom_error *err) {
    loom_ckpt_plan plan = {0};
    loom_status st = LOOM_OK;
    for (int k = 0; k < LOOM_CKPT_KINDS && !st; k++)
        if (dst[k].data)
            st = loom_ckpt_plan_range(&plan, t, (loom_ckpt_kind)k, dst[k].lo, dst[k].hi, 0, 0, err);
    int *ptensor = calloc((size_t)(plan.n ? plan.n : 1), sizeof *ptensor);
    int64_t *covered = calloc((size_t)(plan.n ? plan.n : 1), sizeof *covered);
    char *used = calloc((size_t)(m->n_files ? m->n_files : 1), 1);
    job *jobs = NULL;
    int n_jobs = 0, cap_jobs = 0;
    file_set fs = {0};
    size_t max_bytes = 0;
    if (!st && (!ptensor || !covered || !used))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    /* Every wanted tensor must be in the checkpoint with the model's shape. */
    for (int i = 0; i < plan.n && !st; i++) {
        const loom_ckpt_desc *p = &t->items[plan.items[i].tensor];
        char name[224];
        loom_ckpt_tensor_name(name, sizeof name, plan.items[i].kind, p->name);
        const loom_ckpt_tensor *ct = loom_ckpt_manifest_find(m, name);
        int64_t gs1 = p->ndim == 2 ? p->global_shape[1] : 0;
        const loom_ckpt_tensor *w = ct ? NULL : frozen_when_saved(m, p->name, plan.items[i].kind);
        if (w && plan.items[i].kind == LOOM_CKPT_EMA) ct = w; /* the average from its weights */
        if (!ct && w) {
            zero_piece(&plan.items[i], dst); /* its moments start at zero */
            ptensor[i] = -1;
            covered[i] = loom_ckpt_box_volume(&plan.items[i].box);
        } else if (!ct)
            st =
                loom_error_set(err, LOOM_ERR_INPUT, "%s: checkpoint has no tensor '%s'", dir, name);
        else if (ct->ndim != p->ndim || ct->shape[0] != p->global_shape[0] || ct->shape[1] != gs1)
            st = loom_error_set(
                err, LOOM_ERR_INPUT,
                "%s: tensor '%s' has shape [%" PRId64 ", %" PRId64
                "] (%d-D) in the checkpoint; the model expects [%" PRId64 ", %" PRId64 "] (%d-D)",
                dir, name, ct->shape[0], ct->shape[1], ct->ndim, p->global_shape[0], gs1, p->ndim);
        else
            ptensor[i] = (int)(ct - m->tensors);
    }
    /* The chunks that intersect a wanted piece, and how each one gets there. */
    int fresh[LOOM_CKPT_KINDS] = {0};
    for (int ti = 0; ti < m->n_tensors && !st; ti++) {
        const loom_ckpt_tensor *ct = &m->tensors[ti];
        for (int c = 0; c < ct->n_chunks && !st; c++) {
            const loom_ckpt_box cb = {{ct->chunks[c].off[0], ct->chunks[c].off[1]},
                                      {ct->chunks[c].len[0], ct->chunks[c].len[1]}};
            int hit = 0;
            loom_ckpt_box ib;
            for (int i = 0; i < plan.n && !hit; i++)
                hit = ptensor[i] == ti && loom_ckpt_box_intersect(&cb, &plan.items[i].box, &ib);
            if (!hit) continue;
            if (n_jobs == cap_jobs) {
                cap_jobs = cap_jobs ? 2 * cap_jobs : 256;
                job *j = realloc(jobs, (size_t)cap_jobs * sizeof *j);
                if (!j) {
                    st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
                    break;
                }
                jobs = j;
            }
            job *jb = &jobs[n_jobs++];
            *jb = (job){ti, c, VIA_BUFFER, -1, NULL};
            const scatter_ctx sc = {&plan, ptensor, ti, dst, covered};
            /* (manifest.c has checked that a chunk's bytes are its box's) */
            if ((jb->to = direct_target(&sc, &cb, &jb->piece))) {
                jb->how = mostly_resident(jb->to, ct->chunks[c].bytes) ? COPY_WHOLE : INTO_PLACE;
                if (jb->how == INTO_PLACE) fresh[plan.items[jb->piece].kind] = 1;
            }
            used[ct->chunks[c].file] = 1;
        }
    }
    for (int k = 0; k < LOOM_CKPT_KINDS && !st; k++)
        if (fresh[k])
            want_huge_pages(dst[k].data + (dst[k].lo - dst[k].base),
                            (dst[k].hi - dst[k].lo) * sizeof(float));
    if (!st) st = files_open(&fs, dir, m, used, err);
    for (int j = 0; j < n_jobs && !st; j++) {
        const loom_ckpt_tensor *ct = &m->tensors[jobs[j].tensor];
        const loom_ckpt_chunk *c = &ct->chunks[jobs[j].chunk];
        st = chunk_in_file(dir, m, &fs, ct->name, c, err);
        if (block_bytes(c) > max_bytes) max_bytes = block_bytes(c);
    }
    uint64_t bytes = 0;
    phase_times all = {0};
    if (!st) {
        loom_status first = LOOM_OK;
        loom_error first_err = {0};
        int ahead = 0; /* jobs [0, ahead) have had their WILLNEED */
#pragma omp parallel reduction(+ : bytes)
        {
            void *buf = malloc(max_bytes ? max_bytes : 1);
            XXH3_state_t *h = XXH3_createState();
            loom_error e = {0};
            phase_times pt = {0};
#pragma omp for schedule(dynamic, 1)
            for (int j = 0; j < n_jobs; j++) {
                if (first) continue; /* stop early after an error */
                    /* the disk reads ahead while this chunk is made, read and checked */
#pragma omp critical(loom_ckpt_ahead)
                {
                    uint64_t window = 0;
                    for (int a = j; a < ahead && a < n_jobs; a++)
                        window += m->tensors[jobs[a].tensor].chunks[jobs[a].chunk].bytes;
                    for (; ahead < n_jobs && (ahead <= j || window < PREFETCH_BYTES); ahead++) {
                        const loom_ckpt_chunk *a =
                            &m->tensors[jobs[ahead].tensor].chunks[jobs[ahead].chunk];
                        if (ahead > j) window += a->bytes;
                        (void)posix_fadvise(fs.fd[a->file], (off_t)a->byte_offset, (off_t)a->bytes,
                                            POSIX_FADV_WILLNEED);
                    }
                }
                const loom_ckpt_tensor *ct = &m->tensors[jobs[j].tensor];
                const loom_ckpt_chunk *c = &ct->chunks[jobs[j].chunk];
                const scatter_ctx sc = {&plan, ptensor, jobs[j].tensor, dst, covered};
                loom_status s = buf && h
                                    ? read_chunk(dir, m, &fs, ct->name, c, jobs[j].how, jobs[j].to,
                                                 buf, h, &sc, &pt, &e)
                                    : loom_error_set(&e, LOOM_ERR_NOMEM, "%s: out of memory", dir);
                if (s) {
#pragma omp critical
                    if (!first) first = s, first_err = e;
                    continue;
                }
                if (jobs[j].how != VIA_BUFFER) {
#pragma omp atomic
                    covered[jobs[j].piece] += (int64_t)(c->bytes / sizeof(float));
                }
                bytes += c->bytes;
            }
#pragma omp critical(loom_ckpt_phases)
            {
                all.populate += pt.populate;
                all.read += pt.read;
                all.hash += pt.hash;
                all.copy += pt.copy;
                all.direct += pt.direct;
                all.copied += pt.copied;
            }
            XXH3_freeState(h);
            free(buf);
        }
        if (first) {
            st = first;
            if (err) *err = first_err;
        }
    }
    for (int i = 0; i < plan.n && !st; i++)
        if (covered[i] != loom_ckpt_box_volume(&plan.items[i].box))
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s: tensor '%s' is not fully covered by the checkpoint's chunks",
                                dir, t->items[plan.items[i].tensor].name);
    if (stats) {
        stats->bytes_read = bytes;
        stats->chunks_read = n_jobs;
        stats->populate_ms = all.populate;
        stats->read_ms = all.read;
        stats->hash_ms = all.hash;
        stats->copy_ms = all.copy;
        stats->bytes_direct = all.direct;
        stats->bytes_copied = all.copied;
    }
    files_close(&fs);
    free(jobs);
    free(used);
    free(covered);
    free(ptensor);
    loom_ckpt_plan_free(&plan);
    return st;
}

loom_status loom_ckpt_verify(const char *dir, const loom_ckpt_manifest *m, uint64_t *bytes,
                             loom_error *err) {
    loom_status st = LOOM_OK;
    for (int i = 0; i < m->n_files && !st; i++) {
        char path[1700];
        snprintf(path, sizeof path, "%s/%s", dir, m->files[i]);
        loom_safetensors f;
        if (!(st = loom_safetensors_open(&f, path, err))) loom_safetensors_close(&f);
    }
    file_set fs = {0};
    if (!st) st = files_open(&fs, dir, m, NULL, err);
    size_t max_bytes = 0;
    for (int ti = 0; ti < m->n_tensors && !st; ti++)
        for (int c = 0; c < m->tensors[ti].n_chunks && !st; c++) {
            const loom_ckpt_chunk *ch = &m->tensors[ti].chunks[c];
            st = chunk_in_file(dir, m, &fs, m->tensors[ti].name, ch, err);
            if (block_bytes(ch) > max_bytes) max_bytes = block_bytes(ch);
        }
    void *buf = st ? NULL : malloc(max_bytes ? max_bytes : 1);
    XXH3_state_t *h = st ? NULL : XXH3_createState();
    if (!st && (!buf || !h)) st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    uint64_t total = 0;
    phase_times pt = {0};
    for (int ti = 0; ti < m->n_tensors && !st; ti++)
        for (int c = 0; c < m->tensors[ti].n_chunks && !st; c++) {
            st = read_chunk(dir, m, &fs, m->tensors[ti].name, &m->tensors[ti].chunks[c], VIA_BUFFER,
                            NULL, buf, h, NULL, &pt, err);
            total += m->tensors[ti].chunks[c].bytes;
        }
    XXH3_freeState(h);
    free(buf);
    files_close(&fs);
    if (bytes) *bytes = total;
    return st;
}
