/* Streaming token-shard writer (see shard_stream.h). */
#include "data/shard_stream.h"

#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/shard_files.h"

int loom_prepare_shard_path(char *path, size_t cap, const char *dir, const char *split, int index) {
    return loom_shard_numbered_path(path, cap, dir, split, index);
}

loom_status loom_shard_stream_open(loom_shard_stream *s, const char *dir, const char *split,
                                   int token_bytes, int64_t max_tokens, loom_error *err) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    if (token_bytes != 2 && token_bytes != 4)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: token bytes %d (expected 2 or 4)", dir,
                              token_bytes);
    if (max_tokens < 1 || max_tokens > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_INPUT, "shard size %lld (expected 1 to %d tokens)",
                              (long long)max_tokens, INT32_MAX);
    s->split = split;
    s->token_bytes = token_bytes;
    s->max_tokens = max_tokens;
    s->path_cap = strlen(dir) + strlen(split) + 32;
    s->buf_cap = (size_t)65536 * (size_t)token_bytes;
    s->dir = strdup(dir);
    s->path = malloc(s->path_cap);
    s->tmp = malloc(s->path_cap);
    s->buf = malloc(s->buf_cap);
    if (s->dir && s->path && s->tmp && s->buf) return LOOM_OK;
    loom_shard_stream_abort(s);
    return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for a shard writer", dir);
}

static loom_status stream_flush(loom_shard_stream *s, loom_error *err) {
    loom_status st = loom_shard_tmp_write(s->fd, s->tmp, s->buf, s->buf_n, err);
    if (st == LOOM_OK) s->buf_n = 0;
    return st;
}

static loom_status stream_begin(loom_shard_stream *s, loom_error *err) {
    static const unsigned char zero[LOOM_SHARD_HEADER_BYTES];
    loom_prepare_shard_path(s->path, s->path_cap, s->dir, s->split, s->n_shards);
    loom_status st = loom_shard_tmp_open(s->path, s->tmp, s->path_cap, &s->fd, err);
    s->in_shard = 0;
    return st == LOOM_OK ? loom_shard_tmp_write(s->fd, s->tmp, zero, sizeof zero, err) : st;
}

/* Flush, patch the header, fsync, close, rename into place, fsync the folder. */
static loom_status stream_end(loom_shard_stream *s, loom_error *err) {
    int32_t header[LOOM_SHARD_HEADER_BYTES / 4] = {0};
    header[0] = s->token_bytes == 2 ? LOOM_SHARD_MAGIC_U16 : LOOM_SHARD_MAGIC_U32;
    header[1] = 1;
    header[2] = (int32_t)s->in_shard;
    loom_status st = stream_flush(s, err);
    if (st == LOOM_OK) st = loom_shard_tmp_pwrite(s->fd, s->tmp, header, sizeof header, 0, err);
    if (st == LOOM_OK) st = loom_shard_tmp_commit(&s->fd, s->tmp, s->path, s->dir, err);
    if (st == LOOM_OK) s->n_shards++;
    return st;
}

loom_status loom_shard_stream_put(loom_shard_stream *s, const int32_t *ids, size_t n,
                                  loom_error *err) {
    int64_t limit = s->token_bytes == 2 ? 65536 : (int64_t)INT32_MAX + 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= limit)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "%s/%s: token %d does not fit in %d-byte tokens", s->dir,
                                  s->split, ids[i], s->token_bytes);
        loom_status st = s->fd < 0 ? stream_begin(s, err) : LOOM_OK;
        if (st != LOOM_OK) return st;
        if (s->token_bytes == 2) {
            uint16_t v = (uint16_t)ids[i];
            memcpy(s->buf + s->buf_n, &v, 2);
        } else {
            uint32_t v = (uint32_t)ids[i];
            memcpy(s->buf + s->buf_n, &v, 4);
        }
        s->buf_n += (size_t)s->token_bytes;
        s->in_shard++;
        s->total++;
        if (s->buf_n == s->buf_cap) st = stream_flush(s, err);
        if (st == LOOM_OK && s->in_shard == s->max_tokens) st = stream_end(s, err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

static void stream_free(loom_shard_stream *s) {
    free(s->dir);
    free(s->path);
    free(s->tmp);
    free(s->buf);
    s->dir = s->path = s->tmp = NULL;
    s->buf = NULL;
}

loom_status loom_shard_stream_finish(loom_shard_stream *s, loom_error *err) {
    loom_status st = s->fd >= 0 ? stream_end(s, err) : LOOM_OK;
    if (st != LOOM_OK) loom_shard_stream_abort(s);
    stream_free(s);
    return st;
}

void loom_shard_stream_abort(loom_shard_stream *s) {
    loom_shard_tmp_discard(&s->fd, s->tmp);
    stream_free(s);
}
