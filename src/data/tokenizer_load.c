/* Loading encoder.json + vocab.bpe: every entry is checked, errors name file and entry. */
#include "data/tokenizer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json_field.h"

#define FETCH_HINT "run scripts/fetch_gpt2_tokenizer.sh [DIR] to download it"

static int has_encoder(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/encoder.json", dir) >= (int)sizeof path) return 0;
    return access(path, R_OK) == 0;
}

loom_status loom_tokenizer_resolve(const char *name, char *dir, size_t dir_cap, loom_error *err) {
    if (!name || !*name)
        return loom_error_set(err, LOOM_ERR_INPUT, "--tokenizer: expected gpt2 or a folder");
    if (strcmp(name, "gpt2") != 0) {
        if (snprintf(dir, dir_cap, "%s", name) >= (int)dir_cap)
            return loom_error_set(err, LOOM_ERR_INPUT, "--tokenizer '%s': path too long", name);
        return LOOM_OK;
    }
    char tried[2 * PATH_MAX + 64] = "";
    const char *env = getenv("LOOM_TOKENIZER_DIR");
    if (env && *env) {
        if (has_encoder(env) && snprintf(dir, dir_cap, "%s", env) < (int)dir_cap) return LOOM_OK;
        snprintf(tried, sizeof tried, "%s (LOOM_TOKENIZER_DIR)", env);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        char cand[PATH_MAX + 32];
        snprintf(cand, sizeof cand, "%s/../third_party/gpt2", exe);
        if (has_encoder(cand) && snprintf(dir, dir_cap, "%s", cand) < (int)dir_cap) return LOOM_OK;
        size_t t = strlen(tried);
        snprintf(tried + t, sizeof tried - t, "%s%s", t ? ", " : "", cand);
    }
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "--tokenizer gpt2: no encoder.json found (tried %s); " FETCH_HINT,
                          *tried ? tried : "nothing: LOOM_TOKENIZER_DIR unset, exe path unknown");
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    free(t->tok_bytes);
    free(t->tok_off);
    free(t->merges);
    loom_pretok_free(&t->pretok);
    loom_strmap_free(&t->cache);
    free(t->cache_ids);
    free(t->sym);
    free(t->next);
    free(t->prev);
    free(t->heap);
    free(t->pending);
    free(t);
}

int32_t loom_tokenizer_vocab_size(const loom_tokenizer *t) {
    return t->n_tokens;
}
int32_t loom_tokenizer_merge_count(const loom_tokenizer *t) {
    return t->n_merges;
}

const unsigned char *loom_tokenizer_token(const loom_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_tokens) return NULL;
    *len = t->tok_off[id + 1] - t->tok_off[id];
    return t->tok_bytes + t->tok_off[id];
}

int32_t loom_tokenizer_eot_id(const loom_tokenizer *t) {
    static const char eot[] = "<|endoftext|>";
    size_t len = 0;
    const unsigned char *last = loom_tokenizer_token(t, t->n_tokens - 1, &len);
    return last && len == sizeof eot - 1 && memcmp(last, eot, len) == 0 ? t->n_tokens - 1 : -1;
}

loom_status loom_tokenizer_require_eot(const loom_tokenizer *t, const char *flag, int32_t *eot,
                                       loom_error *err) {
    *eot = loom_tokenizer_eot_id(t);
    if (*eot >= 0) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_INPUT,
                          "%s: the last token (id %d) is not <|endoftext|> (expected the "
                          "end-of-text token last, as GPT-2's encoder.json and loom tokenizer "
                          "train have it)",
                          flag, t->n_tokens - 1);
}

/* encoder.json -> tokens (bytes by id) and a map bytes -> id. */
static loom_status load_encoder(loom_tokenizer *t, loom_strmap *ids, const char *path,
                                loom_error *err) {
    const loom_json_reader r = {path, NULL, err}; /* the errors say "path: ..." */
    json_error_t je;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_json_fail(&r, "cannot open: %s", strerror(errno));
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    fclose(f);
    if (!root) {
        if (je.line <= 0) return loom_json_fail(&r, "%s", je.text);
        return loom_json_fail(&r, "line %d column %d: %s", je.line, je.column, je.text);
    }
    loom_status st = LOOM_OK;
    size_t n = json_is_object(root) ? json_object_size(root) : 0;
    if (!json_is_object(root) || n == 0 || n > INT32_MAX / 2) {
        st = loom_json_fail(&r, "%s", "expected a non-empty JSON object {\"token\": id, ...}");
        goto done;
    }
    loom_byte_buf bytes = {0};
    uint32_t *len_of = calloc(n, sizeof *len_of), *off_of = calloc(n, sizeof *off_of);
    unsigned char *seen = calloc(n, 1);
    if (!len_of || !off_of || !seen || loom_strmap_init(ids, n) != 0) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for %zu tokens", path, n);
        goto free_tmp;
    }
    char shown[160];
    for (void *it = json_object_iter(root); it; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        size_t klen = json_object_iter_key_len(it);
        json_t *v = json_object_iter_value(it);
        loom_bytes_show((const unsigned char *)key, klen, shown, sizeof shown);
        int64_t id;
        if (!loom_json_int_in(v, 0, (int64_t)n - 1, &id)) {
            st = loom_json_fail(&r,
                                "entry \"%s\": expected an integer id in [0, %zu) (ids must "
                                "number the %zu entries densely)",
                                shown, n, n);
            goto free_tmp;
        }
        if (seen[id]) {
            st = loom_json_fail(&r, "entry \"%s\": id %lld used twice", shown, (long long)id);
            goto free_tmp;
        }
        seen[id] = 1;
        size_t before = bytes.n;
        uint32_t bad = 0;
        long rc = klen ? loom_bytes_unspell(key, klen, &bytes, &bad) : 1;
        if (rc < 0 || bytes.n > UINT32_MAX) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
            goto free_tmp;
        }
        if (rc > 0) {
            if (!klen)
                st = loom_json_fail(&r, "%s", "entry \"\": empty token");
            else if (bad == 0xFFFFFFFFu)
                st = loom_json_fail(&r, "entry \"%s\": invalid UTF-8", shown);
            else
                st = loom_json_fail(&r,
                                    "entry \"%s\": character %ld (U+%04X) is not in GPT-2's "
                                    "byte alphabet (bytes_to_unicode)",
                                    shown, rc, bad);
            goto free_tmp;
        }
        off_of[id] = (uint32_t)before;
        len_of[id] = (uint32_t)(bytes.n - before);
        int added = 0;
        if (!loom_strmap_put(ids, bytes.data + before, bytes.n - before, (uint32_t)id, &added)) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
            goto free_tmp;
        }
    }
    /* Keys are distinct strings and the alphabet is a bijection, so the byte strings are
     * distinct too; ids are distinct and < n, so they are exactly 0..n-1. */
    t->n_tokens = (int32_t)n;
    t->tok_off = malloc((n + 1) * sizeof *t->tok_off);
    t->tok_bytes = malloc(bytes.n ? bytes.n : 1);
    if (!t->tok_off || !t->tok_bytes) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
        goto free_tmp;
    }
    uint32_t o = 0;
    for (size_t i = 0; i < n; i++) {
        t->tok_off[i] = o;
        memcpy(t->tok_bytes + o, bytes.data + off_of[i], len_of[i]);
        o += len_of[i];
    }
    t->tok_off[n] = o;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        loom_strmap_slot *s = loom_strmap_find(ids, &c, 1);
        if (!s) {
            unsigned cp = loom_byte_char[b];
            st = loom_json_fail(&r,
                                "no entry for byte 0x%02X (\"\\u%04X\"): a byte-level "
                                "vocabulary needs all 256 single-byte tokens",
                                b, cp);
            goto free_tmp;
        }
        t->byte_id[b] = (int32_t)s->value;
    }
free_tmp:
    free(bytes.data);
    free(len_of);
    free(off_of);
    free(seen);
done:
    json_decref(root);
    return st;
}

static loom_status read_file(const char *path, char **data, size_t *n, loom_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    loom_byte_buf b = {0};
    char chunk[65536];
    size_t got;
    int oom = 0;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (loom_byte_buf_append(&b, chunk, got) != 0) {
            oom = 1;
            break;
        }
    int bad = ferror(f);
    fclose(f);
    if (oom || bad || loom_byte_buf_append(&b, "", 1) != 0) {
        free(b.data);
        return loom_error_set(err, oom ? LOOM_ERR_NOMEM : LOOM_ERR_IO, "%s: %s", path,
                              oom ? "out of memory" : "read failed");
    }
    *data = (char *)b.data;
    *n = b.n - 1;
    return LOOM_OK;
}

/* Looks up one field of a merge line as a token id. */
static loom_status merge_part(const loom_strmap *ids, const char *path, long line, const char *s,
                              size_t n, loom_byte_buf *tmp, int32_t *id, loom_error *err) {
    tmp->n = 0;
    uint32_t bad = 0;
    long r = loom_bytes_unspell(s, n, tmp, &bad);
    char shown[160];
    loom_bytes_show((const unsigned char *)s, n, shown, sizeof shown);
    if (r < 0) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    if (r > 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s line %ld: \"%s\": character %ld is not in GPT-2's byte alphabet",
                              path, line, shown, r);
    loom_strmap_slot *slot = loom_strmap_find(ids, tmp->data, tmp->n);
    if (!slot)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s line %ld: \"%s\" is not in encoder.json",
                              path, line, shown);
    *id = (int32_t)slot->value;
    return LOOM_OK;
}

static loom_status load_merges(loom_tokenizer *t, const loom_strmap *ids, const char *path,
                               loom_error *err) {
    char *text = NULL;
    size_t n = 0;
    loom_status st = read_file(path, &text, &n, err);
    if (st != LOOM_OK) return st;
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    size_t slots = 64;
    while (slots < lines * 2) slots *= 2;
    t->merges = malloc(slots * sizeof *t->merges);
    loom_byte_buf tmp = {0};
    if (!t->merges) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < slots; i++) t->merges[i].key = UINT64_MAX;
    t->merge_mask = slots - 1;
    long line = 0;
    for (size_t p = 0; p < n;) {
        size_t e = p;
        while (e < n && text[e] != '\n') e++;
        line++;
        size_t le = e;
        while (le > p && (text[le - 1] == '\r' || text[le - 1] == ' ' || text[le - 1] == '\t'))
            le--;
        size_t next = e < n ? e + 1 : n;
        if (line == 1 && text[p] == '#') { /* "#version: 0.2" */
            p = next;
            continue;
        }
        if (le == p) { /* blank: allowed only when nothing follows */
            size_t q = next;
            while (q < n && (text[q] == '\n' || text[q] == '\r' || text[q] == ' ')) q++;
            if (q < n) {
                st = loom_error_set(err, LOOM_ERR_INPUT,
                                    "%s line %ld: empty line (expected \"A B\": two tokens)", path,
                                    line);
                goto out;
            }
            break;
        }
        size_t sp = p;
        while (sp < le && text[sp] != ' ') sp++;
        size_t b0 = sp < le ? sp + 1 : le, b1 = b0;
        while (b1 < le && text[b1] != ' ') b1++;
        if (sp == p || sp >= le || b0 == le || b1 != le) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s line %ld: expected two tokens separated by one space", path,
                                line);
            goto out;
        }
        int32_t a = 0, b = 0;
        st = merge_part(ids, path, line, text + p, sp - p, &tmp, &a, err);
        if (st == LOOM_OK) st = merge_part(ids, path, line, text + b0, le - b0, &tmp, &b, err);
        if (st != LOOM_OK) goto out;
        size_t la = t->tok_off[a + 1] - t->tok_off[a], lb = t->tok_off[b + 1] - t->tok_off[b];
        tmp.n = 0;
        if (loom_byte_buf_append(&tmp, t->tok_bytes + t->tok_off[a], la) != 0 ||
            loom_byte_buf_append(&tmp, t->tok_bytes + t->tok_off[b], lb) != 0) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
            goto out;
        }
        loom_strmap_slot *res = loom_strmap_find(ids, tmp.data, tmp.n);
        if (!res) {
            char shown[160];
            loom_bytes_show(tmp.data, tmp.n, shown, sizeof shown);
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s line %ld: the merged token \"%s\" is not in encoder.json", path,
                                line, shown);
            goto out;
        }
        const loom_merge_slot *dup = loom_merge_find(t, a, b);
        if (dup) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s line %ld: duplicate merge (first at line %ld)", path, line,
                                line - (long)t->n_merges + dup->rank);
            goto out;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->merge_mask;
        while (t->merges[i].key != UINT64_MAX) i = (i + 1) & t->merge_mask;
        t->merges[i] = (loom_merge_slot){key, t->n_merges, (int32_t)res->value};
        t->n_merges++;
        p = next;
    }
out:
    free(tmp.data);
    free(text);
    return st;
}

loom_status loom_tokenizer_load_files(loom_tokenizer **out, const char *encoder_json,
                                      const char *vocab_bpe, loom_error *err) {
    *out = NULL;
    loom_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for the tokenizer");
    t->heap_min_len = 24;
    loom_strmap ids = {0};
    loom_status st = load_encoder(t, &ids, encoder_json, err);
    if (st == LOOM_OK) st = load_merges(t, &ids, vocab_bpe, err);
    loom_strmap_free(&ids);
    if (st == LOOM_OK) st = loom_pretok_init(&t->pretok, err);
    if (st == LOOM_OK && loom_strmap_init(&t->cache, 1 << 14) != 0)
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for the tokenizer cache");
    if (st != LOOM_OK) {
        loom_tokenizer_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

loom_status loom_tokenizer_load(loom_tokenizer **out, const char *name_or_dir, loom_error *err) {
    *out = NULL;
    char dir[PATH_MAX];
    loom_status st = loom_tokenizer_resolve(name_or_dir, dir, sizeof dir, err);
    if (st != LOOM_OK) return st;
    char enc[PATH_MAX + 16], voc[PATH_MAX + 16];
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
    return loom_tokenizer_load_files(out, enc, voc, err);
}
