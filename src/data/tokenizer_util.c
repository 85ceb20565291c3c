/* Tokenizer helpers: GPT-2's byte alphabet, byte buffers and the byte-string hash map. */
#include "data/tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* bytes_to_unicode(): printable bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF keep their code
 * point; the other 68 bytes, in increasing order, become 256, 257, ... 323. */
const uint16_t loom_byte_char[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271, 272, 273, 274,
    275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287, 288, 33,  34,  35,  36,  37,
    38,  39,  40,  41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51,  52,  53,  54,  55,  56,
    57,  58,  59,  60,  61,  62,  63,  64,  65,  66,  67,  68,  69,  70,  71,  72,  73,  74,  75,
    76,  77,  78,  79,  80,  81,  82,  83,  84,  85,  86,  87,  88,  89,  90,  91,  92,  93,  94,
    95,  96,  97,  98,  99,  100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113,
    114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289, 290, 291, 292, 293, 294,
    295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313,
    314, 315, 316, 317, 318, 319, 320, 321, 322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170,
    171, 172, 323, 174, 175, 176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189,
    190, 191, 192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207, 208,
    209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 227,
    228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245, 246,
    247, 248, 249, 250, 251, 252, 253, 254, 255,
};

int loom_char_byte(uint32_t cp) {
    if (cp >= 324) return -1;
    if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 256) return -1;
    int n = 256;
    for (int b = 0; b < 256; b++)
        if (loom_byte_char[b] >= 256 && n++ == (int)cp) return b;
    return -1;
}

int loom_byte_buf_append(loom_byte_buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->n, data, n);
    b->n += n;
    return 0;
}

int loom_bytes_spell(const unsigned char *bytes, size_t n, loom_byte_buf *out) {
    for (size_t i = 0; i < n; i++) {
        unsigned c = loom_byte_char[bytes[i]];
        unsigned char u[2];
        int k = 1;
        if (c < 0x80) {
            u[0] = (unsigned char)c;
        } else {
            u[0] = (unsigned char)(0xC0 | (c >> 6));
            u[1] = (unsigned char)(0x80 | (c & 0x3F));
            k = 2;
        }
        if (loom_byte_buf_append(out, u, (size_t)k) != 0) return -1;
    }
    return 0;
}

/* Decodes one UTF-8 character at s[0..n); returns its length, 0 if invalid. */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (k == 0 || k > n || c >= 0xF5) return 0;
    uint32_t v = c & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[k] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return k;
}

long loom_bytes_unspell(const char *s, size_t n, loom_byte_buf *out, uint32_t *bad) {
    const unsigned char *u = (const unsigned char *)s;
    long index = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        size_t k = utf8_next(u + i, n - i, &cp);
        index++;
        int b = k ? loom_char_byte(cp) : -1;
        if (b < 0) {
            *bad = k ? cp : 0xFFFFFFFFu;
            return index;
        }
        unsigned char byte = (unsigned char)b;
        if (loom_byte_buf_append(out, &byte, 1) != 0) return -1;
        i += k;
    }
    return 0;
}

void loom_bytes_show(const unsigned char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    if (cap == 0) return;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        if (s[i] >= 0x20 && s[i] < 0x7F && s[i] != '\\' && s[i] != '"')
            out[o++] = (char)s[i];
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02X", s[i]);
    }
    if (o + 8 >= cap && o + 4 < cap) o += (size_t)snprintf(out + o, cap - o, "...");
    out[o] = '\0';
}

/* ---- hash map */

uint32_t loom_hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(h >> 32);
}

static int slots_alloc(loom_strmap *m, size_t n_slots) {
    m->slots = malloc(n_slots * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < n_slots; i++) m->slots[i].len = UINT32_MAX;
    m->mask = n_slots - 1;
    return 0;
}

int loom_strmap_init(loom_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t n = 64;
    while (n < expected * 2) n *= 2;
    return slots_alloc(m, n);
}

void loom_strmap_free(loom_strmap *m) {
    free(m->slots);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

void loom_strmap_clear(loom_strmap *m) {
    for (size_t i = 0; i <= m->mask; i++) m->slots[i].len = UINT32_MAX;
    m->count = 0;
    m->pool_len = 0;
}

loom_strmap_slot *loom_strmap_find(const loom_strmap *m, const void *key, size_t len) {
    uint32_t h = loom_hash_bytes(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        loom_strmap_slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) return NULL;
        if (s->hash == h && s->len == len && memcmp(m->pool + s->off, key, len) == 0) return s;
    }
}

static int grow(loom_strmap *m) {
    loom_strmap_slot *old = m->slots;
    size_t old_n = m->mask + 1;
    if (slots_alloc(m, old_n * 2) != 0) {
        m->slots = old;
        return -1;
    }
    for (size_t i = 0; i < old_n; i++) {
        if (old[i].len == UINT32_MAX) continue;
        size_t j = old[i].hash & m->mask;
        while (m->slots[j].len != UINT32_MAX) j = (j + 1) & m->mask;
        m->slots[j] = old[i];
    }
    free(old);
    return 0;
}

loom_strmap_slot *loom_strmap_put(loom_strmap *m, const void *key, size_t len, uint32_t value,
                                  int *added) {
    *added = 0;
    loom_strmap_slot *s = loom_strmap_find(m, key, len);
    if (s) return s;
    if (len >= UINT32_MAX || m->pool_len + len > UINT32_MAX) return NULL;
    if ((m->count + 1) * 2 > m->mask + 1 && grow(m) != 0) return NULL;
    if (m->pool_len + len > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap : 4096;
        while (cap < m->pool_len + len) cap *= 2;
        unsigned char *p = realloc(m->pool, cap);
        if (!p) return NULL;
        m->pool = p;
        m->pool_cap = cap;
    }
    if (len) memcpy(m->pool + m->pool_len, key, len);
    uint32_t h = loom_hash_bytes(key, len);
    size_t i = h & m->mask;
    while (m->slots[i].len != UINT32_MAX) i = (i + 1) & m->mask;
    m->slots[i] = (loom_strmap_slot){(uint32_t)m->pool_len, (uint32_t)len, h, value};
    m->pool_len += len;
    m->count++;
    *added = 1;
    return &m->slots[i];
}
