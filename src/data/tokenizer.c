/* Encoding and decoding with a loaded byte-level BPE (see tokenizer.h). */
#include "data/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* Bounds on the piece cache; it is emptied when either is reached. */
#define CACHE_MAX_ENTRIES (1u << 20)
#define CACHE_MAX_IDS (1u << 24)
#define CACHE_MAX_PIECE 256

static int ensure_scratch(loom_tokenizer *t, size_t n) {
    if (n <= t->scratch_cap) return 0;
    size_t cap = t->scratch_cap ? t->scratch_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *s = realloc(t->sym, cap * sizeof *s);
    if (s) t->sym = s;
    int32_t *nx = realloc(t->next, cap * sizeof *nx);
    if (nx) t->next = nx;
    int32_t *pv = realloc(t->prev, cap * sizeof *pv);
    if (pv) t->prev = pv;
    uint64_t *h = realloc(t->heap, 3 * cap * sizeof *h); /* n - 1 pairs + 2 per merge */
    if (h) t->heap = h;
    uint64_t *pd = realloc(t->pending, 2 * cap * sizeof *pd);
    if (pd) t->pending = pd;
    if (!s || !nx || !pv || !h || !pd) return -1;
    t->scratch_cap = cap;
    return 0;
}

/* Short pieces: GPT-2's loop as written. Find the lowest-ranked adjacent pair, merge all
 * its non-overlapping occurrences left to right, repeat. sym[0..n) -> sym[0..return). */
static size_t bpe_scan(const loom_tokenizer *t, int32_t *sym, size_t n) {
    while (n > 1) {
        int32_t best = INT32_MAX, res = 0;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const loom_merge_slot *m = loom_merge_find(t, sym[i], sym[i + 1]);
            if (m && m->rank < best) {
                best = m->rank;
                res = m->result;
                at = i;
            }
        }
        if (best == INT32_MAX) break;
        int32_t a = sym[at], b = sym[at + 1];
        size_t w = at;
        for (size_t i = at; i < n;) {
            if (i + 1 < n && sym[i] == a && sym[i + 1] == b) {
                sym[w++] = res;
                i += 2;
            } else {
                sym[w++] = sym[i++];
            }
        }
        n = w;
    }
    return n;
}

/* Min-heap of (rank << 32 | left position). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}
static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

/* Long pieces: the same result in O(n log n). Symbols form a linked list; candidate
 * pairs sit in a heap by (rank, position). All merges of one rank are done left to right
 * before the pairs they create are considered, exactly like the loop above. */
static size_t bpe_heap(loom_tokenizer *t, size_t n) {
    int32_t *sym = t->sym, *next = t->next, *prev = t->prev;
    uint64_t *heap = t->heap, *pending = t->pending;
    size_t hn = 0, pn = 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const loom_merge_slot *m = loom_merge_find(t, sym[i], sym[i + 1]);
        if (m) heap_push(heap, &hn, ((uint64_t)m->rank << 32) | i);
    }
    uint64_t cur = UINT64_MAX;
    while (hn > 0 || pn > 0) {
        if (pn > 0 && (hn == 0 || (heap[0] >> 32) != cur)) {
            for (size_t k = 0; k < pn; k++) heap_push(heap, &hn, pending[k]);
            pn = 0;
            continue;
        }
        uint64_t e = heap_pop(heap, &hn);
        int32_t l = (int32_t)(uint32_t)e, r = next[l];
        cur = e >> 32;
        if (sym[l] < 0 || r < 0) continue; /* stale: left merged away or now last */
        const loom_merge_slot *m = loom_merge_find(t, sym[l], sym[r]);
        if (!m || (uint64_t)m->rank != cur) continue; /* stale: the pair changed */
        sym[l] = m->result;
        sym[r] = -1;
        next[l] = next[r];
        if (next[r] >= 0) prev[next[r]] = l;
        int32_t pl = prev[l], nl = next[l];
        const loom_merge_slot *q;
        if (pl >= 0 && (q = loom_merge_find(t, sym[pl], sym[l])))
            pending[pn++] = ((uint64_t)q->rank << 32) | (uint32_t)pl;
        if (nl >= 0 && (q = loom_merge_find(t, sym[l], sym[nl])))
            pending[pn++] = ((uint64_t)q->rank << 32) | (uint32_t)l;
    }
    size_t w = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) sym[w++] = sym[i];
    return w;
}

static int push_ids(loom_token_buf *out, const int32_t *ids, size_t n) {
    if (out->n + n > out->cap) {
        size_t cap = out->cap ? out->cap : 1024;
        while (cap < out->n + n) cap *= 2;
        int32_t *p = realloc(out->ids, cap * sizeof *p);
        if (!p) return -1;
        out->ids = p;
        out->cap = cap;
    }
    memcpy(out->ids + out->n, ids, n * sizeof *ids);
    out->n += n;
    return 0;
}

/* Encodes one piece (cached) and appends its ids. */
static loom_status encode_piece(loom_tokenizer *t, const unsigned char *p, size_t n,
                                loom_token_buf *out, loom_error *err) {
    if (n == 1) {
        if (push_ids(out, &t->byte_id[p[0]], 1) != 0) goto oom;
        return LOOM_OK;
    }
    int cacheable = n <= CACHE_MAX_PIECE;
    if (cacheable) {
        loom_strmap_slot *s = loom_strmap_find(&t->cache, p, n);
        if (s) {
            const int32_t *ids = t->cache_ids + s->value;
            if (push_ids(out, ids + 1, (size_t)ids[0]) != 0) goto oom;
            return LOOM_OK;
        }
    }
    if (n > INT32_MAX || ensure_scratch(t, n) != 0) goto oom;
    for (size_t i = 0; i < n; i++) t->sym[i] = t->byte_id[p[i]];
    size_t m = n > t->heap_min_len ? bpe_heap(t, n) : bpe_scan(t, t->sym, n);
    if (push_ids(out, t->sym, m) != 0) goto oom;
    if (!cacheable) return LOOM_OK;
    if (t->cache.count >= CACHE_MAX_ENTRIES || t->cache_n + m + 1 > CACHE_MAX_IDS) {
        loom_strmap_clear(&t->cache);
        t->cache_n = 0;
    }
    if (t->cache_n + m + 1 > t->cache_cap) {
        size_t cap = t->cache_cap ? t->cache_cap : 1 << 16;
        while (cap < t->cache_n + m + 1) cap *= 2;
        int32_t *c = realloc(t->cache_ids, cap * sizeof *c);
        if (!c) return LOOM_OK; /* the cache is an optimisation only */
        t->cache_ids = c;
        t->cache_cap = cap;
    }
    int added = 0;
    if (!loom_strmap_put(&t->cache, p, n, (uint32_t)t->cache_n, &added)) return LOOM_OK;
    t->cache_ids[t->cache_n] = (int32_t)m;
    memcpy(t->cache_ids + t->cache_n + 1, t->sym, m * sizeof *t->sym);
    t->cache_n += m + 1;
    return LOOM_OK;
oom:
    return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory encoding a %zu-byte piece", n);
}

loom_status loom_tokenizer_encode(loom_tokenizer *t, const unsigned char *text, size_t len,
                                  loom_token_buf *out, loom_error *err) {
    size_t pos = 0, s = 0, e = 0;
    int r;
    while ((r = loom_pretok_next(&t->pretok, text, len, &pos, &s, &e, err)) == 1) {
        loom_status st = encode_piece(t, text + s, e - s, out, err);
        if (st != LOOM_OK) return st;
    }
    return r < 0 ? (err ? err->code : LOOM_ERR_STATE) : LOOM_OK;
}

loom_status loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, size_t n,
                                  loom_byte_buf *out, loom_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_tokens)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "token %zu: id %d is outside the vocabulary [0, %d)", i, ids[i],
                                  t->n_tokens);
        uint32_t o = t->tok_off[ids[i]], l = t->tok_off[ids[i] + 1] - o;
        if (loom_byte_buf_append(out, t->tok_bytes + o, l) != 0)
            return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory decoding %zu tokens", n);
    }
    return LOOM_OK;
}
