/* Token-shard datasets: open (validate + mmap) and the deterministic sampler. */
#include "data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/philox.h"

/* Headers and tokens are little-endian on disk and read in place. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "loom's shard reader assumes a little-endian host"
#endif

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Returns the first position whose token is >= vocab_size, or -1. */
static int64_t find_bad_token(const void *tokens, int token_bytes, int64_t n, int vocab_size,
                              uint32_t *value) {
    if (token_bytes == 2) {
        const uint16_t *t = tokens;
        if (vocab_size > UINT16_MAX) return -1; /* every uint16 fits */
        for (int64_t i = 0; i < n; i++) {
            if (t[i] >= (uint32_t)vocab_size) {
                *value = t[i];
                return i;
            }
        }
    } else {
        const uint32_t *t = tokens;
        for (int64_t i = 0; i < n; i++) {
            if (t[i] >= (uint32_t)vocab_size) {
                *value = t[i];
                return i;
            }
        }
    }
    return -1;
}

/* Maps and validates one shard file; on error nothing of sh needs freeing but path. */
static loom_status shard_open(loom_shard *sh, int vocab_size, loom_error *err) {
    const char *path = sh->path;
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
    if (size < LOOM_SHARD_HEADER_BYTES) {
        close(fd);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: truncated header: %" PRId64 " bytes, expected at least %d", path,
                              size, LOOM_SHARD_HEADER_BYTES);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return loom_error_set(err, LOOM_ERR_IO, "%s: mmap failed: %s", path, strerror(map_errno));
    sh->map = map;
    sh->map_bytes = (size_t)size;

    int32_t header[3];
    memcpy(header, map, sizeof header);
    if (header[0] == LOOM_SHARD_MAGIC_U16) {
        sh->token_bytes = 2;
    } else if (header[0] == LOOM_SHARD_MAGIC_U32) {
        sh->token_bytes = 4;
    } else {
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: bad magic 0x%08" PRIx32 " (expected %d or %d)", path,
                              (uint32_t)header[0], LOOM_SHARD_MAGIC_U16, LOOM_SHARD_MAGIC_U32);
    }
    if (header[1] != 1)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: bad version %" PRId32 " (expected 1)", path,
                              header[1]);
    if (header[2] < 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: bad token count %" PRId32 " in header (expected >= 0)", path,
                              header[2]);
    int64_t n = header[2];
    int64_t body = n * sh->token_bytes;
    int64_t have = size - LOOM_SHARD_HEADER_BYTES;
    if (have < body)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: truncated: header says %" PRId64 " tokens (%" PRId64
                              " bytes), file has %" PRId64 " bytes",
                              path, n, body, have);
    if (have > body)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %" PRId64 " trailing bytes: header says %" PRId64
                              " tokens (%" PRId64 " bytes), file has %" PRId64 " bytes",
                              path, have - body, n, body, have);
    sh->n_tokens = n;

    uint32_t value = 0;
    const char *tokens = (const char *)map + LOOM_SHARD_HEADER_BYTES;
    int64_t bad = find_bad_token(tokens, sh->token_bytes, n, vocab_size, &value);
    if (bad >= 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: token %" PRIu32 " at position %" PRId64 " is >= vocab size %d",
                              path, value, bad, vocab_size);
    return LOOM_OK;
}

loom_status loom_dataset_open(loom_dataset *ds, const char *glob_pattern, int vocab_size,
                              int seq_len, loom_error *err) {
    memset(ds, 0, sizeof *ds);
    if (vocab_size <= 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "vocab size %d: expected a positive number",
                              vocab_size);
    if (seq_len <= 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "seq_len %d: expected a positive number",
                              seq_len);

    glob_t g;
    int rc = glob(glob_pattern, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return loom_error_set(err, LOOM_ERR_INPUT, "--data '%s': no file matches", glob_pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return loom_error_set(err, rc == GLOB_NOSPACE ? LOOM_ERR_NOMEM : LOOM_ERR_IO,
                              "--data '%s': cannot expand the pattern (glob error %d)",
                              glob_pattern, rc);
    }
    /* Sort bytewise ourselves: glob's order follows the locale, the sampler must not. */
    qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), cmp_str);

    loom_status st = LOOM_OK;
    ds->seq_len = seq_len;
    ds->shards = calloc(g.gl_pathc, sizeof *ds->shards);
    if (!ds->shards) {
        globfree(&g);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--data '%s': out of memory for %zu shards",
                              glob_pattern, g.gl_pathc);
    }
    int64_t largest = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        loom_shard *sh = &ds->shards[ds->n_shards++]; /* counted now so close frees it */
        sh->path = strdup(g.gl_pathv[i]);
        if (!sh->path) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", g.gl_pathv[i]);
            break;
        }
        st = shard_open(sh, vocab_size, err);
        if (st != LOOM_OK) break;
        sh->n_windows = sh->n_tokens > seq_len ? sh->n_tokens - seq_len : 0;
        sh->first_window = ds->total_windows;
        ds->total_windows += sh->n_windows;
        ds->total_tokens += sh->n_tokens;
        if (sh->n_tokens > largest) largest = sh->n_tokens;
    }
    globfree(&g);
    if (st == LOOM_OK && ds->total_windows == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "--data '%s': no shard has the %lld tokens (seq_len %d + 1) needed "
                            "for one sequence (largest of %d shard(s): %" PRId64 " tokens)",
                            glob_pattern, (long long)seq_len + 1, seq_len, ds->n_shards, largest);
    if (st != LOOM_OK) loom_dataset_close(ds);
    return st;
}

void loom_dataset_close(loom_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++) {
        if (ds->shards[i].map) munmap(ds->shards[i].map, ds->shards[i].map_bytes);
        free(ds->shards[i].path);
    }
    free(ds->shards);
    memset(ds, 0, sizeof *ds);
}

/* The shard holding global window w: the last shard with first_window <= w. Shards
 * without windows share first_window with their successor, so "last" skips them. */
static const loom_shard *find_shard(const loom_dataset *ds, int64_t w) {
    int lo = 0, hi = ds->n_shards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (ds->shards[mid].first_window <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &ds->shards[lo];
}

const loom_shard *loom_dataset_locate(const loom_dataset *ds, uint64_t seed, int64_t step,
                                      int64_t seq, int64_t *token_offset) {
    uint64_t r = loom_philox_u64(seed, LOOM_DATA_STREAM, (uint64_t)step, (uint32_t)seq);
    int64_t w = (int64_t)(r % (uint64_t)ds->total_windows);
    const loom_shard *sh = find_shard(ds, w);
    *token_offset = w - sh->first_window;
    return sh;
}

void loom_dataset_sample(const loom_dataset *ds, uint64_t seed, int64_t step, int64_t first_seq,
                         int n_seqs, int32_t *out) {
    const int64_t len = (int64_t)ds->seq_len + 1;
    for (int i = 0; i < n_seqs; i++) {
        int64_t start;
        const loom_shard *sh = loom_dataset_locate(ds, seed, step, first_seq + i, &start);
        const char *base = (const char *)sh->map + LOOM_SHARD_HEADER_BYTES;
        int32_t *dst = out + (int64_t)i * len;
        if (sh->token_bytes == 2) {
            const uint16_t *src = (const uint16_t *)base + start;
            for (int64_t j = 0; j < len; j++) dst[j] = src[j];
        } else {
            const uint32_t *src = (const uint32_t *)base + start;
            for (int64_t j = 0; j < len; j++) dst[j] = (int32_t)src[j];
        }
    }
}
