/* loom data prepare: documents -> tokens -> train/val shards, streaming (see prepare.h). */
#include "data/prepare.h"

#include "core/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"

int loom_prepare_is_val(double f, int64_t k0) {
    /* The epsilon keeps k * F exact where it is meant to be an integer (200 * 0.005). */
    return floor((double)(k0 + 1) * f + 1e-9) > floor((double)k0 * f + 1e-9);
}

/* ---- Inputs: every glob expanded (sorted) and checked before anything is written. */
typedef struct {
    char **paths;
    size_t n, cap;
} path_list;

static void paths_free(path_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    l->paths = NULL;
    l->n = l->cap = 0;
}

static int paths_push(path_list *l, const char *p) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        char **bigger = realloc(l->paths, cap * sizeof *bigger);
        if (!bigger) return -1;
        l->paths = bigger;
        l->cap = cap;
    }
    if (!(l->paths[l->n] = strdup(p))) return -1;
    l->n++;
    return 0;
}

static loom_status check_file(const char *pat, const char *path, int64_t *total, loom_error *err) {
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return loom_error_set(err, LOOM_ERR_INPUT, "--input '%s': %s: cannot open: %s", pat, path,
                              strerror(e));
    }
    close(fd);
    if (S_ISDIR(sb.st_mode))
        return loom_error_set(err, LOOM_ERR_INPUT, "--input '%s': %s is a folder (expected a file)",
                              pat, path);
    if (*total >= 0) *total = S_ISREG(sb.st_mode) ? *total + (int64_t)sb.st_size : -1;
    return LOOM_OK;
}

static loom_status expand_inputs(const loom_prepare_options *o, path_list *l, int64_t *total,
                                 loom_error *err) {
    *total = 0;
    for (int i = 0; i < o->n_inputs; i++) {
        const char *pat = o->inputs[i];
        if (strcmp(pat, "-") == 0) {
            struct stat sb;
            if (*total >= 0) *total = fstat(0, &sb) == 0 && S_ISREG(sb.st_mode) ? *total : -1;
            if (*total >= 0) *total += (int64_t)sb.st_size;
            if (paths_push(l, "-") != 0)
                return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
            continue;
        }
        glob_t g;
        int rc = glob(pat, 0, NULL, &g);
        if (rc == GLOB_NOMATCH)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--input '%s': no file matches (expected a file, a glob "
                                  "matching files, or - for stdin)",
                                  pat);
        if (rc != 0)
            return loom_error_set(err, rc == GLOB_NOSPACE ? LOOM_ERR_NOMEM : LOOM_ERR_INPUT,
                                  "--input '%s': cannot expand the pattern (%s)", pat,
                                  rc == GLOB_NOSPACE ? "out of memory" : "read error");
        loom_status st = LOOM_OK;
        for (size_t k = 0; k < g.gl_pathc && st == LOOM_OK; k++) {
            st = check_file(pat, g.gl_pathv[k], total, err);
            if (st == LOOM_OK && paths_push(l, g.gl_pathv[k]) != 0)
                st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        }
        globfree(&g);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* ---- Documents: pending text of the open document, encoded in cuts. */
typedef struct {
    loom_tokenizer *tok;
    loom_prepare_stats *st;
    double val_fraction;
    loom_shard_stream train, val;
    int32_t eot;
    size_t chunk;
    unsigned char *pend;
    size_t pend_n, pend_cap, next_try;
    int doc_open, doc_val;
    int nl, cr; /* blank-line splitter: newlines since the last content byte; held "\r" */
    loom_token_buf ids;
} prep;

static loom_status put_ids(prep *p, const int32_t *ids, size_t n, loom_error *err) {
    *(p->doc_val ? &p->st->val_tokens : &p->st->train_tokens) += (int64_t)n;
    return loom_shard_stream_put(p->doc_val ? &p->val : &p->train, ids, n, err);
}

static loom_status encode_out(prep *p, size_t n, loom_error *err) {
    p->ids.n = 0;
    loom_status st = loom_tokenizer_encode(p->tok, p->pend, n, &p->ids, err);
    if (st == LOOM_OK) st = put_ids(p, p->ids.ids, p->ids.n, err);
    memmove(p->pend, p->pend + n, p->pend_n - n);
    p->pend_n -= n;
    return st;
}

static loom_status doc_begin(prep *p, loom_error *err) {
    p->doc_val = loom_prepare_is_val(p->val_fraction, p->st->n_docs);
    p->st->n_docs++;
    p->st->n_val_docs += p->doc_val;
    p->doc_open = 1;
    p->next_try = p->chunk;
    return put_ids(p, &p->eot, 1, err);
}

static loom_status doc_end(prep *p, loom_error *err) {
    if (!p->doc_open) return LOOM_OK;
    p->doc_open = 0;
    return p->pend_n ? encode_out(p, p->pend_n, err) : LOOM_OK;
}

static int alnum(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Encodes the pending text up to its last safe cut (prepare.h); forced cut past 4 chunks. */
static loom_status try_cut(prep *p, loom_error *err) {
    const unsigned char *t = p->pend;
    size_t n = p->pend_n, q = 0;
    for (size_t i = n >= 3 ? n - 2 : 0; i >= 1; i--) {
        if (t[i] == ' ' && alnum(t[i - 1]) && alnum(t[i + 1])) {
            q = i;
            break;
        }
    }
    if (q == 0 && n >= 4 * p->chunk) { /* start of the last character, or n - 1 */
        q = n - 1;
        for (size_t i = n - 1; i + 4 > n && i > 0; i--) {
            if ((t[i] & 0xC0) != 0x80) {
                q = i;
                break;
            }
        }
    }
    loom_status st = q ? encode_out(p, q, err) : LOOM_OK;
    p->next_try = p->pend_n + p->chunk;
    return st;
}

static loom_status pend_reserve(prep *p, size_t more, loom_error *err) {
    if (p->pend_n + more <= p->pend_cap) return LOOM_OK;
    size_t cap = p->pend_cap ? p->pend_cap : 1 << 12;
    while (cap < p->pend_n + more) cap *= 2;
    unsigned char *bigger = realloc(p->pend, cap);
    if (!bigger) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for document text");
    p->pend = bigger;
    p->pend_cap = cap;
    return LOOM_OK;
}

static loom_status feed_file(prep *p, const unsigned char *b, size_t n, loom_error *err) {
    loom_status st = p->doc_open || !n ? LOOM_OK : doc_begin(p, err);
    if (st == LOOM_OK) st = pend_reserve(p, n, err);
    if (st != LOOM_OK) return st;
    memcpy(p->pend + p->pend_n, b, n);
    p->pend_n += n;
    return p->pend_n >= p->next_try ? try_cut(p, err) : LOOM_OK;
}

static loom_status put_byte(prep *p, unsigned char c, loom_error *err) {
    loom_status st = p->doc_open ? LOOM_OK : doc_begin(p, err);
    if (st == LOOM_OK) st = pend_reserve(p, 1, err);
    if (st != LOOM_OK) return st;
    p->pend[p->pend_n++] = c;
    return p->pend_n >= p->next_try ? try_cut(p, err) : LOOM_OK;
}

static loom_status feed_lines(prep *p, const unsigned char *b, size_t n, loom_error *err) {
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < n && st == LOOM_OK; i++) {
        unsigned char c = b[i];
        if (p->doc_open && p->nl == 0) { /* inside a line */
            if (c == '\n')
                p->nl = 1;
            else
                st = put_byte(p, c, err);
            continue;
        }
        if (c == '\n') { /* a blank line ("" or "\r"), or the end of the first line */
            p->cr = 0;
            p->nl += p->doc_open;
            continue;
        }
        if (c == '\r' && !p->cr) {
            p->cr = 1;
            continue;
        }
        if (p->doc_open && p->nl >= 2)
            st = doc_end(p, err);
        else if (p->doc_open)
            st = put_byte(p, '\n', err);
        p->nl = 0;
        if (st == LOOM_OK && p->cr) st = put_byte(p, '\r', err);
        p->cr = 0;
        if (st == LOOM_OK) st = put_byte(p, c, err);
    }
    return st;
}

static double now_s(void) {
    return loom_now_ms() * 1e-3;
}

static loom_status read_input(prep *p, const loom_prepare_options *o, const char *path,
                              unsigned char *buf, double t0, loom_error *err) {
    int fd = strcmp(path, "-") == 0 ? 0 : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--input: %s: cannot open: %s", path,
                              strerror(errno));
    loom_status st = LOOM_OK;
    p->nl = p->cr = 0;
    for (;;) {
        ssize_t got = read(fd, buf, p->chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = loom_error_set(err, LOOM_ERR_INPUT, "--input: %s: read failed: %s",
                                fd ? path : "stdin", strerror(errno));
            break;
        }
        if (got == 0) break;
        p->st->bytes_read += got;
        st = o->doc_sep == LOOM_DOC_SEP_FILE ? feed_file(p, buf, (size_t)got, err)
                                             : feed_lines(p, buf, (size_t)got, err);
        if (st != LOOM_OK) break;
        p->st->seconds = now_s() - t0;
        if (o->progress) o->progress(o->progress_ctx, p->st);
    }
    if (fd) close(fd);
    return st == LOOM_OK ? doc_end(p, err) : st;
}

static loom_status check_options(loom_tokenizer *tok, const loom_prepare_options *o,
                                 loom_error *err) {
    if (o->n_inputs < 1) return loom_error_set(err, LOOM_ERR_INPUT, "--input is required");
    if (!o->out_dir || !*o->out_dir)
        return loom_error_set(err, LOOM_ERR_INPUT, "--out is required");
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return loom_error_set(err, LOOM_ERR_INPUT, "--val-fraction %g: expected a number in [0, 1)",
                              o->val_fraction);
    if (o->shard_tokens < 1 || o->shard_tokens > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--shard-tokens %lld: expected an integer from 1 to %d",
                              (long long)o->shard_tokens, INT32_MAX);
    if (o->doc_sep != LOOM_DOC_SEP_FILE && o->doc_sep != LOOM_DOC_SEP_BLANK_LINE)
        return loom_error_set(err, LOOM_ERR_INPUT, "--doc-separator: expected blank-line or file");
    int32_t eot;
    return loom_tokenizer_require_eot(tok, "--tokenizer", &eot, err);
}

/* Removes DIR/SPLIT_NNNNNN.bin from index `first` on, up to the first missing one. */
static int remove_stale(const char *dir, const char *split, int first) {
    size_t cap = strlen(dir) + strlen(split) + 32;
    char *path = malloc(cap);
    int removed = 0;
    while (path && loom_prepare_shard_path(path, cap, dir, split, first + removed) == 0 &&
           unlink(path) == 0)
        removed++;
    free(path);
    return removed;
}

loom_status loom_prepare_run(loom_tokenizer *tok, const loom_prepare_options *o,
                             loom_prepare_stats *stats, loom_error *err) {
    memset(stats, 0, sizeof *stats);
    double t0 = now_s();
    loom_status st = check_options(tok, o, err);
    if (st != LOOM_OK) return st;
    path_list inputs = {0};
    st = expand_inputs(o, &inputs, &stats->bytes_total, err);
    if (st == LOOM_OK && loom_mkdir_p(o->out_dir) != 0)
        st = loom_error_set(err, LOOM_ERR_IO, "--out '%s': cannot create directory: %s", o->out_dir,
                            strerror(errno));
    if (st != LOOM_OK) {
        paths_free(&inputs);
        return st;
    }
    stats->n_files = (int64_t)inputs.n;
    prep p = {.tok = tok, .st = stats, .val_fraction = o->val_fraction};
    p.eot = loom_tokenizer_vocab_size(tok) - 1;
    p.chunk = o->chunk_bytes ? o->chunk_bytes : (size_t)1 << 20;
    int token_bytes = p.eot < 65536 ? 2 : 4;
    unsigned char *buf = malloc(p.chunk);
    if (!buf) st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for the read buffer");
    if (st == LOOM_OK)
        st = loom_shard_stream_open(&p.train, o->out_dir, "train", token_bytes, o->shard_tokens,
                                    err);
    if (st == LOOM_OK)
        st = loom_shard_stream_open(&p.val, o->out_dir, "val", token_bytes, o->shard_tokens, err);
    for (size_t i = 0; i < inputs.n && st == LOOM_OK; i++)
        st = read_input(&p, o, inputs.paths[i], buf, t0, err);
    if (st == LOOM_OK && stats->n_docs == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "--input: no documents in %lld file(s) of %lld bytes (expected at "
                            "least one non-empty document)",
                            (long long)stats->n_files, (long long)stats->bytes_read);
    if (st == LOOM_OK) st = loom_shard_stream_finish(&p.train, err);
    if (st == LOOM_OK) st = loom_shard_stream_finish(&p.val, err);
    loom_shard_stream_abort(&p.train); /* no-ops once finished */
    loom_shard_stream_abort(&p.val);
    if (st == LOOM_OK) {
        stats->train_shards = p.train.n_shards;
        stats->val_shards = p.val.n_shards;
        stats->stale_removed = remove_stale(o->out_dir, "train", stats->train_shards) +
                               remove_stale(o->out_dir, "val", stats->val_shards);
    }
    stats->seconds = now_s() - t0;
    free(buf);
    free(p.pend);
    free(p.ids.ids);
    paths_free(&inputs);
    return st;
}
