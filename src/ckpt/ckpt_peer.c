#include "ckpt/ckpt_peer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt_dir.h"
#include "core/clock.h"
#include "core/fs.h"

#define PIECE ((size_t)1 << 30) /* bytes per MPI message */
#define TAG_HEAD 71
#define TAG_BODY 72
#define FILES 3 /* per shard: data, index, run state (written in this order) */

static void shard_name(char *out, size_t size, int rank, int which) {
    if (which == 0)
        loom_ckpt_data_name(out, size, rank);
    else if (which == 1)
        loom_ckpt_index_name(out, size, rank);
    else
        snprintf(out, size, "rank_%05d.run.json", rank);
}

static void shard_path(const loom_ckpt_peer *p, char *out, size_t size, int64_t step, int rank,
                       int which) {
    char name[64];
    shard_name(name, sizeof name, rank, which);
    snprintf(out, size, "%s/step_%08lld/%s", p->dir, (long long)step, name);
}

/* ---- files in memory ---- */

/* All n bytes to fd: 0, or the errno of the failed write (ENOSPC for a write of 0). */
static int write_full(int fd, const void *buf, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t k = write(fd, (const char *)buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : ENOSPC;
        done += (size_t)k;
    }
    return 0;
}

static loom_status write_all(const char *path, const void *data, size_t n, loom_error *err) {
    char tmp[LOOM_PATH_MAX + 256];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot create: %s", tmp,
                              strerror(errno));
    int e = write_full(fd, data, n);
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: write failed: %s", path,
                              strerror(e));
    }
    return LOOM_OK;
}

/* A file of n bytes to be filled through its mapping (received bytes land in memory once). */
typedef struct {
    char path[LOOM_PATH_MAX + 256], tmp[LOOM_PATH_MAX + 260];
    void *map, *heap; /* heap: where the bytes go when the file cannot be made */
    size_t n;
} mapped;

static loom_status mapped_create(mapped *f, const char *path, size_t n, loom_error *err) {
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path);
    f->n = n;
    f->map = f->heap = NULL;
    int fd = open(f->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        f->tmp[0] = 0;
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot create: %s", path,
                              strerror(e));
    }
    int e = ftruncate(fd, (off_t)n) != 0 ? errno : 0;
    if (!e && n) {
        f->map = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (f->map == MAP_FAILED) e = errno, f->map = NULL;
    }
    close(fd);
    if (e) {
        unlink(f->tmp);
        f->tmp[0] = 0;
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot size %zu bytes: %s",
                              f->tmp, n, strerror(e));
    }
    return LOOM_OK;
}

/* keep: rename into place; else remove. */
static loom_status mapped_finish(mapped *f, int keep, loom_error *err) {
    if (f->map) munmap(f->map, f->n);
    free(f->heap);
    f->map = f->heap = NULL;
    if (!f->tmp[0]) return LOOM_OK;
    if (keep && rename(f->tmp, f->path) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: rename failed: %s", f->path,
                              strerror(errno));
    if (!keep) unlink(f->tmp);
    f->tmp[0] = 0;
    return LOOM_OK;
}

/* ---- MPI in pieces ---- */

static int send_bytes(const void *buf, size_t n, int to, MPI_Comm comm, MPI_Request *req, int *nr) {
    for (size_t at = 0; at < n; at += PIECE) {
        size_t k = n - at < PIECE ? n - at : PIECE;
        if (MPI_Isend((const char *)buf + at, (int)k, MPI_BYTE, to, TAG_BODY, comm,
                      &req[(*nr)++]) != MPI_SUCCESS)
            return -1;
    }
    return 0;
}

static int recv_bytes(void *buf, size_t n, int from, MPI_Comm comm, MPI_Request *req, int *nr) {
    for (size_t at = 0; at < n; at += PIECE) {
        size_t k = n - at < PIECE ? n - at : PIECE;
        if (MPI_Irecv((char *)buf + at, (int)k, MPI_BYTE, from, TAG_BODY, comm, &req[(*nr)++]) !=
            MPI_SUCCESS)
            return -1;
    }
    return 0;
}

static int pieces(size_t n) {
    return (int)((n + PIECE - 1) / PIECE);
}

/* ---- the background job: this rank's files, then the exchange with the peers ---- */

static loom_status run_job(loom_ckpt_peer *p, loom_error *err) {
    loom_ckpt_writer *w = p->writer;
    loom_ckpt_writer_wait_staged(w); /* the image and its checksums are final */
    const double t0 = loom_now_ms();
    char step_dir[LOOM_PATH_MAX + 160], path[LOOM_PATH_MAX + 256], name[64];
    snprintf(step_dir, sizeof step_dir, "%s/step_%08lld", p->dir, (long long)p->step);
    if (loom_mkdir_p(step_dir) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot create: %s", step_dir,
                              strerror(errno));
    loom_ckpt_data_name(name, sizeof name, p->rank);
    char *index = loom_ckpt_writer_index_text(w, name);
    if (!index) return loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
    const void *own[FILES] = {w->image, index, p->run_text};
    uint64_t own_n[FILES] = {w->image_bytes, strlen(index), strlen(p->run_text)};
    loom_status st = LOOM_OK;
    for (int k = 0; k < FILES && !st; k++) {
        shard_path(p, path, sizeof path, p->step, p->rank, k);
        st = write_all(path, own[k], own_n[k], err);
    }
    p->own_bytes = own_n[0] + own_n[1] + own_n[2];
    p->recv_bytes = 0;
    /* The exchange: sizes first, then the files (every message posted at once, so a pair
     * of hosts sending to each other cannot block on the other). A failed local write
     * still takes part, so that the peer is never left waiting. */
    uint64_t(*head)[FILES] = calloc((size_t)(p->n_srcs ? p->n_srcs : 1), sizeof *head);
    mapped *in = calloc((size_t)(p->n_srcs ? p->n_srcs : 1) * FILES, sizeof *in);
    MPI_Request *req = NULL;
    int nr = 0, mpi_ok = 1;
    if (!head || !in) {
        free(head);
        free(in);
        free(index);
        return st ? st : loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
    }
    {
        MPI_Request hreq[64];
        int nh = 0;
        for (int s = 0; s < p->n_srcs && nh < 63; s++)
            mpi_ok &= MPI_Irecv(head[s], FILES, MPI_UINT64_T, p->srcs[s], TAG_HEAD, p->comm,
                                &hreq[nh++]) == MPI_SUCCESS;
        if (p->dst >= 0)
            mpi_ok &= MPI_Isend(own_n, FILES, MPI_UINT64_T, p->dst, TAG_HEAD, p->comm,
                                &hreq[nh++]) == MPI_SUCCESS;
        mpi_ok &= MPI_Waitall(nh, hreq, MPI_STATUSES_IGNORE) == MPI_SUCCESS;
    }
    int n_req = 0;
    for (int k = 0; k < FILES; k++) n_req += p->dst >= 0 ? pieces(own_n[k]) : 0;
    for (int s = 0; s < p->n_srcs; s++)
        for (int k = 0; k < FILES; k++) n_req += pieces(head[s][k]);
    req = calloc((size_t)(n_req ? n_req : 1), sizeof *req);
    if (!req) mpi_ok = 0;
    loom_status rs = LOOM_OK; /* the receiving side's first error */
    loom_error re = {0};
    for (int s = 0; s < p->n_srcs && mpi_ok; s++)
        for (int k = 0; k < FILES; k++) {
            mapped *f = &in[s * FILES + k];
            shard_path(p, path, sizeof path, p->step, p->srcs[s], k);
            loom_status fs = mapped_create(f, path, head[s][k], rs ? NULL : &re);
            if (fs && !rs) rs = fs;
            /* Without a mapping the bytes still have to be taken off the wire (the sender
             * waits for them): into the heap, dropped afterwards. */
            void *to = f->map;
            if (!to && head[s][k] && !(to = f->heap = malloc(head[s][k]))) {
                mpi_ok = 0; /* nowhere to put them: the peer's send stays pending */
                break;
            }
            mpi_ok &= recv_bytes(to, head[s][k], p->srcs[s], p->comm, req, &nr) == 0;
        }
    for (int k = 0; k < FILES && p->dst >= 0 && mpi_ok; k++)
        mpi_ok &= send_bytes(own[k], own_n[k], p->dst, p->comm, req, &nr) == 0;
    if (mpi_ok) mpi_ok = MPI_Waitall(nr, req, MPI_STATUSES_IGNORE) == MPI_SUCCESS;
    for (int s = 0; s < p->n_srcs; s++) /* data and index first, the run state last */
        for (int k = 0; k < FILES; k++) {
            mapped *f = &in[s * FILES + k];
            loom_status fs = mapped_finish(f, mpi_ok && !rs, rs ? NULL : &re);
            if (fs && !rs) rs = fs;
            if (mpi_ok && !rs) p->recv_bytes += head[s][k];
        }
    free(req);
    free(in);
    free(head);
    free(index);
    p->ms = loom_now_ms() - t0;
    if (st) return st;
    if (!mpi_ok)
        return loom_error_set(err, LOOM_ERR_IO,
                              "--ckpt-peer: step %lld: the copy to/from the peer "
                              "host failed (MPI)",
                              (long long)p->step);
    if (rs) {
        if (err) *err = re;
        return rs;
    }
    return LOOM_OK;
}

static void *thread_main(void *arg) {
    loom_ckpt_peer *p = arg;
    while (loom_worker_next(&p->worker)) {
        loom_error e = {0};
        loom_status st = run_job(p, &e);
        loom_worker_done(&p->worker, st, &e);
    }
    return NULL;
}

/* ---- setup ---- */

/* The job's tag: --ckpt-dir (or --ckpt-fast-dir) as an absolute path, hashed. */
static void job_tag(const char *d, char out[24]) {
    char abs[2 * LOOM_PATH_MAX + 2] = "";
    if (d[0] != '/' && getcwd(abs, LOOM_PATH_MAX)) strcat(abs, "/");
    strncat(abs, d, sizeof abs - strlen(abs) - 1);
    snprintf(out, 24, "%016llx", (unsigned long long)XXH3_64bits(abs, strlen(abs)));
}

loom_status loom_ckpt_peer_open(loom_ckpt_peer *p, const loom_ckpt_peer_options *o,
                                loom_error *err) {
    memset(p, 0, sizeof *p);
    p->comm = MPI_COMM_NULL;
    p->dst = -1;
    if (!o->enabled) return LOOM_OK;
    p->rank = o->rank;
    p->world = o->world;
    if (p->world > 1 && o->world_comm != MPI_COMM_NULL) {
        if (o->thread_level < MPI_THREAD_MULTIPLE)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--ckpt-peer: the copy to the peer host runs in a background "
                                  "thread and needs MPI_THREAD_MULTIPLE (MPI gave %s; unset "
                                  "LOOM_MPI_THREAD=funneled)",
                                  o->thread_level_name);
        if (MPI_Comm_dup(o->world_comm, &p->comm) != MPI_SUCCESS) {
            p->comm = MPI_COMM_NULL;
            return loom_error_set(err, LOOM_ERR_STATE, "--ckpt-peer: MPI_Comm_dup failed");
        }
        p->own_comm = 1;
    }
    if (gethostname(p->host, sizeof p->host) != 0) snprintf(p->host, sizeof p->host, "localhost");
    p->host[sizeof p->host - 1] = 0;
    for (char *c = p->host; *c; c++)
        if (*c == '/') *c = '_';
    char(*names)[64] = calloc((size_t)p->world, sizeof *names);
    p->host_of = calloc((size_t)p->world, sizeof *p->host_of);
    p->srcs = calloc((size_t)p->world, sizeof *p->srcs);
    int *local = calloc((size_t)p->world, sizeof *local), *count = NULL;
    if (!names || !p->host_of || !p->srcs || !local) {
        free(names);
        free(local);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
    }
    if (p->comm != MPI_COMM_NULL)
        MPI_Allgather(p->host, 64, MPI_CHAR, names, 64, MPI_CHAR, p->comm);
    else
        memcpy(names[0], p->host, 64);
    for (int r = 0; r < p->world; r++) {
        p->host_of[r] = -1;
        for (int q = 0; q < r && p->host_of[r] < 0; q++)
            if (!strcmp(names[q], names[r])) p->host_of[r] = p->host_of[q];
        if (p->host_of[r] < 0) p->host_of[r] = p->n_hosts++;
    }
    count = calloc((size_t)p->n_hosts, sizeof *count);
    if (!count) {
        free(names);
        free(local);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
    }
    for (int r = 0; r < p->world; r++) local[r] = count[p->host_of[r]]++;
    p->host_id = p->host_of[p->rank];
    p->leader = local[p->rank] == 0;
    /* rank i of host h keeps its copy on rank i mod n of host h + 1 */
    int *dst_of = calloc((size_t)p->world, sizeof *dst_of);
    for (int r = 0; dst_of && r < p->world; r++) {
        dst_of[r] = -1;
        if (p->n_hosts < 2) continue;
        const int h = (p->host_of[r] + 1) % p->n_hosts, want = local[r] % count[h];
        for (int q = 0; q < p->world && dst_of[r] < 0; q++)
            if (p->host_of[q] == h && local[q] == want) dst_of[r] = q;
    }
    for (int r = 0; dst_of && r < p->world; r++)
        if (dst_of[r] == p->rank) p->srcs[p->n_srcs++] = r;
    p->dst = dst_of ? dst_of[p->rank] : -1;
    free(dst_of);
    free(count);
    free(local);
    free(names);
    char tag[24];
    job_tag(o->job_dir, tag);
    snprintf(p->dir, sizeof p->dir, "%s/%s/%s", o->peer_dir, p->host, tag);
    int mk = loom_mkdir_p(p->dir) == 0 ? 0 : errno;
    int bad = mk != 0;
    if (p->comm != MPI_COMM_NULL) MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, p->comm);
    if (mk)
        return loom_error_set(err, LOOM_ERR_INPUT, "--ckpt-peer-dir %s: cannot create %s: %s",
                              o->peer_dir, p->dir, strerror(mk));
    if (bad)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--ckpt-peer-dir %s: another rank cannot create its folder",
                              o->peer_dir);
    if (loom_worker_start(&p->worker, thread_main, p) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: cannot start a thread");
    p->enabled = 1;
    if (p->rank == 0) {
        if (p->n_hosts < 2)
            fprintf(stderr,
                    "loom: --ckpt-peer: every rank is on %s: checkpoints kept in its memory "
                    "(%s) only, with no copy on another host\n",
                    p->host, p->dir);
        else
            fprintf(stderr,
                    "loom: --ckpt-peer: checkpoints kept in memory on %d hosts (%s on %s), each "
                    "rank's also on the next host's\n",
                    p->n_hosts, p->dir, p->host);
    }
    return LOOM_OK;
}

void loom_ckpt_peer_close(loom_ckpt_peer *p) {
    loom_worker_stop(&p->worker);
    if (p->own_comm) MPI_Comm_free(&p->comm);
    free(p->run_text);
    free(p->host_of);
    free(p->srcs);
    memset(p, 0, sizeof *p);
}

loom_status loom_ckpt_peer_start(loom_ckpt_peer *p, loom_ckpt_writer *w, int64_t step,
                                 char *run_text, loom_error *err) {
    if (!loom_worker_claim(&p->worker)) {
        free(run_text);
        return loom_error_set(err, LOOM_ERR_STATE, "--ckpt-peer: a copy is still running");
    }
    free(p->run_text);
    p->run_text = run_text;
    p->writer = w;
    p->step = step;
    loom_worker_post(&p->worker);
    return LOOM_OK;
}

int loom_ckpt_peer_idle(loom_ckpt_peer *p) {
    return loom_worker_idle(&p->worker);
}

loom_status loom_ckpt_peer_wait(loom_ckpt_peer *p, loom_error *err) {
    return loom_worker_wait(&p->worker, err);
}

void loom_ckpt_peer_keep_only(loom_ckpt_peer *p, int64_t step) {
    if (!p->enabled || !p->leader) return;
    loom_ckpt_entry *list = NULL;
    int n = loom_ckpt_list(p->dir, &list, 0);
    for (int i = 0; i < n; i++)
        if (list[i].step != step) loom_ckpt_remove_step(list[i].path);
    free(list);
}

/* ---- recovery ---- */

typedef struct {
    int64_t step, rank, world;
} held;

/* The leader: the complete shards this host holds. */
static int list_held(const loom_ckpt_peer *p, held **out) {
    *out = NULL;
    loom_ckpt_entry *steps = NULL;
    int n_steps = loom_ckpt_list(p->dir, &steps, 0), n = 0, cap = 0;
    for (int i = 0; i < n_steps; i++) {
        DIR *d = opendir(steps[i].path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int r, len = 0;
            if (sscanf(e->d_name, "rank_%5d.run.json%n", &r, &len) != 1 ||
                len != (int)strlen(e->d_name) || r < 0)
                continue;
            char path[LOOM_PATH_MAX + 256];
            struct stat sb;
            int ok = 1;
            for (int k = 0; k < 2 && ok; k++) {
                shard_path(p, path, sizeof path, steps[i].step, r, k);
                ok = stat(path, &sb) == 0;
            }
            loom_ckpt_manifest run;
            shard_path(p, path, sizeof path, steps[i].step, r, 2);
            if (!ok || loom_ckpt_manifest_load(&run, path, 0, NULL) != LOOM_OK) continue;
            const int64_t world = run.layout.world_size, step = run.step;
            loom_ckpt_manifest_free(&run);
            if (step != steps[i].step || r >= world) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                held *h = realloc(*out, (size_t)cap * sizeof *h);
                if (!h) break;
                *out = h;
            }
            (*out)[n++] = (held){step, r, world};
        }
        if (d) closedir(d);
    }
    free(steps);
    return n;
}

/* Rank 0: the newest step whose every shard some host holds; present[h * world + r]. */
static int64_t choose(const loom_ckpt_peer *p, const held *all, int n, int *world,
                      unsigned char **present, char *why, size_t why_size) {
    int64_t best = -1, seen = INT64_MAX;
    why[0] = 0;
    size_t wl = 0;
    for (;;) {
        int64_t s = -1; /* the next older step held anywhere */
        for (int i = 0; i < n; i++)
            if (all[i].step < seen && all[i].step > s) s = all[i].step;
        if (s < 0) break;
        seen = s;
        int w = 0, agree = 1;
        for (int i = 0; i < n; i++)
            if (all[i].step == s) {
                if (w && all[i].world != w) agree = 0;
                w = (int)all[i].world;
            }
        /* the host of an entry is in the top bits of its rank (loom_ckpt_peer_restore) */
        unsigned char *pr = calloc((size_t)p->n_hosts * (size_t)w, 1);
        if (!pr) break;
        for (int i = 0; i < n; i++)
            if (all[i].step == s) {
                const int h = (int)(all[i].rank >> 32), r = (int)(all[i].rank & 0xffffffff);
                if (h < p->n_hosts && r < w) pr[(size_t)h * w + r] = 1;
            }
        char missing[256] = "";
        size_t ml = 0;
        int complete = agree;
        for (int r = 0; r < w; r++) {
            int any = 0;
            for (int h = 0; h < p->n_hosts; h++) any |= pr[(size_t)h * w + r];
            if (!any) {
                complete = 0;
                if (ml < sizeof missing - 16)
                    ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? "," : "",
                                           r);
            }
        }
        if (complete) {
            best = s;
            *world = w;
            *present = pr;
            break;
        }
        free(pr);
        if (wl < why_size - 64)
            wl += (size_t)snprintf(why + wl, why_size - wl,
                                   "%sstep %lld incomplete in memory (%s%s)", wl ? "; " : "",
                                   (long long)s, agree ? "no surviving host holds rank(s) " : "",
                                   agree ? missing : "shards of different world sizes");
    }
    return best;
}

/* A restore's copies stream each file through two heap buffers of STREAM_PIECE bytes
 * (pread, then MPI; MPI, then write) instead of mapping it: on this machine's VM every
 * first touch of a mapped 4 KiB page traps (~17 us), and mapping both ends of a 1.48 GB
 * copy took 11 s for what the network moves in ~1.5 s. While one piece is on the wire the
 * next is read (sender) or the last one written (receiver). */
#define STREAM_PIECE ((size_t)64 << 20)

static int pread_all(int fd, char *buf, size_t n, uint64_t at) {
    for (size_t done = 0; done < n;) {
        ssize_t k = pread(fd, buf + done, n - done, (off_t)(at + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        done += (size_t)k;
    }
    return 0;
}

static size_t piece_len(uint64_t n, uint64_t at) {
    return n - at < STREAM_PIECE ? (size_t)(n - at) : STREAM_PIECE;
}

/* n bytes of fd to rank `to`; the pieces go out even if a read fails (the receiver waits
 * for them; the loader's XXH3 sums then refuse the bytes). Returns -1 on a failed read. */
static int stream_send(int fd, uint64_t n, int to, MPI_Comm comm, char *buf[2]) {
    MPI_Request req = MPI_REQUEST_NULL;
    int ok = 1, i = 0;
    for (uint64_t at = 0; at < n; at += STREAM_PIECE, i ^= 1) {
        const size_t len = piece_len(n, at);
        if (pread_all(fd, buf[i], len, at) != 0) ok = 0;
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        MPI_Isend(buf[i], (int)len, MPI_BYTE, to, TAG_BODY, comm, &req);
    }
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    return ok ? 0 : -1;
}

/* n bytes from rank `from` into fd (fd < 0: taken off the wire and dropped). Returns 0, or
 * the errno of the first failed write. */
static int stream_recv(int fd, uint64_t n, int from, MPI_Comm comm, char *buf[2]) {
    MPI_Request req = MPI_REQUEST_NULL;
    int e = fd >= 0 ? 0 : EBADF, i = 0;
    if (n) MPI_Irecv(buf[0], (int)piece_len(n, 0), MPI_BYTE, from, TAG_BODY, comm, &req);
    for (uint64_t at = 0; at < n; at += STREAM_PIECE, i ^= 1) {
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        if (at + STREAM_PIECE < n)
            MPI_Irecv(buf[i ^ 1], (int)piece_len(n, at + STREAM_PIECE), MPI_BYTE, from, TAG_BODY,
                      comm, &req);
        if (!e) e = write_full(fd, buf[i], piece_len(n, at));
    }
    return e;
}

/* The shard of rank r: from host `from`'s leader to every leader whose host lacks it. */
static int copy_shard(loom_ckpt_peer *p, int64_t step, int r, int from, const unsigned char *has,
                      const int *leader_of, char *buf[2], uint64_t *bytes_in, loom_error *err) {
    int ok = 1;
    char path[LOOM_PATH_MAX + 256], tmp[LOOM_PATH_MAX + 260];
    if (p->host_id == from) {
        int fd[FILES];
        uint64_t n[FILES] = {0};
        for (int k = 0; k < FILES; k++) {
            shard_path(p, path, sizeof path, step, r, k);
            struct stat sb;
            fd[k] = open(path, O_RDONLY | O_CLOEXEC);
            if (fd[k] < 0 || fstat(fd[k], &sb) != 0) ok = 0;
            n[k] = ok ? (uint64_t)sb.st_size : 0;
        }
        uint64_t head[FILES + 1] = {n[0], n[1], n[2], (uint64_t)ok};
        int read_ok = ok;
        for (int h = 0; h < p->n_hosts; h++) {
            if (has[h]) continue;
            MPI_Send(head, FILES + 1, MPI_UINT64_T, leader_of[h], TAG_HEAD, p->comm);
            /* announced: every piece goes out, even after a failed read */
            for (int k = 0; k < FILES && ok; k++)
                if (stream_send(fd[k], n[k], leader_of[h], p->comm, buf) != 0) read_ok = 0;
        }
        ok = read_ok;
        for (int k = 0; k < FILES; k++)
            if (fd[k] >= 0) close(fd[k]);
        if (!ok)
            loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot read a shard it holds", path);
        return ok ? 0 : -1;
    }
    if (has[p->host_id]) return 0;
    uint64_t head[FILES + 1];
    MPI_Recv(head, FILES + 1, MPI_UINT64_T, leader_of[from], TAG_HEAD, p->comm, MPI_STATUS_IGNORE);
    if (!head[FILES]) return -1;
    snprintf(path, sizeof path, "%s/step_%08lld", p->dir, (long long)step);
    if (loom_mkdir_p(path) != 0) {
        loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot create: %s", path,
                       strerror(errno));
        ok = 0;
    }
    /* data and index first, the run state last: each through a .tmp file, renamed */
    for (int k = 0; k < FILES; k++) {
        shard_path(p, path, sizeof path, step, r, k);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int fd = ok ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
        if (ok && fd < 0) {
            loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: cannot create: %s", tmp,
                           strerror(errno));
            ok = 0;
        }
        const int we = stream_recv(fd, head[k], leader_of[from], p->comm, buf);
        if (we && ok) {
            loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: write failed: %s", tmp,
                           strerror(we));
            ok = 0;
        }
        if (fd >= 0 && close(fd) != 0 && ok) ok = 0;
        if (ok && rename(tmp, path) != 0) {
            loom_error_set(err, LOOM_ERR_IO, "--ckpt-peer: %s: rename failed: %s", path,
                           strerror(errno));
            ok = 0;
        }
        if (!ok && fd >= 0) unlink(tmp);
    }
    if (ok) *bytes_in += head[0] + head[1] + head[2];
    return ok ? 0 : -1;
}

/* Every rank: the manifest of `step` from its shards' indexes and run state in this host's
 * memory (every shard is there once the copies are done). */
static loom_status build_manifest(const loom_ckpt_peer *p, int64_t step, int world,
                                  loom_ckpt_manifest *m, loom_error *err) {
    char path[LOOM_PATH_MAX + 256];
    shard_path(p, path, sizeof path, step, 0, 2);
    loom_status st = loom_ckpt_manifest_load(m, path, 0, err);
    if (st) return st;
    for (int r = 0; r < world && !st; r++) {
        loom_ckpt_manifest idx;
        shard_path(p, path, sizeof path, step, r, 1);
        if (!(st = loom_ckpt_manifest_load(&idx, path, 1, err))) {
            st = loom_ckpt_manifest_merge(m, &idx, err);
            loom_ckpt_manifest_free(&idx);
        }
    }
    snprintf(path, sizeof path, "%s/step_%08lld (peer memory)", p->dir, (long long)step);
    if (!st) st = loom_ckpt_manifest_check_cover(m, path, err);
    if (st) loom_ckpt_manifest_free(m);
    return st;
}

loom_status loom_ckpt_peer_restore(loom_ckpt_peer *p, int64_t disk_newest, loom_ckpt_manifest *m,
                                   loom_ckpt_peer_found *found, loom_error *err) {
    memset(found, 0, sizeof *found);
    found->step = -1;
    const int multi = p->comm != MPI_COMM_NULL;
    held *mine = NULL;
    int n = p->leader ? list_held(p, &mine) : 0;
    for (int i = 0; i < n; i++) mine[i].rank |= (int64_t)p->host_id << 32;
    int *counts = p->rank == 0 ? calloc((size_t)p->world, sizeof *counts) : NULL;
    int *displs = p->rank == 0 ? calloc((size_t)p->world, sizeof *displs) : NULL;
    int nb = n * (int)sizeof(held), total = 0;
    if (multi)
        MPI_Gather(&nb, 1, MPI_INT, counts, 1, MPI_INT, 0, p->comm);
    else if (counts)
        counts[0] = nb;
    held *all = NULL;
    if (p->rank == 0) {
        for (int r = 0; counts && displs && r < p->world; r++)
            displs[r] = total, total += counts[r];
        all = malloc((size_t)(total ? total : 1));
    }
    if (multi)
        MPI_Gatherv(mine, nb, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, p->comm);
    else if (all && n)
        memcpy(all, mine, (size_t)nb);
    free(mine);
    free(counts);
    free(displs);
    /* rank 0 decides: [use, step, world] */
    int64_t plan[3] = {0, -1, 0};
    unsigned char *present = NULL;
    if (p->rank == 0) {
        int world = 0;
        const int64_t s = all ? choose(p, all, total / (int)sizeof(held), &world, &present,
                                       found->why, sizeof found->why)
                              : -1;
        plan[1] = s;
        plan[2] = world;
        plan[0] = s >= 0 && s >= disk_newest;
        size_t wl = strlen(found->why);
        if (s < 0 && wl < sizeof found->why - 64)
            snprintf(found->why + wl, sizeof found->why - wl, "%sno complete step in memory",
                     wl ? "; " : "");
        else if (!plan[0])
            snprintf(found->why + wl, sizeof found->why - wl,
                     "%sstep %lld in memory is older than step %lld on disk", wl ? "; " : "",
                     (long long)s, (long long)disk_newest);
    }
    free(all);
    if (multi) MPI_Bcast(plan, 3, MPI_INT64_T, 0, p->comm);
    found->step = plan[1];
    found->world = (int)plan[2];
    if (!plan[0]) {
        free(present);
        return LOOM_OK;
    }
    const int w = (int)plan[2];
    if (!present) present = calloc((size_t)p->n_hosts * (size_t)w, 1);
    if (!present) return loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
    if (multi) MPI_Bcast(present, p->n_hosts * w, MPI_BYTE, 0, p->comm);
    int *leader_of = calloc((size_t)p->n_hosts, sizeof *leader_of);
    unsigned char *has = calloc((size_t)p->n_hosts, 1);
    if (!leader_of || !has) {
        free(leader_of);
        free(has);
        free(present);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--ckpt-peer: out of memory");
    }
    for (int r = p->world - 1; r >= 0; r--) leader_of[p->host_of[r]] = r;
    /* Shard by shard, in the same order everywhere: the first host holding it sends it to
     * every host lacking it (the leaders only; the other ranks wait below). */
    int bad = 0;
    uint64_t bytes_in = 0;
    int copied = 0;
    loom_error e = {0};
    char *buf[2] = {NULL, NULL};
    if (p->leader) {
        buf[0] = malloc(STREAM_PIECE), buf[1] = malloc(STREAM_PIECE);
        if (!buf[0] || !buf[1]) bad = 1, loom_error_set(&e, LOOM_ERR_NOMEM, "out of memory");
    }
    int no_buffers = bad; /* then no host copies (every host agrees): the disk tier */
    if (multi) MPI_Allreduce(MPI_IN_PLACE, &no_buffers, 1, MPI_INT, MPI_MAX, p->comm);
    for (int r = 0; r < w && !no_buffers; r++) {
        int from = -1;
        for (int h = 0; h < p->n_hosts; h++) {
            has[h] = present[(size_t)h * w + r];
            if (has[h] && from < 0) from = h;
        }
        for (int h = 0; h < p->n_hosts; h++) copied += !has[h];
        if (p->leader && copy_shard(p, plan[1], r, from, has, leader_of, buf, &bytes_in, &e) != 0)
            bad = 1;
    }
    free(buf[0]);
    free(buf[1]);
    free(leader_of);
    free(has);
    free(present);
    /* every host holds every shard now: each rank builds the manifest from its host's */
    if (multi) MPI_Barrier(p->comm);
    if (!bad && build_manifest(p, plan[1], w, m, &e) != LOOM_OK) bad = 1;
    int64_t sums[2] = {bad, (int64_t)bytes_in};
    if (multi) MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_INT64_T, MPI_SUM, p->comm);
    if (sums[0] > 0) {
        if (!bad) loom_ckpt_manifest_free(m);
        if (bad) fprintf(stderr, "loom: rank %d: peer memory not usable: %s\n", p->rank, e.msg);
        if (p->rank == 0)
            snprintf(found->why, sizeof found->why,
                     "step %lld in memory could not be assembled on every host",
                     (long long)plan[1]);
        return LOOM_OK;
    }
    found->use = 1;
    found->shards_copied = copied;
    found->bytes_copied = (uint64_t)sums[1];
    snprintf(found->dir, sizeof found->dir, "%s/step_%08lld", p->dir, (long long)plan[1]);
    return LOOM_OK;
}
