/* Token-shard datasets: open (validate + mmap) and the deterministic sampler. */
#include "data/dataset.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "data/shard_files.h"

/* Headers and tokens are little-endian on disk and read in place. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "loom's shard reader assumes a little-endian host"
#endif

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

/* Maps and validates one shard file; on error close() frees what it holds. */
static loom_status shard_open(loom_shard *sh, const char *path, int vocab_size, loom_error *err) {
    loom_status st =
        loom_shard_map(path, LOOM_SHARD_HEADER_BYTES, "", &sh->path, &sh->map, &sh->map_bytes, err);
    if (st != LOOM_OK) return st;
    const void *map = sh->map;
    int64_t size = (int64_t)sh->map_bytes;
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
    loom_status st = loom_shard_glob(glob_pattern, "--data ", &g, err);
    if (st != LOOM_OK) return st;
    if (g.gl_pathc == 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--data '%s': no file matches", glob_pattern);
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
        st = shard_open(sh, g.gl_pathv[i], vocab_size, err);
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
    for (int i = 0; i < ds->n_shards; i++)
        loom_shard_unmap(ds->shards[i].path, ds->shards[i].map, ds->shards[i].map_bytes);
    free(ds->shards);
    memset(ds, 0, sizeof *ds);
}

/* The shard holding global window w: the last shard with first_window <= w. Shards
 * without windows share first_window with their successor, so "last" skips them. */
static const loom_shard *find_shard(const loom_dataset *ds, int64_t w) {
    int i = loom_shard_find(&ds->shards[0].first_window, sizeof *ds->shards, ds->n_shards, w);
    return &ds->shards[i];
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
