/* Byte-level BPE training with incremental pair counts (see bpe_train.h). */
#include "data/bpe_train.h"
#include "data/tokenizer_impl.h"
#include "core/fs.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *w;
    int32_t n, cap;
} word_list;

typedef struct {
    int64_t count;
    uint32_t pair;
} heap_entry;

typedef struct {
    /* words: distinct pieces, symbols in syms[off .. off + len) */
    int64_t *wcount;
    size_t *woff;
    int32_t *wlen, *wstamp;
    int32_t *syms;
    int64_t n_words;
    /* pairs: hash (a << 32 | b) -> index */
    uint64_t *slot_key;
    uint32_t *slot_idx;
    size_t slot_mask;
    uint64_t *pkey;
    int64_t *pcount;
    word_list *pwhere;
    int32_t *pstamp;
    uint32_t n_pairs, pair_cap;
    heap_entry *heap;
    size_t heap_n, heap_cap;
    uint32_t *touched;
    size_t n_touched, touched_cap;
    /* tokens */
    loom_byte_buf tok;
    uint32_t *tok_off; /* n_tokens + 1 */
    int32_t n_tokens, tok_cap;
    loom_strmap tok_ids;
    uint64_t *merges;
    int32_t n_merges;
    size_t merge_cap;
} trainer;

#define GROW(ptr, cap, need, fail)                                                                 \
    do {                                                                                           \
        if ((size_t)(need) > (size_t)(cap)) {                                                      \
            size_t c_ = (cap) ? (size_t)(cap)*2 : 64;                                              \
            while (c_ < (size_t)(need)) c_ *= 2;                                                   \
            void *p_ = realloc((ptr), c_ * sizeof *(ptr));                                         \
            if (!p_) goto fail;                                                                    \
            (ptr) = p_;                                                                            \
            (cap) = c_;                                                                            \
        }                                                                                          \
    } while (0)

static int heap_less(const trainer *t, heap_entry x, heap_entry y) { /* x before y? */
    if (x.count != y.count) return x.count > y.count;
    return t->pkey[x.pair] < t->pkey[y.pair];
}

static int heap_push(trainer *t, uint32_t pair) {
    GROW(t->heap, t->heap_cap, t->heap_n + 1, fail);
    heap_entry v = {t->pcount[pair], pair};
    size_t i = t->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(t, v, t->heap[p])) break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = v;
    return 0;
fail:
    return -1;
}

static heap_entry heap_pop(trainer *t) {
    heap_entry top = t->heap[0], v = t->heap[--t->heap_n];
    size_t i = 0, n = t->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(t, t->heap[c + 1], t->heap[c])) c++;
        if (!heap_less(t, t->heap[c], v)) break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n) t->heap[i] = v;
    return top;
}

static int slots_rehash(trainer *t, size_t n_slots) {
    uint64_t *k = malloc(n_slots * sizeof *k);
    uint32_t *ix = malloc(n_slots * sizeof *ix);
    if (!k || !ix) {
        free(k);
        free(ix);
        return -1;
    }
    for (size_t i = 0; i < n_slots; i++) k[i] = UINT64_MAX;
    for (uint32_t p = 0; p < t->n_pairs; p++) {
        size_t i = (size_t)((t->pkey[p] * 0x9E3779B97F4A7C15ull) >> 20) & (n_slots - 1);
        while (k[i] != UINT64_MAX) i = (i + 1) & (n_slots - 1);
        k[i] = t->pkey[p];
        ix[i] = p;
    }
    free(t->slot_key);
    free(t->slot_idx);
    t->slot_key = k;
    t->slot_idx = ix;
    t->slot_mask = n_slots - 1;
    return 0;
}

/* Index of pair (a, b), created with count 0 if new; UINT32_MAX when out of memory. */
static uint32_t pair_get(trainer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->slot_mask;
    while (t->slot_key[i] != UINT64_MAX) {
        if (t->slot_key[i] == key) return t->slot_idx[i];
        i = (i + 1) & t->slot_mask;
    }
    if (t->n_pairs == UINT32_MAX - 1) return UINT32_MAX;
    GROW(t->pkey, t->pair_cap, t->n_pairs + 1, fail);
    size_t cap = t->pair_cap;
    int64_t *pc = realloc(t->pcount, cap * sizeof *pc);
    if (pc) t->pcount = pc;
    word_list *pw = realloc(t->pwhere, cap * sizeof *pw);
    if (pw) t->pwhere = pw;
    int32_t *ps = realloc(t->pstamp, cap * sizeof *ps);
    if (ps) t->pstamp = ps;
    if (!pc || !pw || !ps) goto fail;
    uint32_t p = t->n_pairs++;
    t->pkey[p] = key;
    t->pcount[p] = 0;
    t->pwhere[p] = (word_list){0};
    t->pstamp[p] = -1;
    t->slot_key[i] = key;
    t->slot_idx[i] = p;
    if ((size_t)t->n_pairs * 2 > t->slot_mask + 1 && slots_rehash(t, (t->slot_mask + 1) * 2) != 0)
        goto fail;
    return p;
fail:
    return UINT32_MAX;
}

static int where_add(word_list *l, int32_t w) {
    if (l->n > 0 && l->w[l->n - 1] == w) return 0;
    GROW(l->w, l->cap, l->n + 1, fail);
    l->w[l->n++] = w;
    return 0;
fail:
    return -1;
}

/* Adds delta * count to every adjacent pair of word w. track 2: records w in every
 * pair's word list; track 1: only in pairs touching token `hot` (the others held w
 * already), noting those pairs for the heap. */
static int word_pairs(trainer *t, int32_t w, int64_t delta, int track, int32_t hot, int32_t stamp) {
    const int32_t *s = t->syms + t->woff[w];
    for (int32_t i = 0; i + 1 < t->wlen[w]; i++) {
        uint32_t p = pair_get(t, s[i], s[i + 1]);
        if (p == UINT32_MAX) return -1;
        t->pcount[p] += delta * t->wcount[w];
        int is_hot = s[i] == hot || s[i + 1] == hot;
        if (!track || (track == 1 && !is_hot)) continue;
        if (where_add(&t->pwhere[p], w) != 0) return -1;
        if (is_hot && t->pstamp[p] != stamp) {
            t->pstamp[p] = stamp;
            GROW(t->touched, t->touched_cap, t->n_touched + 1, fail);
            t->touched[t->n_touched++] = p;
        }
    }
    return 0;
fail:
    return -1;
}

static int add_token(trainer *t, const unsigned char *bytes, size_t n, int32_t *id) {
    int added = 0;
    loom_strmap_slot *s = loom_strmap_put(&t->tok_ids, bytes, n, (uint32_t)t->n_tokens, &added);
    if (!s) return -1;
    *id = (int32_t)s->value;
    if (!added) return 0;
    GROW(t->tok_off, t->tok_cap, t->n_tokens + 2, fail);
    if (t->n_tokens == 0) t->tok_off[0] = 0;
    if (loom_byte_buf_append(&t->tok, bytes, n) != 0) return -1;
    t->tok_off[++t->n_tokens] = (uint32_t)t->tok.n;
    return 0;
fail:
    return -1;
}

/* Merges pair p (a, b) into a token and updates the words that hold it. */
static int do_merge(trainer *t, uint32_t p, int32_t stamp) {
    int32_t a = (int32_t)(t->pkey[p] >> 32), b = (int32_t)(uint32_t)t->pkey[p];
    loom_byte_buf tmp = {0};
    uint32_t la = t->tok_off[a + 1] - t->tok_off[a], lb = t->tok_off[b + 1] - t->tok_off[b];
    if (loom_byte_buf_append(&tmp, t->tok.data + t->tok_off[a], la) != 0 ||
        loom_byte_buf_append(&tmp, t->tok.data + t->tok_off[b], lb) != 0) {
        free(tmp.data);
        return -1;
    }
    int32_t id = 0;
    int rc = add_token(t, tmp.data, tmp.n, &id);
    free(tmp.data);
    if (rc != 0) return -1;
    GROW(t->merges, t->merge_cap, (size_t)t->n_merges + 1, oom);
    t->merges[t->n_merges++] = t->pkey[p];
    t->n_touched = 0;
    word_list wl = t->pwhere[p];
    t->pwhere[p] = (word_list){0}; /* the pair disappears from every word */
    for (int32_t k = 0; k < wl.n; k++) {
        int32_t w = wl.w[k];
        if (t->wstamp[w] == stamp) continue;
        t->wstamp[w] = stamp;
        int32_t *s = t->syms + t->woff[w], n = t->wlen[w], found = 0;
        for (int32_t i = 0; i + 1 < n && !found; i++) found = s[i] == a && s[i + 1] == b;
        if (!found) continue;
        if (word_pairs(t, w, -1, 0, id, stamp) != 0) goto fail;
        int32_t o = 0;
        for (int32_t i = 0; i < n;) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                s[o++] = id;
                i += 2;
            } else {
                s[o++] = s[i++];
            }
        }
        t->wlen[w] = o;
        if (word_pairs(t, w, +1, 1, id, stamp) != 0) goto fail;
    }
    free(wl.w);
    for (size_t k = 0; k < t->n_touched; k++)
        if (t->pcount[t->touched[k]] > 0 && heap_push(t, t->touched[k]) != 0) return -1;
    return 0;
fail:
    free(wl.w);
oom:
    return -1;
}

static loom_status write_files(const trainer *t, const char *dir, loom_error *err) {
    if (loom_mkdir_p(dir) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--out '%s': cannot create directory: %s", dir,
                              strerror(errno));
    char path[4096];
    json_t *obj = json_object();
    loom_byte_buf s = {0};
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < t->n_tokens && obj; i++) {
        s.n = 0;
        uint32_t o = t->tok_off[i], l = t->tok_off[i + 1] - o;
        int special = i == t->n_tokens - 1; /* <|endoftext|>, spelled as is */
        int bad = special ? loom_byte_buf_append(&s, t->tok.data + o, l)
                          : loom_bytes_spell(t->tok.data + o, l, &s);
        if (bad || json_object_setn_new(obj, (const char *)s.data, s.n, json_integer(i)) != 0) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory writing encoder.json");
            goto out;
        }
    }
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    if (!obj || json_dump_file(obj, path, JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) != 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot write", path);
        goto out;
    }
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        goto out;
    }
    fputs("#version: 0.2\n", f);
    for (int32_t m = 0; m < t->n_merges; m++) {
        int32_t ab[2] = {(int32_t)(t->merges[m] >> 32), (int32_t)(uint32_t)t->merges[m]};
        for (int k = 0; k < 2; k++) {
            s.n = 0;
            uint32_t o = t->tok_off[ab[k]], l = t->tok_off[ab[k] + 1] - o;
            if (loom_bytes_spell(t->tok.data + o, l, &s) != 0) break;
            fwrite(s.data, 1, s.n, f);
            fputc(k == 0 ? ' ' : '\n', f);
        }
    }
    if (ferror(f) | (fclose(f) != 0))
        st = loom_error_set(err, LOOM_ERR_IO, "%s: write failed", path);
out:
    free(s.data);
    json_decref(obj);
    return st;
}

static void trainer_free(trainer *t) {
    free(t->wcount);
    free(t->woff);
    free(t->wlen);
    free(t->wstamp);
    free(t->syms);
    free(t->slot_key);
    free(t->slot_idx);
    free(t->pkey);
    free(t->pcount);
    for (uint32_t p = 0; p < t->n_pairs && t->pwhere; p++) free(t->pwhere[p].w);
    free(t->pwhere);
    free(t->pstamp);
    free(t->heap);
    free(t->touched);
    free(t->tok.data);
    free(t->tok_off);
    loom_strmap_free(&t->tok_ids);
    free(t->merges);
}

/* Pre-tokenises the text and fills the word table. */
static loom_status count_words(trainer *t, const unsigned char *text, size_t len,
                               loom_bpe_train_stats *stats, loom_error *err) {
    loom_pretok pt;
    loom_status st = loom_pretok_init(&pt, err);
    if (st != LOOM_OK) return st;
    loom_strmap words;
    if (loom_strmap_init(&words, 1 << 16) != 0) {
        loom_pretok_free(&pt);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory counting words");
    }
    size_t pos = 0, s = 0, e = 0, cap = 0, syms_cap = 0, n_syms = 0;
    int r;
    while ((r = loom_pretok_next(&pt, text, len, &pos, &s, &e, err)) == 1) {
        stats->n_pieces++;
        int added = 0;
        loom_strmap_slot *slot =
            loom_strmap_put(&words, text + s, e - s, (uint32_t)t->n_words, &added);
        if (!slot || e - s > INT32_MAX) goto oom;
        if (!added) {
            t->wcount[slot->value]++;
            continue;
        }
        GROW(t->wcount, cap, t->n_words + 1, oom);
        int64_t *wc = t->wcount;
        (void)wc;
        size_t *wo = realloc(t->woff, cap * sizeof *wo);
        if (wo) t->woff = wo;
        int32_t *wl = realloc(t->wlen, cap * sizeof *wl);
        if (wl) t->wlen = wl;
        if (!wo || !wl) goto oom;
        GROW(t->syms, syms_cap, n_syms + (e - s), oom);
        t->wcount[t->n_words] = 1;
        t->woff[t->n_words] = n_syms;
        t->wlen[t->n_words] = (int32_t)(e - s);
        for (size_t i = s; i < e; i++) {
            int32_t id = 0;
            unsigned char c = text[i];
            id = (int32_t)loom_strmap_find(&t->tok_ids, &c, 1)->value;
            t->syms[n_syms++] = id;
        }
        t->n_words++;
    }
    if (r < 0) st = err ? err->code : LOOM_ERR_STATE;
    goto out;
oom:
    st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory counting words");
out:
    loom_strmap_free(&words);
    loom_pretok_free(&pt);
    return st;
}

loom_status loom_bpe_train(const unsigned char *text, size_t len, int32_t vocab_size,
                           const char *out_dir, loom_bpe_train_stats *stats, loom_error *err) {
    loom_bpe_train_stats local = {0};
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (vocab_size < 257)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--vocab-size %d: expected at least 257 (256 bytes + <|endoftext|>)",
                              vocab_size);
    if (len == 0)
        return loom_error_set(err, LOOM_ERR_INPUT, "--input: empty text, nothing to learn");
    trainer t = {0};
    loom_status st = LOOM_OK;
    if (loom_strmap_init(&t.tok_ids, (size_t)vocab_size) != 0 || slots_rehash(&t, 1 << 12) != 0)
        goto oom;
    /* Byte tokens in GPT-2's order: by their alphabet character. */
    for (uint16_t c = 0; c < 324; c++) {
        int b = loom_char_byte(c);
        int32_t id = 0;
        unsigned char byte = (unsigned char)b;
        if (b >= 0 && add_token(&t, &byte, 1, &id) != 0) goto oom;
    }
    st = count_words(&t, text, len, stats, err);
    if (st != LOOM_OK) goto out;
    stats->n_words = t.n_words;
    if (!(t.wstamp = malloc(((size_t)t.n_words + 1) * sizeof *t.wstamp))) goto oom;
    for (int64_t w = 0; w < t.n_words; w++) {
        t.wstamp[w] = -1;
        if (word_pairs(&t, (int32_t)w, +1, 2, -2, -1) != 0) goto oom;
    }
    for (uint32_t p = 0; p < t.n_pairs; p++)
        if (heap_push(&t, p) != 0) goto oom;
    while (t.n_tokens < vocab_size - 1 && t.heap_n > 0) {
        heap_entry e = heap_pop(&t);
        if (e.count != t.pcount[e.pair]) { /* stale: counts only fell since the push */
            if (t.pcount[e.pair] > 0 && heap_push(&t, e.pair) != 0) goto oom;
            continue;
        }
        if (e.count <= 0) break;
        if (do_merge(&t, e.pair, t.n_merges) != 0) goto oom;
    }
    int32_t id = 0;
    static const char eot[] = "<|endoftext|>";
    if (add_token(&t, (const unsigned char *)eot, sizeof eot - 1, &id) != 0) goto oom;
    stats->n_merges = t.n_merges;
    stats->n_tokens = t.n_tokens;
    st = write_files(&t, out_dir, err);
    goto out;
oom:
    st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory while training the BPE");
out:
    trainer_free(&t);
    return st;
}
