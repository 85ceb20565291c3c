/* GPT-2 pre-tokenisation with PCRE2.
 *
 * The reference (gpt-3-encoder's Encoder.js) runs the pattern as a JavaScript /u regex,
 * where \s is ECMAScript's WhiteSpace + LineTerminator set. PCRE2's \s differs (it
 * includes U+0085 and U+180E and lacks U+FEFF), so the set is written out here; \S and
 * [^\s...] use its complement. \p{L} and \p{N} come from PCRE2's Unicode tables (10.42:
 * Unicode 14; node 20: Unicode 15 — only characters new in Unicode 15 can differ).
 *
 * Invalid UTF-8: compiled with PCRE2_MATCH_INVALID_UTF, invalid sequences never match;
 * the bytes between two matches are returned as one piece (merged as plain bytes). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/tokenizer_impl.h"

#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r "                                                                         \
    "\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"

static const char pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                              "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

loom_status loom_pretok_init(loom_pretok *p, loom_error *err) {
    p->code = p->match = NULL;
    p->jit = 0;
    int ec = 0;
    PCRE2_SIZE eo = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return loom_error_set(err, LOOM_ERR_STATE,
                              "PCRE2 cannot compile the GPT-2 pattern at %zu: %s", (size_t)eo,
                              (const char *)msg);
    }
    p->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) {
        pcre2_code_free(re);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for PCRE2 match data");
    }
    p->code = re;
    p->match = md;
    return LOOM_OK;
}

void loom_pretok_free(loom_pretok *p) {
    if (p->match) pcre2_match_data_free(p->match);
    if (p->code) pcre2_code_free(p->code);
    p->code = p->match = NULL;
}

int loom_pretok_next(loom_pretok *p, const unsigned char *text, size_t len, size_t *pos,
                     size_t *start, size_t *end, loom_error *err) {
    size_t at = *pos;
    if (at >= len) return 0;
    int rc = p->jit ? pcre2_jit_match(p->code, text, len, at, 0, p->match, NULL)
                    : pcre2_match(p->code, text, len, at, 0, p->match, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) { /* only invalid bytes remain */
        *start = at;
        *end = *pos = len;
        return 1;
    }
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        loom_error_set(err, LOOM_ERR_STATE, "PCRE2 match failed at byte %zu: %s", at,
                       (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->match);
    if (ov[0] > at) { /* invalid bytes before the match: a piece of their own */
        *start = at;
        *end = *pos = ov[0];
        return 1;
    }
    if (ov[1] <= ov[0]) { /* cannot happen: every alternative consumes a character */
        loom_error_set(err, LOOM_ERR_STATE, "PCRE2 returned an empty match at byte %zu", at);
        return -1;
    }
    *start = ov[0];
    *end = *pos = ov[1];
    return 1;
}
