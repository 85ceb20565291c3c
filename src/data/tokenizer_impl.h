/* Internals shared by the tokenizer's files and the BPE trainer (not a public contract):
 * the byte <-> character alphabet, a byte-string hash map, the pre-tokeniser and the
 * tokenizer struct itself. */
#ifndef LOOM_DATA_TOKENIZER_IMPL_H
#define LOOM_DATA_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "data/tokenizer.h"

/* ---- GPT-2's bytes_to_unicode(): byte b is spelled as code point loom_byte_char[b]. */
extern const uint16_t loom_byte_char[256];
/* Code point -> byte, -1 for characters outside the alphabet (code points < 324). */
int loom_char_byte(uint32_t cp);
/* Appends the alphabet spelling (UTF-8) of bytes[0..n) to out; -1 when out of memory. */
int loom_bytes_spell(const unsigned char *bytes, size_t n, loom_byte_buf *out);
/* Reverses loom_bytes_spell: UTF-8 s[0..n) -> bytes into out. Returns 0, or the 1-based
 * character index of the first character outside the alphabet (its code point in *bad,
 * 0xFFFFFFFF for invalid UTF-8), or -1 when out of memory. */
long loom_bytes_unspell(const char *s, size_t n, loom_byte_buf *out, uint32_t *bad);
/* Writes a printable, quoted-safe rendering of s[0..n) (non-printables as \xNN). */
void loom_bytes_show(const unsigned char *s, size_t n, char *out, size_t cap);
int loom_byte_buf_append(loom_byte_buf *b, const void *data, size_t n);

/* ---- Open-addressing hash map: byte string -> uint32 value. Keys are copied. */
typedef struct {
    uint32_t off, len, hash, value; /* len == UINT32_MAX: empty slot */
} loom_strmap_slot;
typedef struct {
    loom_strmap_slot *slots;
    size_t mask, count;
    unsigned char *pool;
    size_t pool_len, pool_cap;
} loom_strmap;

uint32_t loom_hash_bytes(const unsigned char *p, size_t n);
int loom_strmap_init(loom_strmap *m, size_t expected); /* 0, or -1: out of memory */
void loom_strmap_free(loom_strmap *m);
void loom_strmap_clear(loom_strmap *m);
/* The slot holding key, or NULL. */
loom_strmap_slot *loom_strmap_find(const loom_strmap *m, const void *key, size_t len);
/* Inserts key with value unless present; returns its slot (*added = 1 if new), NULL when
 * out of memory. Slot pointers stay valid until the next insert. */
loom_strmap_slot *loom_strmap_put(loom_strmap *m, const void *key, size_t len, uint32_t value,
                                  int *added);
static inline const unsigned char *loom_strmap_key(const loom_strmap *m,
                                                   const loom_strmap_slot *s) {
    return m->pool + s->off;
}

/* ---- GPT-2 pre-tokenisation (PCRE2). */
typedef struct {
    void *code;  /* pcre2_code_8 * */
    void *match; /* pcre2_match_data_8 * */
    int jit;     /* 1 when JIT compiled */
} loom_pretok;

loom_status loom_pretok_init(loom_pretok *p, loom_error *err);
void loom_pretok_free(loom_pretok *p);
/* Next piece of text[0..len) at or after *pos: sets [*start, *end), advances *pos and
 * returns 1; 0 at the end; -1 on a PCRE2 failure (err filled). Pieces tile the text. */
int loom_pretok_next(loom_pretok *p, const unsigned char *text, size_t len, size_t *pos,
                     size_t *start, size_t *end, loom_error *err);

/* ---- The tokenizer. */
typedef struct {
    uint64_t key;   /* (left id << 32) | right id; UINT64_MAX: empty */
    int32_t rank;   /* line order in vocab.bpe */
    int32_t result; /* id of left + right */
} loom_merge_slot;

struct loom_tokenizer {
    int32_t n_tokens;
    unsigned char *tok_bytes; /* all tokens' bytes back to back */
    uint32_t *tok_off;        /* n_tokens + 1 offsets into tok_bytes */
    int32_t byte_id[256];     /* id of each single-byte token */
    loom_merge_slot *merges;  /* hash table, merge_mask + 1 slots */
    size_t merge_mask;
    int32_t n_merges;
    loom_pretok pretok;
    /* Encoding state: cache of piece -> offset in cache_ids ([count, ids...]). */
    loom_strmap cache;
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    /* BPE scratch. */
    int32_t *sym, *next, *prev;
    uint64_t *heap, *pending;
    size_t scratch_cap;
    /* Pieces of more than this many bytes use the heap algorithm, shorter ones the
     * rescanning loop (both exact; tests lower it to compare them). */
    size_t heap_min_len;
};

/* Merge lookup: the slot for (a, b) or NULL. */
static inline const loom_merge_slot *loom_merge_find(const loom_tokenizer *t, int32_t a,
                                                     int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->merge_mask;
    for (;;) {
        const loom_merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

#endif
